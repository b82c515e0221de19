"""The coordinator core as pure logic: sessions and leases, blocking requests, what follows from
a change, replies held until durable, recovery and bootstrap. Time is an input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from catalog import (
    INGEST,
    SYSTEM,
    BrokerExistsError,
    Catalog,
    ConflictError,
    InvalidCommandError,
    InvalidReplicationFactorError,
    NotAuthorizedError,
    NotOwnerError,
    PrincipalRef,
    QueryRef,
    QueryState,
    RecordTypeMismatchError,
    SessionKind,
    SessionRef,
    TopicExistsError,
    TopicKind,
    UnknownBrokerError,
    UnknownSessionError,
    UnknownTopicError,
    catalog_topic,
)
from catalog import CreateTopic as CreateTopicCommand
from coordinator import (
    Bootstrap,
    Checkpointed,
    Committed,
    CoordinatorConfig,
    CoordinatorState,
    Persist,
    Received,
    Respond,
    SpawnProcesses,
    Tick,
)
from querylib.cluster import QueryFailedError
from querylib.cluster import messages as m

from ._driver import RESOURCES, Driver


def test_bootstrap_registers_the_broker_and_creates_every_catalog_topic() -> None:
    d = Driver()
    catalog = d.state.catalog
    assert d.state.catalog_broker == "tcp://127.0.0.1:7401"
    topics = d.state.catalog_topics()
    assert set(topics) == {"sessions", "brokers", "executors", "queries", "topics",
                           "publications", "subscriptions", "drops", "users", "tokens",
                           "homes", "counters"}
    for name, topic in topics.items():
        assert topic.short_name == catalog_topic(name)
        assert topic.owner == SYSTEM and topic.internal
    version = catalog.version
    d.feed(Bootstrap("coord-host", "tcp://127.0.0.1:7401", d.wall))
    assert catalog.version == version, "bootstrapping again at the same address changes nothing"


def test_bootstrap_at_a_new_address_keeps_the_broker_id() -> None:
    d = Driver()
    old = d.state.catalog_broker_id
    d.feed(Bootstrap("coord-host", "tcp://127.0.0.1:9999", d.wall))
    assert d.state.catalog_broker_id == old
    assert d.state.catalog_broker == "tcp://127.0.0.1:9999"


def test_a_reply_waits_until_its_change_is_durable() -> None:
    d = Driver()
    token = d.send(m.OpenSession(lease_ms=1000))
    persists = [i for i in d.out if isinstance(i, Persist)]
    assert persists and not [i for i in d.out if isinstance(i, Respond)]
    assert d.state.held == 1
    d.feed(Committed(persists[-1].version - 1))
    assert token not in d.answers
    d.feed(Committed(persists[-1].version))
    assert d.answer(token).session_id == 1


def test_a_read_of_uncommitted_state_waits_too() -> None:
    d = Driver()
    session = d.session()
    d.send(m.CreateTopic(session_id=session, name="numbers"))  # not committed yet
    token = d.send(m.LookupTopic(name="numbers"))
    assert token not in d.answers
    d.commit()
    assert d.answer(token).topic.short_name == "numbers"


def test_requests_renew_the_lease_and_it_expires_without_them() -> None:
    d = Driver()
    session = d.session(lease_ms=1000)
    d.tick(0.9)
    d.call(m.Heartbeat(session_id=session))
    d.tick(0.9)
    d.call(m.CreateTopic(session_id=session, name="t"))  # any request renews
    d.tick(0.9)
    assert session in d.state.leases
    d.tick(0.2)
    assert session not in d.state.leases
    assert [e.session_id for e in d.ended if e.expired] == [session]
    with pytest.raises(UnknownSessionError):
        d.call(m.Heartbeat(session_id=session))


def test_an_expired_session_loses_what_it_owned_but_its_topics_stay() -> None:
    d = Driver()
    session = d.session(lease_ms=500)
    d.call(m.CreateTopic(session_id=session, name="numbers", partitions=2))
    d.call(m.Publish(session_id=session, name="numbers"))
    d.call(m.Subscribe(session_id=session, name="numbers"))
    catalog = d.state.catalog
    assert len(catalog.publications) == len(catalog.subscriptions) == 1
    d.tick(0.6)
    d.commit()
    assert len(catalog.publications) == len(catalog.subscriptions) == 0
    assert len(catalog.sessions) == 0
    assert catalog.find_topic("numbers") is not None


def test_lease_requests_are_clamped() -> None:
    d = Driver(config=CoordinatorConfig(min_lease_ms=100, max_lease_ms=5000))
    assert d.call(m.OpenSession(lease_ms=1)).lease_ms == 100
    assert d.call(m.OpenSession(lease_ms=10**9)).lease_ms == 5000
    session = d.session()
    assert d.call(m.Heartbeat(session_id=session, lease_ms=-5)).lease_ms == 100


def test_resume_hands_the_session_back_or_says_it_is_gone() -> None:
    d = Driver()
    session = d.session(lease_ms=1000)
    reply = d.call(m.OpenSession(resume=session, lease_ms=2000))
    assert reply.resumed and reply.session_id == session and reply.lease_ms == 2000
    with pytest.raises(InvalidCommandError):
        d.call(m.OpenSession(resume=session, kind=SessionKind.EXECUTOR))
    d.tick(2.1)
    with pytest.raises(UnknownSessionError):
        d.call(m.OpenSession(resume=session))


def test_close_session_cleans_up_like_expiry_without_failing_anything() -> None:
    d = Driver()
    session = d.session()
    d.call(m.CreateTopic(session_id=session, name="t"))
    d.call(m.Publish(session_id=session, name="t"))
    d.call(m.CloseSession(session_id=session))
    assert not d.state.catalog.publications and session not in d.state.leases
    assert [e.expired for e in d.ended] == [False]


# -- blocking requests --------------------------------------------------------------------------


def test_blocking_subscribe_is_answered_when_the_topic_appears() -> None:
    d = Driver()
    waiting = d.session(lease_ms=10_000)
    token = d.send(m.Subscribe(session_id=waiting, name="later", wait_ms=5000))
    d.commit()
    assert token not in d.answers and len(d.state.waiters) == 1
    owner = d.session(lease_ms=10_000)
    d.tick(1.0)
    d.call(m.CreateTopic(session_id=owner, name="public/default/later", partitions=3))
    reply = d.answer(token)
    assert reply.topic.partitions == 3 and len(d.state.waiters) == 0
    assert d.state.catalog.subscriptions_of(SessionRef(waiting))


def test_blocking_lookup_times_out_with_a_retriable_error() -> None:
    d = Driver()
    token = d.send(m.LookupTopic(name="never", wait_ms=1500))
    d.tick(1.0)
    assert token not in d.answers
    d.tick(0.6)
    with pytest.raises(UnknownTopicError) as info:
        d.answer(token)
    assert info.value.retriable


def test_a_waiting_request_fails_when_its_session_ends() -> None:
    d = Driver()
    session = d.session(lease_ms=500)
    token = d.send(m.Subscribe(session_id=session, name="later", wait_ms=60_000))
    d.tick(0.6)
    d.commit()
    with pytest.raises(UnknownSessionError):
        d.answer(token)
    assert len(d.state.waiters) == 0


def test_waiters_are_bounded() -> None:
    d = Driver(config=CoordinatorConfig(max_waiters=2))
    tokens = [d.send(m.LookupTopic(name=f"t{i}", wait_ms=1000)) for i in range(3)]
    assert tokens[2] in d.answers and tokens[0] not in d.answers
    with pytest.raises(UnknownTopicError):
        d.answer(tokens[2])


def test_without_wait_a_missing_topic_fails_at_once() -> None:
    d = Driver()
    session = d.session()
    with pytest.raises(UnknownTopicError):
        d.call(m.Subscribe(session_id=session, name="nope"))


# -- queries and executors ----------------------------------------------------------------------


def _query(d: Driver, processes: int = 2, leases: tuple[int, ...] = ()
           ) -> tuple[list[tuple[int, int, int]], int]:
    leases = leases or (10_000,) * processes
    hosts = [d.host(f"host-{i}", lease_ms=leases[i]) for i in range(processes)]
    client = d.session(lease_ms=10_000)
    query = d.call(m.SubmitQuery(session_id=client, name="job", program="job.py",
                                 processes=processes,
                                 executors=tuple(h[2] for h in hosts))).query
    return hosts, query.query_id


def test_a_query_starts_once_every_process_registered() -> None:
    d = Driver()
    _, query_id = _query(d, processes=2)
    d.session(SessionKind.QUERY, query_id=query_id, process=0)
    assert d.state.catalog.query(query_id).state == QueryState.SUBMITTED
    with pytest.raises(ConflictError):
        d.session(SessionKind.QUERY, query_id=query_id, process=0)
    with pytest.raises(InvalidCommandError):
        d.session(SessionKind.QUERY, query_id=query_id, process=5)
    d.session(SessionKind.QUERY, query_id=query_id, process=1)
    assert d.state.catalog.query(query_id).state == QueryState.RUNNING


def test_a_process_that_registered_and_left_before_the_last_registered_counts() -> None:
    """A short process may register, finish and close its session before a sibling registers:
    the query runs when the last registers, not only once the early one's exit is reported."""
    d = Driver()
    _, query_id = _query(d, processes=2)
    early = d.session(SessionKind.QUERY, query_id=query_id, process=0)
    d.call(m.CloseSession(session_id=early))
    assert d.state.catalog.query(query_id).state == QueryState.SUBMITTED
    d.session(SessionKind.QUERY, query_id=query_id, process=1)
    assert d.state.catalog.query(query_id).state == QueryState.RUNNING
    assert query_id not in d.state.registered


def test_a_query_process_acts_as_its_query() -> None:
    d = Driver()
    _, query_id = _query(d, processes=1)
    process = d.session(SessionKind.QUERY, lease_ms=10_000, query_id=query_id, process=0)
    info = d.call(m.CreateTopic(session_id=process, name="out", partitions=2))
    assert info.topic.owner == QueryRef(query_id)
    # Its partitions land on the broker of the executor running the process.
    executor = d.state.catalog.executor(d.state.catalog.query(query_id).executors[0])
    assert set(info.topic.locations) == {executor.broker_id}
    d.call(m.Publish(session_id=process, name="out"))
    assert d.state.catalog.publications_of(QueryRef(query_id))


def test_a_lost_process_session_fails_the_query_and_kills_the_rest() -> None:
    d = Driver()
    hosts, query_id = _query(d, processes=2)
    d.session(SessionKind.QUERY, lease_ms=500, query_id=query_id, process=0)
    d.session(SessionKind.QUERY, lease_ms=10_000, query_id=query_id, process=1)
    assert d.state.catalog.query(query_id).state == QueryState.RUNNING
    d.tick(0.6)
    d.commit()
    query = d.state.catalog.query(query_id)
    assert query.state == QueryState.FAILED and "process 0" in query.reason
    (kill,) = d.kills
    assert kill.query_id == query_id
    assert [(p, e, s) for p, e, s in kill.processes] == [
        (0, hosts[0][2], hosts[0][0]), (1, hosts[1][2], hosts[1][0])]


def test_a_process_that_exited_before_its_session_expired_fails_nothing() -> None:
    d = Driver()
    hosts, query_id = _query(d, processes=1)
    d.session(SessionKind.QUERY, lease_ms=500, query_id=query_id, process=0)
    d.call(m.ReportExit(session_id=hosts[0][0], query_id=query_id, process=0, exit_code=0))
    assert d.state.catalog.query(query_id).state == QueryState.FINISHED
    d.tick(0.6)
    assert d.state.catalog.query(query_id).state == QueryState.FINISHED
    assert not d.kills


def test_an_expired_executor_fails_its_queries_and_the_others_are_told_to_kill() -> None:
    d = Driver()
    hosts, query_id = _query(d, processes=2, leases=(500, 60_000))
    d.tick(0.6)
    d.commit()
    assert d.state.catalog.query(query_id).state == QueryState.FAILED
    assert "lost executor" in d.state.catalog.query(query_id).reason
    (kill,) = d.kills
    # The process on the lost executor has no session to reach any more.
    assert (0, hosts[0][2], None) in kill.processes
    assert (1, hosts[1][2], hosts[1][0]) in kill.processes


def test_submit_sends_one_spawn_once_durable_naming_every_process_and_its_executor() -> None:
    d = Driver()
    hosts = [d.host(f"host-{i}", lease_ms=10_000) for i in range(2)]
    client = d.session(lease_ms=10_000)
    d.send(m.SubmitQuery(session_id=client, name="job", program="sha256:ab", processes=2,
                         workers=3, args=("x",), executors=(hosts[1][2], hosts[0][2])))
    # Not before the query is durable: a crash could still forget it.
    assert not [i for i in d.out if isinstance(i, SpawnProcesses)]
    (spawn,) = [i for i in d.commit() if isinstance(i, SpawnProcesses)]
    assert (spawn.program, spawn.process_count, spawn.workers, spawn.args) == (
        "sha256:ab", 2, 3, ("x",))
    assert list(spawn.processes) == [(0, hosts[1][2], hosts[1][0]), (1, hosts[0][2], hosts[0][0])]


def test_a_query_whose_processes_do_not_all_register_fails_at_the_start_timeout() -> None:
    d = Driver(config=CoordinatorConfig(start_timeout_ms=2_000))
    hosts, query_id = _query(d, processes=2)
    d.session(SessionKind.QUERY, lease_ms=60_000, query_id=query_id, process=0)
    d.tick(1.5)
    assert d.state.catalog.query(query_id).state == QueryState.SUBMITTED
    d.tick(0.6)
    d.commit()
    query = d.state.catalog.query(query_id)
    assert query.state == QueryState.FAILED
    assert "not every process registered within 2s (process 1 did not)" in query.reason
    (kill,) = d.kills  # whatever started is killed
    assert {p for p, _, _ in kill.processes} == {0, 1}


def test_a_started_query_is_not_failed_by_its_old_start_deadline() -> None:
    d = Driver(config=CoordinatorConfig(start_timeout_ms=2_000))
    _, query_id = _query(d, processes=1)
    d.session(SessionKind.QUERY, lease_ms=60_000, query_id=query_id, process=0)
    assert d.state.catalog.query(query_id).state == QueryState.RUNNING
    d.tick(3.0)
    assert d.state.catalog.query(query_id).state == QueryState.RUNNING
    assert not d.kills


def test_a_spawn_failure_fails_the_query_kills_the_rest_and_answers_the_waiting_submit() -> None:
    d = Driver()
    hosts = [d.host(f"host-{i}", lease_ms=10_000) for i in range(2)]
    client = d.session(lease_ms=10_000)
    waiting = d.send(m.SubmitQuery(session_id=client, name="job", program="job.py",
                                   processes=2, executors=tuple(h[2] for h in hosts),
                                   wait=True))
    (spawn,) = [i for i in d.commit() if isinstance(i, SpawnProcesses)]
    assert waiting not in d.answers  # held until every process registered, or it failed
    query_id = spawn.query_id
    d.session(SessionKind.QUERY, lease_ms=60_000, query_id=query_id, process=0)
    d.call(m.ReportSpawnFailed(session_id=hosts[1][0], query_id=query_id, process=1,
                               reason="ArtifactMissingError: no such program"))
    query = d.state.catalog.query(query_id)
    assert query.state == QueryState.FAILED
    assert "process 1 could not start: ArtifactMissingError" in query.reason
    assert d.kills and d.kills[-1].query_id == query_id
    with pytest.raises(QueryFailedError, match="could not start"):
        d.answer(waiting)


def test_a_waiting_submit_is_answered_once_the_query_runs() -> None:
    d = Driver()
    host = d.host("host-a", lease_ms=10_000)
    client = d.session(lease_ms=10_000)
    waiting = d.send(m.SubmitQuery(session_id=client, name="job", program="job.py",
                                   processes=1, executors=(host[2],), wait=True))
    d.commit()
    assert waiting not in d.answers
    query_id = max(q.query_id for q in d.state.catalog.queries)
    d.session(SessionKind.QUERY, lease_ms=60_000, query_id=query_id, process=0)
    assert d.answer(waiting).query.state == QueryState.RUNNING


def test_kill_query_tells_the_executors() -> None:
    d = Driver()
    hosts, query_id = _query(d, processes=1)
    client = d.session(lease_ms=10_000)
    reply = d.call(m.KillQuery(session_id=client, query_id=query_id, reason="by test"))
    assert reply.query.state == QueryState.KILLED
    assert d.kills[0].reason == "by test"


def test_placement_spreads_processes_over_free_slots() -> None:
    d = Driver()
    hosts = [d.host(f"h{i}", lease_ms=10_000) for i in range(2)]
    client = d.session(lease_ms=10_000)
    query = d.call(m.SubmitQuery(session_id=client, name="q", program="p", processes=4)).query
    assert sorted(query.executors) == sorted([hosts[0][2], hosts[1][2]] * 2)


def test_submit_without_executors_is_refused() -> None:
    d = Driver()
    client = d.session()
    with pytest.raises(InvalidCommandError, match="tq executor"):
        d.call(m.SubmitQuery(session_id=client, name="q", program="p"))


def test_only_the_registering_session_removes_its_executor() -> None:
    d = Driver()
    session, _, executor = d.host()
    other = d.session()
    with pytest.raises(NotOwnerError):
        d.call(m.RemoveExecutor(session_id=other, executor_id=executor))
    d.call(m.RemoveExecutor(session_id=session, executor_id=executor))


def test_sessions_and_strings_are_bounded() -> None:
    d = Driver(config=CoordinatorConfig(max_sessions=2))
    session = d.session()
    d.session()
    with pytest.raises(ConflictError, match="sessions are open"):
        d.session()
    with pytest.raises(InvalidCommandError):
        d.call(m.CreateTopic(session_id=session, name="t", record_type="x" * 1000))
    with pytest.raises(InvalidCommandError):
        d.call(m.SubmitQuery(session_id=session, name="q", program="p", args=("a" * 70_000,)))


def test_a_querys_arguments_are_bounded_in_number_too() -> None:
    """Only their joined length was bounded, so a million empty arguments passed (the 4 MiB
    message limit aside), each a string object the catalog holds, copies to every follower
    and hands every process."""
    d = Driver()
    d.host()
    session = d.session(lease_ms=60_000)
    with pytest.raises(InvalidCommandError, match="the query has 1000000 arguments; at most "
                                                  "4096"):
        d.call(m.SubmitQuery(session_id=session, name="q", program="p", args=("",) * 1_000_000))
    version = d.state.catalog.version
    with pytest.raises(InvalidCommandError, match="4097 arguments"):
        d.call(m.SubmitQuery(session_id=session, name="q", program="p", args=("x",) * 4097))
    assert d.state.catalog.version == version
    query = d.call(m.SubmitQuery(session_id=session, name="q", program="p",
                                 args=("x",) * 4096)).query
    assert len(query.args) == 4096


def test_a_subscribers_record_type_is_checked_before_use_and_never_echoed() -> None:
    """A Subscribe's record type was neither bounded nor checked: a 1 MB one came back whole
    in the mismatch error, and one naming a topic not there yet waited, held, with its
    request. It is checked as a topic's is (at most 256 printable characters), before the
    topic is looked up; what is refused is described, not repeated."""
    d = Driver()
    session = d.session(lease_ms=60_000)
    d.call(m.CreateTopic(session_id=session, name="t", record_type="json/Point"))
    huge = "Q" * 1_000_000
    for name, wait_ms in (("t", 0), ("not-yet", 60_000)):
        token = d.send(m.Subscribe(session_id=session, name=name, record_type=huge,
                                   wait_ms=wait_ms))
        d.commit()
        with pytest.raises(InvalidCommandError, match="the record type is 1000000 characters "
                                                      "long; at most 256") as refused:
            d.answer(token)
        assert len(str(refused.value)) < 200
    assert len(d.state.waiters) == 0
    for bad in ("json/\x1b[2J", "json/a\nb"):
        for request in (m.Subscribe(session_id=session, name="t", record_type=bad),
                        m.CreateTopic(session_id=session, name="u", record_type=bad)):
            with pytest.raises(InvalidCommandError, match="printable") as refused:
                d.call(request)
            assert bad not in str(refused.value)
    with pytest.raises(RecordTypeMismatchError, match="carries 'json/Point' records, not "
                                                      "'json/Line'"):
        d.call(m.Subscribe(session_id=session, name="t", record_type="json/Line"))
    d.call(m.Subscribe(session_id=session, name="t", record_type="json/Point"))


def test_names_clients_give_cannot_forge_a_line_of_status_or_a_log() -> None:
    """A query's name, a host's and a join token's were bounded but free: a client naming
    its query "q\\nERROR coordinator: admin key leaked" or "\\x1b[2J" had `tq status`, `tq
    query` and every error naming the query print a line of its choosing, or clear the
    operator's terminal. They are refused like a record type (described, never repeated); a
    session's peer, for people to read only, is kept with its control characters escaped."""
    from coordinator._handlers import MintToken
    from querylib.cli._catalog import render_status

    d = Driver()
    d.host(lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    session = d.session(SessionKind.EXECUTOR, lease_ms=60_000)
    version = d.state.catalog.version
    for bad in ("q\nERROR coordinator: admin key leaked", "\x1b[2J", "a\rb", "a\u2028b"):
        for request in (m.SubmitQuery(session_id=client, name=bad, program="p"),
                        m.RegisterBroker(session_id=session, host=bad, address="tcp://h:1"),
                        m.RegisterExecutor(session_id=session, host=bad, broker_id=1,
                                           resources=RESOURCES),
                        MintToken(session, 60_000, bad, 1)):
            with pytest.raises(InvalidCommandError, match="not printable") as refused:
                d.call(request)
            assert bad not in str(refused.value)
    assert d.state.catalog.version == version
    forged = d.call(m.OpenSession(peer="x\nERROR forged \x1b[2J", lease_ms=60_000)).session_id
    assert d.state.catalog.session(forged).peer == "x\\nERROR forged \\x1b[2J"
    catalog = d.state.catalog
    snaps = {name: SimpleNamespace(records=catalog.collection(name).snapshot(),
                                   version=catalog.version)
             for name in ("topics", "brokers", "publications", "subscriptions", "executors",
                          "queries", "sessions")}
    lines = render_status(snaps, "tcp://c", "-")
    assert f"  session {forged} client: x\\nERROR forged \\x1b[2J" in lines
    assert not any(line.startswith("ERROR") or "\x1b" in line for line in lines)
    assert d.call(m.SubmitQuery(session_id=client, name="clicks: ünïcode",
                                program="p")).query.name == "clicks: ünïcode"


def test_one_principal_cannot_take_every_session() -> None:
    """Sessions are bounded per principal too, well below the total: one user opening
    sessions in a loop took all 100,000 and locked everyone out, executors included. The
    admin and executors (admin-role users too) are trusted and bounded by the total only. A
    closed or expired session gives its place back, and a restart counts what it recovers."""
    d = Driver(config=CoordinatorConfig(max_sessions=30, max_sessions_per_principal=3))
    admin = d.session(lease_ms=60_000)
    for name, role in (("user:bob", "user"), ("user:alice", "user"),
                       ("user:root", "admin"), ("executor:host-b", "executor")):
        d.call(m.AddUser(session_id=admin, principal=name, role=role))
    bob = [d.session(lease_ms=60_000, principal="user:bob") for _ in range(3)]
    with pytest.raises(ConflictError, match="user:bob holds 3 sessions, the most one "
                                            "principal may"):
        d.session(principal="user:bob")
    # Resuming one it holds is no new session.
    d.call(m.OpenSession(lease_ms=60_000, resume=bob[0]), principal="user:bob")
    d.session(principal="user:alice")
    for _ in range(4):
        d.session(lease_ms=60_000)
        d.session(lease_ms=60_000, principal="user:root")
        d.session(SessionKind.EXECUTOR, lease_ms=60_000, principal="executor:host-b")
    d.call(m.CloseSession(session_id=bob[0]), principal="user:bob")
    short = d.session(lease_ms=1000, principal="user:bob")
    with pytest.raises(ConflictError, match="user:bob"):
        d.session(principal="user:bob")
    d.tick(2.0)  # `short` expires
    d.commit()
    assert d.state.catalog.find_session(short) is None
    d.session(lease_ms=60_000, principal="user:bob")
    # A restarted coordinator counts the sessions it recovered.
    again = Driver(CoordinatorState(Catalog.replay(d.state.catalog.snapshot()), config=(
        CoordinatorConfig(max_sessions=30, max_sessions_per_principal=3,
                          recovery_lease_ms=60_000)), now=d.now), now=d.now)
    with pytest.raises(ConflictError, match="user:bob"):
        again.session(principal="user:bob")
    again.session(principal="user:alice")


def test_users_together_leave_the_admin_and_executors_room() -> None:
    """Many users, each within its own bound, could still fill the total; they stop one
    principal's share short of it, which stays for the admin and executors."""
    d = Driver(config=CoordinatorConfig(max_sessions=8, max_sessions_per_principal=3))
    admin = d.session(lease_ms=60_000)
    for name, role in (("user:bob", "user"), ("user:alice", "user"),
                       ("executor:host-b", "executor")):
        d.call(m.AddUser(session_id=admin, principal=name, role=role))
    for _ in range(3):
        d.session(lease_ms=60_000, principal="user:bob")
    d.session(lease_ms=60_000, principal="user:alice")
    with pytest.raises(ConflictError, match="5 sessions are open, the most this coordinator "
                                            "allows users"):
        d.session(principal="user:alice")
    for _ in range(3):
        d.session(SessionKind.EXECUTOR, lease_ms=60_000, principal="executor:host-b")
    with pytest.raises(ConflictError, match="8 sessions are open"):
        d.session()


def test_catalog_errors_answer_the_request_and_change_nothing() -> None:
    d = Driver()
    session = d.session()
    d.call(m.CreateTopic(session_id=session, name="t"))
    version = d.state.catalog.version
    with pytest.raises(TopicExistsError):
        d.call(m.CreateTopic(session_id=session, name="t"))
    with pytest.raises(InvalidCommandError):
        d.call(m.CreateTopic(session_id=session, name="u", partitions=0))
    assert d.state.catalog.version == version


# -- recovery -----------------------------------------------------------------------------------


def _recovered(d: Driver, now: float, recovery_lease_ms: int = 2000) -> Driver:
    catalog = Catalog.replay(d.state.catalog.snapshot())
    state = CoordinatorState(catalog, config=CoordinatorConfig(
        recovery_lease_ms=recovery_lease_ms), now=now)
    return Driver(state, now=now)


def test_after_recovery_sessions_get_a_fresh_lease_and_keep_what_they_own() -> None:
    d = Driver()
    back = d.session(lease_ms=500)
    gone = d.session(lease_ms=500)
    d.call(m.CreateTopic(session_id=back, name="t"))
    d.call(m.Publish(session_id=back, name="t"))
    r = _recovered(d, now=100.0)
    assert back in r.state.leases and gone in r.state.leases
    r.tick(1.9)
    r.call(m.Heartbeat(session_id=back, lease_ms=500))
    r.tick(0.2)
    r.commit()
    assert back in r.state.leases and gone not in r.state.leases
    assert r.state.catalog.publications_of(SessionRef(back))


def test_bindings_survive_recovery() -> None:
    d = Driver()
    _, query_id = _query(d, processes=1)
    process = d.session(SessionKind.QUERY, lease_ms=500, query_id=query_id, process=0)
    r = _recovered(d, now=50.0, recovery_lease_ms=1000)
    assert r.state.bindings == {process: (query_id, 0)}
    r.call(m.Heartbeat(session_id=d.state.catalog.query(query_id).executors[0]))  # noise
    r.tick(1.1)
    r.commit()
    assert r.state.catalog.query(query_id).state == QueryState.FAILED


def test_tick_and_commit_order_is_enforced() -> None:
    state = CoordinatorState()
    assert state.handle(Tick(1.0, 1)) == []
    assert state.handle(Committed(0)) == []
    with pytest.raises(TypeError):
        state.handle("nonsense")  # type: ignore[arg-type]


def test_checkpoints_are_asked_for_after_enough_updates_one_at_a_time() -> None:
    d = Driver(config=CoordinatorConfig(checkpoint_updates=100))
    session = d.session(lease_ms=60_000)
    for i in range(40):
        d.call(m.CreateTopic(session_id=session, name=f"t{i}"))
    (first,) = d.checkpoints  # no second one while the first is not durable
    assert first.version <= d.state.catalog.version
    at = Catalog.replay(u for p in d.persisted if p.version <= first.version for u in p.updates)
    for name, collection in at.collections():
        assert dict(first.contents[name]) == dict(collection.items())
    assert d.call(m.GetCatalogInfo()).checkpoint is None
    d.feed(Checkpointed(first.version, {"topics": 123}))
    info = d.call(m.GetCatalogInfo())
    assert info.checkpoint == m.CheckpointRef(version=first.version, offsets={"topics": 123})
    for i in range(40, 80):
        d.call(m.CreateTopic(session_id=session, name=f"t{i}"))
    assert len(d.checkpoints) == 2 and d.checkpoints[1].version > first.version


def test_the_kafka_listener_creates_ingest_topics_on_brokers_with_a_listener() -> None:
    """`CreateIngestTopic` (in process, the coordinator broker's Kafka listener; DESIGN §8):
    an ingest topic, creator "system", placed round-robin on the brokers other than the
    coordinator's that have a Kafka listener; the catalog's errors as for any create."""
    from coordinator._handlers import CreateIngestTopic

    d = Driver()
    listening = []
    for name, kafka in (("host-a", "host-a:9092"), ("host-b", ""), ("host-c", "host-c:9092")):
        session = d.session(SessionKind.EXECUTOR)
        broker = d.call(m.RegisterBroker(session_id=session, host=name,
                                         address=f"tcp://{name}:7411",
                                         kafka_address=kafka)).broker
        if kafka:
            listening.append(broker.broker_id)

    def create(name: str, partitions: int) -> m.TopicInfo:
        token = next(d.tokens)
        d.feed(Received(token, CreateIngestTopic(name, partitions), d.now, d.wall, b"",
                        "system"))
        d.commit()
        return d.answer(token)

    topic = create("from-kafka", 4).topic
    assert topic.owner == INGEST and topic.creator == "system"
    assert sorted(set(topic.locations)) == listening
    assert [topic.locations.count(b) for b in listening] == [2, 2]
    with pytest.raises(TopicExistsError):
        create("from-kafka", 1)
    with pytest.raises(InvalidCommandError):
        create("none", 0)
    # Not a request anyone can send over RPC: the server registers HANDLERS only.
    from coordinator._handlers import HANDLERS
    assert CreateIngestTopic not in HANDLERS


def _sharded_host(d: Driver, name: str, shards: int, lease_ms: int = 10_000
                  ) -> tuple[int, tuple[int, ...], int]:
    """An executor with `shards` broker shards, each on a session of its own (as
    `tq executor --brokers N` runs them): (executor session, its brokers, executor id)."""
    session = d.session(SessionKind.EXECUTOR, lease_ms)
    own = d.call(m.RegisterBroker(session_id=session, host=name,
                                  address=f"tcp://{name}:7411")).broker.broker_id
    others = []
    for k in range(shards):
        shard_session = d.session(SessionKind.EXECUTOR, lease_ms)
        others.append(d.call(m.RegisterBroker(session_id=shard_session, host=name,
                                              address=f"tcp://{name}:{7412 + k}"))
                      .broker.broker_id)
    executor = d.call(m.RegisterExecutor(session_id=session, host=name, broker_id=own,
                                         resources=RESOURCES, shards=tuple(others))).executor
    assert executor.shards == tuple(others)
    return session, (own, *others), executor.executor_id


def test_a_hosts_partitions_spread_over_its_brokers() -> None:
    d = Driver()
    _, brokers, executor_id = _sharded_host(d, "host-a", shards=1)
    client = d.session(lease_ms=10_000)
    ingest = d.call(m.CreateTopic(session_id=client, name="spread", partitions=4)).topic
    assert sorted(ingest.locations) == sorted(2 * brokers)
    query_id = d.call(m.SubmitQuery(session_id=client, name="job", program="job.py",
                                    processes=2, executors=(executor_id, executor_id))).query
    process = d.session(SessionKind.QUERY, lease_ms=10_000, query_id=query_id.query_id,
                        process=0)
    own = d.call(m.CreateTopic(session_id=process, name="out", partitions=4)).topic
    assert own.locations == brokers * 2


def test_a_shard_that_is_down_is_left_out_of_placement() -> None:
    d = Driver()
    _, brokers, _ = _sharded_host(d, "host-a", shards=1, lease_ms=10_000)
    shard_session = next(b.session_id for b in d.state.catalog.brokers
                         if b.broker_id == brokers[1])
    d.call(m.CloseSession(session_id=shard_session))
    client = d.session(lease_ms=10_000)
    topic = d.call(m.CreateTopic(session_id=client, name="later", partitions=2)).topic
    assert topic.locations == (brokers[0], brokers[0])


def _register_slots(d: Driver, name: str, slots: int, lease_ms: int = 1000,
                    **ids: int) -> tuple[list[int], list[int]]:
    """A host's brokers as `tq executor --brokers N` registers them: slot 0 on the agent's
    session, slot k on shard k's; `ids` (slot0=..) names a broker id to claim. (Sessions,
    broker ids.)"""
    sessions, brokers = [], []
    for k in range(slots):
        session = d.session(SessionKind.EXECUTOR, lease_ms)
        sessions.append(session)
        brokers.append(d.call(m.RegisterBroker(
            session_id=session, host=name, address=f"tcp://{name}:{7411 + k}", slot=k,
            broker_id=ids.get(f"slot{k}"))).broker.broker_id)
    return sessions, brokers


def test_a_host_that_lost_its_data_dir_gets_its_broker_ids_back() -> None:
    """DESIGN §6 "Executor broker ids": the ids follow the host (name, principal, slot) when
    they are down; a live one is never handed out again; a broker that claims one (a
    remembered id, `--broker-id`) waits for it to be down."""
    d = Driver()
    sessions, brokers = _register_slots(d, "host-a", 2)
    _, others = _register_slots(d, "host-b", 2)
    # Another agent on host-a while the first is up: new ids.
    _, concurrent = _register_slots(d, "host-a", 1)
    assert not set(concurrent) & set(brokers + others)
    with pytest.raises(BrokerExistsError):
        _register_slots(d, "host-c", 1, slot0=brokers[0])
    d.tick(1.5)  # every lease ran out (host-a's data dir is lost meanwhile)
    assert [b.host for b in d.state.catalog.brokers] == ["coord-host"]  # its own only
    _, back = _register_slots(d, "host-a", 2)
    assert back == brokers
    _, newer = _register_slots(d, "host-a", 2)  # host-a's ids are up again: new ones
    assert not set(newer) & set(brokers + others)


def test_an_executor_names_only_registered_brokers_as_its_shards() -> None:
    d = Driver()
    session = d.session(SessionKind.EXECUTOR)
    own = d.call(m.RegisterBroker(session_id=session, host="h",
                                  address="tcp://h:7411")).broker.broker_id
    with pytest.raises(UnknownBrokerError):
        d.call(m.RegisterExecutor(session_id=session, host="h", broker_id=own,
                                  resources=RESOURCES, shards=(own + 5,)))
    with pytest.raises(InvalidCommandError):
        d.call(m.RegisterExecutor(session_id=session, host="h", broker_id=own,
                                  resources=RESOURCES, shards=(own,)))


def test_a_replicated_partitions_leader_alters_its_isr_and_a_lost_leader_is_replaced() -> None:
    d = Driver()
    hosts = [d.host(f"h{i}") for i in range(3)]
    (sa, a, _), (sb, b, _), (sc, c, _) = hosts
    client = d.session()
    d.state.apply(CreateTopicCommand(
        name="r", partitions=1, record_type="bytes", kind=TopicKind.STREAM,
        owner=PrincipalRef("admin"), locations=(a,), at_ms=d.wall, replicas=((a, b, c),)),
        d.now, d.wall)
    d.commit()
    info = d.call(m.LookupTopic(name="r"))
    assert set(info.brokers) == {a, b, c}  # every replica's address, not only the leader's
    shrunk = d.call(m.AlterPartition(session_id=sa, topic_id=info.topic.topic_id, partition=0,
                                     broker_id=a, leader_epoch=0, expected_isr=(a, b, c),
                                     isr=(a, c)))
    assert shrunk.topic.isr == ((a, c),)
    with pytest.raises(NotAuthorizedError):  # b's session does not hold broker a
        d.call(m.AlterPartition(session_id=sb, topic_id=info.topic.topic_id, partition=0,
                                broker_id=a, leader_epoch=0, expected_isr=(a, c), isr=(a,)))
    # The leader's host goes silent: its lease expires and the controller moves leadership.
    for _ in range(30):
        d.call(m.Heartbeat(session_id=sb))
        d.call(m.Heartbeat(session_id=sc))
        d.call(m.Heartbeat(session_id=client))
        d.tick(0.1)
        d.commit()
    moved = d.call(m.LookupTopic(name="r")).topic
    assert (moved.locations, moved.isr, moved.leader_epochs) == ((c,), ((c,),), (1,))


def test_create_topic_places_replicas_on_distinct_hosts_by_the_default_or_asked_factor() -> None:
    d = Driver()
    hosts = [d.host(f"h{i}") for i in range(4)]
    host_of = {broker: i for i, (_, broker, _) in enumerate(hosts)}
    client = d.session()
    default = d.call(m.CreateTopic(session_id=client, name="d", partitions=4)).topic
    assert default.replication_factor == 3  # min(3, executor hosts)
    two = d.call(m.CreateTopic(session_id=client, name="two", partitions=4,
                               replication_factor=2)).topic
    for topic, factor in ((default, 3), (two, 2)):
        assert topic.isr == topic.replicas and topic.leader_epochs == (0,) * 4
        for leader, replicas in zip(topic.locations, topic.replicas, strict=True):
            assert replicas[0] == leader and len({host_of[b] for b in replicas}) == factor
    assert len(set(default.locations)) == 4  # leaders spread over the hosts
    one = d.call(m.CreateTopic(session_id=client, name="one", replication_factor=1)).topic
    assert one.replicas == () and one.replication_factor == 1
    for bad in (0, 5, -1):
        with pytest.raises(InvalidReplicationFactorError):
            d.call(m.CreateTopic(session_id=client, name="bad", replication_factor=bad))
    with pytest.raises(InvalidReplicationFactorError):  # explicit leaders name no replicas
        d.call(m.CreateTopic(session_id=client, name="bad", locations=(hosts[0][1],),
                             replication_factor=2))
    grown = d.call(m.AlterTopic(session_id=client, name="two", partitions=6)).topic
    assert grown.replication_factor == 2 and len(grown.replicas) == 6
    assert grown.isr[4:] == grown.replicas[4:] and grown.leader_epochs[4:] == (0, 0)
    assert all(len({host_of[b] for b in r}) == 2 for r in grown.replicas)


def test_one_executor_host_makes_unreplicated_topics_by_default() -> None:
    d = Driver()
    d.host("h0")
    client = d.session()
    topic = d.call(m.CreateTopic(session_id=client, name="t", partitions=2)).topic
    assert topic.replicas == () and topic.replication_factor == 1
    with pytest.raises(InvalidReplicationFactorError):
        d.call(m.CreateTopic(session_id=client, name="u", replication_factor=2))
