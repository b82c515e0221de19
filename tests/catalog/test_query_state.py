"""The query state table, pair by pair: directly, and through the catalog's commands."""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from catalog import (
    QUERY_TRANSITIONS,
    Catalog,
    CatalogError,
    ConflictError,
    FailQuery,
    KillQuery,
    PlaceQuery,
    ProcessExited,
    Publish,
    QueryEvent,
    QueryRef,
    QueryState,
    QueryStateError,
    StartQuery,
    Subscribe,
    classify_exit,
    next_query_state,
)
from tests.catalog._helpers import create_topic, host, submit

PAIRS = list(itertools.product(QueryState, QueryEvent))
ENDED = {QueryState.FINISHED, QueryState.FAILED, QueryState.KILLED}


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s}-{e}" for s, e in PAIRS])
def test_every_pair_is_in_the_table_or_an_error(state: QueryState, event: QueryEvent) -> None:
    if (state, event) in QUERY_TRANSITIONS:
        assert next_query_state(state, event) is QUERY_TRANSITIONS[(state, event)]
    else:
        with pytest.raises(QueryStateError) as info:
            next_query_state(state, event)
        assert info.value.state == state.value and info.value.event == event.value
        assert state.value in str(info.value) and event.value in str(info.value)


def test_table_shape() -> None:
    assert set(QUERY_TRANSITIONS) <= set(PAIRS)
    for (state, _event), after in QUERY_TRANSITIONS.items():
        # An ended query never runs again, and finished absorbs nothing.
        if state in ENDED:
            assert after is state
        assert state is not QueryState.FINISHED
    # A pending query has no process: it is placed, killed or fails (its start timeout), and
    # nothing else; only `place` leaves pending alive.
    assert {(e, a) for (s, e), a in QUERY_TRANSITIONS.items() if s is QueryState.PENDING} == {
        (QueryEvent.PLACE, QueryState.SUBMITTED), (QueryEvent.KILL, QueryState.KILLED),
        (QueryEvent.FAIL, QueryState.FAILED)}
    assert [s for (s, e) in QUERY_TRANSITIONS if e is QueryEvent.PLACE] == [QueryState.PENDING]
    # Every live state can end each way, and only `start` leads to running.
    for state in (QueryState.SUBMITTED, QueryState.RUNNING):
        assert QUERY_TRANSITIONS[(state, QueryEvent.LAST_PROCESS_EXITED)] is QueryState.FINISHED
        assert QUERY_TRANSITIONS[(state, QueryEvent.PROCESS_FAILED)] is QueryState.FAILED
        assert QUERY_TRANSITIONS[(state, QueryEvent.KILL)] is QueryState.KILLED
        assert QUERY_TRANSITIONS[(state, QueryEvent.FAIL)] is QueryState.FAILED
    into_running = {(s, e) for (s, e), a in QUERY_TRANSITIONS.items() if a is QueryState.RUNNING}
    assert into_running == {
        (QueryState.SUBMITTED, QueryEvent.START),
        (QueryState.RUNNING, QueryEvent.PROCESS_EXITED),
    }
    assert all(s.ended == (s in ENDED) for s in QueryState)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(QueryEvent), max_size=12))
def test_event_sequences_never_leave_an_ended_state(events: list[QueryEvent]) -> None:
    state = QueryState.PENDING
    for event in events:
        try:
            after = next_query_state(state, event)
        except QueryStateError:
            continue
        if state.ended:
            assert after is state
        # Nothing goes back to waiting for slots.
        assert after is not QueryState.PENDING
        state = after


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-20, 3)), min_size=1, max_size=5),
    st.data(),
)
def test_classify_exit(codes: list[int | None], data: st.DataObject) -> None:
    process = data.draw(st.integers(0, len(codes) - 1))
    code = data.draw(st.integers(-20, 3))
    event = classify_exit(codes, process, code)
    others_running = any(c is None for i, c in enumerate(codes) if i != process)
    if code != 0:
        assert event is QueryEvent.PROCESS_FAILED
    elif others_running:
        assert event is QueryEvent.PROCESS_EXITED
    else:
        assert event is QueryEvent.LAST_PROCESS_EXITED


# -- through the catalog ------------------------------------------------------------------------


def _query_in(state: QueryState, event: QueryEvent) -> tuple[Catalog, int]:
    """A catalog holding a 3-process query in `state`, set up so that the command for `event`
    is classified as `event` (for LAST_PROCESS_EXITED, processes 1 and 2 exited 0 already).
    A pending query is submitted unplaced, and every other one placed through pending."""
    catalog = Catalog()
    _, broker, executor = host(catalog)
    query = submit(catalog, ())
    qid = query.query_id
    assert query.state is QueryState.PENDING and not query.placed
    if state is QueryState.PENDING:
        return catalog, qid
    catalog.apply(PlaceQuery(query_id=qid, executors=(executor.executor_id,) * 3, at_ms=4))
    # Give the query something to lose when it ends.
    topic = create_topic(catalog, "out", QueryRef(qid), broker.broker_id)
    catalog.apply(Publish(topic_id=topic.topic_id, publisher=QueryRef(qid)))
    catalog.apply(Subscribe(topic_id=topic.topic_id, subscriber=QueryRef(qid)))
    if event is QueryEvent.LAST_PROCESS_EXITED and state is not QueryState.FINISHED:
        for process in (1, 2):
            catalog.apply(ProcessExited(query_id=qid, process=process, exit_code=0, at_ms=5))
    if state is not QueryState.SUBMITTED:
        catalog.apply(StartQuery(query_id=qid, at_ms=6))
    if state is QueryState.FINISHED:
        for process in range(3):
            catalog.apply(ProcessExited(query_id=qid, process=process, exit_code=0, at_ms=7))
    elif state is QueryState.FAILED:
        catalog.apply(FailQuery(query_id=qid, reason="test", at_ms=7))
    elif state is QueryState.KILLED:
        catalog.apply(KillQuery(query_id=qid, at_ms=7))
    assert catalog.query(qid).state is state
    return catalog, qid


def _command(event: QueryEvent, query_id: int):
    return {
        QueryEvent.PLACE: PlaceQuery(query_id=query_id, executors=(1, 1, 1), at_ms=9),
        QueryEvent.START: StartQuery(query_id=query_id, at_ms=9),
        QueryEvent.PROCESS_EXITED: ProcessExited(
            query_id=query_id, process=0, exit_code=0, at_ms=9
        ),
        QueryEvent.LAST_PROCESS_EXITED: ProcessExited(
            query_id=query_id, process=0, exit_code=0, at_ms=9
        ),
        QueryEvent.PROCESS_FAILED: ProcessExited(
            query_id=query_id, process=0, exit_code=-15, at_ms=9
        ),
        QueryEvent.KILL: KillQuery(query_id=query_id, at_ms=9),
        QueryEvent.FAIL: FailQuery(query_id=query_id, reason="gave up", at_ms=9),
    }[event]


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s}-{e}" for s, e in PAIRS])
def test_catalog_follows_the_table(state: QueryState, event: QueryEvent) -> None:
    catalog, qid = _query_in(state, event)
    before = catalog.snapshot()
    expected = QUERY_TRANSITIONS.get((state, event))
    if expected is None:
        # A finished query has no process left to exit: the catalog refuses that report as a
        # second exit before it gets to the table. Either way: a conflict, nothing changes.
        with pytest.raises(ConflictError):
            catalog.apply(_command(event, qid))
        assert catalog.snapshot() == before
        return
    was = catalog.query(qid)
    catalog.apply(_command(event, qid))
    query = catalog.query(qid)
    assert query.state is expected
    if event in (QueryEvent.PROCESS_EXITED, QueryEvent.LAST_PROCESS_EXITED):
        assert query.exit_codes[0] == 0
    if event is QueryEvent.PROCESS_FAILED:
        assert query.exit_codes[0] == -15
    if expected.ended and not was.ended:
        assert query.ended_at_ms == 9
        assert catalog.publications_of(QueryRef(qid)) == []
        assert catalog.subscriptions_of(QueryRef(qid)) == []
    else:
        assert query.ended_at_ms == was.ended_at_ms
    if expected is QueryState.RUNNING and state is QueryState.SUBMITTED:
        assert query.started_at_ms == 9
    catalog.check_invariants()
    assert Catalog.replay(catalog.snapshot()) == catalog


def test_refused_transition_names_the_query() -> None:
    catalog, qid = _query_in(QueryState.KILLED, QueryEvent.KILL)
    with pytest.raises(QueryStateError, match=rf"query {qid} is killed: .*'kill'"):
        catalog.apply(KillQuery(query_id=qid, at_ms=10))
    assert isinstance(QueryStateError("x"), CatalogError)


def test_a_pending_query_has_no_process_until_placed() -> None:
    catalog = Catalog()
    _, _, executor = host(catalog)
    query = submit(catalog, (), processes=2)
    assert (query.state, query.executors, query.exit_codes, query.placed) == (
        QueryState.PENDING, (), (), False)
    with pytest.raises(CatalogError, match="2 processes"):
        catalog.apply(PlaceQuery(query_id=query.query_id, executors=(executor.executor_id,),
                                 at_ms=4))
    with pytest.raises(QueryStateError, match="no process of it was started"):
        catalog.apply(ProcessExited(query_id=query.query_id, process=0, exit_code=0, at_ms=4))
    catalog.apply(PlaceQuery(query_id=query.query_id, executors=(executor.executor_id,) * 2,
                             at_ms=5))
    placed = catalog.query(query.query_id)
    assert (placed.state, placed.executors, placed.exit_codes) == (
        QueryState.SUBMITTED, (executor.executor_id,) * 2, (None, None))
    catalog.check_invariants()


def test_a_query_killed_while_pending_stays_unplaced() -> None:
    catalog = Catalog()
    host(catalog)
    query = submit(catalog, (), processes=2)
    catalog.apply(KillQuery(query_id=query.query_id, at_ms=6, reason="by test"))
    killed = catalog.query(query.query_id)
    assert (killed.state, killed.executors, killed.reason) == (QueryState.KILLED, (), "by test")
    catalog.check_invariants()
    assert Catalog.replay(catalog.snapshot()) == catalog
