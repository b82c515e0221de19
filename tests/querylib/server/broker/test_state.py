"""BrokerState, the broker's pure core: sessions, produce credit, acks, frontiers, delivery."""

from __future__ import annotations

import pytest

from catalog.errors import ProtocolError
from querylib.broker._errors import (
    BatchTooLargeError,
    CreditExceededError,
    NotProducerError,
    UnknownBrokerSessionError,
    UnknownPartitionError,
)
from querylib.broker.messages import Done, Produced, SessionOpened, Subscribed
from querylib.errors import InvalidLengthError, OffsetOutOfRangeError, RecordError, StorageError
from querylib.server.broker._events import (
    AdvanceFrontier,
    Append,
    AppendFailed,
    CloseSession,
    Deliver,
    DropSubscription,
    EndStream,
    Fail,
    GrantCredit,
    Heartbeat,
    OpenProducer,
    OpenSession,
    Produce,
    Read,
    ReadFailed,
    Reply,
    SessionExpired,
    Subscribe,
    SubscriptionClosed,
    Tick,
    Unsubscribe,
)
from querylib.server.broker._state import BrokerLimits

from ._sim import Sim, control_of, fake_batch

P = ("t", 0)


def started(limits: BrokerLimits | None = None, *, auto_durable: bool = True) -> Sim:
    sim = Sim(limits, auto_durable=auto_durable)
    sim.open_partition(P)
    sim.feed(OpenSession("o-p", "p", 10.0))
    sim.feed(OpenProducer("op-p", "p", P))
    return sim


def produce(sim: Sim, token: str, size: int = 100, session: str = "p") -> None:
    sim.feed(Produce(token, session, P, fake_batch(1, b"x" * size)))


def test_open_session_clamps_the_lease_and_reports_limits():
    sim = Sim(BrokerLimits(max_lease=30.0))
    sim.feed(OpenSession("t1", "a", 1000.0))
    reply = sim.replies["t1"]
    assert isinstance(reply, SessionOpened) and reply.lease == 30.0


def test_requests_of_an_unknown_session_fail_retriably():
    sim = Sim()
    sim.open_partition(P)
    for stim in [Heartbeat("h", "ghost"), CloseSession("c", "ghost"),
                 OpenProducer("o", "ghost", P), Produce("pr", "ghost", P, fake_batch()),
                 AdvanceFrontier("a", "ghost", P, 1), EndStream("e", "ghost", P),
                 Subscribe("s", "ghost", 1, P, "earliest", 100), Unsubscribe("u", "ghost", 1)]:
        sim.feed(stim)
        error = sim.replies[stim.token]
        assert isinstance(error, UnknownBrokerSessionError) and error.retriable


def test_produce_is_acknowledged_with_its_offset_once_durable():
    sim = started(auto_durable=False)
    produce(sim, "a")
    produce(sim, "b")
    sim.complete_append(P)
    sim.complete_append(P)
    assert "a" not in sim.replies  # appended, not yet durable
    sim.flush(P)
    assert sim.replies["a"] == Produced(base_offset=0, next_offset=1)
    assert sim.replies["b"] == Produced(base_offset=1, next_offset=2)


def test_producer_window_pushes_back_and_acks_return_credit():
    sim = started(BrokerLimits(producer_window=250), auto_durable=False)
    produce(sim, "a", 100)
    produce(sim, "b", 100)
    produce(sim, "c", 100)  # window still positive before this one: allowed to overshoot
    produce(sim, "d", 100)
    assert isinstance(sim.replies["d"], CreditExceededError)
    for _ in range(3):
        sim.complete_append(P)
    sim.flush(P)
    produce(sim, "e", 100)
    assert "e" not in sim.replies and len(sim.appends[P]) == 1


def test_produce_checks_role_partition_and_batch():
    sim = started()
    sim.feed(OpenSession("o-q", "q", 10.0))
    produce(sim, "not-producer", session="q")
    assert isinstance(sim.replies["not-producer"], NotProducerError)
    sim.feed(Produce("no-part", "p", ("t", 9), fake_batch()))
    assert isinstance(sim.replies["no-part"], UnknownPartitionError)
    sim.feed(Produce("control", "p", P, fake_batch(control=True)))
    assert isinstance(sim.replies["control"], ProtocolError)
    sim.feed(Produce("two", "p", P, fake_batch() + fake_batch()))
    assert isinstance(sim.replies["two"], InvalidLengthError)
    sim.feed(Produce("junk", "p", P, b"\x00" * 10))
    assert isinstance(sim.replies["junk"], RecordError)
    sim.feed(Produce("big", "p", P, fake_batch(1, b"x" * (9 << 20))))
    assert isinstance(sim.replies["big"], BatchTooLargeError)
    assert sim.replies["big"].kafka_error_code == 10  # MESSAGE_TOO_LARGE
    assert not sim.appends[P]


def test_failed_append_fails_the_request_and_refunds_the_window():
    sim = started(BrokerLimits(producer_window=150))
    produce(sim, "a", 100)
    (instr,) = sim.appends[P]
    sim.appends[P].clear()
    sim.feed(AppendFailed(P, instr.ticket, OSError("disk on fire")))
    assert isinstance(sim.replies["a"], StorageError)
    produce(sim, "b", 100)
    assert "b" not in sim.replies and sim.appends[P]


def test_frontier_is_the_minimum_over_producers_and_written_as_controls():
    sim = started()
    sim.feed(OpenSession("o-q", "q", 10.0))
    sim.feed(OpenProducer("op-q", "q", P))
    sim.feed(AdvanceFrontier("a1", "p", P, 5))
    assert sim.replies["a1"] == Done() and not sim.appends[P]  # q still at 0
    sim.feed(AdvanceFrontier("a2", "q", P, 3))
    sim.complete_append(P)
    assert sim.replies["a2"] == Done()
    sim.feed(EndStream("e1", "q", P))
    sim.complete_append(P)
    sim.feed(EndStream("e2", "p", P))
    sim.complete_append(P)
    assert [control_of(s) for _, _, s in sim.logs[P]] == [("F", 3), ("F", 5), ("E", None)]
    sim.feed(AdvanceFrontier("late", "p", P, 9))
    assert isinstance(sim.replies["late"], NotProducerError)


def test_expired_producer_stops_holding_the_frontier_back():
    sim = started()
    sim.feed(OpenSession("o-q", "q", 5.0))
    sim.feed(OpenProducer("op-q", "q", P))
    sim.feed(AdvanceFrontier("a1", "p", P, 7))
    sim.feed(Tick(3.0))
    sim.feed(Heartbeat("hb", "p"))
    out = sim.feed(Tick(6.0))
    assert SessionExpired("q") in out
    sim.complete_append(P)
    assert [control_of(s) for _, _, s in sim.logs[P]] == [("F", 7)]
    assert "p" in sim.state.sessions


def test_subscriber_catches_up_from_disk_then_tails_from_memory():
    sim = started()
    for i in range(3):
        produce(sim, f"a{i}")
        sim.complete_append(P)
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 10_000)
    out = sim.feed(Subscribe("sub", "s", 1, P, "earliest", 10_000))
    assert sim.replies["sub"] == Subscribed(offset=0, log_start=0, log_end=3, frontier=None,
                                            ended=False)
    (read,) = [i for i in out if isinstance(i, Read)]
    sim.complete_read(read.serial)
    assert sim.subs[("s", 1)].next_offset == 3 and not sim.reads
    produce(sim, "a3")
    out = sim.complete_append(P)
    (d,) = [i for i in out if isinstance(i, Deliver)]
    assert (d.offset, d.next_offset) == (3, 4) and d.data == sim.logs[P][3][2]


def test_credit_stops_delivery_and_a_grant_resumes_it_from_disk():
    sim = started()
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 1)
    sim.feed(Subscribe("sub", "s", 1, P, "latest", 1))
    for i in range(3):
        produce(sim, f"a{i}", 100)
        sim.complete_append(P)
    assert sim.subs[("s", 1)].batches == [(0, 1)]  # one batch of overshoot, then nothing
    sim.subs[("s", 1)].granted += 10_000
    out = sim.feed(GrantCredit("s", 1, 10_000))
    (read,) = [i for i in out if isinstance(i, Read)]
    sim.complete_read(read.serial)
    assert sim.subs[("s", 1)].batches == [(0, 1), (1, 2), (2, 3)]


def test_subscribe_offsets_out_of_range_and_latest_reports_the_frontier():
    sim = started()
    sim.feed(AdvanceFrontier("a", "p", P, 4))
    sim.complete_append(P)
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.feed(Subscribe("too-far", "s", 1, P, 5, 100))
    assert isinstance(sim.replies["too-far"], OffsetOutOfRangeError)
    sim.feed(Subscribe("neg", "s", 1, P, -1, 100))
    assert isinstance(sim.replies["neg"], OffsetOutOfRangeError)
    sim.feed(Subscribe("latest", "s", 1, P, "latest", 100))
    assert sim.replies["latest"] == Subscribed(offset=1, log_start=0, log_end=1, frontier=4,
                                               ended=False)
    sim.feed(Subscribe("dup", "s", 1, P, "latest", 100))
    assert isinstance(sim.replies["dup"], ProtocolError)


def test_bad_grants_close_the_subscription_and_stale_grants_are_counted():
    sim = started()
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 10)
    sim.feed(Subscribe("sub", "s", 1, P, "latest", 10))
    out = sim.feed(GrantCredit("s", 1, -5))
    assert [type(i) for i in out] == [SubscriptionClosed]
    assert sim.feed(GrantCredit("s", 1, 5)) == []
    assert sim.feed(GrantCredit("nobody", 1, 5)) == []
    assert sim.state.counters["stale_grants"] == 2
    sim.track("s", 2, 10)
    sim.feed(Subscribe("sub2", "s", 2, P, "latest", 10))
    out = sim.feed(GrantCredit("s", 2, sim.state.limits.max_credit))
    assert isinstance(out[0], SubscriptionClosed)
    assert isinstance(out[0].error, CreditExceededError)


def test_read_results_for_a_removed_subscription_are_ignored():
    sim = started()
    produce(sim, "a")
    sim.complete_append(P)
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 100)
    out = sim.feed(Subscribe("sub", "s", 1, P, "earliest", 100))
    (read,) = [i for i in out if isinstance(i, Read)]
    sim.feed(Unsubscribe("u", "s", 1))
    assert sim.complete_read(read.serial) == []
    assert sim.state.counters["stale_reads"] == 1


def test_read_failure_closes_the_subscription_with_the_error():
    sim = started()
    produce(sim, "a")
    sim.complete_append(P)
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 100)
    out = sim.feed(Subscribe("sub", "s", 1, P, "earliest", 100))
    (read,) = [i for i in out if isinstance(i, Read)]
    out = sim.feed(ReadFailed(read.serial, 0, OffsetOutOfRangeError("gone")))
    assert isinstance(out[0], SubscriptionClosed)
    assert isinstance(out[0].error, OffsetOutOfRangeError)


def test_a_failed_delivery_ends_the_subscription_once():
    sim = started()
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 10_000)
    sim.feed(Subscribe("sub", "s", 1, P, "latest", 10_000))
    out = sim.feed(DropSubscription("s", 1, OSError("peer gone")))
    assert [type(i) for i in out] == [SubscriptionClosed]
    assert isinstance(out[0].error, ProtocolError)
    assert sim.feed(DropSubscription("s", 1, OSError("again"))) == []
    produce(sim, "a")
    assert not [i for i in sim.complete_append(P) if isinstance(i, Deliver)]


def test_closing_a_session_ends_its_subscriptions_and_producers():
    sim = started()
    sim.feed(OpenSession("o-s", "s", 10.0))
    sim.track("s", 1, 100)
    sim.feed(Subscribe("sub", "s", 1, P, "latest", 100))
    out = sim.feed(CloseSession("c", "p"))
    assert Reply("c", Done()) in out and SessionExpired("p") in out
    sim.feed(CloseSession("c2", "s"))
    assert sim.state.statistics()["subscriptions"] == 0


def test_unknown_stimulus_is_a_bug_not_a_no_op():
    with pytest.raises(TypeError):
        Sim().feed(object())


def test_out_of_order_append_completion_is_a_shell_bug():
    from querylib.server.broker._events import AppendCompleted

    sim = started()
    produce(sim, "a")
    produce(sim, "b")
    second: Append = sim.appends[P][1]
    with pytest.raises(RuntimeError):
        sim.feed(AppendCompleted(P, second.ticket, 0, 1, 0, 1))


def test_fail_never_leaves_partial_effects():
    sim = started(BrokerLimits(producer_window=100))
    produce(sim, "a", 200)
    sim.feed(AdvanceFrontier("adv", "p", P, 5))
    assert isinstance(sim.replies["adv"], CreditExceededError)
    sim.complete_append(P)
    assert sim.state.partitions[P].frontier.producers["p"] == 0
    assert all(not isinstance(v, Fail) for v in sim.replies.values())


def test_a_written_produce_is_answered_before_the_fsync_and_a_durable_one_after():
    """A produce marked `written` is answered once its append completes (its Append asks for
    no fsync); a durable produce after it waits for the flush, which makes both durable; the
    written one is shown to subscribers only then, and answered once."""
    sim = started(auto_durable=False)
    sim.track("p", 1, 1 << 20)  # the sim checks every delivery is durable
    sim.feed(Subscribe("sub", "p", 1, P, "earliest", 1 << 20))
    sim.feed(Produce("w", "p", P, fake_batch(1, b"w"), written=True))
    sim.feed(Produce("d", "p", P, fake_batch(1, b"d")))
    assert [a.sync for a in sim.appends[P]] == [False, True]
    sim.complete_append(P)
    assert sim.replies["w"] == Produced(base_offset=0, next_offset=1)  # before any fsync
    assert sim.state.partitions[P].visible_end == 0  # not shown: not durable
    sim.complete_append(P)
    assert "d" not in sim.replies  # durable only: waits for the fsync
    replies = len(sim.replies)
    sim.flush(P)  # the durable one's fsync covers the file: both durable
    assert sim.replies["d"] == Produced(base_offset=1, next_offset=2)
    assert len(sim.replies) == replies + 1  # "w" is not answered again
    assert sim.state.partitions[P].visible_end == 2


def test_a_written_produce_returns_its_window_when_answered():
    # Each batch costs about 170 bytes: two fit only if the first's cost came back.
    sim = started(BrokerLimits(producer_window=250), auto_durable=False)
    sim.feed(Produce("w", "p", P, fake_batch(1, b"x" * 100), written=True))
    sim.complete_append(P)
    assert isinstance(sim.replies["w"], Produced)
    produce(sim, "b", 100)  # the window is whole again although nothing is durable yet
    produce(sim, "c", 100)
    assert "b" not in sim.replies and "c" not in sim.replies and len(sim.appends[P]) == 2
