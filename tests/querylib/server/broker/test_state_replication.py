"""BrokerState on a replicated partition (DESIGN §5 "Replication"): the high watermark gates
acks and subscriber visibility after durability; a follower refuses producers and readers;
min.insync.replicas; followers' fetches fenced by epoch and membership; ISR proposals."""

from __future__ import annotations

from querylib.broker._errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)
from querylib.broker.messages import Produced, Subscribed
from querylib.records import encode_batch
from querylib.server.broker._events import (
    Deliver,
    OpenProducer,
    OpenSession,
    Produce,
    ProposeIsr,
    ReplicaFetched,
    SetReplicaRole,
    Subscribe,
    Tick,
)
from querylib.server.broker._replication import PartitionRole
from querylib.server.broker._state import HELD_BATCHES, BrokerLimits

from ._sim import Sim, fake_batch

P = ("t", 0)


def role(leader: int = 1, epoch: int = 2, isr=(1, 2, 3)) -> PartitionRole:
    return PartitionRole(topic_id=1, partition=0, leader_id=leader, leader_epoch=epoch,
                         replicas=(1, 2, 3), isr=tuple(isr))


def leading(isr=(1, 2, 3), min_insync: int = 1, limits: BrokerLimits | None = None) -> Sim:
    sim = Sim(limits)
    sim.open_partition(P)
    sim.feed(SetReplicaRole(P, role(isr=isr), broker_id=1, min_insync=min_insync))
    sim.feed(OpenSession("o-p", "p", 10.0))
    sim.feed(OpenProducer("op-p", "p", P))
    return sim


def test_a_produce_is_answered_once_every_in_sync_replica_fetched_it():
    sim = leading()
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    sim.complete_append(P)
    assert "a" not in sim.replies  # durable on the leader only
    sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=1, leader_epoch=2))
    assert sim.replies["f2"].high_watermark == 0 and "a" not in sim.replies  # as it was
    sim.feed(ReplicaFetched("f3", P, replica=3, fetch_offset=1, leader_epoch=2))
    assert sim.replies["a"] == Produced(base_offset=0, next_offset=1)
    assert sim.state.partition_info(P).high_watermark == 1


def test_a_subscriber_sees_nothing_above_the_high_watermark():
    sim = leading(isr=(1, 2))
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 10_000)
    sim.feed(Subscribe("sub", "s", 1, P, "earliest", 10_000))
    assert isinstance(sim.replies["sub"], Subscribed)
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    out = sim.complete_append(P)
    assert not [i for i in out if isinstance(i, Deliver)]
    out = sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=1, leader_epoch=2))
    delivered = [i for i in out if isinstance(i, Deliver)]
    assert delivered
    # The bytes as the leader's log stores them: its leader epoch stamped, as on disk.
    assert int.from_bytes(delivered[0].data[12:16], "big") == 2


def test_a_follower_refuses_producers_and_readers():
    sim = Sim()
    sim.open_partition(P)
    sim.feed(SetReplicaRole(P, role(), broker_id=2))
    sim.feed(OpenSession("o-p", "p", 10.0))
    sim.feed(OpenProducer("op-p", "p", P))
    assert isinstance(sim.replies["op-p"], NotLeaderOrFollowerError)
    sim.feed(Subscribe("sub", "p", 1, P, "earliest", 10_000))
    assert isinstance(sim.replies["sub"], NotLeaderOrFollowerError)


def test_a_producer_opened_before_the_leader_lost_its_role_is_refused():
    sim = leading()
    sim.feed(SetReplicaRole(P, role(leader=2, epoch=3), broker_id=1))
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    assert isinstance(sim.replies["a"], NotLeaderOrFollowerError)
    assert not sim.appends[P]


def test_min_insync_replicas_refuses_a_produce_and_appends_nothing():
    sim = leading(isr=(1,), min_insync=2)
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    assert isinstance(sim.replies["a"], NotEnoughReplicasError)
    assert not sim.appends[P]


def test_replica_fetches_are_fenced_by_epoch_and_membership():
    sim = leading()
    sim.feed(ReplicaFetched("old", P, replica=2, fetch_offset=0, leader_epoch=1))
    assert isinstance(sim.replies["old"], FencedLeaderEpochError)
    sim.feed(ReplicaFetched("who", P, replica=7, fetch_offset=0, leader_epoch=2))
    assert isinstance(sim.replies["who"], NotLeaderOrFollowerError)
    plain = Sim()
    plain.open_partition(P)
    plain.feed(ReplicaFetched("none", P, replica=2, fetch_offset=0, leader_epoch=2))
    assert isinstance(plain.replies["none"], NotLeaderOrFollowerError)


def test_a_lagging_follower_is_proposed_out_and_back_in():
    sim = leading(limits=BrokerLimits(replica_lag_time_max=5.0))
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    sim.complete_append(P)
    sim.feed(Tick(1.0, 1000))
    sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=1, leader_epoch=2))
    out = sim.feed(Tick(4.0, 4000))
    assert not [i for i in out if isinstance(i, ProposeIsr)]
    out = sim.feed(Tick(6.0, 6000))
    assert [i.isr for i in out if isinstance(i, ProposeIsr)] == [(1, 2)]
    assert sim.replies.get("a") is None  # the ISR changes only with the new role
    sim.feed(SetReplicaRole(P, role(isr=(1, 2)), broker_id=1))
    assert sim.replies["a"] == Produced(base_offset=0, next_offset=1)
    sim.feed(Tick(7.0, 7000))
    sim.feed(ReplicaFetched("f2b", P, replica=2, fetch_offset=1, leader_epoch=2))
    sim.feed(ReplicaFetched("f3", P, replica=3, fetch_offset=1, leader_epoch=2))
    out = sim.feed(Tick(7.5, 7500))
    assert [i.isr for i in out if isinstance(i, ProposeIsr)] == [(1, 2, 3)]


def test_a_deposed_leader_fails_the_produces_still_waiting_for_the_high_watermark():
    sim = leading()
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    sim.complete_append(P)
    sim.feed(Produce("b", "p", P, fake_batch(1, b"y")))  # still in flight
    sim.feed(SetReplicaRole(P, role(leader=2, epoch=3), broker_id=1))
    assert isinstance(sim.replies["a"], NotLeaderOrFollowerError)
    assert isinstance(sim.replies["b"], NotLeaderOrFollowerError)
    sim.complete_append(P)  # its append completes later: answered once only


def test_an_isr_proposal_no_role_answered_is_proposed_again():
    # Refused (the controller saw another ISR, a lost reply, a timeout): no new role comes, and
    # the follower must not stay out of the ISR for good.
    sim = leading(isr=(1, 2), limits=BrokerLimits(replica_lag_time_max=5.0))
    sim.feed(ReplicaFetched("f3", P, replica=3, fetch_offset=0, leader_epoch=2))
    out = sim.feed(Tick(1.0, 1000))
    assert [i.isr for i in out if isinstance(i, ProposeIsr)] == [(1, 2, 3)]
    out = sim.feed(Tick(1.5, 1500))
    assert not [i for i in out if isinstance(i, ProposeIsr)]  # not every tick
    out = sim.feed(Tick(3.5, 3500))
    assert [i.isr for i in out if isinstance(i, ProposeIsr)] == [(1, 2, 3)]
    sim.feed(SetReplicaRole(P, role(isr=(1, 2, 3)), broker_id=1))
    out = sim.feed(Tick(4.0, 4000))
    assert not [i for i in out if isinstance(i, ProposeIsr)]


def test_a_replica_fetch_of_recent_batches_is_answered_from_memory():
    # Batches above the high watermark are still held (unflushed): a follower's fetch gets
    # them as stored, its leader epoch stamped, without a read of the log.
    sim = leading()
    for token, value in (("a", b"x"), ("b", b"y"), ("c", b"z")):
        sim.feed(Produce(token, "p", P, fake_batch(1, value)))
        sim.complete_append(P)
    sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=0, leader_epoch=2))
    answer = sim.replies["f2"]
    assert answer.high_watermark == 0 and answer.batches is not None
    assert len(answer.batches) == 3
    assert all(int.from_bytes(b[12:16], "big") == 2 for b in answer.batches)
    assert [int.from_bytes(b[:8], "big") for b in answer.batches] == [0, 1, 2]
    # At most max_bytes, but at least one batch; from where the fetch asks.
    sim.feed(ReplicaFetched("f3", P, replica=3, fetch_offset=1, leader_epoch=2, max_bytes=1))
    assert sim.replies["f3"].batches == answer.batches[1:2]
    # Below what is still held (the high watermark passed it): read from the log.
    sim.feed(ReplicaFetched("f2b", P, replica=2, fetch_offset=2, leader_epoch=2))
    sim.feed(ReplicaFetched("f3b", P, replica=3, fetch_offset=3, leader_epoch=2))
    sim.feed(ReplicaFetched("f2c", P, replica=2, fetch_offset=0, leader_epoch=2))
    assert sim.replies["f2c"].high_watermark == 2 and sim.replies["f2c"].batches is None


def test_a_waiting_replica_fetch_is_answered_with_the_next_batch_from_memory():
    sim = leading()
    sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=0, leader_epoch=2, max_wait=0.5))
    assert "f2" not in sim.replies
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    sim.complete_append(P)
    answer = sim.replies["f2"]
    assert answer.high_watermark == 0 and len(answer.batches) == 1
    # Its wait over with nothing appended: answered with nothing.
    sim.feed(ReplicaFetched("f2b", P, replica=2, fetch_offset=1, leader_epoch=2, max_wait=0.5))
    sim.feed(Tick(1.0, 1000))
    assert sim.replies["f2b"].batches == ()


def test_a_waiting_replica_fetch_is_answered_once_with_a_whole_commit():
    # The lane appends a commit's batches with one write and reports them back to back: the
    # waiting fetches are answered after the last, with all of them, not with the first alone
    # (which would leave the rest to one more fetch each follower).
    sim = leading()
    sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=0, leader_epoch=2, max_wait=0.5))
    for n in range(3):
        sim.feed(Produce(f"p{n}", "p", P, fake_batch(1, b"x")))
    sim.complete_append(P, more=True)
    sim.complete_append(P, more=True)
    assert "f2" not in sim.replies
    sim.complete_append(P)
    answer = sim.replies["f2"]
    assert answer.high_watermark == 0 and len(answer.batches) == 3


def test_a_replica_fetch_from_memory_takes_at_most_held_batches():
    sim = leading()
    for n in range(HELD_BATCHES + 5):
        sim.feed(Produce(f"p{n}", "p", P, fake_batch(1, b"x")))
        sim.complete_append(P)
    sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=0, leader_epoch=2))
    assert len(sim.replies["f2"].batches) == HELD_BATCHES


def test_a_run_the_high_watermark_uncovers_goes_to_a_tailing_subscriber_as_one_delivery():
    # The followers' fetches move the high watermark several batches at a time: such a run
    # goes as one delivery (as a read of the log would), big batches included, each batch a
    # payload frame of its own: the very stored bytes the followers fetched (hashed once for
    # them, DigestCache), never joined into a copy that would need a hash of its own.
    sim = leading(isr=(1, 2))
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 4 * 1024 * 1024)
    sim.feed(Subscribe("sub", "s", 1, P, "earliest", 4 * 1024 * 1024))
    payloads = [bytes([n]) * 100_000 for n in range(3)]
    for n, payload in enumerate(payloads):
        sim.feed(Produce(f"p{n}", "p", P, fake_batch(1, payload)))
        sim.complete_append(P)
    sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=0, leader_epoch=2))
    fetched = sim.replies["f2"].batches
    out = sim.feed(ReplicaFetched("f2b", P, replica=2, fetch_offset=3, leader_epoch=2))
    delivered = [i for i in out if isinstance(i, Deliver)]
    assert [(d.offset, d.next_offset) for d in delivered] == [(0, 3)]
    frames = delivered[0].data
    assert isinstance(frames, tuple) and len(frames) == 3
    assert all(frame is batch for frame, batch in zip(frames, fetched, strict=True))
    assert [frame.count(p) for frame, p in zip(frames, payloads, strict=True)] == [1, 1, 1]


def test_a_tail_delivery_of_a_replicated_run_takes_at_most_held_batches_frames():
    # A frame a batch: a run stays within the RPC's max_frames, the rest in the next delivery.
    sim = leading(isr=(1, 2))
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 4 * 1024 * 1024)
    sim.feed(Subscribe("sub", "s", 1, P, "earliest", 4 * 1024 * 1024))
    count = HELD_BATCHES + 3
    for n in range(count):
        sim.feed(Produce(f"p{n}", "p", P, fake_batch(1, b"x")))
        sim.complete_append(P)
    out = sim.feed(ReplicaFetched("f2", P, replica=2, fetch_offset=count, leader_epoch=2))
    delivered = [i for i in out if isinstance(i, Deliver)]
    assert [(d.offset, d.next_offset) for d in delivered] == \
        [(0, HELD_BATCHES), (HELD_BATCHES, count)]
    assert [len(d.data) for d in delivered] == [HELD_BATCHES, 3]


def test_a_deposed_leader_leaves_the_transactions_it_knew_to_its_leader():
    """A transaction open when its leader was deposed is the new leader's to abort: the
    follower writes no ABORT marker of its own once it times out (a record its leader lacks,
    and perhaps of a transaction its truncation cut away); promoted, it learns the
    transactions again from its log (`_reopen`)."""
    sim = leading(isr=(1,))
    sim.feed(Produce("a", "p", P, encode_batch(
        [(0, None, b"x", ())], producer_id=7, producer_epoch=0, base_sequence=0,
        is_transactional=True)))
    sim.complete_append(P)
    assert sim.state.partitions[P].open_txns == {7: 0}
    sim.feed(SetReplicaRole(P, role(leader=2, epoch=3), broker_id=1))
    sim.feed(Tick(sim.state.now + sim.state.limits.max_transaction_seconds + 1))
    assert not sim.appends[P]
