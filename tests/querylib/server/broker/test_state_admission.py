"""Admission in the broker's pure core (DESIGN §5 "Admission"): a producer opens only where
the topic's writers rule admits its session's principal, on a partition the broker hosts or
may open, on a stream that has not ended unless it reopens it. Rules the core does not have
are asked for (ResolveTopic), partitions it may host are opened (OpenPartition), and the
requests wait meanwhile."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.errors import UnknownTopicError
from querylib.broker._errors import (
    BrokerProtocolError,
    NotProducerError,
    PartitionNotHereError,
    PrincipalError,
    StreamEndedError,
    TopicAuthorizationError,
    UnknownPartitionError,
)
from querylib.broker.messages import Produced, ProducerOpened
from querylib.errors import StorageError
from querylib.server.broker._events import (
    CloseSession,
    EndStream,
    OpenProducer,
    OpenSession,
    PartitionOpenFailed,
    Produce,
    ResolveTopic,
    TopicAccess,
    TopicForgotten,
    TopicResolved,
)
from querylib.server.broker._state import BrokerLimits

from ._sim import Sim, fake_batch

P = ("t", 0)


def session(sim: Sim, name: str, principal: str = "admin") -> None:
    sim.feed(OpenSession(f"open-{name}", name, 10.0, principal))
    assert not isinstance(sim.replies[f"open-{name}"], Exception)


def test_a_topic_without_a_rule_is_asked_about_and_its_writers_wait() -> None:
    sim = Sim()
    sim.open_partition(P, writers=None)
    session(sim, "a", "query:7")
    session(sim, "b", "query:7")
    sim.feed(OpenProducer("a1", "a", P))
    sim.feed(OpenProducer("b1", "b", P))
    assert sim.asks == [ResolveTopic(1, "t", 0, False)]  # one question for both
    assert "a1" not in sim.replies and "b1" not in sim.replies
    sim.feed(TopicResolved(1, access=TopicAccess("t", "query:7")))
    assert isinstance(sim.replies["a1"], ProducerOpened)
    assert isinstance(sim.replies["b1"], ProducerOpened)
    assert sim.state.rule_of("t") == TopicAccess("t", "query:7")


def test_the_rule_admits_its_owner_only() -> None:
    sim = Sim()
    sim.open_partition(P, writers="query:7")
    for name, principal in [("owner", "query:7"), ("other", "query:8"), ("admin", "admin"),
                            ("anon", "anonymous"), ("bob", "user:bob")]:
        session(sim, name, principal)
        sim.feed(OpenProducer(f"{name}-open", name, P))
    assert isinstance(sim.replies["owner-open"], ProducerOpened)
    # A refusal is checked against the directory once more (the rule may be stale): one
    # question for all of them, and the same answer refuses them.
    assert sim.asks == [ResolveTopic(1, "t", 0, False)]
    assert not any(f"{name}-open" in sim.replies for name in ["other", "admin", "anon", "bob"])
    sim.feed(TopicResolved(1, access=TopicAccess("t", "query:7")))
    for name in ["other", "admin", "anon", "bob"]:
        error = sim.replies[f"{name}-open"]
        assert isinstance(error, TopicAuthorizationError), name
        assert error.kafka_error_code == 29 and "may not write" in str(error)
    # refused producers hold nothing: their produce is not a producer's
    sim.feed(Produce("p", "admin", P, fake_batch()))
    assert isinstance(sim.replies["p"], NotProducerError)


def test_a_stale_rule_does_not_refuse_the_topics_new_owner() -> None:
    """Re-running: the catalog gave the topic to query 8 (its owner query 7 ended); a broker
    that has not followed that change yet asks before refusing query 8's writer."""
    sim = Sim()
    sim.open_partition(P, writers="query:7")
    session(sim, "new", "query:8")
    sim.feed(OpenProducer("new-open", "new", P))
    assert "new-open" not in sim.replies
    assert sim.asks == [ResolveTopic(1, "t", 0, False)]
    sim.feed(TopicResolved(1, access=TopicAccess("t", "query:8")))
    assert isinstance(sim.replies["new-open"], ProducerOpened)
    assert sim.state.rule_of("t") == TopicAccess("t", "query:8")
    # The old owner is refused by the new rule, after asking once.
    session(sim, "old", "query:7")
    sim.feed(OpenProducer("old-open", "old", P))
    sim.feed(TopicResolved(2, access=TopicAccess("t", "query:8")))
    assert isinstance(sim.replies["old-open"], TopicAuthorizationError)


def test_an_ingest_topic_admits_anyone() -> None:
    sim = Sim()
    sim.open_partition(P, writers="*")
    for name, principal in [("admin", "admin"), ("anon", "anonymous"), ("q", "query:1")]:
        session(sim, name, principal)
        sim.feed(OpenProducer(f"{name}-open", name, P))
        assert isinstance(sim.replies[f"{name}-open"], ProducerOpened)


def test_system_topics_are_tq_s_own_by_their_name() -> None:
    sim = Sim()
    logs = ("__logs", 0)
    sim.open_partition(logs, writers="*")  # whatever a directory says: the name decides
    session(sim, "admin", "admin")
    session(sim, "anon", "anonymous")
    session(sim, "sys", "system")
    sim.feed(OpenProducer("admin-open", "admin", logs))
    sim.feed(OpenProducer("anon-open", "anon", logs))
    sim.feed(OpenProducer("sys-open", "sys", logs))
    sim.feed(OpenProducer("sys-new", "sys", ("__catalog.topics", 0)))
    assert isinstance(sim.replies["admin-open"], TopicAuthorizationError)
    assert "internal" in str(sim.replies["anon-open"])
    assert isinstance(sim.replies["sys-open"], ProducerOpened)
    assert sim.asks == []  # never asked about
    assert [o.partition for o in sim.opens] == [("__catalog.topics", 0)]


def test_a_partition_placed_here_is_opened_for_its_writer() -> None:
    sim = Sim()
    session(sim, "a", "query:1")
    sim.feed(TopicAccess("t", "query:1", partitions=3, here=(0, 2)))
    sim.feed(OpenProducer("open-0", "a", ("t", 0)))
    sim.feed(OpenProducer("again-0", "a", ("t", 0)))  # while it opens
    assert [o.partition for o in sim.opens] == [("t", 0)]
    sim.feed(OpenProducer("open-1", "a", ("t", 1)))
    sim.feed(OpenProducer("open-5", "a", ("t", 5)))
    assert isinstance(sim.replies["open-1"], PartitionNotHereError)
    assert sim.replies["open-1"].kafka_error_code == 6 and sim.replies["open-1"].retriable
    assert isinstance(sim.replies["open-5"], UnknownPartitionError)
    assert "open-0" not in sim.replies
    sim.complete_open()
    assert isinstance(sim.replies["open-0"], ProducerOpened)
    assert isinstance(sim.replies["again-0"], ProducerOpened)
    # A placed partition exists: it opens without `create`.
    sim.feed(OpenProducer("open-2", "a", ("t", 2), create=False))
    sim.feed(PartitionOpenFailed(("t", 2), StorageError("disk full")))
    assert isinstance(sim.replies["open-2"], StorageError)


def test_without_placements_only_a_creating_writer_opens_a_partition() -> None:
    sim = Sim()
    session(sim, "a")
    sim.feed(TopicAccess("t", "*"))  # a standalone broker's rule: anyone, anywhere
    sim.feed(OpenProducer("plain", "a", ("t", 4), create=False))
    assert isinstance(sim.replies["plain"], UnknownPartitionError)
    sim.feed(OpenProducer("creating", "a", ("t", 4)))
    assert [o.partition for o in sim.opens] == [("t", 4)]


def test_a_refusal_of_the_directory_fails_the_waiting_writers_only() -> None:
    sim = Sim()
    session(sim, "a")
    sim.feed(OpenProducer("plain", "a", ("new", 0)))
    sim.feed(OpenProducer("creating", "a", ("new", 0), create_topic=True))
    assert [(q.topic, q.create) for q in sim.asks] == [("new", False), ("new", True)]
    sim.feed(TopicResolved(sim.asks[0].ask, error=UnknownTopicError("no topic 'new'")))
    assert isinstance(sim.replies["plain"], UnknownTopicError)
    assert "creating" not in sim.replies
    sim.feed(TopicResolved(sim.asks[1].ask, access=TopicAccess("new", "*", 1, (0,))))
    sim.complete_open()
    assert isinstance(sim.replies["creating"], ProducerOpened)
    sim.feed(TopicResolved(sim.asks[0].ask, error=UnknownTopicError("late")))  # stale: no-op


def test_the_directory_changes_rules_and_forgets_topics() -> None:
    sim = Sim()
    sim.open_partition(P, writers="query:1")
    session(sim, "q2", "query:2")
    sim.feed(OpenProducer("before", "q2", P))
    sim.feed(TopicResolved(sim.asks[-1].ask, access=TopicAccess("t", "query:1")))
    assert isinstance(sim.replies["before"], TopicAuthorizationError)
    sim.feed(TopicAccess("t", "query:2"))  # deleted and made again, by query 2
    sim.feed(OpenProducer("after", "q2", P))
    assert isinstance(sim.replies["after"], ProducerOpened)
    sim.feed(TopicForgotten("t"))
    session(sim, "q3", "query:3")
    sim.feed(OpenProducer("forgotten", "q3", P))
    assert [a.topic for a in sim.asks] == ["t", "t"] and "forgotten" not in sim.replies


def test_writing_after_the_end_of_a_stream_needs_an_explicit_reopen() -> None:
    sim = Sim()
    sim.open_partition(P, writers="*")
    session(sim, "a")
    sim.feed(OpenProducer("open", "a", P))
    sim.feed(EndStream("end", "a", P))
    assert sim.controls(P) == [("E", None)]
    assert sim.state.partition_info(P).ended
    session(sim, "b")
    sim.feed(OpenProducer("late", "b", P))
    error = sim.replies["late"]
    assert isinstance(error, StreamEndedError) and error.kafka_error_code == 44
    assert "reopen" in str(error)
    sim.feed(OpenProducer("reopen", "b", P, reopen=True))
    assert isinstance(sim.replies["reopen"], ProducerOpened)
    sim.feed(Produce("data", "b", P, fake_batch()))
    assert sim.controls(P) == [("E", None), ("R", None), None]  # the end is superseded
    info = sim.state.partition_info(P)
    assert not info.ended and info.log_end == 3
    assert sim.replies["data"] == Produced(base_offset=2, next_offset=3)


def test_a_recovered_end_holds_after_a_restart() -> None:
    sim = Sim()
    sim.open_partition(P, writers="*", frontier=4, ended=True)
    session(sim, "a")
    sim.feed(OpenProducer("late", "a", P, rejoin=True))
    assert isinstance(sim.replies["late"], StreamEndedError)


def test_a_session_states_a_principal_once() -> None:
    sim = Sim()
    sim.feed(OpenSession("bad", "s", 10.0, "root"))
    assert isinstance(sim.replies["bad"], PrincipalError)
    sim.feed(OpenSession("ok", "s", 10.0, "query:3"))
    sim.feed(OpenSession("renew", "s", 10.0, "query:3"))
    sim.feed(OpenSession("switch", "s", 10.0, "query:4"))
    assert not isinstance(sim.replies["renew"], Exception)
    assert isinstance(sim.replies["switch"], PrincipalError)


def test_waiting_writers_are_bounded() -> None:
    sim = Sim(BrokerLimits(max_parked=2))
    session(sim, "a")
    for i in range(3):
        sim.feed(OpenProducer(f"o{i}", "a", (f"t{i}", 0)))
    assert isinstance(sim.replies["o2"], BrokerProtocolError)
    assert len(sim.asks) == 2
    sim.feed(TopicResolved(sim.asks[0].ask, error=UnknownTopicError("no")))
    sim.feed(OpenProducer("o3", "a", ("t3", 0)))
    assert "o3" not in sim.replies  # room again


@pytest.mark.parametrize("principal", ["admin", "anonymous", "system", "user:ann",
                                       "executor:host-1", "query:12"])
def test_the_principals_of_the_contract_are_accepted(principal: str) -> None:
    sim = Sim()
    sim.feed(OpenSession("o", "s", 10.0, principal))
    assert not isinstance(sim.replies["o"], Exception)


PRINCIPALS = {"s1": "query:1", "s2": "query:2", "s3": "admin"}
steps = st.lists(st.one_of(
    st.tuples(st.just("rule"), st.sampled_from(["*", "query:1", "query:2"])),
    st.tuples(st.just("open"), st.sampled_from(sorted(PRINCIPALS)), st.booleans()),
    st.tuples(st.just("end"), st.sampled_from(sorted(PRINCIPALS))),
    st.tuples(st.just("produce"), st.sampled_from(sorted(PRINCIPALS)))), max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_every_answer_is_what_the_rules_say(ops: list) -> None:
    """Against a model: an open is admitted iff the rule in force admits the principal and
    the stream is open (or reopened); a produce is accepted iff the session produces; the
    stream ends when its last producer ends and only a reopening goes on after that."""
    sim = Sim()
    sim.open_partition(P, writers="*")
    for name, principal in PRINCIPALS.items():
        session(sim, name, principal)
    rule, ended, producing = "*", False, set()
    for i, (kind, *args) in enumerate(ops):
        token = f"{i}-{kind}"
        if kind == "rule":
            rule = args[0]
            sim.feed(TopicAccess("t", rule))
            continue
        name = args[0]
        if kind == "open":
            asked = len(sim.asks)
            sim.feed(OpenProducer(token, name, P, reopen=args[1]))
            admitted = rule == "*" or rule == PRINCIPALS[name]
            if not admitted:
                # A refusal asks the directory once more, which says the same.
                assert len(sim.asks) == asked + 1 and token not in sim.replies
                sim.feed(TopicResolved(sim.asks[-1].ask, access=TopicAccess("t", rule)))
                assert isinstance(sim.replies[token], TopicAuthorizationError)
            elif ended and not args[1]:
                assert isinstance(sim.replies[token], StreamEndedError)
            else:
                assert isinstance(sim.replies[token], ProducerOpened)
                producing.add(name)
                ended = False
        elif kind == "end":
            sim.feed(EndStream(token, name, P))
            if name in producing:
                producing.discard(name)
                ended = ended or not producing
            else:
                assert isinstance(sim.replies[token], NotProducerError)
        else:
            sim.feed(Produce(token, name, P, fake_batch()))
            if name not in producing:
                assert isinstance(sim.replies[token], NotProducerError)
        sim.controls(P)  # every append lands and is durable
        if kind == "produce" and name in producing:
            assert isinstance(sim.replies[token], Produced)
        assert sim.state.partition_info(P).ended == ended
        assert set(sim.state.partitions[P].frontier.producers) == producing


def test_one_principal_cannot_take_every_session() -> None:
    """Sessions are bounded per principal too (below the broker's total), so one user, or
    every connector stream writing as anonymous, cannot leave the broker none for the rest;
    tq's own principals and the admin are bounded by the total only. A closed session gives
    its place back."""
    sim = Sim(BrokerLimits(max_sessions=8, max_sessions_per_principal=3))
    for i in range(4):
        sim.feed(OpenSession(f"bob{i}", f"b{i}", 10.0, "user:bob"))
    assert isinstance(sim.replies["bob3"], BrokerProtocolError)
    assert "user:bob" in str(sim.replies["bob3"])
    sim.feed(OpenSession("renew", "b0", 10.0, "user:bob"))  # a renewal is no new session
    assert not isinstance(sim.replies["renew"], Exception)
    sim.feed(OpenSession("alice", "a", 10.0, "user:alice"))
    assert not isinstance(sim.replies["alice"], Exception)
    for i in range(4):
        sim.feed(OpenSession(f"admin{i}", f"s{i}", 10.0, "admin"))
        assert not isinstance(sim.replies[f"admin{i}"], Exception)
    sim.feed(CloseSession("close", "b0"))
    sim.feed(OpenSession("bob-again", "b9", 10.0, "user:bob"))
    assert not isinstance(sim.replies["bob-again"], Exception)
