"""The catalog's rules, one behaviour at a time: ids, ownership, cascades, replay, refusals."""

from __future__ import annotations

import msgspec
import pytest

from catalog import (
    INGEST,
    SYSTEM,
    AddUser,
    AlreadyPublishedError,
    BrokerExistsError,
    BrokerInUseError,
    Catalog,
    CatalogError,
    CloseSession,
    CorruptCatalogError,
    Counters,
    CreateTopic,
    DeleteTopic,
    InvalidCommandError,
    InvalidPartitionsError,
    InvalidTopicNameError,
    NotOwnerError,
    NotPublishedError,
    OpenSession,
    PartitionsDropped,
    ProcessAlreadyExitedError,
    ProcessExited,
    Publication,
    Publish,
    QueryEndedError,
    QueryRef,
    QueryState,
    RecordTypeMismatchError,
    RegisterBroker,
    RemoveBroker,
    RemoveExecutor,
    ReservedTopicNameError,
    SessionExpired,
    SessionKind,
    SessionRef,
    StartQuery,
    SubmitQuery,
    Subscribe,
    Subscription,
    TopicExistsError,
    TopicKind,
    UnknownBrokerError,
    UnknownCollectionError,
    UnknownExecutorError,
    UnknownQueryError,
    UnknownSessionError,
    UnknownTopicError,
    Unpublish,
    Update,
    UserError,
    catalog_topic,
)
from tests.catalog._helpers import add_user, create_topic, host, open_session, submit


def test_empty_catalog() -> None:
    catalog = Catalog()
    assert catalog.version == 0
    assert catalog.snapshot() == []
    assert Catalog.replay([]) == catalog
    catalog.check_invariants()


def test_each_change_is_one_version_and_carries_the_counters() -> None:
    catalog = Catalog()
    first = catalog.apply(OpenSession(kind=SessionKind.CLIENT, peer="cli", at_ms=10))
    assert first.version == catalog.version == 1
    assert first.updates == (
        Update("sessions", first.created, 1),
        Update("counters", Counters(version=1, next_session_id=2), 1),
    )
    second = catalog.apply(OpenSession(kind=SessionKind.CLIENT, peer="cli", at_ms=11))
    assert second.version == 2
    assert second.created.session_id == 2
    # Retractions come first, so a reader never holds two counters records.
    assert [u.diff for u in second.updates] == [-1, 1, 1]


def test_ids_are_never_reused_even_after_compaction() -> None:
    catalog = Catalog()
    session, broker, executor = host(catalog)
    catalog.apply(SessionExpired(session_id=session.session_id, at_ms=5))
    assert len(catalog.executors) == len(catalog.brokers) == len(catalog.sessions) == 0
    # Recover from a compacted snapshot: nothing but the counters record says which ids went.
    recovered = Catalog.replay(catalog.snapshot())
    assert recovered == catalog
    # Another host: a broker id goes back only to its own host (test_broker_homes.py).
    again_session, again_broker, again_executor = host(recovered, "host-b")
    assert again_session.session_id > session.session_id
    assert again_broker.broker_id > broker.broker_id
    assert again_executor.executor_id > executor.executor_id
    # Its own host gets its id back: where it was registered survives compaction too.
    assert host(recovered)[1].broker_id == broker.broker_id


def test_query_lifecycle_and_exit_codes() -> None:
    catalog = Catalog()
    _, _, executor = host(catalog)
    query = submit(catalog, (executor.executor_id,) * 2)
    assert query.state is QueryState.SUBMITTED
    assert query.exit_codes == (None, None)
    catalog.apply(StartQuery(query_id=query.query_id, at_ms=20))
    catalog.apply(ProcessExited(query_id=query.query_id, process=1, exit_code=0, at_ms=30))
    assert catalog.query(query.query_id).state is QueryState.RUNNING
    with pytest.raises(ProcessAlreadyExitedError, match="process 1 of query 1 exited already"):
        catalog.apply(ProcessExited(query_id=query.query_id, process=1, exit_code=0, at_ms=31))
    with pytest.raises(InvalidCommandError, match="has processes 0..1, not 2"):
        catalog.apply(ProcessExited(query_id=query.query_id, process=2, exit_code=0, at_ms=31))
    catalog.apply(ProcessExited(query_id=query.query_id, process=0, exit_code=0, at_ms=40))
    done = catalog.query(query.query_id)
    assert done.state is QueryState.FINISHED
    assert (done.started_at_ms, done.ended_at_ms, done.exit_codes) == (20, 40, (0, 0))


def test_a_failing_process_fails_the_query_and_later_exits_are_recorded() -> None:
    catalog = Catalog()
    _, _, executor = host(catalog)
    query = submit(catalog, (executor.executor_id,) * 3)
    catalog.apply(StartQuery(query_id=query.query_id, at_ms=20))
    catalog.apply(ProcessExited(query_id=query.query_id, process=0, exit_code=3, at_ms=30))
    failed = catalog.query(query.query_id)
    assert failed.state is QueryState.FAILED
    assert failed.reason == "process 0 exited with code 3"
    # The coordinator terminates the others; their codes still reach the record.
    catalog.apply(ProcessExited(query_id=query.query_id, process=1, exit_code=-15, at_ms=31))
    catalog.apply(ProcessExited(query_id=query.query_id, process=2, exit_code=0, at_ms=32))
    failed = catalog.query(query.query_id)
    assert failed.exit_codes == (3, -15, 0)
    assert failed.state is QueryState.FAILED and failed.ended_at_ms == 30


def test_the_first_failure_and_its_words_are_the_reason() -> None:
    catalog = Catalog()
    _, _, executor = host(catalog)
    query = submit(catalog, (executor.executor_id,) * 2)
    catalog.apply(StartQuery(query_id=query.query_id, at_ms=20))
    said = "ZeroDivisionError: division by zero (at job.py:4 in ratio)"
    catalog.apply(ProcessExited(query_id=query.query_id, process=1, exit_code=1, at_ms=30,
                                reason=said))
    catalog.apply(ProcessExited(query_id=query.query_id, process=0, exit_code=-9, at_ms=31,
                                reason="KeyboardInterrupt"))
    failed = catalog.query(query.query_id)
    assert failed.reason == f"process 1 exited with code 1: {said}"
    other = submit(catalog, (executor.executor_id,))
    catalog.apply(ProcessExited(query_id=other.query_id, process=0, exit_code=-9, at_ms=40))
    assert catalog.query(other.query_id).reason == "process 0 was killed by signal 9 (SIGKILL)"


def test_submit_checks_placement() -> None:
    catalog = Catalog()
    _, _, executor = host(catalog)
    with pytest.raises(InvalidCommandError, match="placement names 1 executors for 2 processes"):
        catalog.apply(
            SubmitQuery(name="q", program="p", processes=2, workers=1, executors=(1,), at_ms=1)
        )
    with pytest.raises(InvalidCommandError, match="at least one process"):
        catalog.apply(
            SubmitQuery(name="q", program="p", processes=0, workers=1, executors=(), at_ms=1)
        )
    with pytest.raises(UnknownExecutorError, match="no registered executor 9"):
        catalog.apply(
            SubmitQuery(name="q", program="p", processes=1, workers=1, executors=(9,), at_ms=1)
        )
    with pytest.raises(UnknownQueryError):
        catalog.apply(StartQuery(query_id=1, at_ms=1))


def test_topic_names_are_canonical_and_unique() -> None:
    catalog = Catalog()
    _, broker, _ = host(catalog)
    topic = create_topic(catalog, "numbers", INGEST, broker.broker_id)
    assert topic.name == "persistent://public/default/numbers"
    assert topic.short_name == "numbers"
    for spelling in ("numbers", "public/default/numbers", "persistent://public/default/numbers"):
        assert catalog.topic_by_name(spelling) == topic
        with pytest.raises(TopicExistsError, match="topic 'numbers' exists already"):
            create_topic(catalog, spelling, INGEST, broker.broker_id)
    assert catalog.find_topic("acme/prod/numbers") is None
    with pytest.raises(UnknownTopicError, match="no topic 'acme/prod/numbers'") as info:
        catalog.topic_by_name("acme/prod/numbers")
    assert info.value.retriable  # a blocking subscribe waits for it
    with pytest.raises(InvalidTopicNameError) as bad:
        create_topic(catalog, "a/b", INGEST, broker.broker_id)
    assert isinstance(bad.value, UserError)


def test_system_names_are_reserved() -> None:
    catalog = Catalog()
    _, broker, _ = host(catalog)
    with pytest.raises(ReservedTopicNameError, match="reserved for the system: '__logs'"):
        create_topic(catalog, "__logs", INGEST, broker.broker_id)
    logs = create_topic(catalog, "__logs", SYSTEM, broker.broker_id)
    assert logs.internal
    for requester, force in ((INGEST, True), (SessionRef(1), True)):
        with pytest.raises(NotOwnerError, match="is a system topic"):
            catalog.apply(DeleteTopic(topic_id=logs.topic_id, requester=requester, force=force))
    catalog.apply(DeleteTopic(topic_id=logs.topic_id, requester=SYSTEM))


def test_partitions_and_locations() -> None:
    catalog = Catalog()
    _, broker, _ = host(catalog)

    def create(partitions: int, locations: tuple[int, ...]) -> None:
        catalog.apply(
            CreateTopic(
                name="t",
                partitions=partitions,
                record_type="int",
                kind=TopicKind.STREAM,
                owner=INGEST,
                locations=locations,
                at_ms=1,
            )
        )

    with pytest.raises(InvalidPartitionsError, match="1 to 10000 partitions, not 0"):
        create(0, ())
    with pytest.raises(InvalidPartitionsError, match="1 partition locations given for 2"):
        create(2, (broker.broker_id,))
    with pytest.raises(UnknownBrokerError, match="no registered broker 7"):
        create(2, (broker.broker_id, 7))
    create(2, (broker.broker_id, broker.broker_id))


def test_only_the_owner_publishes_except_to_ingest_topics() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    owner = QueryRef(submit(catalog, (executor.executor_id,)).query_id)
    other = QueryRef(submit(catalog, (executor.executor_id,)).query_id)
    out = create_topic(catalog, "out", owner, broker.broker_id)
    feed = create_topic(catalog, "feed", INGEST, broker.broker_id)
    with pytest.raises(NotOwnerError, match="'out' is owned by query 1, which has not ended"):
        catalog.apply(Publish(topic_id=out.topic_id, publisher=other))
    catalog.apply(Publish(topic_id=out.topic_id, publisher=owner))
    with pytest.raises(AlreadyPublishedError):
        catalog.apply(Publish(topic_id=out.topic_id, publisher=owner))
    catalog.apply(Publish(topic_id=feed.topic_id, publisher=other))
    client = SessionRef(open_session(catalog).session_id)
    catalog.apply(Publish(topic_id=feed.topic_id, publisher=client))
    # A party removes only its own publication.
    with pytest.raises(NotPublishedError, match="query 2 does not publish 'out'"):
        catalog.apply(Unpublish(topic_id=out.topic_id, publisher=other))
    catalog.apply(Unpublish(topic_id=out.topic_id, publisher=owner))
    assert catalog.publications_on(out.topic_id) == []


def test_subscribe_checks_record_type_and_kind() -> None:
    catalog = Catalog()
    _, broker, _ = host(catalog)
    client = SessionRef(open_session(catalog).session_id)
    topic = create_topic(catalog, "words", INGEST, broker.broker_id, record_type="str")
    with pytest.raises(RecordTypeMismatchError, match="carries 'str' records, not 'int'"):
        catalog.apply(Subscribe(topic_id=topic.topic_id, subscriber=client, record_type="int"))
    with pytest.raises(RecordTypeMismatchError, match="is a stream, not a collection"):
        catalog.apply(
            Subscribe(topic_id=topic.topic_id, subscriber=client, kind=TopicKind.COLLECTION)
        )
    catalog.apply(Subscribe(topic_id=topic.topic_id, subscriber=client, record_type="str"))
    with pytest.raises(UnknownSessionError):
        catalog.apply(Subscribe(topic_id=topic.topic_id, subscriber=SessionRef(99)))


def test_a_query_that_ends_leaves_its_topics_behind() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    add_user(catalog, "user:alice")
    add_user(catalog, "user:bob")
    query = submit(catalog, (executor.executor_id,), owner="user:alice")
    me = QueryRef(query.query_id)
    out = create_topic(catalog, "out", me, broker.broker_id)
    feed = create_topic(catalog, "feed", INGEST, broker.broker_id)
    catalog.apply(Publish(topic_id=out.topic_id, publisher=me))
    catalog.apply(Subscribe(topic_id=feed.topic_id, subscriber=me))
    reader = SessionRef(open_session(catalog, principal="user:bob").session_id)
    catalog.apply(Subscribe(topic_id=out.topic_id, subscriber=reader))
    # Nobody but who manages the owner deletes its topic; an admin only with force.
    with pytest.raises(NotOwnerError, match="user:bob may not delete it"):
        catalog.apply(DeleteTopic(topic_id=out.topic_id, requester=reader,
                                  principal="user:bob"))
    with pytest.raises(NotOwnerError, match="an admin deletes it with --force"):
        catalog.apply(DeleteTopic(topic_id=out.topic_id, requester=reader, principal="admin"))

    catalog.apply(ProcessExited(query_id=query.query_id, process=0, exit_code=0, at_ms=50))
    assert catalog.query(query.query_id).state is QueryState.FINISHED
    assert catalog.publications_of(me) == [] and catalog.subscriptions_of(me) == []
    # The topic stays readable (marked published: a later run starts an epoch), and its other
    # readers stay subscribed.
    assert catalog.topic(out.topic_id) == msgspec.structs.replace(out, published=True)
    assert catalog.subscriptions_on(out.topic_id) == [
        Subscription(topic_id=out.topic_id, subscriber=reader)
    ]
    with pytest.raises(QueryEndedError, match=r"query 1 has ended \(finished\)"):
        catalog.apply(Publish(topic_id=out.topic_id, publisher=me))
    # An orphan is still not bob's to delete; its submitter deletes it, subscriptions too.
    with pytest.raises(NotOwnerError):
        catalog.apply(DeleteTopic(topic_id=out.topic_id, requester=reader,
                                  principal="user:bob"))
    change = catalog.apply(DeleteTopic(topic_id=out.topic_id, requester=reader,
                                       principal="user:alice"))
    assert Update("subscriptions", Subscription(topic_id=out.topic_id, subscriber=reader), -1) in (
        change.updates
    )
    assert catalog.find_topic("out") is None
    # The name is free again, under a new id, once its broker dropped the old partitions.
    catalog.apply(PartitionsDropped(topic_id=out.topic_id, broker_id=broker.broker_id))
    assert create_topic(catalog, "out", INGEST, broker.broker_id).topic_id > out.topic_id


def test_force_delete_of_a_live_owners_topic() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    add_user(catalog, "user:alice")
    me = QueryRef(submit(catalog, (executor.executor_id,)).query_id)
    out = create_topic(catalog, "out", me, broker.broker_id)
    catalog.apply(Publish(topic_id=out.topic_id, publisher=me))
    # Force is an admin's: a user's --force does not reach another's topic.
    with pytest.raises(NotOwnerError):
        catalog.apply(DeleteTopic(topic_id=out.topic_id, requester=INGEST, force=True,
                                  principal="user:alice"))
    catalog.apply(DeleteTopic(topic_id=out.topic_id, requester=INGEST, force=True,
                              principal="admin"))
    assert catalog.publications_of(me) == []


def test_session_expiry_cascades() -> None:
    catalog = Catalog()
    session, broker, executor = host(catalog, "host-a")
    _, broker_b, executor_b = host(catalog, "host-b")
    query = submit(catalog, (executor.executor_id, executor_b.executor_id))
    me = QueryRef(query.query_id)
    catalog.apply(StartQuery(query_id=query.query_id, at_ms=5))
    out = create_topic(catalog, "out", me, broker.broker_id, partitions=1)
    catalog.apply(Publish(topic_id=out.topic_id, publisher=me))
    client = open_session(catalog)
    catalog.apply(Subscribe(topic_id=out.topic_id, subscriber=SessionRef(client.session_id)))
    untouched = submit(catalog, (executor_b.executor_id,))

    catalog.apply(SessionExpired(session_id=session.session_id, at_ms=60))
    lost = catalog.query(query.query_id)
    assert lost.state is QueryState.FAILED
    assert lost.reason == "lost executor 1"
    assert lost.ended_at_ms == 60
    assert catalog.publications_of(me) == []
    assert catalog.query(untouched.query_id).state is QueryState.SUBMITTED
    assert [e.executor_id for e in catalog.executors] == [executor_b.executor_id]
    assert [b.broker_id for b in catalog.brokers] == [broker_b.broker_id]
    # The topic stays, located on the broker that left: it re-joins under its id.
    assert catalog.topic(out.topic_id).locations == (broker.broker_id,)
    with pytest.raises(UnknownSessionError):
        catalog.apply(SessionExpired(session_id=session.session_id, at_ms=61))

    catalog.apply(CloseSession(session_id=client.session_id, at_ms=70))
    assert catalog.subscriptions_on(out.topic_id) == []
    assert Catalog.replay(catalog.snapshot()) == catalog


def test_removing_an_executor_only_fails_queries_still_running_there() -> None:
    catalog = Catalog()
    _, _, a = host(catalog, "a")
    _, _, b = host(catalog, "b")
    query = submit(catalog, (a.executor_id, b.executor_id))
    catalog.apply(ProcessExited(query_id=query.query_id, process=0, exit_code=0, at_ms=5))
    catalog.apply(RemoveExecutor(executor_id=a.executor_id, at_ms=6))
    assert catalog.query(query.query_id).state is QueryState.SUBMITTED  # process 0 was done
    catalog.apply(RemoveExecutor(executor_id=b.executor_id, at_ms=7))
    assert catalog.query(query.query_id).state is QueryState.FAILED
    with pytest.raises(UnknownExecutorError):
        catalog.apply(RemoveExecutor(executor_id=b.executor_id, at_ms=8))


def test_brokers_rejoin_under_their_id() -> None:
    catalog = Catalog()
    session = open_session(catalog, SessionKind.EXECUTOR)
    _, broker, _ = host(catalog)
    with pytest.raises(BrokerInUseError, match="still serves executor 1"):
        catalog.apply(RemoveBroker(broker_id=broker.broker_id))
    own = catalog.apply(RegisterBroker(host="c", address="tcp://c:1", session_id=None)).created
    catalog.apply(RemoveBroker(broker_id=own.broker_id))
    with pytest.raises(UnknownBrokerError, match="was never assigned"):
        catalog.apply(RegisterBroker(host="c", address="x", session_id=None, broker_id=42))
    with pytest.raises(BrokerExistsError, match="registered already"):
        catalog.apply(
            RegisterBroker(host="c", address="x", session_id=None, broker_id=broker.broker_id)
        )
    back = catalog.apply(
        RegisterBroker(
            host="c", address="tcp://c:2", session_id=session.session_id, broker_id=own.broker_id
        )
    ).created
    assert back.broker_id == own.broker_id and back.address == "tcp://c:2"
    assert catalog.counters.next_broker_id == own.broker_id + 1


def test_refused_commands_change_nothing() -> None:
    catalog = Catalog()
    _, broker, _ = host(catalog)
    before, version = catalog.snapshot(), catalog.version
    for command in (
        DeleteTopic(topic_id=1, requester=INGEST),
        Publish(topic_id=1, publisher=SYSTEM),
        CloseSession(session_id=77, at_ms=1),
        RegisterBroker(host="x", address="y", session_id=77),
    ):
        with pytest.raises(CatalogError):
            catalog.apply(command)
    with pytest.raises(InvalidCommandError, match="not a catalog command: str"):
        catalog.apply("OpenSession")  # type: ignore[arg-type]
    assert catalog.snapshot() == before and catalog.version == version


def test_replay_refuses_corrupt_updates() -> None:
    catalog = Catalog()
    _, broker, _ = host(catalog)
    topic = create_topic(catalog, "feed", INGEST, broker.broker_id)
    good = catalog.snapshot()
    dangling = Update("publications", Publication(topic_id=99, publisher=SYSTEM), 1)
    wrong_place = Update("topics", Publication(topic_id=topic.topic_id, publisher=SYSTEM), 1)
    with pytest.raises(CorruptCatalogError, match="names a topic that does not exist"):
        Catalog.replay([*good, dangling])
    with pytest.raises(CorruptCatalogError, match="a Publication record in collection 'topics'"):
        Catalog.replay([*good, wrong_place])
    with pytest.raises(CorruptCatalogError, match="multiplicity"):
        Catalog.replay([*good, Update("topics", topic, -2)])
    with pytest.raises(CorruptCatalogError, match="multiplicity 2"):
        Catalog.replay([*good, Update("topics", topic, 1)])
    with pytest.raises(CorruptCatalogError, match="has an id outside 1..0"):
        Catalog.replay([u for u in good if u.collection != "counters"])


def test_catalog_topics() -> None:
    assert catalog_topic("executors") == "__catalog.executors"
    with pytest.raises(UnknownCollectionError, match="one of sessions, brokers"):
        catalog_topic("nope")
    with pytest.raises(UnknownCollectionError):
        Catalog().collection("nope")



def test_a_follower_applying_each_committed_change_equals_the_catalog() -> None:
    """What a standby coordinator does with etcd's log (DESIGN §3 "Coordinator failover"):
    the catalog read at some version, then each later change as the active one emitted it."""
    source = Catalog()
    add_user(source, "user:alice")
    host(source)
    follower = Catalog.replay(source.snapshot())
    changes = [source.apply(OpenSession(kind=SessionKind.CLIENT, peer=f"p{i}", at_ms=i))
               for i in range(3)]
    changes.append(source.apply(AddUser(principal="user:bob", role="user",
                                        requester="admin", at_ms=5)))
    for change in changes:
        follower.apply_committed(change.version, change.updates)
    assert follower.snapshot() == source.snapshot() and follower.version == source.version
    assert follower.user("user:bob") is not None  # its indexes follow too

    last = changes[-1]
    with pytest.raises(CorruptCatalogError, match="does not follow"):
        follower.apply_committed(source.version + 2, last.updates)
    with pytest.raises(CorruptCatalogError, match="does not set the catalog version"):
        follower.apply_committed(source.version + 1, last.updates)
    (counters,) = [r for c, r, d in last.updates if c == "counters" and d > 0]
    nobody = msgspec.structs.replace(follower.user("user:bob"), principal="user:nobody")
    bad = [Update("users", nobody, -1), Update("counters", counters, -1),
           Update("counters", msgspec.structs.replace(counters, version=source.version + 1), 1)]
    with pytest.raises(CorruptCatalogError):
        follower.apply_committed(source.version + 1, bad)
    assert follower.snapshot() == source.snapshot()  # a refused change changes nothing
