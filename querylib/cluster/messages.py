"""The coordinator's RPC messages (DESIGN §2): sessions, topics, publications, subscriptions,
brokers, executors and queries.

Declarations only. They live in `querylib` because every tq process speaks them and `querylib`
may not import `coordinator`. Catalog records travel as themselves (tagged msgspec Structs), so a
reply carries the exact record the catalog holds. Times are milliseconds. Every request that acts
for someone names its session: the coordinator derives the acting party from it (the query a
query-process session runs, else the session itself), never from a field the client fills in.

Client -> coordinator requests (reply in brackets):
    coord.session.open      OpenSession        [SessionOpened]   new session, or resume one
    coord.session.renew     Heartbeat          [Renewed]         renew the lease
    coord.session.close     CloseSession       [Done]
    coord.info              GetCatalogInfo     [CatalogInfo]     version, catalog broker, topics
    coord.loads             GetLoads           [Loads]           each executor's last load
    coord.topic.lookup      LookupTopic        [TopicInfo]       optionally waiting for it
    coord.topic.create      CreateTopic        [TopicInfo]
    coord.topic.delete      DeleteTopic        [Done]
    coord.topic.alter       AlterTopic         [TopicInfo]
    coord.partition.alter   AlterPartition     [TopicInfo]       a leader changes its ISR
    coord.topic.dropped     ReportPartitionsDropped [Done]       a broker dropped a deleted topic
    coord.publish           Publish            [TopicInfo]
    coord.unpublish         Unpublish          [Done]
    coord.subscribe         Subscribe          [TopicInfo]       optionally waiting for the topic
    coord.unsubscribe       Unsubscribe        [Done]
    coord.broker.register   RegisterBroker     [BrokerInfo]
    coord.broker.remove     RemoveBroker       [Done]
    coord.broker.decommission DecommissionBroker [Decommissioned] admins: move a broker's
                                                                 replicas to live ones, retire it
    coord.executor.register RegisterExecutor   [ExecutorInfo]
    coord.executor.remove   RemoveExecutor     [Done]
    coord.query.submit      SubmitQuery        [QueryInfo]
    coord.query.exited      ReportExit         [QueryInfo]       an executor reports an exit code
    coord.query.kill        KillQuery          [QueryInfo]
    coord.query.spawn_failed ReportSpawnFailed [QueryInfo]       an executor could not start one
    coord.artifact.upload   UploadArtifact     [ArtifactStored]  a chunk of a program pack
    coord.artifact.fetch    FetchArtifact      [ArtifactStored]  ... and its bytes back (payload)
    coord.user.add          AddUser            [UserCredential]  admins: a new named principal
    coord.user.rotate       RotateUser         [UserCredential]  admins: a new key for one
    coord.user.remove       RemoveUser         [Done]            admins: its key stops working
    coord.principal.key     ResolvePrincipal   [PrincipalKey]    executors: a principal's broker
                                                                 key, for their broker's keyring
    coord.token.create      CreateToken        [TokenMinted]     admins: a one-time join token
    coord.token.revoke      RevokeToken        [Done]            admins: it joins nobody any more
    coord.join              JoinCluster        [JoinBundle]      a join token's holder (join:ID,
                                                                 no session): redeem it once
Coordinator -> executor notify:
    coord.spawn.processes   SpawnProcesses                       start these processes of a query
    coord.kill.processes    KillProcesses                        terminate what is left of a query
    coord.drop.partitions   DropPartitions                       drop a deleted topic's partitions
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from catalog import (
    MAX_BROKER_SLOT,
    Broker,
    Executor,
    JoinToken,
    Query,
    Resources,
    SessionKind,
    Topic,
    TopicKind,
    UnknownTopicError,
    User,
)
from querylib.rpc import Notify, Reply, Request

__all__ = [
    "ARTIFACT_CHUNK_BYTES",
    "CURVE_KEY_PATTERN",
    "AddUser",
    "AlterPartition",
    "AlterTopic",
    "ArtifactStored",
    "AwaitStart",
    "BrokerInfo",
    "CatalogInfo",
    "CheckpointRef",
    "CloseSession",
    "CreateToken",
    "CreateTopic",
    "Decommissioned",
    "DecommissionBroker",
    "DeleteTopic",
    "Done",
    "DropPartitions",
    "ExecutorInfo",
    "FetchArtifact",
    "GetCatalogInfo",
    "GetGroups",
    "GetLoads",
    "GroupInfo",
    "GroupOffset",
    "Groups",
    "Heartbeat",
    "HostLoad",
    "JoinBundle",
    "JoinCluster",
    "KillProcesses",
    "KillQuery",
    "Loads",
    "LookupTopic",
    "OpenSession",
    "PartitionMove",
    "PartitionStuck",
    "PrincipalKey",
    "ProcessLoad",
    "Publish",
    "QueryInfo",
    "RegisterBroker",
    "RegisterExecutor",
    "RemoveBroker",
    "RemoveExecutor",
    "RemoveUser",
    "Renewed",
    "ReportExit",
    "ReportPartitionsDropped",
    "ReportSpawnFailed",
    "ResolvePrincipal",
    "RevokeToken",
    "RotateUser",
    "SessionOpened",
    "SpawnProcesses",
    "SubmitQuery",
    "Subscribe",
    "TokenMinted",
    "TopicInfo",
    "Unpublish",
    "Unsubscribe",
    "UploadArtifact",
    "UserCredential",
    "partition_leader",
]


# --------------------------------------------------------------------------- replies


class Done(Reply, tag="coord.done"):
    """The request took effect; `version` is the catalog version that holds the effect."""

    version: int


class SessionOpened(Reply, tag="coord.session.opened"):
    session_id: int
    lease_ms: int           # the lease granted (the coordinator clamps the request)
    version: int
    resumed: bool           # True: an existing session was handed back
    catalog_broker: str     # the broker serving the __catalog.* topics
    namespace: str = "public/default"  # the cluster's default: what a bare topic name means
    catalog_broker_key: str = ""  # its CURVE public key, "" when it is a PLAIN server


class Renewed(Reply, tag="coord.session.renewed"):
    lease_ms: int
    version: int


class CheckpointRef(msgspec.Struct, frozen=True):
    """The latest checkpoint of the catalog topics: a follower starts at its collection's
    block offset, where the collection at `version` is written out whole."""

    version: int
    offsets: dict[str, int]


class CatalogInfo(Reply, tag="coord.info.reply"):
    version: int
    catalog_broker: str
    collections: dict[str, str]   # collection -> its topic on the catalog broker
    checkpoint: CheckpointRef | None = None
    namespace: str = "public/default"  # the cluster's default: what a bare topic name means
    catalog_broker_key: str = ""  # its CURVE public key, "" when it is a PLAIN server


def partition_leader(topic: Topic, partition: int) -> tuple[int, int, int]:
    """Partition `partition`'s leader in `topic`: (topic id, broker id, leader epoch)."""
    epochs = topic.leader_epochs
    return topic.topic_id, topic.locations[partition], epochs[partition] if epochs else 0


class TopicInfo(Reply, tag="coord.topic.info"):
    topic: Topic
    brokers: dict[int, str]       # broker id -> address, for every partition location
    version: int
    epoch: int = 0                # on Publish: the epoch the publication's writers start
    # broker id -> CURVE public key, for those of `brokers` that are CURVE servers
    broker_keys: dict[int, str] = {}

    def leader(self, partition: int) -> tuple[int, int, int]:
        """Partition `partition`'s leader as the catalog names it: (topic id, broker id,
        leader epoch), what a watch of its leader starts from (`Cluster.watch_leader`)."""
        return partition_leader(self.topic, partition)

    def leader_address(self, partition: int) -> str:
        """The address of the broker leading `partition` (UnknownTopicError when it is not
        up)."""
        broker_id = self.topic.locations[partition]
        try:
            return self.brokers[broker_id]
        except KeyError:
            raise UnknownTopicError(f"partition {partition} of {self.topic.short_name!r} is "
                                    f"on broker {broker_id}, which is not up") from None


class BrokerInfo(Reply, tag="coord.broker.info"):
    broker: Broker
    version: int


class ExecutorInfo(Reply, tag="coord.executor.info"):
    executor: Executor
    version: int


class QueryInfo(Reply, tag="coord.query.info"):
    query: Query
    version: int


class ArtifactStored(Reply, tag="coord.artifact.stored"):
    """The coordinator holds the pack `sha256` (hex) of `size` bytes (FetchArtifact: the bytes
    follow as the reply's one payload frame)."""

    sha256: str
    size: int


# --------------------------------------------------------------------------- load


class ProcessLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One query process with everything it started (a Spark JVM, a multiprocessing pool)."""

    query_id: int
    process: int
    pid: int
    rss: int                 # bytes, summed over the process and its descendants
    cpu_percent: float       # since the previous sample; 100.0 = one core busy
    processes: int           # the process and its live descendants


class HostLoad(msgspec.Struct, frozen=True, kw_only=True):
    sampled_at_ms: int
    cpu_percent: float       # the whole host, 0..100 (all cores)
    memory_used: int
    memory_available: int
    disk_free: int           # on the data directory's file system
    running: int             # query processes under supervision
    per_process: tuple[ProcessLoad, ...] = ()


# --------------------------------------------------------------------------- sessions


class OpenSession(Request[SessionOpened], tag="coord.session.open"):
    """Open a session, or take back `resume` if the coordinator still holds it (after a client
    restart, or after the coordinator's). A query process names its query and process index:
    the session then acts as that query, and its expiry fails the query."""

    kind: SessionKind = SessionKind.CLIENT
    peer: str = ""
    lease_ms: int = 10_000
    resume: int | None = None
    query_id: int | None = None
    process: int | None = None


class Heartbeat(Request[Renewed], tag="coord.session.renew"):
    session_id: int
    lease_ms: int | None = None   # None: keep the lease length granted before
    load: HostLoad | None = None  # an executor's: its host's load, for placement


class CloseSession(Request[Done], tag="coord.session.close"):
    session_id: int


class GetCatalogInfo(Request[CatalogInfo], tag="coord.info"):
    pass


class Loads(Reply, tag="coord.loads.reply"):
    """The load each executor reported with its last heartbeat (by executor id; one that has
    not sent one yet is missing). Kept in the coordinator's memory, not in the catalog: it
    changes with every heartbeat."""

    loads: dict[int, HostLoad]


class GetLoads(Request[Loads], tag="coord.loads"):
    pass


class GroupOffset(msgspec.Struct, frozen=True):
    topic: str              # as Kafka clients name it
    partition: int
    offset: int             # the group's committed offset


class GroupInfo(msgspec.Struct, frozen=True):
    group_id: str
    state: str              # Kafka's: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    members: int
    committed: list[GroupOffset]


class Groups(Reply, tag="coord.groups.reply"):
    """The consumer groups the cluster's group coordinator holds (the coordinator's Kafka
    listener): those the asking principal may describe (every one for the admin)."""

    groups: list[GroupInfo]


class GetGroups(Request[Groups], tag="coord.groups"):
    pass


# --------------------------------------------------------------------------- topics


class LookupTopic(Request[TopicInfo], tag="coord.topic.lookup"):
    """The topic called `name`; with `wait_ms`, wait that long for it to be created."""

    name: str
    wait_ms: int = 0


class CreateTopic(Request[TopicInfo], tag="coord.topic.create"):
    """Create a topic owned by the session's party (or by `ingest`, fed from outside).
    `locations` (broker id per partition) defaults to the coordinator's placement.
    `replication_factor` (None: 1 with one executor host, else min(3, hosts)) copies each
    partition on as many executor hosts (DESIGN §5 "Replication"); not with `locations`."""

    session_id: int
    name: str
    partitions: int = 1
    record_type: str = "bytes"
    kind: TopicKind = TopicKind.STREAM
    ingest: bool = False
    locations: tuple[int, ...] | None = None
    replication_factor: int | None = None


class AlterPartition(Request[TopicInfo], tag="coord.partition.alter"):
    """A replicated partition's leader changes its in-sync replicas (Kafka's AlterPartition,
    KIP-497): sent by the session holding broker `broker_id`, the leader of `partition` at
    `leader_epoch`, believing the ISR to be `expected_isr`; applied only if all three still
    hold (else FencedLeaderEpochError or a retriable refusal with the topic as it is)."""

    session_id: int
    topic_id: int
    partition: int
    broker_id: int
    leader_epoch: int
    expected_isr: tuple[int, ...]
    isr: tuple[int, ...]


class DeleteTopic(Request[Done], tag="coord.topic.delete"):
    session_id: int
    name: str
    force: bool = False


class AlterTopic(Request[TopicInfo], tag="coord.topic.alter"):
    """Grow a topic to `partitions` (None: as it is), the new ones on `locations` (default:
    the coordinator's placement), and set its Kafka configs (`configs`: name -> value, None
    for the broker's). Kafka's CreatePartitions and IncrementalAlterConfigs; `tq topic alter`,
    `tq topic add-partitions`."""

    session_id: int
    name: str
    partitions: int | None = None
    locations: tuple[int, ...] | None = None
    configs: dict[str, str | None] = {}


class ReportPartitionsDropped(Request[Done], tag="coord.topic.dropped"):
    """An executor's broker dropped its partitions of deleted topic `topic_id` (after a
    `DropPartitions`): the coordinator forgets that pending drop."""

    session_id: int
    topic_id: int
    broker_id: int


class DropPartitions(Notify, tag="coord.drop.partitions"):
    """To an executor: drop these partitions of deleted topic `topic_id` (`name`, canonical)
    from broker `broker_id`, files included, then answer `ReportPartitionsDropped`. Sent after
    the delete is durable and again each time that broker registers, until reported."""

    topic_id: int
    name: str
    broker_id: int
    partitions: list[int]


class Publish(Request[TopicInfo], tag="coord.publish"):
    session_id: int
    name: str


class Unpublish(Request[Done], tag="coord.unpublish"):
    session_id: int
    name: str


class Subscribe(Request[TopicInfo], tag="coord.subscribe"):
    """Subscribe the session's party; with `wait_ms`, wait that long for the topic to exist."""

    session_id: int
    name: str
    record_type: str | None = None
    kind: TopicKind | None = None
    wait_ms: int = 0


class Unsubscribe(Request[Done], tag="coord.unsubscribe"):
    session_id: int
    name: str


# --------------------------------------------------------------------------- brokers, executors

CURVE_KEY_PATTERN = r"\A(?:[0-9a-zA-Z.:+=^!/*?&<>()\[\]{}@%$#-]{40})?\Z"
"""A CURVE public key as ZeroMQ takes it (40 characters of Z85), or "" for a PLAIN server."""

CurveKey = Annotated[str, msgspec.Meta(pattern=CURVE_KEY_PATTERN)]


class RegisterBroker(Request[BrokerInfo], tag="coord.broker.register"):
    """A broker came up; it leaves with the session. `broker_id` re-joins under an old id
    (its home's principal's, or an admin's)."""

    session_id: int
    host: str
    address: str
    broker_id: int | None = None
    kafka_address: str = ""  # HOST:PORT of the broker's Kafka listener, "" for none
    curve_key: CurveKey = ""  # the broker's CURVE public key (Z85), "" for a PLAIN server
    # Which of its host's brokers (0: an executor's own, k: its shard k). With no broker_id,
    # the id last registered from this host, principal and slot comes back if it is down.
    slot: Annotated[int, msgspec.Meta(ge=0, le=MAX_BROKER_SLOT)] = 0


class RemoveBroker(Request[Done], tag="coord.broker.remove"):
    session_id: int
    broker_id: int


class PartitionMove(msgspec.Struct, frozen=True):
    """A decommissioned broker's replica of `topic`'s `partition` went to broker `to`."""

    topic: str  # the short name
    partition: int
    to: int


class PartitionStuck(msgspec.Struct, frozen=True):
    """A decommissioned broker's partition that could not move, and why."""

    topic: str  # the short name
    partition: int
    reason: str


class Decommissioned(Reply, tag="coord.broker.decommission.reply"):
    """What `DecommissionBroker` did: the replicas it moved, those it could not (the broker
    is `retired` only when none is left), at catalog `version` (DESIGN §5 "Decommissioning
    a broker")."""

    broker_id: int
    moved: list[PartitionMove]
    stuck: list[PartitionStuck]
    retired: bool
    version: int


class DecommissionBroker(Request[Decommissioned], tag="coord.broker.decommission"):
    """Admins: move every replica off broker `broker_id` to live brokers and retire it; a
    broker that is up only with `force` (it is drained, then takes nothing new)."""

    session_id: int
    broker_id: int
    force: bool = False


class RegisterExecutor(Request[ExecutorInfo], tag="coord.executor.register"):
    session_id: int
    host: str
    broker_id: int
    resources: Resources
    shards: tuple[int, ...] = ()  # the host's other brokers (`tq executor --brokers N`)


class RemoveExecutor(Request[Done], tag="coord.executor.remove"):
    session_id: int
    executor_id: int


# --------------------------------------------------------------------------- queries


class SubmitQuery(Request[QueryInfo], tag="coord.query.submit"):
    """A query placed on `executors` (one per process), or by the coordinator when None. The
    coordinator tells those executors to spawn the processes; a query it places that does not
    fit the free process slots is pending until it does (in submission order)."""

    session_id: int
    name: str
    program: str
    processes: int = 1
    workers: int = 1
    args: tuple[str, ...] = ()
    executors: tuple[int, ...] | None = None
    # True: answer once every process registered (the query runs), or with QueryFailedError
    # once it failed (a spawn failed, the start timed out, it was killed).
    wait: bool = False
    # From submission until every process registered (waiting for slots included); past it
    # the query fails. None: the coordinator's default.
    start_timeout_ms: int | None = None


class AwaitStart(Request[QueryInfo], tag="coord.query.await_start"):
    """Answer once query `query_id` runs (every process registered), or with QueryFailedError
    once it failed or was killed first: what a query process waits on before running `main`
    (the start barrier), and `tq submit` after a pending reply."""

    session_id: int
    query_id: int


class ReportExit(Request[QueryInfo], tag="coord.query.exited"):
    session_id: int
    query_id: int
    process: int
    exit_code: int
    reason: str = ""  # why it failed, as the process wrote it (its TQ_FAILURE_FILE)


class KillQuery(Request[QueryInfo], tag="coord.query.kill"):
    session_id: int
    query_id: int
    reason: str = "killed"


class KillProcesses(Notify, tag="coord.kill.processes"):
    """To an executor: terminate these processes of the query (it failed or was killed)."""

    query_id: int
    processes: list[int]
    reason: str


class ReportSpawnFailed(Request[QueryInfo], tag="coord.query.spawn_failed"):
    """An executor could not start a process of the query: the query fails with `reason`."""

    session_id: int
    query_id: int
    process: int
    reason: str


class SpawnProcesses(Notify, tag="coord.spawn.processes"):
    """To an executor: start these processes of the query. `program` is a source
    (`sha256:<hex>` for an uploaded pack, `file://`, `http(s)://`)."""

    query_id: int
    program: str
    processes: list[int]
    process_count: int
    workers: int
    args: list[str]
    executor_id: int
    # The processes' credential (principal `query:<query_id>`), sealed with the executor's
    # own key (querylib.rpc.seal): only that executor reads it (DESIGN §12).
    credential: bytes = b""
    name: str = ""  # the query's name, for its processes' titles (TQ_QUERY_NAME)


# --------------------------------------------------------------------------- principals


class UserCredential(Reply, tag="coord.user.credential"):
    """A named principal and its key, sealed with the requester's own key."""

    user: User
    sealed_key: bytes
    version: int
    coordinator_key: str = ""  # the coordinator's CURVE public key, "" when it is PLAIN


class PrincipalKey(Reply, tag="coord.principal.key.reply"):
    """A principal's broker-audience key sealed with the requester's key; empty when the
    principal does not exist (now). `valid_ms`: how long the requester may cache it."""

    principal: str
    sealed_key: bytes
    valid_ms: int


class AddUser(Request[UserCredential], tag="coord.user.add"):
    session_id: int
    principal: str  # user:NAME or executor:NAME
    role: str = "user"


class RotateUser(Request[UserCredential], tag="coord.user.rotate"):
    session_id: int
    principal: str


class RemoveUser(Request[Done], tag="coord.user.remove"):
    session_id: int
    principal: str


class ResolvePrincipal(Request[PrincipalKey], tag="coord.principal.key"):
    """`principal`'s broker key; with `curve_key` (and no principal): the principal whose
    broker key gives that CURVE public key (Z85), and its key."""

    session_id: int
    principal: str
    curve_key: bytes = b""


# --------------------------------------------------------------------------- joining a host


class TokenMinted(Reply, tag="coord.token.create.reply"):
    """A new join token: its record, its secret (the key of `join:ID`) sealed with the
    requester's key, and the addresses joiners reach the coordinator at (DESIGN §12 "Joining
    a host")."""

    token: JoinToken
    sealed_secret: bytes
    coordinators: list[str]
    version: int
    coordinator_key: str = ""  # its CURVE public key, when it is a CURVE server (DESIGN §2)


class CreateToken(Request[TokenMinted], tag="coord.token.create"):
    session_id: int
    ttl_ms: int = 3_600_000
    name: str = ""  # the executor name the joiner gets ("": its host name)


class RevokeToken(Request[Done], tag="coord.token.revoke"):
    session_id: int
    token_id: int


class JoinBundle(Reply, tag="coord.join.reply"):
    """What a joining host gets for its token: its executor principal and key (sealed with
    the token's key, in a reply signed with it), every coordinator address, and the cluster's
    settings. New fields get defaults, so older joiners still decode it."""

    principal: str
    sealed_key: bytes
    coordinators: list[str]
    namespace: str = ""
    version: int = 0
    coordinator_key: str = ""  # its CURVE public key, when it is a CURVE server (DESIGN §2)


class JoinCluster(Request[JoinBundle], tag="coord.join"):
    """Redeem the join token the sender authenticated with (principal `join:ID`); needs no
    session. `name`: the executor name asked for (the joiner's host name)."""

    name: str


# --------------------------------------------------------------------------- artifacts


# The most bytes of a pack one UploadArtifact carries: the coordinator accepts no bigger
# message (DESIGN §2 "Limits"), so an unsigned one cannot make it buffer more.
ARTIFACT_CHUNK_BYTES = 1024 * 1024


class UploadArtifact(Request[ArtifactStored], tag="coord.artifact.upload"):
    """One chunk of a program pack, content-addressed: bytes [offset, offset + chunk) of a
    pack of `size` bytes that must hash to `sha256`, as the request's one payload frame of at
    most ARTIFACT_CHUNK_BYTES. Chunks come in order, each after the reply to the one before;
    offset 0 starts (or restarts) the session's upload of that pack. The reply says how many
    bytes are held; once they are `size`, the pack is checked and stored."""

    session_id: int
    sha256: str
    offset: int = 0
    size: int = 0


class FetchArtifact(Request[ArtifactStored], tag="coord.artifact.fetch"):
    """The pack `sha256`, as the reply's payload frame (NotFoundError if nobody uploaded it)."""

    session_id: int
    sha256: str
