"""Clients follow a leader that moved while the old one lives (DESIGN §5 "Replication",
issue 19): three real brokers over real ZeroMQ, roles set through the broker's seam
(`BrokerServer.replication.set_role`) as an executor sets them from the catalog; the producer's
`locate` stands for the catalog."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from querylib.broker import AsyncProducer, AsyncSubscriber, Data
from querylib.kafka._apis import ApiKey
from querylib.kafka._client import KafkaClient
from querylib.records import iter_batches
from querylib.server.kafka import BrokerKafka, KafkaConfig
from tests.conftest import wait_for_async
from tests.integration.test_replication import SECRET, Cluster


def _values(cluster: Cluster, broker_id: int) -> list[bytes]:
    log = cluster.log(broker_id)
    data = log.read(0, 1 << 24)
    return [r.value for b in iter_batches(data) if not b.is_control for r in b.records]


class Moving:
    """The three brokers of `Cluster`, broker 1 leading; `locate` answers the leader of now
    (the catalog's part), `move` makes another broker the leader."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.leader = 1

    async def locate(self) -> str:
        return self.cluster.addresses[self.leader - 1]

    async def move(self, leader: int, epoch: int, **roles: object) -> None:
        self.leader = leader
        await self.cluster.set_roles(leader=leader, epoch=epoch, **roles)

    async def producer(self) -> AsyncProducer:
        """A producer of partition 0, one record a batch, that follows the leader."""
        return await AsyncProducer(self.cluster.addresses[0], "t", 0, secret=SECRET,
                                   timeout=10, batch_records=1, locate=self.locate,
                                   reconnect_timeout=30).start()


@contextlib.asynccontextmanager
async def moving(tmp_path: Path) -> AsyncIterator[Moving]:
    cluster = Cluster(tmp_path)
    await cluster.start()
    try:
        yield Moving(cluster)
    finally:
        await cluster.close()


def test_a_producer_follows_a_leader_moved_while_the_old_one_lives(tmp_path):
    """Records in flight when the leader is deposed are sent again to the new leader with
    their sequences: every acknowledged record once, in order, nothing duplicated though the
    new leader already held some of them."""
    async def main() -> None:
        async with moving(tmp_path) as moves:
            cluster = moves.cluster
            producer = await moves.producer()
            for i in range(5):
                await producer.send(b"a%d" % i)
            await producer.flush()
            # Broker 3 stops fetching: what follows reaches broker 2 but is not acknowledged.
            cluster.servers[2].replication.hold(True)
            for i in range(5):
                await producer.send(b"b%d" % i)
            await wait_for_async(lambda: cluster.log(2).log_end_offset >= 10, timeout=30,
                                 what="broker 2 fetched the unacknowledged records")
            flushed = asyncio.ensure_future(producer.flush())
            # The controller moves leadership to broker 2; broker 1 lives on as a follower.
            await moves.move(2, 2, isr=(1, 2))
            cluster.servers[2].replication.hold(False)
            await asyncio.wait_for(flushed, 60)
            for i in range(5):
                await producer.send(b"c%d" % i)
            await producer.flush()
            await producer.close(end=False)
            expected = [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)] + \
                [b"c%d" % i for i in range(5)]
            assert _values(cluster, 2) == expected

    asyncio.run(main())


def test_a_subscriber_follows_a_leader_moved_while_the_old_one_lives(tmp_path):
    """A subscriber of the old leader hears it was deposed and resumes after its last record
    on the new leader: every record once, in order."""
    async def main() -> None:
        async with moving(tmp_path) as moves:
            cluster = moves.cluster
            producer = await moves.producer()
            subscriber = await AsyncSubscriber(cluster.addresses[0], "t", 0, secret=SECRET,
                                               timeout=10, locate=moves.locate,
                                               reconnect_timeout=30).start()
            seen: list[bytes] = []

            async def read_until(count: int) -> None:
                while len(seen) < count:
                    event = await asyncio.wait_for(subscriber.next_event(), 60)
                    if isinstance(event, Data):
                        seen.extend(r.value for r in event.records)

            for i in range(5):
                await producer.send(b"a%d" % i)
            await producer.flush()
            await read_until(5)
            await moves.move(2, 2)
            for i in range(5):
                await producer.send(b"c%d" % i)
            await producer.flush()
            await read_until(10)
            assert seen == [b"a%d" % i for i in range(5)] + [b"c%d" % i for i in range(5)]
            assert subscriber.link.address == cluster.addresses[1]
            await subscriber.close()
            await producer.close(end=False)

    asyncio.run(main())


def _kafka_fetch(address: str, epoch: int) -> int:
    with KafkaClient(address) as client:
        response = client.call(ApiKey.FETCH, 11, replica_id=-1, max_wait=0, min_bytes=0,
                               max_bytes=1 << 20, isolation_level=0, session_id=0,
                               session_epoch=-1, forgotten_topics_data=(), rack_id="",
                               topics=[{"topic": "t", "partitions": [
                                   {"partition": 0, "current_leader_epoch": epoch,
                                    "fetch_offset": 0, "log_start_offset": -1,
                                    "partition_max_bytes": 1 << 20}]}])
    return int(response.responses[0].partitions[0].error_code)


def _kafka_list_offsets(address: str, epoch: int) -> tuple[int, int]:
    with KafkaClient(address) as client:
        response = client.call(ApiKey.LIST_OFFSETS, 4, replica_id=-1, isolation_level=0,
                               topics=[{"name": "t", "partitions": [
                                   {"partition_index": 0, "current_leader_epoch": epoch,
                                    "timestamp": -1}]}])
    p = response.topics[0].partitions[0]
    return int(p.error_code), p.offset


def _kafka_epoch_end(address: str, epoch: int, current: int) -> tuple[int, int, int]:
    with KafkaClient(address) as client:
        response = client.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, 3, replica_id=-1,
                               topics=[{"topic": "t", "partitions": [
                                   {"partition": 0, "current_leader_epoch": current,
                                    "leader_epoch": epoch}]}])
    p = response.topics[0].partitions[0]
    return int(p.error_code), p.leader_epoch, p.end_offset


def test_the_kafka_listener_answers_as_a_replica_and_validates_leader_epochs(tmp_path):
    """Fetch and ListOffsets to a follower: NOT_LEADER_OR_FOLLOWER (6); to the leader at an
    older current_leader_epoch FENCED_LEADER_EPOCH (74), a newer UNKNOWN_LEADER_EPOCH (76);
    OffsetForLeaderEpoch (23) gives where an epoch ended, so a consumer validates its position
    after the leader moved."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        kafkas = [await BrokerKafka(s.port, KafkaConfig(host="127.0.0.1", port=0),
                                    secret=SECRET).start() for s in cluster.servers[:2]]
        one, two = (k.address for k in kafkas)
        try:
            producer = await AsyncProducer(cluster.addresses[0], "t", 0, secret=SECRET,
                                           timeout=10, batch_records=1).start()
            for i in range(5):
                await producer.send(b"a%d" % i)
            await producer.flush()
            call = asyncio.to_thread
            assert await call(_kafka_fetch, one, 1) == 0
            assert await call(_kafka_fetch, one, -1) == 0
            assert await call(_kafka_fetch, one, 0) == 74
            assert await call(_kafka_fetch, one, 2) == 76
            assert await call(_kafka_fetch, two, 1) == 6
            assert await call(_kafka_list_offsets, one, 1) == (0, 5)
            assert (await call(_kafka_list_offsets, one, 0))[0] == 74
            assert (await call(_kafka_list_offsets, two, 1))[0] == 6
            assert await call(_kafka_epoch_end, one, 1, 1) == (0, 1, 5)
            assert (await call(_kafka_epoch_end, two, 1, 1))[0] == 6
            await producer.close(end=False)

            await cluster.set_roles(leader=2, epoch=2)
            assert await call(_kafka_fetch, one, 2) == 6
            assert await call(_kafka_fetch, two, 1) == 74
            assert await call(_kafka_fetch, two, 2) == 0
            assert await call(_kafka_epoch_end, two, 1, 2) == (0, 1, 5)
            assert (await call(_kafka_epoch_end, two, 1, 1))[0] == 74
        finally:
            for kafka in kafkas:
                await kafka.close()
            await cluster.close()

    asyncio.run(main())


def test_a_subscriber_arriving_while_the_new_leader_opens_its_partition_again_waits(tmp_path):
    """A promoted follower opens its partition again before it leads (DESIGN §5
    "Replication"); a client that follows the catalog can reach it in that moment, and is
    answered once it leads, not told that the broker has no such partition."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        new_leader = cluster.servers[1]
        gate, reopening, asked = asyncio.Event(), asyncio.Event(), asyncio.Event()
        open_partition, ensure = new_leader._open, new_leader._ensure

        async def held_open(pid, incarnation=None):  # the promotion's open, held at the gate
            reopening.set()
            await gate.wait()
            await open_partition(pid, incarnation)

        async def noted_ensure(topic, partition, create, incarnation=None):
            if not create:
                asked.set()  # the subscriber's request reached the broker
            return await ensure(topic, partition, create, incarnation)

        try:
            producer = await AsyncProducer(cluster.addresses[0], "t", 0, secret=SECRET,
                                           timeout=10, batch_records=1).start()
            for i in range(3):
                await producer.send(b"a%d" % i)
            await producer.flush()
            await producer.close(end=False)
            await wait_for_async(lambda: cluster.log(2).log_end_offset >= 3, timeout=30,
                                 what="broker 2 fetched the records")
            new_leader._open, new_leader._ensure = held_open, noted_ensure
            promoting = asyncio.ensure_future(cluster.set_roles(leader=2, epoch=2))
            await asyncio.wait_for(reopening.wait(), 30)
            subscribing = asyncio.ensure_future(AsyncSubscriber(
                cluster.addresses[1], "t", 0, secret=SECRET, timeout=10).start())
            await asyncio.wait_for(asked.wait(), 30)
            for _ in range(5):  # let the broker answer it, if it answers before the open
                await asyncio.sleep(0)
            gate.set()
            await asyncio.wait_for(promoting, 30)
            subscriber = await asyncio.wait_for(subscribing, 30)
            seen: list[bytes] = []
            while len(seen) < 3:
                event = await asyncio.wait_for(subscriber.next_event(), 30)
                if isinstance(event, Data):
                    seen.extend(r.value for r in event.records)
            assert seen == [b"a0", b"a1", b"a2"]
            await subscriber.close()
        finally:
            gate.set()
            await cluster.close()

    asyncio.run(main())
