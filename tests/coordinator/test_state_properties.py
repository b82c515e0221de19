"""Random programs against the coordinator core: whatever the order of requests, ticks and
commits, every request is answered exactly once (and only after its change is durable), leases
and the catalog's sessions agree, and the catalog keeps its invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import SessionKind
from coordinator import Committed, Respond
from querylib.cluster import messages as m

from ._driver import Driver

NAMES = ("a", "b", "tenant/ns/c")
LEASES = st.sampled_from([100, 300, 1000, 5000])

OPS = st.one_of(
    st.tuples(st.just("open"), LEASES, st.sampled_from(list(SessionKind)[:2])),
    st.tuples(st.just("heartbeat"), st.integers(0, 8), LEASES),
    st.tuples(st.just("close"), st.integers(0, 8)),
    st.tuples(st.just("create"), st.integers(0, 8), st.sampled_from(NAMES), st.integers(1, 3)),
    st.tuples(st.just("delete"), st.integers(0, 8), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("publish"), st.integers(0, 8), st.sampled_from(NAMES)),
    st.tuples(st.just("subscribe"), st.integers(0, 8), st.sampled_from(NAMES),
              st.sampled_from([0, 200, 2000])),
    st.tuples(st.just("unsubscribe"), st.integers(0, 8), st.sampled_from(NAMES)),
    st.tuples(st.just("lookup"), st.sampled_from(NAMES), st.sampled_from([0, 500])),
    st.tuples(st.just("host"), LEASES),
    st.tuples(st.just("tick"), st.floats(0.0, 1.0)),
    st.tuples(st.just("commit"), st.floats(0.0, 1.0)),
)


def _request(op: tuple, sessions: list[int]) -> object | None:
    def sid(i: int) -> int:
        return sessions[i % len(sessions)] if sessions else 999

    kind = op[0]
    if kind == "open":
        return m.OpenSession(lease_ms=op[1], kind=op[2])
    if kind == "heartbeat":
        return m.Heartbeat(session_id=sid(op[1]), lease_ms=op[2])
    if kind == "close":
        return m.CloseSession(session_id=sid(op[1]))
    if kind == "create":
        return m.CreateTopic(session_id=sid(op[1]), name=op[2], partitions=op[3])
    if kind == "delete":
        return m.DeleteTopic(session_id=sid(op[1]), name=op[2], force=op[3])
    if kind == "publish":
        return m.Publish(session_id=sid(op[1]), name=op[2])
    if kind == "subscribe":
        return m.Subscribe(session_id=sid(op[1]), name=op[2], wait_ms=op[3])
    if kind == "unsubscribe":
        return m.Unsubscribe(session_id=sid(op[1]), name=op[2])
    if kind == "lookup":
        return m.LookupTopic(name=op[1], wait_ms=op[2])
    return None


def _check(d: Driver) -> None:
    state = d.state
    catalog = state.catalog
    catalog.check_invariants()
    open_sessions = {s.session_id for s in catalog.sessions}  # type: ignore[union-attr]
    assert {s for s in open_sessions if s in state.leases} == open_sessions
    assert len(state.leases) == len(open_sessions)
    for session_id, binding in state.bindings.items():
        assert session_id in open_sessions and state.bound[binding] == session_id
    assert state.committed <= catalog.version


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=60))
def test_every_request_is_answered_once_and_only_when_durable(ops: list[tuple]) -> None:
    d = Driver()
    sessions: list[int] = []
    tokens: list[int] = []
    for op in ops:
        kind = op[0]
        if kind == "tick":
            d.tick(op[1])
        elif kind == "commit":
            # Commit part of what is pending: durability arrives in pieces.
            target = d.state.committed + round(op[1] * (d.state.catalog.version
                                                        - d.state.committed))
            out = d.feed(Committed(target))
            assert all(r.reply is None or getattr(r.reply, "version", 0) <= target
                       for r in out if isinstance(r, Respond))
        elif kind == "host":
            tokens.append(d.send(m.OpenSession(kind=SessionKind.EXECUTOR, lease_ms=op[1])))
        else:
            tokens.append(d.send(_request(op, sessions)))
        for token in tokens:
            respond = d.answers.get(token)
            if respond is not None and isinstance(respond.reply, m.SessionOpened):
                if respond.reply.session_id not in sessions:
                    sessions.append(respond.reply.session_id)
        # Anything answered was answered at a durable version.
        for respond in d.out:
            if isinstance(respond, Respond) and respond.reply is not None:
                assert getattr(respond.reply, "version", 0) <= d.state.committed
        _check(d)
    d.commit()
    d.tick(10.0)  # past every wait and lease
    d.commit()
    assert set(tokens) <= set(d.answers), "every request is answered in the end"
    assert d.state.held == 0 and len(d.state.waiters) == 0
    assert len(d.state.catalog.sessions) == 0
    _check(d)
