"""Clients follow a leader that moved while the old one lives (DESIGN §5 "Replication",
issue 19): three real brokers over real ZeroMQ, roles set through the broker's seam
(`BrokerServer.set_replica_role`) as an executor sets them from the catalog; the producer's
`locate` stands for the catalog."""

from __future__ import annotations

import asyncio

from querylib.broker import AsyncProducer, AsyncSubscriber, Data
from querylib.records import iter_batches
from tests.conftest import wait_for_async
from tests.integration.test_replication import SECRET, Cluster


def _values(cluster: Cluster, broker_id: int) -> list[bytes]:
    log = cluster.log(broker_id)
    data = log.read(0, 1 << 24)
    return [r.value for b in iter_batches(data) if not b.is_control for r in b.records]


def test_a_producer_follows_a_leader_moved_while_the_old_one_lives(tmp_path):
    """Records in flight when the leader is deposed are sent again to the new leader with
    their sequences: every acknowledged record once, in order, nothing duplicated though the
    new leader already held some of them."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        leader = {"id": 1}

        async def locate() -> str:
            return cluster.addresses[leader["id"] - 1]

        try:
            producer = await AsyncProducer(cluster.addresses[0], "t", 0, secret=SECRET,
                                           timeout=10, batch_records=1, locate=locate,
                                           reconnect_timeout=30).start()
            for i in range(5):
                await producer.send(b"a%d" % i)
            await producer.flush()
            # Broker 3 stops fetching: what follows reaches broker 2 but is not acknowledged.
            cluster.servers[2].hold_replica_fetches(True)
            for i in range(5):
                await producer.send(b"b%d" % i)
            await wait_for_async(lambda: cluster.log(2).log_end_offset >= 10, timeout=30,
                                 what="broker 2 fetched the unacknowledged records")
            flushed = asyncio.ensure_future(producer.flush())
            # The controller moves leadership to broker 2; broker 1 lives on as a follower.
            leader["id"] = 2
            await cluster.set_roles(leader=2, epoch=2, isr=(1, 2))
            cluster.servers[2].hold_replica_fetches(False)
            await asyncio.wait_for(flushed, 60)
            for i in range(5):
                await producer.send(b"c%d" % i)
            await producer.flush()
            await producer.close(end=False)
            expected = [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)] + \
                [b"c%d" % i for i in range(5)]
            assert _values(cluster, 2) == expected
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_subscriber_follows_a_leader_moved_while_the_old_one_lives(tmp_path):
    """A subscriber of the old leader hears it was deposed and resumes after its last record
    on the new leader: every record once, in order."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        leader = {"id": 1}

        async def locate() -> str:
            return cluster.addresses[leader["id"] - 1]

        try:
            producer = await AsyncProducer(cluster.addresses[0], "t", 0, secret=SECRET,
                                           timeout=10, batch_records=1, locate=locate,
                                           reconnect_timeout=30).start()
            subscriber = await AsyncSubscriber(cluster.addresses[0], "t", 0, secret=SECRET,
                                               timeout=10, locate=locate,
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
            leader["id"] = 2
            await cluster.set_roles(leader=2, epoch=2)
            for i in range(5):
                await producer.send(b"c%d" % i)
            await producer.flush()
            await read_until(10)
            assert seen == [b"a%d" % i for i in range(5)] + [b"c%d" % i for i in range(5)]
            assert subscriber.link.address == cluster.addresses[1]
            await subscriber.close()
            await producer.close(end=False)
        finally:
            await cluster.close()

    asyncio.run(main())
