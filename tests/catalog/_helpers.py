"""Builders for catalog tests: a small cluster in a few lines."""

from __future__ import annotations

from catalog import (
    AddUser,
    Broker,
    Catalog,
    CreateTopic,
    Executor,
    OpenSession,
    Owner,
    PrincipalRef,
    Query,
    RegisterBroker,
    RegisterExecutor,
    Resources,
    Session,
    SessionKind,
    SubmitQuery,
    Topic,
    TopicKind,
    User,
)

RESOURCES = Resources(cores=4, memory=8 << 30, disk=100 << 30, slots=8)


def add_user(catalog: Catalog, principal: str, role: str = "user") -> User:
    """A named principal, made by the admin."""
    user = catalog.apply(AddUser(principal=principal, role=role, requester="admin",
                                 at_ms=1)).created
    assert isinstance(user, User)
    return user


def open_session(catalog: Catalog, kind: SessionKind = SessionKind.CLIENT, *,
                 principal: str = "admin") -> Session:
    session = catalog.apply(OpenSession(kind=kind, peer="test", at_ms=1,
                                        principal=principal)).created
    assert isinstance(session, Session)
    return session


def host(catalog: Catalog, name: str = "host-a") -> tuple[Session, Broker, Executor]:
    """An executor session with its broker and executor, as an executor agent registers."""
    session = open_session(catalog, SessionKind.EXECUTOR)
    broker = catalog.apply(
        RegisterBroker(host=name, address=f"tcp://{name}:7411", session_id=session.session_id)
    ).created
    assert isinstance(broker, Broker)
    executor = catalog.apply(
        RegisterExecutor(
            host=name,
            broker_id=broker.broker_id,
            resources=RESOURCES,
            session_id=session.session_id,
            at_ms=2,
        )
    ).created
    assert isinstance(executor, Executor)
    return session, broker, executor


def submit(catalog: Catalog, executors: tuple[int, ...], name: str = "job", *,
           owner: str = "admin", processes: int = 3) -> Query:
    """A query placed on `executors`, or a pending one of `processes` when that is empty."""
    query = catalog.apply(
        SubmitQuery(
            name=name,
            program="sha256:abc",
            args=("--n", "3"),
            processes=len(executors) or processes,
            workers=2,
            executors=executors,
            at_ms=3,
            owner=owner,
        )
    ).created
    assert isinstance(query, Query)
    return query


def create_topic(
    catalog: Catalog,
    name: str,
    owner: Owner,
    broker_id: int,
    *,
    partitions: int = 1,
    record_type: str = "int",
    kind: TopicKind = TopicKind.STREAM,
) -> Topic:
    topic = catalog.apply(
        CreateTopic(
            name=name,
            partitions=partitions,
            record_type=record_type,
            kind=kind,
            owner=owner,
            locations=(broker_id,) * partitions,
            at_ms=4,
        )
    ).created
    assert isinstance(topic, Topic)
    return topic


def hosts(count: int) -> tuple[Catalog, list[Session], list[int]]:
    """A catalog with `count` executor hosts: their sessions and broker ids."""
    catalog = Catalog()
    sessions, brokers = [], []
    for i in range(count):
        session, broker, _ = host(catalog, f"host-{i}")
        sessions.append(session)
        brokers.append(broker.broker_id)
    return catalog, sessions, brokers


def create_replicated(catalog: Catalog, replicas: tuple[tuple[int, ...], ...],
                      name: str = "t") -> Topic:
    """An admin's topic with a partition on each replica set, led by its first broker."""
    topic = catalog.apply(CreateTopic(
        name=name, partitions=len(replicas), record_type="bytes", kind=TopicKind.STREAM,
        owner=PrincipalRef("admin"), locations=tuple(r[0] for r in replicas), at_ms=4,
        replicas=replicas)).created
    assert isinstance(topic, Topic)
    catalog.check_invariants()
    return topic
