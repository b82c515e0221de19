"""The catalog's records: immutable, hashable msgspec Structs, one type per collection.

A record never changes; a change is a retraction of the old record and an insertion of the new
one (diffs -1 and +1). Records are multiset elements, so every record is frozen (hashable) and
built only from hashable fields (tuples, never lists). Each record type carries a msgpack tag
(field `type`) so a decoded update is checked against the collection it claims to belong to.

Times are integer milliseconds since the Unix epoch, given by the caller: nothing here reads a
clock.

Collections (DESIGN §3: the thesis' five plus `sessions`, `brokers` and `counters`):

    sessions       Session       client, executor and query-process sessions (leases live in the
                                 coordinator; the catalog only knows which are open)
    brokers        Broker        every broker up now (a broker re-joins under its old id)
    homes          BrokerHome    where each broker id was last registered (host, principal,
                                 slot): a host that lost its data dir gets its id back
    executors      Executor      host agents, each with the broker it runs
    queries        Query         every query ever submitted, with its state and exit codes
    topics         Topic         name, partitions, record type tag, kind, owner, locations
    publications   Publication   (topic, publisher)
    subscriptions  Subscription  (topic, subscriber)
    drops          PendingDrop   partitions of deleted topics a broker has not dropped yet
    users          User          named principals an admin made (`tq user add`): role and
                                 credential generation, never the key (DESIGN §12)
    tokens         JoinToken     one-time join tokens (`tq token create`): expiry and use, never
                                 the secret (DESIGN §12 "Joining a host")
    counters       Counters      one record: the catalog version and the next id of each kind, so
                                 replay restores them even from a compacted snapshot

Must not: read clocks, do I/O, or hold mutable fields.
"""

from __future__ import annotations

import enum
from typing import Literal, NamedTuple, TypeAlias

import msgspec

from catalog._names import TopicName
from catalog.errors import InvalidConfigError, UnknownCollectionError

__all__ = [
    "COLLECTIONS",
    "INGEST",
    "SYSTEM",
    "Broker",
    "BrokerHome",
    "CollectionName",
    "Counters",
    "Executor",
    "IngestRef",
    "JoinToken",
    "Owner",
    "Party",
    "PendingDrop",
    "PrincipalRef",
    "Publication",
    "Query",
    "QueryRef",
    "QueryState",
    "Record",
    "Resources",
    "Session",
    "SessionKind",
    "SessionRef",
    "Subscription",
    "SystemRef",
    "TOPIC_CONFIGS",
    "Topic",
    "TopicKind",
    "check_topic_config",
    "Update",
    "User",
    "catalog_topic",
]


class QueryState(enum.StrEnum):
    """pending -> submitted -> running -> finished | failed | killed (the table is in
    `_query_state`)."""

    PENDING = "pending"  # waits for free process slots; no process placed or started yet
    SUBMITTED = "submitted"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"

    @property
    def ended(self) -> bool:
        return self in (QueryState.FINISHED, QueryState.FAILED, QueryState.KILLED)


class TopicKind(enum.StrEnum):
    STREAM = "stream"
    COLLECTION = "collection"


class SessionKind(enum.StrEnum):
    CLIENT = "client"  # the CLI, a notebook, a Spark driver, a connector
    EXECUTOR = "executor"  # a host agent (and the broker it runs)
    QUERY = "query"  # one process of a query


# -- who owns, publishes, subscribes ------------------------------------------------------------


class _Ref(msgspec.Struct, frozen=True, tag_field="type"):
    pass


class QueryRef(_Ref, frozen=True, tag="query"):
    """A query, as owner, publisher or subscriber. Alive while submitted or running."""

    query_id: int


class SessionRef(_Ref, frozen=True, tag="session"):
    """A client session. Alive while the session is open."""

    session_id: int


class PrincipalRef(_Ref, frozen=True, tag="principal"):
    """A principal (`user:alice`, `admin`) as the owner of a topic a client session created: the
    topic is its principal's, not the session's, so a script that reconnects (a new session of
    the same principal) still owns it. Alive while the principal exists (DESIGN §12)."""

    principal: str


class IngestRef(_Ref, frozen=True, tag="ingest"):
    """The owner of topics fed from outside (`tq produce`, the connector and Kafka endpoints).

    Always alive; anyone may publish into an ingest topic.
    """


class SystemRef(_Ref, frozen=True, tag="system"):
    """The coordinator itself: owner and publisher of the `__` system topics. Always alive."""


INGEST = IngestRef()
SYSTEM = SystemRef()

# A party publishes or subscribes; an owner may also be `ingest`, which is nobody in particular.
Party: TypeAlias = QueryRef | SessionRef | SystemRef
# SessionRef owners come from catalogs written before principals owned client topics.
Owner: TypeAlias = QueryRef | SessionRef | PrincipalRef | IngestRef | SystemRef


# -- records ------------------------------------------------------------------------------------


class _Record(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class Session(_Record, frozen=True, tag="session"):
    session_id: int
    kind: SessionKind
    peer: str  # who opened it, for people: "tq-cli alice@host pid 4242"
    opened_at_ms: int
    # The authenticated principal that opened it (DESIGN §12); only it may use the session.
    # Last, with a default: catalogs written before principals load (as "admin").
    principal: str = "admin"


class Resources(msgspec.Struct, frozen=True, kw_only=True):
    """What an executor offers: cores, memory and disk in bytes, and process slots."""

    cores: int
    memory: int
    disk: int
    slots: int


class Broker(_Record, frozen=True, tag="broker"):
    broker_id: int
    host: str
    address: str  # where producers and subscribers connect: "tcp://10.0.0.5:7411"
    session_id: int | None  # None: the coordinator's own broker, which leaves with nobody
    # HOST:PORT of its Kafka listener, "" for none. Last, with a default: older catalogs load.
    kafka_address: str = ""
    # Its CURVE public key (Z85) when it is a CURVE server (reachable from other hosts), ""
    # for a PLAIN one: clients connect with CURVE exactly when it is set. Last, with a
    # default: older catalogs load.
    curve_key: str = ""


class BrokerHome(_Record, frozen=True, tag="broker_home", omit_defaults=True):
    """Where broker `broker_id` was last registered by a session, kept after it leaves: its
    host name, the principal of the session that registered it, and its slot on the host (0:
    an executor's own broker, k: its shard k). A broker registering with no id on the same
    host, principal and slot while this one is down gets this id back, so a host whose data
    dir was lost comes back as the replicas the catalog names (DESIGN §6 "Executor broker
    ids")."""

    broker_id: int
    host: str
    principal: str
    slot: int
    # Decommissioned (`tq broker decommission`, DESIGN §5 "Decommissioning a broker"): the id
    # holds no replica and names no broker any more; placement never uses it. Last, with a
    # default left out of the encoding: older catalogs load and other homes keep their bytes.
    retired: bool = False


class Executor(_Record, frozen=True, tag="executor"):
    executor_id: int
    session_id: int | None  # None: embedded in the coordinator's process (`tq up`)
    host: str
    broker_id: int
    broker: str  # the broker's address, copied so `tq status` needs no join
    resources: Resources
    registered_at_ms: int
    # The host's other brokers (`tq executor --brokers N`: one process each, DESIGN §5); its
    # queries' partitions spread over broker_id and these. Last, with a default: older
    # catalogs load.
    shards: tuple[int, ...] = ()


class Query(_Record, frozen=True, tag="query"):
    query_id: int
    name: str
    program: str  # the artifact: a content address or a path
    args: tuple[str, ...]
    processes: int
    workers: int  # per process
    executors: tuple[int, ...]  # executor id of process i; () while pending (not placed)
    state: QueryState
    exit_codes: tuple[int | None, ...]  # of process i; None while it runs (or was lost); ()
    # while pending
    submitted_at_ms: int
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    reason: str = ""  # why it failed or was killed, for people
    owner: str = "admin"  # the principal that submitted it (older catalogs: admin)
    # How long it may take from submission until every process registered (waiting for slots
    # included); past it the coordinator fails the query. 0: the coordinator's default.
    start_timeout_ms: int = 0

    @property
    def ended(self) -> bool:
        return self.state.ended

    @property
    def placed(self) -> bool:
        """Whether its processes have executors (every query but a pending one)."""
        return len(self.executors) == self.processes


class Topic(_Record, frozen=True, tag="topic"):
    topic_id: int
    name: str  # canonical full form, persistent://tenant/namespace/name
    partitions: int
    record_type: str  # tag checked on subscribe, as the thesis checks TypeId
    kind: TopicKind
    owner: Owner
    locations: tuple[int, ...]  # broker id hosting partition i
    internal: bool  # a `__` system topic
    created_at_ms: int
    creator: str = ""  # the principal that created it ("" in older catalogs): may delete an
    # ingest topic it created
    published: bool = False  # some publisher has published it: a later run starts an epoch
    epoch: int = 0  # the epoch of its owner's latest run (DESIGN §5 "Epochs")
    # Kafka topic configs set for it (`tq topic alter`, IncrementalAlterConfigs), sorted by
    # name: retention.ms, retention.bytes, segment.bytes (TOPIC_CONFIGS); others are the
    # broker's. Empty in older catalogs.
    configs: tuple[tuple[str, str], ...] = ()
    # Replication (DESIGN §5 "Replication"), all three empty for a topic of one replica (and in
    # older catalogs). Partition i is stored by the brokers `replicas[i]` (preferred leader
    # first); `locations[i]` is its leader, one of `isr[i]`, the replicas holding every
    # acknowledged record; `leader_epochs[i]` grows by one at every change of its leader.
    replicas: tuple[tuple[int, ...], ...] = ()
    isr: tuple[tuple[int, ...], ...] = ()
    leader_epochs: tuple[int, ...] = ()

    @property
    def replication_factor(self) -> int:
        return len(self.replicas[0]) if self.replicas else 1

    @property
    def topic_name(self) -> TopicName:
        return TopicName.parse(self.name)

    @property
    def short_name(self) -> str:
        return self.topic_name.short

    def config(self, name: str) -> str | None:
        """The topic's own value of a Kafka config, None when it has none (the broker's)."""
        return dict(self.configs).get(name)


class Publication(_Record, frozen=True, tag="publication", omit_defaults=True):
    """One per (topic, publisher). A query's processes publish collectively: `processes` are
    those holding it (sorted); it leaves when the last lets go or the query ends. Empty for
    other publishers, and in records written before processes were counted (last, with a
    default: older catalogs load; such a record leaves at the first process's unpublish).
    Encoded without `processes` (and `epoch`) when empty, so those records keep their
    bytes."""

    topic_id: int
    publisher: Party
    processes: tuple[int, ...] = ()
    # The epoch its writers start when they reopen the topic's partitions (DESIGN §5
    # "Epochs"): 0 for the topic's first publication, else the catalog version that created
    # it, so a later run's epoch is higher than every earlier one's.
    epoch: int = 0


class Subscription(_Record, frozen=True, tag="subscription"):
    topic_id: int
    subscriber: Party


class PendingDrop(_Record, frozen=True, tag="pending_drop"):
    """Partitions of a deleted topic that the broker hosting them has not dropped yet. Inserted
    with the delete, in the same change; the coordinator tells the broker's executor to drop
    them, again each time that broker registers, and retracts the record on its report
    (DESIGN §3 "Deleting topics"). `topic_id` is the deleted incarnation: a topic created
    again under the name has another id and is never the subject of this record."""

    topic_id: int
    name: str  # canonical, as the deleted topic's; its partition directories are named by it
    broker_id: int
    partitions: tuple[int, ...]  # sorted


class User(_Record, frozen=True, tag="user"):
    """A named principal (`user:NAME` or `executor:NAME`) and its role. Its key is derived from
    the cluster secret, the name and `generation` (querylib.rpc.principal_key); rotating the
    credential bumps the generation, so the old key stops working (DESIGN §12)."""

    principal: str
    role: str  # catalog.Role
    generation: int
    created_at_ms: int


class JoinToken(_Record, frozen=True, tag="join_token"):
    """A one-time join token (`tq token create`, DESIGN §12 "Joining a host"). Its secret is the
    key of principal `join:ID` at generation `salt` (querylib.rpc.principal_key), derived from
    the cluster secret: the catalog holds no secret and no digest a leaked copy could be
    replayed with. `salt` is random, so a token cannot be minted again from its id. Redeemed
    once, before `expires_at_ms`, for the credential of `executor:NAME` (`name`, else the
    joiner's host name); `used_by` says which, `used_at_ms` when (0: not yet)."""

    token_id: int
    salt: int
    name: str  # "" : the joiner names itself (its host name)
    created_by: str
    created_at_ms: int
    expires_at_ms: int
    used_at_ms: int = 0
    used_by: str = ""

    @property
    def used(self) -> bool:
        return self.used_at_ms > 0


class Counters(_Record, frozen=True, tag="counters"):
    """The catalog version and the next id of each kind. Ids start at 1 and are never reused
    (a broker id goes back only to the host it was last registered on: `BrokerHome`)."""

    version: int = 0
    next_session_id: int = 1
    next_broker_id: int = 1
    next_executor_id: int = 1
    next_query_id: int = 1
    next_topic_id: int = 1
    next_token_id: int = 1


Record: TypeAlias = (
    Session | Broker | BrokerHome | Executor | Query | Topic | Publication | Subscription
    | PendingDrop | User | JoinToken | Counters
)

CollectionName: TypeAlias = Literal[
    "sessions",
    "brokers",
    "homes",
    "executors",
    "queries",
    "topics",
    "publications",
    "subscriptions",
    "drops",
    "users",
    "tokens",
    "counters",
]

# Collection name -> the one record type it holds. The order is the order of a snapshot.
COLLECTIONS: dict[str, type[msgspec.Struct]] = {
    "sessions": Session,
    "brokers": Broker,
    "homes": BrokerHome,
    "executors": Executor,
    "queries": Query,
    "topics": Topic,
    "publications": Publication,
    "subscriptions": Subscription,
    "drops": PendingDrop,
    "users": User,
    "tokens": JoinToken,
    "counters": Counters,
}


class Update(NamedTuple):
    """One change of one collection: `diff` copies of `record` added (or removed if negative)."""

    collection: CollectionName
    record: Record
    diff: int


# The Kafka topic configs a topic may set (bounds: Kafka's); each overrides the broker's.
TOPIC_CONFIGS: dict[str, tuple[int, int]] = {
    "retention.ms": (-1, 2**63 - 1),
    "retention.bytes": (-1, 2**63 - 1),
    "segment.bytes": (14, 2**31 - 1),
    # How many in-sync replicas must hold a record before acks=all / a flush is answered
    # (DESIGN §5 "Replication"); the brokers enforce it.
    "min.insync.replicas": (1, 2**31 - 1),
}


def check_topic_config(name: str, value: str) -> str:
    """`value` in canonical form if `name` is a topic config tq honours and `value` is within
    its bounds; InvalidConfigError otherwise."""
    bounds = TOPIC_CONFIGS.get(name)
    if bounds is None:
        raise InvalidConfigError(f"topic config {name!r} is not one tq sets per topic; "
                                 f"these are: {', '.join(sorted(TOPIC_CONFIGS))}")
    try:
        number = int(value)
    except ValueError:
        raise InvalidConfigError(f"{name} {value!r} is not a whole number") from None
    if not bounds[0] <= number <= bounds[1]:
        raise InvalidConfigError(f"{name} {number} is outside {bounds[0]}..{bounds[1]}")
    return str(number)


def catalog_topic(collection: str) -> str:
    """The system topic a collection is published as: `__catalog.<collection>`."""
    if collection not in COLLECTIONS:
        raise UnknownCollectionError(
            f"unknown catalog collection {collection!r}; one of {', '.join(COLLECTIONS)}"
        )
    return f"__catalog.{collection}"
