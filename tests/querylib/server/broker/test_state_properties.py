"""Hypothesis over event sequences: whatever clients do and however I/O interleaves,
- deliveries per subscription are contiguous, byte-exact, durable, and within credit + 1 batch;
- every append is acknowledged exactly once, and only once durable;
- the frontier control records are monotone and never above a live producer's frontier;
- subscribers (however slow, stopped or misbehaving) change nothing a producer sees;
- memory held for appends stays within the producers' windows.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.errors import TqError
from querylib.broker.messages import Produced
from querylib.server.broker._events import (
    AdvanceFrontier,
    CloseSession,
    EndStream,
    GrantCredit,
    Heartbeat,
    OpenProducer,
    OpenSession,
    Produce,
    Subscribe,
    Tick,
    Unsubscribe,
)
from querylib.server.broker._state import BrokerLimits

from ._sim import Sim, control_of, fake_batch

PARTS = [("t", 0), ("t", 1)]
PRODUCERS = ["p0", "p1"]
SUBSCRIBERS = ["s0", "s1"]
LIMITS = BrokerLimits(producer_window=600, max_credit=2000, max_read_bytes=700,
                      min_lease=1.0, max_lease=10.0)

part = st.sampled_from(range(len(PARTS)))
producers = st.sampled_from(PRODUCERS)
subscribers = st.sampled_from(SUBSCRIBERS)
produce = st.tuples(st.just("produce"), producers, part, st.integers(0, 300), st.integers(1, 3))
complete = st.tuples(st.just("complete"), part)


def weighted(*pairs: tuple[st.SearchStrategy, int]) -> st.SearchStrategy:
    """Pick common operations more often than rare ones (session churn, time jumps)."""
    return st.sampled_from([s for s, w in pairs for _ in range(w)]).flatmap(lambda s: s)


producer_ops = weighted(
    (produce, 6), (complete, 6),
    (st.tuples(st.just("flush"), part), 2),
    (st.tuples(st.just("advance"), producers, part, st.integers(0, 3)), 2),
    (st.tuples(st.just("open"), producers, part), 1),
    (st.tuples(st.just("end"), producers, part), 1),
    (st.tuples(st.just("hb"), producers), 1),
    (st.tuples(st.just("reopen"), producers), 1),
    (st.tuples(st.just("close"), producers), 1),
    (st.tuples(st.just("tick"), st.floats(0.0, 2.0)), 1),
)
subscriber_ops = weighted(
    (st.tuples(st.just("read"), st.integers(0, 5)), 6),
    (st.tuples(st.just("grant"), subscribers, st.integers(1, 3),
               st.one_of(st.integers(1, 1500), st.integers(-10, 0))), 4),
    (st.tuples(st.just("subscribe"), subscribers, st.integers(1, 3), part,
               st.sampled_from(["earliest", "earliest", "latest", 0, 1, 2, 5]),
               st.integers(0, 1500)), 4),
    (st.tuples(st.just("unsub"), subscribers, st.integers(1, 3)), 1),
    (st.tuples(st.just("shb"), subscribers), 1),
    (st.tuples(st.just("sreopen"), subscribers), 1),
)
# Each op carries how much I/O completes after it (0..3): appends (3 also flushes) after a
# producer-side op, reads after a subscriber-side op. Without this, hypothesis rarely lines up
# produce, complete and flush by chance.
io = st.integers(0, 3)
any_ops = st.lists(st.tuples(st.one_of(producer_ops, subscriber_ops), io), min_size=5,
                   max_size=80)
only_producer_ops = st.lists(st.tuples(producer_ops, io), max_size=60)
SUB_KINDS = {"subscribe", "grant", "unsub", "read", "shb", "sreopen"}


def run(ops: list[tuple], auto_durable: bool,
        ids: list[int] | None = None) -> tuple[Sim, list[frozenset]]:
    """Drive a Sim through `ops`; return it and, after every producer-side op, the set of
    acknowledged request tokens (("op", id) with ids defaulting to the op's position)."""
    sim = Sim(LIMITS, auto_durable=auto_durable)
    for pid in PARTS:
        sim.open_partition(pid)
    for who in PRODUCERS + SUBSCRIBERS:
        sim.feed(OpenSession(("open", who), who, 5.0))
    for who, p in [("p0", 0), ("p1", 1), ("p0", 1)]:
        sim.feed(OpenProducer(("open", who, p), who, PARTS[p]))
    now = 0.0
    acked_after: list[frozenset] = []
    produced = sim.produced = {}
    for i, (op, io_steps) in zip(ids or range(len(ops)), ops, strict=True):
        kind = op[0]
        token = ("op", i)
        if kind == "open":
            sim.feed(OpenProducer(token, op[1], PARTS[op[2]]))
        elif kind == "produce":
            produced[token] = PARTS[op[2]]
            sim.feed(Produce(token, op[1], PARTS[op[2]], fake_batch(op[4], b"x" * op[3])))
        elif kind == "advance":
            session = sim.state.sessions.get(op[1])
            mine = session is not None and PARTS[op[2]] in session.producing
            current = (sim.state.partitions[PARTS[op[2]]].frontier.producers.get(op[1], 0)
                       if mine else 0)
            sim.feed(AdvanceFrontier(token, op[1], PARTS[op[2]], current + op[3]))
        elif kind == "end":
            sim.feed(EndStream(token, op[1], PARTS[op[2]]))
        elif kind in ("hb", "shb"):
            sim.feed(Heartbeat(token, op[1]))
        elif kind in ("reopen", "sreopen"):
            sim.feed(OpenSession(token, op[1], 5.0))
        elif kind == "close":
            sim.feed(CloseSession(token, op[1]))
        elif kind == "complete":
            sim.complete_append(PARTS[op[1]])
        elif kind == "flush":
            sim.flush(PARTS[op[1]])
        elif kind == "tick":
            now += op[1]
            sim.feed(Tick(now))
        elif kind == "subscribe":
            _, who, sub_id, p, start, credit = op
            out = sim.feed(Subscribe(token, who, sub_id, PARTS[p], start, credit))
            if not isinstance(sim.replies[token], TqError):
                sim.track(who, sub_id, credit)
            del out
        elif kind == "grant":
            _, who, sub_id, n = op
            track = sim.subs.get((who, sub_id))
            if track is not None and not track.closed and n > 0:
                session = sim.state.sessions.get(who)
                serial = session.subs.get(sub_id) if session else None
                sub = sim.state.subscriptions.by_serial.get(serial) if serial else None
                if sub is not None and sub.credit.available + n <= LIMITS.max_credit:
                    track.granted += n
            sim.feed(GrantCredit(who, sub_id, n))
        elif kind == "unsub":
            sim.feed(Unsubscribe(token, op[1], op[2]))
            if not isinstance(sim.replies[token], TqError):
                sim.subs[(op[1], op[2])].closed = True
        elif kind == "read":
            if sim.reads:
                serial = sorted(sim.reads)[op[1] % len(sim.reads)]
                sim.complete_read(serial)
        if kind in SUB_KINDS:
            for serial in sorted(sim.reads)[:io_steps]:
                sim.complete_read(serial)
        else:
            for pid in PARTS:
                for _ in range(io_steps):
                    sim.complete_append(pid)
                if io_steps == 3:
                    sim.flush(pid)
        if kind not in SUB_KINDS:
            acked_after.append(frozenset(t for t, v in sim.replies.items()
                                         if isinstance(v, Produced)))
        check_invariants(sim)
    return sim, acked_after


def check_invariants(sim: Sim) -> None:
    for pid in PARTS:
        controls = [control_of(s) for _, _, s in sim.logs[pid]]
        frontiers = [v for c in controls if c and c[0] == "F" for v in [c[1]]]
        assert frontiers == sorted(frontiers), "frontier records went backwards"
        assert len(set(frontiers)) == len(frontiers), "a frontier was written twice"
        live = sim.state.partitions[pid].frontier.producers
        if live and frontiers:
            assert frontiers[-1] <= min(live.values())
    # Appends are held only while in flight or not durable: within the producers' windows
    # (each may overshoot by one request) plus broker-made controls.
    pending = sim.state.statistics()["pending_bytes"]
    assert pending <= len(PRODUCERS) * (LIMITS.producer_window + 300 + 61 * 3) + 2000


def everything_acked(sim: Sim, produced: dict) -> None:
    """Finish all I/O; then every accepted produce is acknowledged with exactly the offsets
    its batch was stored at, and every stored data batch was acknowledged."""
    everything_acked_step(sim)
    for pid in PARTS:
        acked = sorted((v.base_offset, v.next_offset) for t, v in sim.replies.items()
                       if isinstance(v, Produced) and produced.get(t) == pid)
        stored = [(b, n) for b, n, s in sim.logs[pid] if control_of(s) is None]
        assert acked == stored
    accepted = [t for t in produced if not isinstance(sim.replies.get(t), TqError)]
    assert all(isinstance(sim.replies.get(t), Produced) for t in accepted)


@settings(max_examples=150, deadline=None)
@given(any_ops, st.booleans())
def test_invariants_hold_for_any_event_sequence(ops, auto_durable):
    sim, _ = run(ops, auto_durable)
    # Each partition's stored batches are numbered without gap.
    for pid in PARTS:
        expected = 0
        for base, nxt, _ in sim.logs[pid]:
            assert base == expected
            expected = nxt


@settings(max_examples=100, deadline=None)
@given(any_ops, st.booleans())
def test_subscribers_never_change_what_producers_see(ops, auto_durable):
    """The same producer-side ops with and without any subscriber activity: identical acks at
    every step and identical logs. A stopped subscriber cannot delay a producer's ack."""
    with_subs, acked_with = run(ops, auto_durable)
    kept = [i for i, op in enumerate(ops) if op[0][0] not in SUB_KINDS]
    without, acked_without = run([ops[i] for i in kept], auto_durable, kept)
    assert acked_with == acked_without
    assert with_subs.logs == without.logs


@settings(max_examples=100, deadline=None)
@given(any_ops)
def test_a_subscriber_granting_enough_credit_receives_every_batch_once(ops):
    """A subscriber from earliest with ample credit ends up with exactly the log's batches."""
    sim, _ = run(ops, True)
    sim.feed(OpenSession("final", "watcher", 10.0))
    for p, pid in enumerate(PARTS):
        sim.track("watcher", p, LIMITS.max_credit)
        sim.feed(Subscribe(("w", p), "watcher", p, pid, "earliest", LIMITS.max_credit))
    for _ in range(1000):
        if not (sim.reads or any(sim.appends.values())):
            break
        everything_acked_step(sim)
        for p in range(len(PARTS)):
            track = sim.subs[("watcher", p)]
            room = LIMITS.max_credit - (track.granted - track.delivered)
            if room > 0:
                track.granted += room
                sim.feed(GrantCredit("watcher", p, room))
    for p, pid in enumerate(PARTS):
        stored = [(b, n) for b, n, _ in sim.logs[pid]]
        assert sim.subs[("watcher", p)].batches == stored


def everything_acked_step(sim: Sim) -> None:
    for pid in PARTS:
        while sim.appends[pid]:
            sim.complete_append(pid)
        sim.flush(pid)
    for serial in sorted(sim.reads):
        sim.complete_read(serial)


REQUEST_KINDS = {"open", "produce", "advance", "end", "hb", "shb", "reopen", "sreopen", "close",
                 "subscribe", "unsub"}


@settings(max_examples=100, deadline=None)
@given(any_ops, st.booleans())
def test_every_request_is_answered_exactly_once(ops, auto_durable):
    """Whatever the session's state, every request gets one answer (a reply or a typed
    error) once the I/O it started completes: none is dropped, none answered twice (the Sim
    checks that)."""
    sim, _ = run(ops, auto_durable)
    everything_acked_step(sim)
    asked = [("op", i) for i, (op, _) in enumerate(ops) if op[0] in REQUEST_KINDS]
    assert [t for t in asked if t not in sim.replies] == []
    for token in asked:
        answer = sim.replies[token]
        assert not isinstance(answer, Exception) or isinstance(answer, TqError)


@settings(max_examples=100, deadline=None)
@given(only_producer_ops, st.booleans())
def test_every_durable_produce_is_acknowledged_with_its_offsets(ops, auto_durable):
    sim, _ = run(ops, auto_durable)
    everything_acked(sim, sim.produced)


stream_ops = st.lists(weighted(
    (st.tuples(st.just("produce"), st.just("p0"), st.just(0), st.integers(0, 400),
               st.integers(1, 3)), 5),
    (st.tuples(st.just("complete"), st.just(0)), 4),
    (st.tuples(st.just("flush"), st.just(0)), 2),
    (st.tuples(st.just("advance"), st.just("p0"), st.just(0), st.integers(0, 2)), 1),
    (st.tuples(st.just("read"), st.integers(0, 3)), 4),
    (st.tuples(st.just("grant"), subscribers, st.just(1), st.integers(1, 900)), 4),
    (st.tuples(st.just("subscribe"), subscribers, st.just(1), st.just(0),
               st.sampled_from(["earliest", "latest"]), st.integers(0, 900)), 1),
).map(lambda op: (op, 0)), min_size=20, max_size=150)


@settings(max_examples=100, deadline=None)
@given(stream_ops, st.booleans())
def test_one_stream_many_speeds(ops, auto_durable):
    """One producer, subscribers joining early or late and granting credit at random: every
    delivery is checked by the Sim (contiguous, exact bytes, durable, within credit)."""
    first = (("subscribe", "s0", 1, 0, "earliest", 500), 0)
    sim, _ = run([first, *ops], auto_durable)
    for track in sim.subs.values():
        assert track.delivered < track.granted + LIMITS.max_batch_bytes
