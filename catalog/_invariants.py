"""The catalog's invariants, checked as a whole: on replay, and after every step in the tests.

The rules in `_rules` keep these true command by command; this module says what "true" is, so
recovery can refuse catalog topics that hold something else. Every violation is reported as
CorruptCatalogError naming the record.

Must not: change anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog._access import publishes_as_owner
from catalog._names import TopicName
from catalog._principals import PrincipalKind, Role, principal_kind
from catalog._records import (
    COLLECTIONS,
    SYSTEM,
    Broker,
    Executor,
    JoinToken,
    Party,
    Publication,
    Query,
    QueryRef,
    QueryState,
    SessionRef,
    Subscription,
    Topic,
    User,
)
from catalog.errors import CatalogError, CorruptCatalogError

if TYPE_CHECKING:
    from catalog._catalog import Catalog

__all__ = ["check_invariants"]

_ID_LIMITS = {
    "sessions": ("session_id", "next_session_id"),
    "brokers": ("broker_id", "next_broker_id"),
    "homes": ("broker_id", "next_broker_id"),
    "executors": ("executor_id", "next_executor_id"),
    "queries": ("query_id", "next_query_id"),
    "topics": ("topic_id", "next_topic_id"),
    "tokens": ("token_id", "next_token_id"),
}


def _fail(why: str) -> CorruptCatalogError:
    return CorruptCatalogError(f"catalog invariant broken: {why}")


def check_invariants(catalog: Catalog) -> None:
    """Raise CorruptCatalogError unless every invariant of the catalog holds."""
    _check_shape(catalog)
    _check_executors(catalog)
    registered = {e.executor_id for e in catalog.executors if isinstance(e, Executor)}
    for query in catalog.queries:
        assert isinstance(query, Query)
        _check_query(catalog, query, registered)
    _check_topics(catalog)
    _check_users(catalog)
    _check_tokens(catalog)
    publishers: set[tuple[int, object]] = set()
    for publication in catalog.publications:
        assert isinstance(publication, Publication)
        topic = _topic_of(catalog, publication, publication.topic_id)
        _check_live(catalog, publication, publication.publisher)
        if not publishes_as_owner(catalog, publication.publisher, topic):
            raise _fail(f"{publication!r} publishes a topic it does not own")
        key = (publication.topic_id, publication.publisher)
        if key in publishers:
            raise _fail(f"{publication!r} is a second publication of one publisher")
        publishers.add(key)
        _check_holders(catalog, publication)
    for subscription in catalog.subscriptions:
        assert isinstance(subscription, Subscription)
        _topic_of(catalog, subscription, subscription.topic_id)
        _check_live(catalog, subscription, subscription.subscriber)


def _check_holders(catalog: Catalog, publication: Publication) -> None:
    """The processes holding a publication: distinct, sorted, of its query."""
    held = publication.processes
    if not held:
        return
    if not isinstance(publication.publisher, QueryRef):
        raise _fail(f"{publication!r} names processes of a publisher that has none")
    count = catalog.query(publication.publisher.query_id).processes
    if list(held) != sorted(set(held)) or held[0] < 0 or held[-1] >= count:
        raise _fail(f"{publication!r} names processes outside 0..{count - 1} or out of order")


def _check_shape(catalog: Catalog) -> None:
    """Set semantics, the counters record, unique ids below their counters."""
    counters = catalog.counters
    for name, collection in catalog.collections():
        expected = COLLECTIONS[name]
        for record, count in collection.items():
            if type(record) is not expected:
                raise _fail(f"a {type(record).__name__} in {name}")
            if count != 1:
                raise _fail(f"{record!r} has multiplicity {count} in {name}")
    stored = list(catalog.collection("counters"))
    if stored != ([counters] if counters.version else []):
        raise _fail(f"counters collection {stored!r} does not match version {counters.version}")
    for name, (id_field, counter_field) in _ID_LIMITS.items():
        limit = getattr(counters, counter_field)
        seen: set[int] = set()
        for record in catalog.collection(name):
            record_id = getattr(record, id_field)
            if not 1 <= record_id < limit:
                raise _fail(f"{record!r} has an id outside 1..{limit - 1}")
            if record_id in seen:
                raise _fail(f"two {name} records with id {record_id}")
            seen.add(record_id)


def _check_executors(catalog: Catalog) -> None:
    for broker in catalog.brokers:
        assert isinstance(broker, Broker)
        if broker.session_id is not None:
            _session_open(catalog, broker, broker.session_id)
    for executor in catalog.executors:
        assert isinstance(executor, Executor)
        if executor.session_id is not None:
            _session_open(catalog, executor, executor.session_id)
        try:
            broker = catalog.broker(executor.broker_id)
        except CatalogError:
            raise _fail(f"{executor!r} names a broker that is not registered") from None
        if broker.address != executor.broker:
            raise _fail(f"{executor!r} names broker address {executor.broker!r}, not ours")


def _check_query(catalog: Catalog, query: Query, registered: set[int]) -> None:
    n = query.processes
    if n < 1 or query.workers < 1:
        raise _fail(f"{query!r} has inconsistent process counts")
    if query.placed:
        if len(query.exit_codes) != n or query.state is QueryState.PENDING:
            raise _fail(f"{query!r} has inconsistent process counts")
    elif query.executors or query.exit_codes or query.state not in (
            QueryState.PENDING, QueryState.FAILED, QueryState.KILLED):
        # Unplaced: pending, or failed or killed while pending; no process ever ran.
        raise _fail(f"{query!r} is unplaced but not pending")
    if query.start_timeout_ms < 0:
        raise _fail(f"{query!r} has a negative start timeout")
    if any(not 1 <= e < catalog.counters.next_executor_id for e in query.executors):
        raise _fail(f"{query!r} names an executor id never assigned")
    if query.ended != (query.ended_at_ms is not None):
        raise _fail(f"{query!r}: ended_at_ms is set exactly when the query has ended")
    if (query.state in (QueryState.PENDING, QueryState.SUBMITTED)) != (
            query.started_at_ms is None) and not query.ended:
        raise _fail(f"{query!r}: started_at_ms is set exactly when the query started")
    exited = [code for code in query.exit_codes if code is not None]
    if query.state is QueryState.FINISHED and (len(exited) != n or any(exited)):
        raise _fail(f"{query!r} finished without every process exiting 0")
    if not query.ended:
        if any(exited) or len(exited) == n:
            raise _fail(f"{query!r} is {query.state.value} after its processes ended")
        for executor_id, code in zip(query.executors, query.exit_codes, strict=True):
            if code is None and executor_id not in registered:
                raise _fail(f"{query!r} runs a process on executor {executor_id}, which left")


def _check_topics(catalog: Catalog) -> None:
    names: set[str] = set()
    counters = catalog.counters
    retired = catalog.retired_brokers()
    for topic in catalog.topics:
        assert isinstance(topic, Topic)
        try:
            name = TopicName.parse(topic.name)
        except CatalogError:
            raise _fail(f"{topic!r} has an invalid name") from None
        if name.full != topic.name or name.internal != topic.internal:
            raise _fail(f"{topic!r} is not stored in canonical form")
        if topic.name in names:
            raise _fail(f"two topics named {topic.name!r}")
        names.add(topic.name)
        if topic.internal and topic.owner != SYSTEM:
            raise _fail(f"{topic!r} is internal but not owned by the system")
        if topic.partitions < 1 or len(topic.locations) != topic.partitions:
            raise _fail(f"{topic!r} has inconsistent partitions")
        if any(not 1 <= b < counters.next_broker_id for b in topic.locations):
            raise _fail(f"{topic!r} is located on a broker id never assigned")
        _check_replication(topic, counters.next_broker_id)
        if retired.intersection(set(topic.locations).union(*topic.replicas)):
            raise _fail(f"{topic!r} is placed on a decommissioned broker")
        owner = topic.owner
        if isinstance(owner, QueryRef) and not 1 <= owner.query_id < counters.next_query_id:
            raise _fail(f"{topic!r} is owned by a query id never assigned")
        if isinstance(owner, SessionRef) and not 1 <= owner.session_id < counters.next_session_id:
            raise _fail(f"{topic!r} is owned by a session id never assigned")


def _check_replication(topic: Topic, next_broker_id: int) -> None:
    """A replicated topic (DESIGN §5 "Replication"): per partition two or more distinct
    replicas (as many for every partition), an ISR of replicas in replica order holding the
    leader (`locations`), a leader epoch; a topic of one replica has none of the three."""
    per_partition = (topic.replicas, topic.isr, topic.leader_epochs)
    if not any(per_partition):
        return
    if topic.internal or any(len(field) != topic.partitions for field in per_partition):
        raise _fail(f"{topic!r} has replication state that does not match its partitions")
    factor = len(topic.replicas[0])
    for leader, replicas, isr, epoch in zip(topic.locations, *per_partition, strict=True):
        if len(replicas) != factor or factor < 2 or len(set(replicas)) != factor \
                or any(not 1 <= b < next_broker_id for b in replicas):
            raise _fail(f"{topic!r} has replicas {replicas}: not {factor} distinct brokers")
        if leader not in isr or tuple(b for b in replicas if b in isr) != isr or epoch < 0:
            raise _fail(f"{topic!r}: ISR {isr} is not the leader {leader} and other replicas "
                        f"of {replicas} in their order, or epoch {epoch} is negative")


def _check_tokens(catalog: Catalog) -> None:
    for token in catalog.tokens:
        assert isinstance(token, JoinToken)
        if token.expires_at_ms <= token.created_at_ms or token.used != bool(token.used_by):
            raise _fail(f"{token!r} expires before it was made, or is used by nobody")


def _check_users(catalog: Catalog) -> None:
    names: set[str] = set()
    for user in catalog.users:
        assert isinstance(user, User)
        try:
            kind = principal_kind(user.principal)
            role = Role(user.role)
        except (CatalogError, ValueError):
            raise _fail(f"{user!r} has an invalid name or role") from None
        if kind not in (PrincipalKind.USER, PrincipalKind.EXECUTOR) or (
                (kind is PrincipalKind.EXECUTOR) != (role is Role.EXECUTOR)):
            raise _fail(f"{user!r} has a role its kind of name cannot have")
        if user.principal in names or user.generation < 0:
            raise _fail(f"{user!r} is a second record of its name, or has a negative generation")
        names.add(user.principal)


def _session_open(catalog: Catalog, record: object, session_id: int) -> None:
    try:
        catalog.session(session_id)
    except CatalogError:
        raise _fail(f"{record!r} belongs to session {session_id}, which is not open") from None


def _topic_of(catalog: Catalog, record: object, topic_id: int) -> Topic:
    try:
        return catalog.topic(topic_id)
    except CatalogError:
        raise _fail(f"{record!r} names a topic that does not exist") from None


def _check_live(catalog: Catalog, record: object, party: Party) -> None:
    if not catalog.is_live(party):
        raise _fail(f"{record!r} belongs to a party that is no longer alive")
