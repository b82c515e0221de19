"""Queries wait for process slots, and start only once every process registered: the pending
queue (submission order, start timeout, kill while pending) and the start barrier (AwaitStart),
on the pure coordinator core."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import (
    ConflictError,
    InvalidCommandError,
    NotAuthorizedError,
    Query,
    QueryState,
    SessionKind,
)
from coordinator import CoordinatorConfig, CoordinatorState, Received, SpawnProcesses
from coordinator._placement import used_slots
from querylib.cluster import QueryFailedError
from querylib.cluster import messages as m

from ._driver import Driver


def _submit(d: Driver, client: int, processes: int, *, name: str = "job",
            start_timeout_ms: int | None = None) -> Query:
    return d.call(m.SubmitQuery(session_id=client, name=name, program="p",
                                processes=processes,
                                start_timeout_ms=start_timeout_ms)).query


def _state(d: Driver, query_id: int) -> QueryState:
    return d.state.catalog.query(query_id).state


def _spawned(d: Driver) -> list[int]:
    return [i.query_id for i in d.out if isinstance(i, SpawnProcesses)]


def _exit_all(d: Driver, host_session: int, query: Query) -> None:
    for process in range(query.processes):
        d.call(m.ReportExit(session_id=host_session, query_id=query.query_id,
                            process=process, exit_code=0))


def test_a_query_that_does_not_fit_the_free_slots_is_pending_and_starts_when_they_free() -> None:
    """Issue 14 problem 4: a 1-process subscriber plus a 2-process publisher on 2 slots."""
    d = Driver()
    host, _, executor = d.host(slots=2, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    subscriber = _submit(d, client, 1, name="subscriber")
    assert subscriber.state == QueryState.SUBMITTED and subscriber.executors == (executor,)
    publisher = _submit(d, client, 2, name="publisher")
    assert publisher.state == QueryState.PENDING
    assert (publisher.executors, publisher.exit_codes) == ((), ())
    assert d.state.pending == [publisher.query_id]
    assert publisher.query_id not in _spawned(d)
    d.session(SessionKind.QUERY, lease_ms=60_000, query_id=subscriber.query_id, process=0)
    assert _state(d, subscriber.query_id) == QueryState.RUNNING
    # The subscriber ends: its slot frees, and the publisher is placed and spawned.
    d.send(m.ReportExit(session_id=host, query_id=subscriber.query_id, process=0, exit_code=0))
    (spawn,) = [i for i in d.commit() if isinstance(i, SpawnProcesses)]
    assert spawn.query_id == publisher.query_id
    placed = d.state.catalog.query(publisher.query_id)
    assert (placed.state, placed.executors, placed.exit_codes) == (
        QueryState.SUBMITTED, (executor, executor), (None, None))
    assert d.state.pending == []


def test_pending_queries_start_in_submission_order_and_none_jumps_the_queue() -> None:
    d = Driver()
    host, _, _ = d.host(slots=3, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    first = _submit(d, client, 3, name="first")  # takes every slot
    big = _submit(d, client, 3, name="big")
    small = _submit(d, client, 1, name="small")
    assert (_state(d, big.query_id), _state(d, small.query_id)) == (
        QueryState.PENDING, QueryState.PENDING)
    assert d.state.pending == [big.query_id, small.query_id]
    # One slot frees: `small` would fit, but `big` came first, so both wait.
    d.call(m.ReportExit(session_id=host, query_id=first.query_id, process=0, exit_code=0))
    assert d.state.pending == [big.query_id, small.query_id]
    d.call(m.ReportExit(session_id=host, query_id=first.query_id, process=1, exit_code=0))
    d.call(m.ReportExit(session_id=host, query_id=first.query_id, process=2, exit_code=0))
    assert _state(d, big.query_id) == QueryState.SUBMITTED
    assert _state(d, small.query_id) == QueryState.PENDING
    _exit_all(d, host, d.state.catalog.query(big.query_id))
    assert _state(d, small.query_id) == QueryState.SUBMITTED
    assert d.state.pending == []


def test_a_pending_query_fails_at_its_own_start_timeout_saying_why() -> None:
    d = Driver(config=CoordinatorConfig(start_timeout_ms=60_000))
    d.host(slots=2, lease_ms=600_000)
    client = d.session(lease_ms=600_000)
    _submit(d, client, 2)
    waiting = d.send(m.SubmitQuery(session_id=client, name="late", program="p", processes=2,
                                   wait=True, start_timeout_ms=3_000))
    d.commit()
    query_id = d.state.pending[0]
    assert waiting not in d.answers
    d.tick(2.9)
    assert _state(d, query_id) == QueryState.PENDING
    d.tick(0.2)
    d.commit()
    query = d.state.catalog.query(query_id)
    assert query.state == QueryState.FAILED and query.executors == ()
    assert query.reason.startswith("waited 3s for 2 free process slots (0 of the executors' 2 "
                                   "are free)")
    assert "--slots" in query.reason and "--start-timeout" in query.reason
    with pytest.raises(QueryFailedError, match="waited 3s for 2 free process slots"):
        d.answer(waiting)
    assert d.state.pending == [] and not d.kills  # nothing ran, nothing to kill


def test_the_start_timeout_counts_from_submission_and_bounds_registration_too() -> None:
    d = Driver(config=CoordinatorConfig(start_timeout_ms=60_000))
    host, _, _ = d.host(slots=1, lease_ms=600_000)
    client = d.session(lease_ms=600_000)
    first = _submit(d, client, 1)
    second = _submit(d, client, 1, start_timeout_ms=5_000)
    d.tick(4.0)
    d.call(m.ReportExit(session_id=host, query_id=first.query_id, process=0, exit_code=0))
    assert _state(d, second.query_id) == QueryState.SUBMITTED
    d.tick(1.5)  # placed at 4 s, never registered: it fails at 5 s, not at 60 s
    d.commit()
    query = d.state.catalog.query(second.query_id)
    assert query.state == QueryState.FAILED
    assert "not every process registered within 5s" in query.reason
    assert d.kills and d.kills[-1].query_id == second.query_id


def test_start_timeouts_are_bounded() -> None:
    d = Driver(config=CoordinatorConfig(max_start_timeout_ms=10_000))
    d.host(lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    for bad in (0, -1, 10_001):
        with pytest.raises(InvalidCommandError, match="start timeout"):
            _submit(d, client, 1, start_timeout_ms=bad)
    assert _submit(d, client, 1, start_timeout_ms=10_000).start_timeout_ms == 10_000


def test_kill_while_pending_ends_it_without_processes_and_the_queue_moves_on() -> None:
    d = Driver()
    host, _, _ = d.host(slots=2, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    first = _submit(d, client, 2)
    blocked = _submit(d, client, 2, name="blocked")
    after = _submit(d, client, 1, name="after")
    waiting = d.send(m.AwaitStart(session_id=client, query_id=blocked.query_id))
    d.commit()
    assert waiting not in d.answers
    reply = d.call(m.KillQuery(session_id=client, query_id=blocked.query_id, reason="by test"))
    assert reply.query.state == QueryState.KILLED and reply.query.executors == ()
    assert not d.kills  # no process to kill
    with pytest.raises(QueryFailedError, match="killed: by test"):
        d.answer(waiting)
    assert d.state.pending == [after.query_id]
    d.call(m.ReportExit(session_id=host, query_id=first.query_id, process=0, exit_code=0))
    assert _state(d, after.query_id) == QueryState.SUBMITTED
    d.tick(120.0)  # the killed query's old deadline does nothing
    assert _state(d, blocked.query_id) == QueryState.KILLED


def test_a_pending_query_refuses_registration() -> None:
    d = Driver()
    d.host(slots=1, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    _submit(d, client, 1)
    pending = _submit(d, client, 1)
    with pytest.raises(ConflictError, match="pending"):
        d.session(SessionKind.QUERY, query_id=pending.query_id, process=0)


def test_a_new_executor_places_pending_queries() -> None:
    d = Driver()
    d.host("a", slots=1, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    _submit(d, client, 1)
    pending = _submit(d, client, 2)
    assert pending.state == QueryState.PENDING
    _, _, executor = d.host("b", slots=2, lease_ms=60_000)
    query = d.state.catalog.query(pending.query_id)
    assert query.state == QueryState.SUBMITTED and query.executors == (executor, executor)


def test_pending_queries_survive_a_restart_with_a_fresh_deadline() -> None:
    d = Driver(config=CoordinatorConfig(start_timeout_ms=10_000))
    host, _, _ = d.host(slots=1, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    first = _submit(d, client, 1)
    pending = _submit(d, client, 1)
    d.tick(8.0)
    d.commit()
    # A coordinator restarted from the same catalog at another clock.
    again = Driver(CoordinatorState(d.state.catalog, config=d.state.config, now=100.0),
                   now=100.0)
    assert again.state.pending == [pending.query_id]
    again.tick(9.0)  # 17 s after submission, 9 s after the restart: still waiting
    assert _state(again, pending.query_id) == QueryState.PENDING
    again.call(m.ReportExit(session_id=host, query_id=first.query_id, process=0, exit_code=0))
    assert _state(again, pending.query_id) == QueryState.SUBMITTED


# -- the start barrier ----------------------------------------------------------------------------


def test_await_start_answers_every_process_once_the_last_registered() -> None:
    """Issue 14 problem 10: no process runs `main` before every process of its query registered:
    each registers, then waits on AwaitStart, answered only when the query runs."""
    d = Driver()
    d.host(slots=4, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    query = _submit(d, client, 3)
    sessions = []
    waits = []
    for process in range(3):
        session = d.session(SessionKind.QUERY, lease_ms=60_000, query_id=query.query_id,
                            process=process)
        sessions.append(session)
        waits.append(d.send(m.AwaitStart(session_id=session, query_id=query.query_id)))
        d.commit()
        if process < 2:
            assert not [w for w in waits if w in d.answers], "answered before all registered"
    assert [d.answer(w).query.state for w in waits] == [QueryState.RUNNING] * 3
    # Asked after the start, it answers at once.
    assert d.call(m.AwaitStart(session_id=sessions[0], query_id=query.query_id)
                  ).query.state == QueryState.RUNNING


def test_await_start_fails_when_the_query_fails_to_start() -> None:
    d = Driver(config=CoordinatorConfig(start_timeout_ms=2_000))
    d.host(slots=4, lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    query = _submit(d, client, 2)
    session = d.session(SessionKind.QUERY, lease_ms=60_000, query_id=query.query_id, process=0)
    waiting = d.send(m.AwaitStart(session_id=session, query_id=query.query_id))
    d.commit()
    d.tick(2.5)
    d.commit()
    with pytest.raises(QueryFailedError, match="not every process registered within 2s"):
        d.answer(waiting)


def _as(d: Driver, principal: str, request: object) -> object:
    token = next(d.tokens)
    d.feed(Received(token, request, d.now, d.wall, b"peer", principal))
    d.commit()
    return d.answer(token)


def test_only_the_query_and_who_manages_it_wait_on_it() -> None:
    d = Driver()
    d.host(lease_ms=60_000)
    admin = d.session(lease_ms=60_000)
    d.call(m.AddUser(session_id=admin, principal="user:bob", role="user"))
    query = _submit(d, admin, 1)
    bob = _as(d, "user:bob", m.OpenSession(lease_ms=60_000, peer="bob")).session_id
    with pytest.raises(NotAuthorizedError, match="may not wait on query"):
        _as(d, "user:bob", m.AwaitStart(session_id=bob, query_id=query.query_id))
    own = f"query:{query.query_id}"
    process = _as(d, own, m.OpenSession(kind=SessionKind.QUERY, lease_ms=60_000, peer="q",
                                        query_id=query.query_id, process=0)).session_id
    reply = _as(d, own, m.AwaitStart(session_id=process, query_id=query.query_id))
    assert reply.query.state == QueryState.RUNNING


# -- properties -----------------------------------------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 4), st.sampled_from([None, 1_000, 5_000])),
    st.tuples(st.just("exit"), st.integers(0, 20), st.integers(0, 3)),
    st.tuples(st.just("kill"), st.integers(0, 20)),
    st.tuples(st.just("register"), st.integers(0, 20), st.integers(0, 3)),
    st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_the_queue_keeps_slots_order_and_deadlines(ops: list[tuple]) -> None:
    d = Driver(config=CoordinatorConfig(start_timeout_ms=4_000))
    host, _, executor = d.host(slots=4, lease_ms=600_000)
    client = d.session(lease_ms=600_000)
    submitted: dict[int, float] = {}  # query id -> when submitted
    for op in ops:
        queries = sorted(submitted)
        if op[0] == "submit":
            query = _submit(d, client, op[1], start_timeout_ms=op[2])
            submitted[query.query_id] = d.now
        elif op[0] == "tick":
            d.tick(op[1])
            d.commit()
        elif queries:
            query = d.state.catalog.query(queries[op[1] % len(queries)])
            process = op[2] % query.processes if len(op) > 2 else 0
            request: object
            if op[0] == "kill":
                request = m.KillQuery(session_id=client, query_id=query.query_id)
            elif op[0] == "exit":
                request = m.ReportExit(session_id=host, query_id=query.query_id,
                                       process=process, exit_code=0)
            else:
                request = m.OpenSession(kind=SessionKind.QUERY, lease_ms=600_000, peer="t",
                                        query_id=query.query_id, process=process)
            d.send(request)
            d.commit()
        catalog = d.state.catalog
        catalog.check_invariants()
        # Never more processes placed on the executor than it has slots.
        assert used_slots(catalog)[executor] <= 4
        all_queries = sorted(catalog.queries, key=lambda q: q.query_id)
        pending = [q.query_id for q in all_queries if q.state == QueryState.PENDING]
        assert d.state.pending == pending  # the queue is the pending queries, oldest first
        for query in all_queries:
            # Submission order: nothing placed while an older query still waits.
            if query.placed and pending:
                assert pending[0] > query.query_id or query.query_id not in submitted
            # Nothing outlives its start deadline without starting.
            timeout = d.state.config.start_timeout(query) / 1000
            if d.now >= submitted[query.query_id] + timeout:
                assert query.state not in (QueryState.PENDING, QueryState.SUBMITTED)
