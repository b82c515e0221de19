"""Commands the catalog state machine accepts, and the `Change` it returns for each.

Commands are frozen msgspec Structs with a tag, so the coordinator can log or forward them and
decode them type-checked (`Command` is the tagged union). Each carries every input the catalog
needs, including times (`at_ms`): the catalog reads no clock.

Who may do what is decided by the fields, not by a hidden caller: the coordinator fills
`requester`, `publisher` and `subscriber` with the party that made the request (the session or
the query behind it) and `principal` / `requester` strings with the authenticated principal
behind it (DESIGN §12), and the catalog checks ownership against them (`_access`).

Must not: hold logic; the rules live in `_rules`.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from catalog._records import Owner, Party, Record, Resources, SessionKind, TopicKind, Update

__all__ = [
    "AlterPartition",
    "AlterTopic",
    "Change",
    "CloseSession",
    "Command",
    "CreateTopic",
    "DecommissionBroker",
    "DeleteTopic",
    "FailQuery",
    "KillQuery",
    "OpenSession",
    "AddUser",
    "CreateToken",
    "RedeemToken",
    "RevokeToken",
    "PartitionsDropped",
    "ProcessExited",
    "Publish",
    "RegisterBroker",
    "RegisterExecutor",
    "RemoveBroker",
    "RemoveExecutor",
    "RemoveUser",
    "RotateUser",
    "SessionExpired",
    "PlaceQuery",
    "StartQuery",
    "SubmitQuery",
    "Subscribe",
    "Unpublish",
    "Unsubscribe",
]


class _Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="command"):
    pass


# -- sessions -----------------------------------------------------------------------------------


class OpenSession(_Command, frozen=True, tag="open_session"):
    """A client, executor or query process connected. Creates a Session with a new id."""

    kind: SessionKind
    peer: str
    at_ms: int
    principal: str = "admin"  # who authenticated; only it may use the session


class CloseSession(_Command, frozen=True, tag="close_session"):
    """The session said goodbye. Everything it owned leaves, as for SessionExpired."""

    session_id: int
    at_ms: int


class SessionExpired(_Command, frozen=True, tag="session_expired"):
    """The session's lease ran out. Its executors and brokers leave (queries with processes on
    those executors fail), its publications and subscriptions leave; topics it owns stay."""

    session_id: int
    at_ms: int


# -- brokers and executors ----------------------------------------------------------------------


class RegisterBroker(_Command, frozen=True, tag="register_broker"):
    """A broker came up. `broker_id=None` asks for an id: the one last registered on the same
    host, by the same principal, in the same slot, when that one is down (a host that lost
    its data dir), else a new one. An id the catalog assigned before (and that is not up now)
    re-joins, keeping the partitions located there, when its home's principal registers it
    (or an admin). Either way the id's home becomes (host, principal, slot)."""

    host: str
    address: str
    session_id: int | None  # None: the coordinator's own broker
    broker_id: int | None = None
    kafka_address: str = ""  # HOST:PORT of its Kafka listener, "" for none
    curve_key: str = ""  # its CURVE public key, "" for a PLAIN server
    slot: int = 0  # which of its host's brokers: 0 an executor's own, k its shard k


class RemoveBroker(_Command, frozen=True, tag="remove_broker"):
    """A broker left cleanly. Refused while an executor still names it."""

    broker_id: int


class DecommissionBroker(_Command, frozen=True, tag="decommission_broker"):
    """An admin (`requester`) takes broker `broker_id` out of service for good (DESIGN §5
    "Decommissioning a broker"). Each move `(topic_id, partition, replacement)` puts
    `replacement` (registered, on no replica of it yet) in the partition's replicas in place
    of the broker, which leaves its ISR; where it led, the first other member of the ISR
    leads at the next epoch. A partition whose only in-sync replica it is cannot move (no
    unclean election). Once it holds no replica and locates no partition, its home is
    retired: its id is never placed on, handed out or registered again. A registered (live)
    broker only with `force`; never the coordinator's own."""

    broker_id: int
    requester: str
    force: bool = False
    moves: tuple[tuple[int, int, int], ...] = ()


class RegisterExecutor(_Command, frozen=True, tag="register_executor"):
    """A host agent joined. Creates an Executor with a new id."""

    host: str
    broker_id: int
    resources: Resources
    session_id: int | None  # None: embedded in the coordinator's process
    at_ms: int
    shards: tuple[int, ...] = ()  # the host's other brokers, registered already


class RemoveExecutor(_Command, frozen=True, tag="remove_executor"):
    """The executor left (or the coordinator gave up on it). Live queries with a process still
    running there fail: that process is lost."""

    executor_id: int
    at_ms: int


# -- queries ------------------------------------------------------------------------------------


class SubmitQuery(_Command, frozen=True, tag="submit_query"):
    """Creates a Query in state submitted, placed on `executors` (one executor id per process),
    or pending when `executors` is empty: it waits for free slots (PlaceQuery places it)."""

    name: str
    program: str
    processes: int
    workers: int
    executors: tuple[int, ...]
    at_ms: int
    args: tuple[str, ...] = ()
    owner: str = "admin"  # the submitting principal: it (and its submitters) manage the query
    start_timeout_ms: int = 0  # recorded for the coordinator (0: its default)


class PlaceQuery(_Command, frozen=True, tag="place_query"):
    """A pending query got its executors (one per process): pending -> submitted."""

    query_id: int
    executors: tuple[int, ...]
    at_ms: int


class StartQuery(_Command, frozen=True, tag="start_query"):
    """Every process of the query registered: submitted -> running."""

    query_id: int
    at_ms: int


class ProcessExited(_Command, frozen=True, tag="process_exited"):
    """An executor reports a process's exit code (negative: killed by that signal). Only the
    session of the executor the process was placed on may (`session_id`; None: the
    coordinator itself)."""

    query_id: int
    process: int
    exit_code: int
    at_ms: int
    session_id: int | None = None
    reason: str = ""  # why it failed, in the process's words ("" if it did not say)


class KillQuery(_Command, frozen=True, tag="kill_query"):
    """`requester` (a principal) must manage the query: an admin, the query itself, or a
    principal on its chain of submitters."""

    query_id: int
    at_ms: int
    reason: str = "killed"
    requester: str = "admin"


class FailQuery(_Command, frozen=True, tag="fail_query"):
    """The coordinator gave up on the query (spawn failed, registration timed out, ...)."""

    query_id: int
    reason: str
    at_ms: int


# -- topics, publications, subscriptions --------------------------------------------------------


class CreateTopic(_Command, frozen=True, tag="create_topic"):
    """Creates a Topic. `name` is any accepted spelling; the catalog stores the canonical one.
    `locations[i]` is the broker that hosts partition i; each must be up. A replicated topic
    names `replicas[i]` too (at least two distinct brokers each, all up, `locations[i]` first:
    its leader); each starts in sync, at leader epoch 0."""

    name: str
    partitions: int
    record_type: str
    kind: TopicKind
    owner: Owner
    locations: tuple[int, ...]
    at_ms: int
    creator: str = ""  # the principal asking; an ingest topic's creator may delete it
    replicas: tuple[tuple[int, ...], ...] = ()


class DeleteTopic(_Command, frozen=True, tag="delete_topic"):
    """Deletes a topic and every publication and subscription of it.

    `principal` must own it or manage its owning query (`_access.may_delete_topic`); an admin
    may delete an orphan, and any topic with `force`. Internal topics only by the system
    (`requester` SYSTEM).
    """

    topic_id: int
    requester: Owner
    force: bool = False
    principal: str = "admin"


class AlterTopic(_Command, frozen=True, tag="alter_topic"):
    """Grows a topic to `partitions` (None: as it is), the new ones on `locations` (one broker
    id each, every one up), and sets or removes its configs (`configs`: (name, value or None
    for the broker's), only TOPIC_CONFIGS). Kafka's CreatePartitions and
    IncrementalAlterConfigs. `principal` must be allowed to (`_access.may_alter_topic`)."""

    topic_id: int
    partitions: int | None = None
    locations: tuple[int, ...] = ()
    configs: tuple[tuple[str, str | None], ...] = ()
    principal: str = "admin"
    replicas: tuple[tuple[int, ...], ...] = ()  # of the new partitions, for a replicated topic


class AlterPartition(_Command, frozen=True, tag="alter_partition"):
    """The leader of a replicated partition changes its in-sync replicas (Kafka's
    AlterPartition, KIP-497): `session_id` holds broker `broker_id`, which must lead
    `partition` at `leader_epoch` (else FencedLeaderEpochError) and state the catalog's ISR
    as `expected_isr` (else StaleIsrError: it acted on an old view). The new `isr` keeps the
    leader and adds only registered replicas."""

    session_id: int
    topic_id: int
    partition: int
    broker_id: int
    leader_epoch: int
    expected_isr: tuple[int, ...]
    isr: tuple[int, ...]


class AddUser(_Command, frozen=True, tag="add_user"):
    """An admin (`requester`) names a new principal (`user:NAME` or `executor:NAME`)."""

    principal: str
    role: str
    requester: str
    at_ms: int


class RemoveUser(_Command, frozen=True, tag="remove_user"):
    """An admin removes a named principal: its credential stops working; topics it owns are
    orphaned (an admin may delete them)."""

    principal: str
    requester: str


class RotateUser(_Command, frozen=True, tag="rotate_user"):
    """An admin replaces a named principal's credential: the generation goes up by one, so the
    old key stops working."""

    principal: str
    requester: str


class CreateToken(_Command, frozen=True, tag="create_token"):
    """An admin (`requester`) mints a one-time join token valid for `ttl_ms` from `at_ms`
    (DESIGN §12 "Joining a host"). `salt` is random (the caller draws it); `name`, when not
    "", is the executor name the joiner gets."""

    salt: int
    name: str
    ttl_ms: int
    requester: str
    at_ms: int


class RevokeToken(_Command, frozen=True, tag="revoke_token"):
    """An admin removes a join token: it joins nobody any more."""

    token_id: int
    requester: str


class RedeemToken(_Command, frozen=True, tag="redeem_token"):
    """The holder of join token `token_id` (principal `join:ID`) joins: once, before it
    expires, the token is marked used and `executor:NAME` is made (`name` the joiner's; a
    token minted with a name overrides it)."""

    token_id: int
    name: str
    at_ms: int


class PartitionsDropped(_Command, frozen=True, tag="partitions_dropped"):
    """Broker `broker_id` dropped its partitions of deleted topic `topic_id`: the pending drop
    leaves (UnknownTopicError if there is none: nothing to acknowledge)."""

    topic_id: int
    broker_id: int


class Publish(_Command, frozen=True, tag="publish"):
    """`publisher` starts publishing the topic: it must own it, or the topic must be ingest's.
    `process`: which process of the publishing query (None for other parties)."""

    topic_id: int
    publisher: Party
    process: int | None = None


class Unpublish(_Command, frozen=True, tag="unpublish"):
    """`publisher` stops publishing; only the publisher itself can remove its publication.
    A query's publication leaves once every `process` holding it has unpublished."""

    topic_id: int
    publisher: Party
    process: int | None = None


class Subscribe(_Command, frozen=True, tag="subscribe"):
    """`subscriber` subscribes; if `record_type` or `kind` is given it must match the topic."""

    topic_id: int
    subscriber: Party
    record_type: str | None = None
    kind: TopicKind | None = None


class Unsubscribe(_Command, frozen=True, tag="unsubscribe"):
    topic_id: int
    subscriber: Party


Command: TypeAlias = (
    OpenSession
    | CloseSession
    | SessionExpired
    | RegisterBroker
    | RemoveBroker
    | DecommissionBroker
    | RegisterExecutor
    | RemoveExecutor
    | SubmitQuery
    | PlaceQuery
    | StartQuery
    | ProcessExited
    | KillQuery
    | FailQuery
    | CreateTopic
    | DeleteTopic
    | AlterTopic
    | AlterPartition
    | PartitionsDropped
    | Publish
    | Unpublish
    | Subscribe
    | Unsubscribe
    | AddUser
    | RemoveUser
    | RotateUser
    | CreateToken
    | RevokeToken
    | RedeemToken
)


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """What one command did: the new version, the consolidated updates (retractions first), and
    the record the command created, if any (so the caller learns a new id)."""

    version: int
    updates: tuple[Update, ...]
    created: Record | None = None
