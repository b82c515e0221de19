"""Replicated partitions on three real brokers over real ZeroMQ on loopback (DESIGN §5
"Replication"): a leader and two followers, their roles set through the broker's seam
(`BrokerServer.replication.set_role`), as an executor sets them from the catalog."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from catalog.errors import TqError
from querylib.broker import BrokerLink, OpenProducerRequest, ProduceRequest
from querylib.broker._errors import PrincipalError
from querylib.broker.messages import (
    AdvanceRequest,
    EndStreamRequest,
    EpochEndRequest,
    Produced,
    ReplicaFetchRequest,
)
from querylib.log import LogConfig
from querylib.records import encode_batch, iter_batches
from querylib.rpc import BROKER, RpcClient
from querylib.server.broker import BrokerServer
from querylib.server.broker._replication import PartitionRole
from tests.conftest import wait_for_async
from tests.integration._broker_helpers import read_records

SECRET = os.urandom(32)
PID = ("t", 0)


class Cluster:
    def __init__(self, tmp_path: Path, flush: str = "always") -> None:
        self.servers = [BrokerServer(tmp_path / f"b{i}", SECRET,
                                     log_config=LogConfig(flush=flush)) for i in (1, 2, 3)]
        self.addresses: list[str] = []

    async def start(self, *, leader: int = 1, epoch: int = 1) -> None:
        self.addresses = [await s.start() for s in self.servers]
        await self.set_roles(leader=leader, epoch=epoch)

    async def set_roles(self, *, leader: int, epoch: int, isr=(1, 2, 3)) -> None:
        await self.set_roles_on((1, 2, 3), leader=leader, epoch=epoch, isr=isr)

    async def set_roles_on(self, brokers, *, leader: int, epoch: int, isr=(1, 2, 3)) -> None:
        role = PartitionRole(topic_id=1, partition=0, leader_id=leader, leader_epoch=epoch,
                             replicas=(1, 2, 3), isr=tuple(isr),
                             leader_address=self.addresses[leader - 1])
        for broker_id in brokers:
            await self.servers[broker_id - 1].replication.set_role("t", 0, role,
                                                               broker_id=broker_id)

    def log(self, broker_id: int):
        return self.servers[broker_id - 1].partition_log(PID)

    async def close(self) -> None:
        for server in self.servers:
            await server.close()


async def producer(address: str) -> BrokerLink:
    link = BrokerLink(address, SECRET, timeout=10)
    await link.start()
    await link.request(OpenProducerRequest(session=link.session, topic="t", partition=0))
    return link


def produce(link: BrokerLink, value: bytes) -> asyncio.Task[Produced]:
    return asyncio.ensure_future(link.request(
        ProduceRequest(session=link.session, topic="t", partition=0),
        payload=[encode_batch([(1, None, value, ())])]))


async def produce_replicated(cluster: Cluster, count: int) -> tuple[BrokerLink, bytes]:
    """`count` records produced at the leader (broker 1) one at a time, and waited for until
    both followers hold the leader's log; the open link and that log's bytes."""
    link = await producer(cluster.addresses[0])
    for i in range(count):
        assert (await asyncio.wait_for(produce(link, b"v%d" % i), 30)).base_offset == i
    data = cluster.log(1).read(0, 1 << 20)
    for follower in (2, 3):
        await wait_for_async(lambda f=follower: _stored(cluster, f) == data,
                             timeout=30, what="the follower holds the leader's log")
    return link, data


def _stored(cluster: Cluster, broker_id: int) -> bytes | None:
    """What a replica's log holds now; None while its fetcher truncates it (a log is not
    read while it is truncated: `PartitionLog.truncate_to`), so a wait asks again."""
    try:
        return cluster.log(broker_id).read(0, 1 << 20)
    except TqError:
        return None


def test_followers_hold_byte_identical_logs_with_the_leader_epoch_stamped(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(epoch=4)
        try:
            link, data = await produce_replicated(cluster, 5)  # byte-identical on all three
            epochs = {b.partition_leader_epoch for b in iter_batches(data)}
            assert epochs == {4}
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_the_leader_hashes_each_held_batch_once_for_both_followers(tmp_path):
    """Both followers fetch each batch while the leader still holds it (above the high
    watermark); the reply to each is signed with the batch's digest, computed once for the
    two (DESIGN §5 "Replication"), and verifies at both: their logs are the leader's."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link, _ = await produce_replicated(cluster, 6)
            assert cluster.servers[0].replication.digests.hashed == 6
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_run_the_high_watermark_uncovers_reaches_the_subscriber_unjoined(tmp_path):
    """Batches held above the high watermark (both followers paused) become visible at once
    when the followers catch up: they go to a tailing subscriber as one delivery of a payload
    frame a batch, the stored bytes the followers fetched, signed with their digests (no
    join, no second hash: `push_digests` stays 0, each batch hashed once) and sent as the
    same zero-copy zmq frame (made once a batch for both followers and the subscriber: the
    batches are over zmq's copy threshold), and the subscriber takes them in order."""
    from querylib.broker import Subscriber

    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        sub = None
        try:
            sub = await asyncio.to_thread(Subscriber, cluster.addresses[0], "t", 0,
                                          secret=SECRET)
            link = await producer(cluster.addresses[0])
            for follower in cluster.servers[1:]:
                follower.replication.hold(True)
            values = [bytes([i]) * 100_000 for i in range(5)]
            sent = [produce(link, value) for value in values]
            await wait_for_async(lambda: cluster.log(1).log_end_offset == 5, timeout=30,
                                 what="the leader appended the five batches")
            for follower in cluster.servers[1:]:
                follower.replication.hold(False)
            done = await asyncio.wait_for(asyncio.gather(*sent), 30)
            assert [p.base_offset for p in done] == [0, 1, 2, 3, 4]

            assert [v for _, v in await asyncio.to_thread(read_records, sub, 5)] == values
            leader = cluster.servers[0]
            assert leader.replication.digests.hashed == 5
            assert leader.replication.digests.shared == 5
            assert leader.counters["push_digests"] == 0
            await link.close()
        finally:
            if sub is not None:
                await asyncio.to_thread(sub.close)
            await cluster.close()

    asyncio.run(main())


def test_a_tail_delivery_of_a_replicated_batch_reuses_the_followers_digest(tmp_path):
    """A subscriber at the leader's tail gets each batch once the high watermark passes it:
    the same stored bytes the followers fetched, already hashed for them, so the push is
    signed with that digest (no second hash: `push_digests` stays 0) and verifies."""
    from querylib.broker import Subscriber

    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        sub = None
        try:
            sub = await asyncio.to_thread(Subscriber, cluster.addresses[0], "t", 0,
                                          secret=SECRET)
            link = await producer(cluster.addresses[0])
            for i in range(5):
                assert (await asyncio.wait_for(produce(link, b"v%d" % i), 30)).base_offset == i

            assert [v for _, v in await asyncio.to_thread(read_records, sub, 5)] == \
                [b"v%d" % i for i in range(5)]
            leader = cluster.servers[0]
            assert leader.replication.digests.hashed == 5
            assert leader.counters["push_digests"] == 0
            await link.close()
        finally:
            if sub is not None:
                await asyncio.to_thread(sub.close)
            await cluster.close()

    asyncio.run(main())


@pytest.mark.parametrize("flush", ["never", "always"])
def test_a_follower_appends_on_its_loop_only_when_no_append_waits_for_the_disk(tmp_path, flush):
    """As the leader's append lane does (DESIGN §5 "Fair service"): under the "never" flush
    policy a follower appends what it fetched on its event loop (the page cache takes it; no
    thread hop per fetch), and its log is the leader's; under "always" (an fsync per append)
    every append goes to the append pool, off the loop."""
    async def main() -> None:
        cluster = Cluster(tmp_path, flush=flush)
        pooled: list[str] = []
        for server in cluster.servers[1:]:
            pool = server.replication._append_pool
            submit = pool.submit

            def counted(fn, *args, submit=submit, **kwargs):
                pooled.append(getattr(fn, "__name__", repr(fn)))
                return submit(fn, *args, **kwargs)

            pool.submit = counted  # type: ignore[method-assign]
        await cluster.start()
        try:
            link, _ = await produce_replicated(cluster, 5)
            appends = pooled.count("append_replica")
            assert appends == 0 if flush == "never" else appends >= 2
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_produce_is_answered_only_once_every_follower_fetched_it(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = await producer(cluster.addresses[0])
            cluster.servers[2].replication.hold(True)
            ack = produce(link, b"held")
            leader = cluster.servers[0].state.partitions[PID].replication
            await wait_for_async(lambda: leader._followers[2].fetched >= 1, timeout=30,
                                 what="follower 2 fetched past the record")
            assert not ack.done()  # follower 3 has not fetched it
            assert cluster.servers[0].state.partition_info(PID).high_watermark == 0
            cluster.servers[2].replication.hold(False)
            assert (await asyncio.wait_for(ack, 30)).next_offset == 1
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_follower_refuses_a_producer(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = BrokerLink(cluster.addresses[1], SECRET, timeout=10)
            await link.start()
            with pytest.raises(TqError) as raised:
                await link.request(OpenProducerRequest(session=link.session, topic="t",
                                                       partition=0))
            assert raised.value.kafka_error_code == 6
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_follower_with_a_divergent_tail_truncates_to_the_leaders_log(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(leader=1, epoch=1)
        try:
            link = await producer(cluster.addresses[0])
            for value in (b"a", b"b"):
                await asyncio.wait_for(produce(link, value), 30)
            for server in cluster.servers[1:]:
                server.replication.hold(True)
            unacked = produce(link, b"c, never acknowledged")
            await wait_for_async(lambda: cluster.log(1).log_end_offset == 3, timeout=30,
                                 what="the leader appended c")
            # Broker 1 is deposed (as the controller would): broker 2 leads at epoch 2.
            await cluster.set_roles(leader=2, epoch=2, isr=(2, 3))
            link2 = await producer(cluster.addresses[1])
            assert (await asyncio.wait_for(produce(link2, b"d"), 30)).base_offset == 2
            data = cluster.log(2).read(0, 1 << 20)
            for broker in (1, 3):
                await wait_for_async(
                    lambda b=broker: _stored(cluster, b) == data, timeout=30,
                    what=f"broker {broker} converged on the leader's log")
            with pytest.raises(TqError) as raised:
                await asyncio.wait_for(unacked, 30)  # never acknowledged, and told so
            assert raised.value.kafka_error_code == 6
            await link.close(clean=False)
            await link2.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_restarted_follower_catches_up_from_its_log_end(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = await producer(cluster.addresses[0])
            await asyncio.wait_for(produce(link, b"before"), 30)
            await cluster.servers[2].close()
            # Out of the ISR while away (the controller's change), so the leader acks without it.
            await cluster.set_roles_on((1, 2), leader=1, epoch=1, isr=(1, 2))
            for i in range(3):
                await asyncio.wait_for(produce(link, b"while away %d" % i), 30)
            cluster.servers[2] = BrokerServer(tmp_path / "b3", SECRET,
                                              log_config=LogConfig(flush="always"))
            await cluster.servers[2].start()
            await cluster.set_roles_on((3,), leader=1, epoch=1, isr=(1, 2))
            data = cluster.log(1).read(0, 1 << 20)
            await wait_for_async(lambda: _stored(cluster, 3) == data, timeout=30,
                                 what="the restarted follower caught up")
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_subscriber_never_sees_records_above_the_high_watermark(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = await producer(cluster.addresses[0])
            await asyncio.wait_for(produce(link, b"acked"), 30)
            cluster.servers[2].replication.hold(True)
            held = produce(link, b"above the high watermark")
            await wait_for_async(lambda: cluster.log(1).log_end_offset == 2, timeout=30,
                                 what="the leader appended it")
            port = cluster.servers[0].port
            info = port.info(PID)
            assert info.high_watermark == 1 and info.log_end == 1
            cluster.servers[2].replication.hold(False)
            await asyncio.wait_for(held, 30)
            assert port.info(PID).high_watermark == 2
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_promoted_follower_shows_readers_nothing_above_the_high_watermark(tmp_path):
    """A follower holds a record its leader appended and never acknowledged: the other
    follower lacks it. Promoted (its leader cut off), it shows readers only what its ISR holds,
    its log end is not its high watermark: had it served that record and then lost the
    leadership to the other follower, a record readers were served would be gone, and what
    they read no prefix of what is stored (issue 19's cut-off leader check). A reader resuming
    above its high watermark, as one that read everything the old leader acknowledged does,
    waits there; once the ISR holds the record, readers get it."""
    from querylib.broker import Subscriber
    from querylib.server.kafka import BrokerBackend, KafkaConfig

    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        subs: list[Subscriber] = []
        try:
            link, _ = await produce_replicated(cluster, 1)
            follower = cluster.servers[1].state.partitions
            await wait_for_async(lambda: follower[PID].visible_end == 1, timeout=30,
                                 what="follower 2 learnt the high watermark 1")
            cluster.servers[2].replication.hold(True)  # broker 3 fetches no more
            unacked = produce(link, b"never acknowledged")
            await wait_for_async(lambda: cluster.log(2).log_end_offset == 2, timeout=30,
                                 what="follower 2 fetched the record")
            # Broker 1 is cut off: the controller moves the leadership to broker 2 at epoch 2,
            # ISR (2, 3); broker 3 has not taken its new role yet.
            await cluster.set_roles_on((1, 2), leader=2, epoch=2, isr=(2, 3))
            with pytest.raises(TqError):
                await asyncio.wait_for(unacked, 30)
            await link.close(clean=False)
            port = cluster.servers[1].port
            assert port.info(PID).high_watermark == 1  # broker 3 lacks offset 1
            # A Kafka consumer there reads nothing above it, and is not out of range.
            kafka = BrokerBackend(port, KafkaConfig())
            assert [(r.offsets.high_watermark, r.chunks) for r in [
                await kafka.read("t", 0, o, 1 << 20) for o in (1, 2)]] == [(1, []), (1, [])]
            for start in ("earliest", 2):
                subs.append(await asyncio.to_thread(
                    Subscriber, cluster.addresses[1], "t", 0, secret=SECRET, start=start))
            # Broker 3 takes its role and fetches: the record is on the whole ISR.
            await cluster.set_roles_on((3,), leader=2, epoch=2, isr=(2, 3))
            cluster.servers[2].replication.hold(False)
            await wait_for_async(lambda: port.info(PID).high_watermark == 2, timeout=30,
                                 what="the high watermark over the new ISR")
            link2 = await producer(cluster.addresses[1])
            assert (await asyncio.wait_for(produce(link2, b"after"), 30)).base_offset == 2
            await link2.close()

            assert await asyncio.to_thread(read_records, subs[0], 3) == [
                (0, b"v0"), (1, b"never acknowledged"), (2, b"after")]
            assert await asyncio.to_thread(read_records, subs[1], 1) == [(2, b"after")]
        finally:
            for sub in subs:
                await asyncio.to_thread(sub.close)
            await cluster.close()

    asyncio.run(main())


def test_a_follower_that_stops_fetching_is_proposed_out_of_the_isr_and_back(tmp_path):
    from querylib.server.broker._state import BrokerLimits

    async def main() -> None:
        cluster = Cluster(tmp_path)
        cluster.servers[0] = BrokerServer(tmp_path / "b1", SECRET,
                                          limits=BrokerLimits(replica_lag_time_max=0.3),
                                          log_config=LogConfig(flush="always"))
        proposals: list = []
        cluster.servers[0].replication.on_isr_proposal = proposals.append
        await cluster.start()
        try:
            link = await producer(cluster.addresses[0])
            await asyncio.wait_for(produce(link, b"a"), 30)
            cluster.servers[2].replication.hold(True)
            produce(link, b"b")
            await wait_for_async(lambda: any(p.isr == (1, 2) for p in proposals), timeout=30,
                                 what="follower 3 proposed out")
            # The coordinator accepts (AlterPartition): the new role comes back.
            await cluster.set_roles(leader=1, epoch=1, isr=(1, 2))
            cluster.servers[2].replication.hold(False)
            await wait_for_async(lambda: any(p.isr == (1, 2, 3) for p in proposals),
                                 timeout=30, what="follower 3 proposed back in")
            await link.close(clean=False)
        finally:
            await cluster.close()

    asyncio.run(main())


def test_min_insync_replicas_refuses_a_produce_to_a_small_isr(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            role = PartitionRole(topic_id=1, partition=0, leader_id=1, leader_epoch=1,
                                 replicas=(1, 2, 3), isr=(1,))
            await cluster.servers[0].replication.set_role("t", 0, role, broker_id=1, min_insync=2)
            link = BrokerLink(cluster.addresses[0], SECRET, timeout=10)
            await link.start()
            with pytest.raises(TqError) as raised:
                await link.request(OpenProducerRequest(session=link.session, topic="t",
                                                       partition=0))
            assert raised.value.kafka_error_code == 19
            assert cluster.log(1).log_end_offset == 0
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_fetch_beyond_the_leaders_log_end_is_refused(tmp_path):
    # A replica claiming records the leader never wrote (a tail it did not truncate) must not
    # count towards the high watermark: the leader answers OFFSET_OUT_OF_RANGE (Kafka's rule).
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        client = RpcClient(cluster.addresses[0], SECRET, audience=BROKER, timeout=10)
        try:
            cluster.servers[2].replication.hold(True)
            link = await producer(cluster.addresses[0])
            pending = produce(link, b"held")
            await wait_for_async(lambda: cluster.log(1).log_end_offset == 1)
            await client.connect()
            with pytest.raises(TqError) as raised:
                await client.request(ReplicaFetchRequest("t", 0, fetch_offset=5,
                                                         leader_epoch=1, replica=3))
            assert raised.value.kafka_error_code == 1
            assert not pending.done()
            cluster.servers[2].replication.hold(False)
            assert (await pending).base_offset == 0
            await link.close()
        finally:
            await client.close()
            await cluster.close()

    asyncio.run(main())


def test_a_follower_ahead_of_its_leader_at_the_same_epoch_truncates_and_converges(tmp_path):
    # The leader's log ends below the follower's at the same epoch (a leader restarted having
    # lost an unflushed tail, its role not set again): its fetch is refused as out of range,
    # and the follower truncates where the leader's epoch ends before fetching again, instead
    # of asking for the same offset forever.
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = await producer(cluster.addresses[0])
            await asyncio.wait_for(produce(link, b"a"), 30)
            await wait_for_async(lambda: cluster.log(3).log_end_offset == 1, timeout=30,
                                 what="follower 3 has a")
            cluster.servers[2].replication.hold(True)
            stored = cluster.log(1).read(0, 1 << 20)  # a's batch as stored (epoch 1)
            cluster.log(3).append_replica((1).to_bytes(8, "big") + stored[8:])  # a tail at 1
            assert cluster.log(3).log_end_offset == 2
            cluster.servers[2].replication.hold(False)
            await wait_for_async(lambda: cluster.log(3).log_end_offset == 1, timeout=30,
                                 what="follower 3 cut the tail the leader does not have")
            await asyncio.wait_for(produce(link, b"b"), 30)
            data = cluster.log(1).read(0, 1 << 20)
            await wait_for_async(lambda: _stored(cluster, 3) == data, timeout=30,
                                 what="follower 3 converged on the leader's log")
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_promoted_follower_knows_the_producers_frontier_and_end_its_log_holds(tmp_path):
    """A follower appends its leader's batches without judging them, so when it is promoted
    it must learn what they say before it serves: a producer's batch resent to the new leader
    is the same batch (not appended twice), and the frontier and end of stream stand."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(leader=1, epoch=1)
        try:
            link = await producer(cluster.addresses[0])
            producer_id = 1 << 62 | 12345
            batches = [encode_batch([(1, None, b"v%d" % i, ())], producer_id=producer_id,
                                    producer_epoch=0, base_sequence=i) for i in range(3)]
            for batch in batches:
                await asyncio.wait_for(link.request(
                    ProduceRequest(session=link.session, topic="t", partition=0),
                    payload=[batch]), 30)
            await link.request(AdvanceRequest(session=link.session, topic="t", partition=0,
                                              frontier=7))
            await link.request(EndStreamRequest(session=link.session, topic="t", partition=0))
            end = cluster.log(1).log_end_offset
            await wait_for_async(lambda: cluster.log(2).log_end_offset == end, timeout=30,
                                 what="follower 2 holds everything")
            await link.close(clean=False)
            await cluster.set_roles(leader=2, epoch=2, isr=(2, 3))
            # Told as they stand at its high watermark: once that covers its log (broker 3
            # holds it too), the frontier and the end it holds.
            state = cluster.servers[1].state
            await wait_for_async(lambda: state.partition_info(PID).high_watermark == end,
                                 timeout=30, what="the new leader's high watermark")
            info = state.partition_info(PID)
            assert (info.frontier, info.ended) == (7, True)
            # The producer comes back to the new leader and resends its last batch, as a
            # producer whose answer was lost does: the same offsets, nothing appended.
            link2 = BrokerLink(cluster.addresses[1], SECRET, timeout=10)
            await link2.start()
            await link2.request(OpenProducerRequest(
                session=link2.session, topic="t", partition=0, rejoin=True, producer_id=producer_id,
                last_sequence=2, ending=True))
            again = await asyncio.wait_for(link2.request(
                ProduceRequest(session=link2.session, topic="t", partition=0),
                payload=[batches[2]]), 30)
            assert again.base_offset == 2
            assert cluster.log(2).log_end_offset == end
            await link2.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_promoted_follower_tells_the_frontier_and_end_at_its_high_watermark(tmp_path):
    """A follower holds a frontier and an end of stream its leader wrote and never
    acknowledged (the other follower lacks them). Promoted, it shows readers its log up to its
    high watermark only, and what it tells of the partition (`partition_info`: the frontier,
    whether it ended) is what holds there, not at its log end; once the ISR holds the rest,
    the frontier and the end stand."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link, _ = await produce_replicated(cluster, 1)
            await link.request(AdvanceRequest(session=link.session, topic="t", partition=0,
                                              frontier=3))
            await wait_for_async(lambda: cluster.servers[1].state.partitions[PID].visible_end
                                 == cluster.log(1).log_end_offset, timeout=30,
                                 what="follower 2 learnt the high watermark")
            cluster.servers[2].replication.hold(True)  # broker 3 fetches no more
            unacked = [produce(link, b"never acknowledged")]
            unacked.append(asyncio.ensure_future(link.request(AdvanceRequest(
                session=link.session, topic="t", partition=0, frontier=7))))
            unacked.append(asyncio.ensure_future(link.request(EndStreamRequest(
                session=link.session, topic="t", partition=0))))
            mark = cluster.servers[1].state.partitions[PID].visible_end
            await wait_for_async(lambda: cluster.log(2).log_end_offset == mark + 3, timeout=30,
                                 what="follower 2 fetched the record, frontier and end")
            await cluster.set_roles_on((1, 2), leader=2, epoch=2, isr=(2, 3))
            for request in unacked:
                with pytest.raises(TqError):
                    await asyncio.wait_for(request, 30)
            await link.close(clean=False)
            port = cluster.servers[1].port
            info = port.info(PID)
            assert (info.high_watermark, info.frontier, info.ended) == (mark, 3, False)
            await cluster.set_roles_on((3,), leader=2, epoch=2, isr=(2, 3))
            cluster.servers[2].replication.hold(False)
            await wait_for_async(lambda: port.info(PID).high_watermark == mark + 3, timeout=30,
                                 what="the high watermark over the new ISR")
            info = port.info(PID)
            assert (info.frontier, info.ended) == (7, True)
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_caught_up_followers_fetch_waits_at_the_log_end_for_the_next_append(tmp_path):
    """Kafka's replica.fetch.wait.max.ms: a fetch at the leader's log end is answered by the
    next append (with its batch), not at once and empty, so followers neither poll an idle
    leader nor lag a busy one by a polling interval; with no append, when its wait is over."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        client = RpcClient(cluster.addresses[0], SECRET, audience=BROKER, timeout=60)
        try:
            cluster.servers[2].replication.hold(True)  # this test fetches as replica 3
            await client.connect()
            waiting = asyncio.ensure_future(client.exchange(ReplicaFetchRequest(
                "t", 0, fetch_offset=0, leader_epoch=1, replica=3, max_wait_ms=30_000)))
            leader = cluster.servers[0].state.partitions[PID]
            await wait_for_async(lambda: leader.replica_waits, timeout=30,
                                 what="the fetch waits at the leader")
            assert not waiting.done()
            link = await producer(cluster.addresses[0])
            pending = produce(link, b"first")
            _reply, frames = await asyncio.wait_for(waiting, 30)
            assert [r.value for b in iter_batches(b"".join(bytes(f) for f in frames))
                    for r in b.records] == [b"first"]
            # No append: answered empty once the wait is over.
            _reply, frames = await client.exchange(ReplicaFetchRequest(
                "t", 0, fetch_offset=1, leader_epoch=1, replica=3, max_wait_ms=200))
            assert b"".join(bytes(f) for f in frames) == b""
            with pytest.raises(TqError):  # a wait beyond the limit is refused
                await client.exchange(ReplicaFetchRequest(
                    "t", 0, fetch_offset=1, leader_epoch=1, replica=3, max_wait_ms=10**9))
            cluster.servers[2].replication.hold(False)
            assert (await asyncio.wait_for(pending, 30)).base_offset == 0
            await link.close()
        finally:
            await client.close()
            await cluster.close()

    asyncio.run(main())


def test_a_new_leader_knows_the_idempotent_producers_it_replicated(tmp_path):
    """A producer that lost its leader sends its unanswered batch again to the new one, which
    replicated it already: answered with the offsets it has, not appended twice (promoted, the
    follower learnt the producer's sequence numbers from its log)."""
    producer_id = 1 << 62

    def batch(seq: int, value: bytes) -> bytes:
        return encode_batch([(1, None, value, ())], producer_id=producer_id, producer_epoch=0,
                            base_sequence=seq)

    async def send(link: BrokerLink, payload: bytes) -> Produced:
        return await asyncio.wait_for(link.request(
            ProduceRequest(session=link.session, topic="t", partition=0),
            payload=[payload]), 30)

    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(leader=1, epoch=1)
        try:
            link = await producer(cluster.addresses[0])
            assert (await send(link, batch(0, b"a"))).base_offset == 0
            assert (await send(link, batch(1, b"b"))).base_offset == 1
            # Broker 1 is deposed: broker 2, which fetched both, leads at epoch 2.
            await cluster.set_roles(leader=2, epoch=2, isr=(2, 3))
            link2 = await producer(cluster.addresses[1])
            again = await send(link2, batch(1, b"b"))
            assert (again.base_offset, again.next_offset) == (1, 2)
            assert (await send(link2, batch(2, b"c"))).base_offset == 2
            values = [r.value for b in iter_batches(cluster.log(2).read(0, 1 << 20))
                      for r in b.records]
            assert values == [b"a", b"b", b"c"]
            await link.close(clean=False)
            await link2.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_replica_fetch_naming_a_replica_its_principal_does_not_hold_is_refused(tmp_path):
    """The replica id in a fetch is checked against who signs it (`may_replicate(principal,
    replica)`): a broker of the cluster that names another replica is refused, and its fetch
    moves nothing (before, any cluster broker could claim to be any follower and so raise the
    high watermark over records that follower never had)."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        leader = cluster.servers[0]
        # The admin's secret signs here: say it holds broker 2 only.
        leader.replication.may_replicate = lambda principal, replica: replica == 2
        client = RpcClient(cluster.addresses[0], SECRET, audience=BROKER, timeout=30)
        try:
            await client.connect()
            with pytest.raises(PrincipalError):
                await client.exchange(ReplicaFetchRequest(
                    "t", 0, fetch_offset=0, leader_epoch=1, replica=3, max_wait_ms=0))
            with pytest.raises(PrincipalError):
                await client.request(EpochEndRequest("t", 0, 1, 3))
            reply, _frames = await client.exchange(ReplicaFetchRequest(
                "t", 0, fetch_offset=0, leader_epoch=1, replica=2, max_wait_ms=0))
            assert reply.high_watermark == 0
        finally:
            await client.close()
            await cluster.close()

    asyncio.run(main())


def test_a_leader_drained_out_of_the_replicas_fails_its_waits_and_fetches_from_nobody(tmp_path):
    """A broker decommissioned while up (DESIGN §5 "Decommissioning a broker") is told a role
    that does not name it: a produce waiting for its high watermark fails as on a deposed
    leader, and it does not fetch from the new leader (which would refuse it forever)."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(leader=1, epoch=1)
        try:
            link = await producer(cluster.addresses[0])
            await asyncio.wait_for(produce(link, b"a"), 30)
            for server in cluster.servers[1:]:
                server.replication.hold(True)
            unacked = produce(link, b"b, never acknowledged")
            await wait_for_async(lambda: cluster.log(1).log_end_offset == 2, timeout=30,
                                 what="the leader appended b")
            # Broker 3 still catching up (out of the ISR): broker 1 keeps its copy meanwhile.
            drained = PartitionRole(topic_id=1, partition=0, leader_id=2, leader_epoch=2,
                                    replicas=(2, 3), isr=(2,),
                                    leader_address=cluster.addresses[1])
            await cluster.servers[0].replication.set_role("t", 0, drained, broker_id=1)
            with pytest.raises(TqError) as raised:
                await asyncio.wait_for(unacked, 30)
            assert raised.value.kafka_error_code == 6
            assert all(PID not in f.partitions
                       for f in cluster.servers[0].replication._fetchers.values())
            await link.close(clean=False)
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_broker_drained_out_of_the_replicas_drops_its_copy_once_they_are_in_sync(tmp_path):
    """Its copy is needed while a replica that took its place catches up; once every replica
    the catalog names is in sync, the drained broker deletes its files (told again, it does not
    make the partition anew)."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(leader=1, epoch=1)
        try:
            link, _ = await produce_replicated(cluster, 3)
            await link.close(clean=False)
            drained = cluster.servers[2]  # broker 3: replaced by broker 4 (not running here)
            directory = Path(drained.data_dir) / "t-0"
            assert directory.is_dir()
            catching_up = PartitionRole(topic_id=1, partition=0, leader_id=1, leader_epoch=1,
                                        replicas=(1, 2, 4), isr=(1, 2),
                                        leader_address=cluster.addresses[0])
            await drained.replication.set_role("t", 0, catching_up, broker_id=3)
            assert PID in drained.state.partitions and directory.is_dir()  # still needed
            in_sync = PartitionRole(topic_id=1, partition=0, leader_id=1, leader_epoch=1,
                                    replicas=(1, 2, 4), isr=(1, 2, 4),
                                    leader_address=cluster.addresses[0])
            await drained.replication.set_role("t", 0, in_sync, broker_id=3)
            assert PID not in drained.state.partitions and not directory.exists()
            await drained.replication.set_role("t", 0, in_sync, broker_id=3)
            assert PID not in drained.state.partitions and not directory.exists()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_follower_promoted_while_it_appends_reopens_its_log_once_the_append_is_done(
        tmp_path):
    """The catalog promotes a follower whose fetcher is writing its log on the pool at that
    moment: the promotion (which closes the log and opens it again, to learn what the
    appended batches say) waits for the append instead of closing the log under it (before:
    it was reopened without the batch the pool went on writing into the old one; or, under
    load, LogLockedError while the old one was still held)."""
    import threading

    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            log = cluster.log(2)
            entered, release = threading.Event(), threading.Event()
            append = log.append_replica

            def slow_append(data: bytes) -> object:
                entered.set()
                release.wait(60)
                return append(data)

            log.append_replica = slow_append  # type: ignore[method-assign]
            link = await producer(cluster.addresses[0])
            acked = produce(link, b"v")
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, entered.wait, 30)
            promote = asyncio.ensure_future(
                cluster.set_roles_on((2,), leader=2, epoch=2, isr=(1, 2, 3)))
            for _ in range(20):  # the promotion gets as far as it can without the append
                await asyncio.sleep(0)
            assert not promote.done()
            release.set()
            await asyncio.wait_for(promote, 30)
            assert cluster.log(2).log_end_offset == 1  # appended, then reopened with it
            acked.cancel()
            await link.close()
        finally:
            release.set()
            await cluster.close()

    asyncio.run(main())


def test_a_follower_stopped_and_started_knows_the_transactions_it_replicated(tmp_path):
    """A follower appends its leader's batches without judging them, so its core knows
    nothing of the transactions in them. Stopped cleanly, it must not keep that ignorance as
    its transaction history (`_txn_index`) through the offsets it replicated: started again,
    it would walk only the log after them and serve an aborted transaction's records as
    committed once it leads (or to a reader of it)."""
    from querylib.records import transaction_marker_batch

    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = await producer(cluster.addresses[0])
            txn = encode_batch([(0, None, b"aborted", ())], producer_id=7, producer_epoch=3,
                               base_sequence=0, is_transactional=True)
            for batch in (txn, transaction_marker_batch(7, 3, False, timestamp=0),
                          encode_batch([(1, None, b"after", ())])):
                await asyncio.wait_for(link.request(
                    ProduceRequest(session=link.session, topic="t", partition=0),
                    payload=[batch]), 30)
            await link.close()
            for follower in (2, 3):
                await wait_for_async(
                    lambda f=follower: cluster.servers[f - 1].state.partitions[PID]
                    .visible_end == 3,
                    timeout=30, what="the follower's high watermark to reach the end")
        finally:
            await cluster.close()
        assert await _aborted_after_restart(tmp_path / "b2") == [(7, 0)]

    asyncio.run(main())


async def _aborted_after_restart(data_dir) -> list[tuple[int, int]]:
    """The aborted transactions of t-0's first 3 offsets, as a broker started again on
    `data_dir` (after its cluster closed) reports them."""
    restarted = BrokerServer(data_dir, SECRET, log_config=LogConfig())
    await restarted.start(None)
    try:
        pid = await restarted.port.ensure("t", 0, create=False)
        return restarted.port.aborted_transactions(pid, 0, 3)
    finally:
        await restarted.close()


def test_a_truncated_replica_forgets_the_transaction_history_of_the_tail_it_dropped(tmp_path):
    """Broker 1 led, appended a transaction and its abort that nobody acknowledged, and was
    restarted: its opening kept the history "producer 7 aborted at 0" through offset 2. Its
    successor committed producer 7's transaction there instead; broker 1, a follower now,
    truncates to 0 and takes the leader's log. The history must go with the tail it
    describes: kept, a restart would trust it (it names offsets the log still has) and hide
    the committed records as aborted."""
    from querylib.records import transaction_marker_batch

    def txn(value: bytes) -> bytes:
        return encode_batch([(0, None, value, ())], producer_id=7, producer_epoch=3,
                            base_sequence=0, is_transactional=True)

    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(leader=1, epoch=1)
        try:
            for server in cluster.servers[1:]:
                server.replication.hold(True)
            link = await producer(cluster.addresses[0])
            unacked = [asyncio.ensure_future(link.request(  # the followers hold: never acked
                ProduceRequest(session=link.session, topic="t", partition=0), payload=[batch]))
                for batch in (txn(b"tail"), transaction_marker_batch(7, 3, False, timestamp=0))]
            await wait_for_async(lambda: cluster.log(1).log_end_offset == 2, timeout=30,
                                 what="the leader appended the tail")
            await link.close(clean=False)
            await cluster.servers[0].close()
            await asyncio.gather(*unacked, return_exceptions=True)
            cluster.servers[0] = BrokerServer(tmp_path / "b1", SECRET,
                                              log_config=LogConfig(flush="always"))
            cluster.addresses[0] = await cluster.servers[0].start()
            for server in cluster.servers[1:]:
                server.replication.hold(False)
            await cluster.set_roles(leader=2, epoch=2, isr=(2, 3))
            link2 = await producer(cluster.addresses[1])
            for batch in (txn(b"committed"), transaction_marker_batch(7, 3, True, timestamp=0),
                          encode_batch([(1, None, b"after", ())])):
                await asyncio.wait_for(link2.request(
                    ProduceRequest(session=link2.session, topic="t", partition=0),
                    payload=[batch]), 30)
            await link2.close()
            data = cluster.log(2).read(0, 1 << 20)
            await wait_for_async(lambda: _stored(cluster, 1) == data, timeout=30,
                                 what="broker 1 converged on the leader's log")
        finally:
            await cluster.close()
        assert await _aborted_after_restart(tmp_path / "b1") == []

    asyncio.run(main())


TXN_PRODUCER = 1 << 62 | 777


async def cut_a_transaction(cluster: Cluster) -> None:
    """Broker 2 opens its partition holding a transaction's first record (producer
    TXN_PRODUCER at offset 2, never ended): promoted at epoch 2, it keeps the transaction
    history beside its log through offset 3 with that transaction open. Broker 3, which
    never had the record, leads at epoch 3 and appends other records at 2, 3 and 4; broker 2,
    its follower, truncates to 2 (the transaction's record goes) and fetches them, so its log
    (the leader's, byte for byte) holds no transaction at all and ends past the history's."""
    await cluster.start(leader=1, epoch=1)
    link, _ = await produce_replicated(cluster, 2)                       # offsets 0, 1
    cluster.servers[2].replication.hold(True)                           # broker 3 lags
    txn = asyncio.ensure_future(link.request(
        ProduceRequest(session=link.session, topic="t", partition=0),
        payload=[encode_batch([(1, None, b"cut", ())], producer_id=TXN_PRODUCER,
                              producer_epoch=0, base_sequence=0, is_transactional=True)]))
    await wait_for_async(lambda: cluster.log(2).log_end_offset == 3, timeout=30,
                         what="follower 2 fetched the transaction's record")
    await cluster.set_roles_on((1, 2), leader=2, epoch=2, isr=(1, 2))
    assert cluster.servers[1].state.partitions[PID].open_txns == {TXN_PRODUCER: 2}
    with pytest.raises(TqError):
        await asyncio.wait_for(txn, 30)  # its leader was deposed before acknowledging it
    await link.close(clean=False)
    await cluster.set_roles_on((3, 1, 2), leader=3, epoch=3, isr=(3,))
    link3 = await producer(cluster.addresses[2])
    for value in (b"c", b"d", b"e"):
        await asyncio.wait_for(produce(link3, value), 30)
    await link3.close()
    data = cluster.log(3).read(0, 1 << 20)
    await wait_for_async(lambda: _stored(cluster, 2) == data, timeout=30,
                         what="broker 2 truncated and converged on the leader's log")
    assert cluster.log(2).log_end_offset == 5


def test_a_promoted_follower_forgets_a_transaction_its_truncation_cut(tmp_path):
    """The history broker 2 kept (through 3, the transaction open at 2) describes a log it no
    longer has, though its log now ends past 3: promoted again, it knows no open
    transaction, and its last stable offset (what read_committed readers read up to) is its
    high watermark, not 2 for good (before: the history was trusted, the cut transaction
    stayed open, and nothing from offset 2 on was ever read as committed)."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        try:
            await cut_a_transaction(cluster)
            await cluster.set_roles(leader=2, epoch=4, isr=(2, 3))
            state = cluster.servers[1].state
            assert state.partitions[PID].open_txns == {}
            await wait_for_async(lambda: state.partition_info(PID).high_watermark == 5,
                                 timeout=30, what="the new leader's high watermark")
            assert state.partition_info(PID).log_end == 5  # the last stable offset
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_restarted_follower_forgets_a_transaction_its_truncation_cut(tmp_path):
    """Broker 2's files as a crash leaves them after the truncation, and after a clean close:
    opened again, neither knows the cut transaction (before: a crash left the history through
    3 with the transaction open, trusted since the log ends past 3; a clean close kept the
    follower's transactions as it last learnt them, the cut one open, through its high
    watermark)."""
    import shutil

    from querylib.server.broker._disk import open_partition, partition_path

    async def main() -> None:
        cluster = Cluster(tmp_path)
        try:
            await cut_a_transaction(cluster)
            # What a crash leaves: the files as they are now (the follower waits at its
            # leader's log end, writing nothing).
            shutil.copytree(partition_path(str(tmp_path / "b2"), PID),
                            partition_path(str(tmp_path / "crashed"), PID))
            opened = open_partition(str(tmp_path / "crashed"), PID, LogConfig())
            opened.log.close()
            assert opened.log.log_end_offset == 5
            assert opened.transactions == ((), (), ())
            await cluster.servers[1].close()
            cluster.servers[1] = BrokerServer(tmp_path / "b2", SECRET,
                                              log_config=LogConfig(flush="always"))
            await cluster.servers[1].start()
            state = cluster.servers[1].state
            assert state.partitions[PID].open_txns == {}
            assert state.partition_info(PID).log_end == 5
        finally:
            await cluster.close()

    asyncio.run(main())
