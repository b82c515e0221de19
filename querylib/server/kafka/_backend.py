"""What the Kafka endpoint needs from the broker behind it: `KafkaBackend`, and the values that
cross that line.

The listener and its handlers speak Kafka; the backend hosts partitions, stores group state and
knows the cluster. `BrokerBackend` (a tq broker in the same process, its cluster view from the
catalog, or the broker alone for `tq broker` and `tq kafka`) implements it.

Topic names here are the Kafka-visible names (`numbers`, `tenant/ns/name`). Offsets and sizes
are Kafka's. Errors are `TqError`s whose `kafka_error_code` the handlers put in responses
(UnknownTopicError, NotLeaderError, OffsetOutOfRangeError, RecordError, ...).

Declarations only: no I/O here.
"""

from __future__ import annotations

import uuid
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from catalog import Topic, TopicName

from ._fetch import SizedChunk

if TYPE_CHECKING:
    from ._txn import TransactionCoordinator

__all__ = [
    "AppendResult",
    "BrokerInfo",
    "CommittedOffset",
    "ConfigEntry",
    "GroupMemberRecord",
    "GroupRecord",
    "KafkaBackend",
    "PartitionInfo",
    "PartitionOffsets",
    "PartitionRead",
    "TopicInfo",
    "kafka_topic_id",
]

# Kafka topic ids are derived, not stored: uuid5 in this namespace of the topic's canonical
# name, its catalog id and its creation time (DESIGN §8 "Topic ids").
_TOPIC_ID_NAMESPACE = uuid.UUID("6a1c3f0e-2b8d-5e47-9c1a-7f4e2d9b8a31")


def kafka_topic_id(full_name: str, catalog_id: int = 0, created_ms: int = 0) -> uuid.UUID:
    """The Kafka topic id (Metadata v10+, Fetch v13+, CreateTopics v7) of one incarnation of
    a topic: the same from every listener, a new one when the name is created again. A broker
    without a catalog derives it from the name alone (catalog id and time 0)."""
    return uuid.uuid5(_TOPIC_ID_NAMESPACE, f"{full_name}\x00{catalog_id}\x00{created_ms}")


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A broker as Kafka clients see it: where to connect for the partitions it leads."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    index: int
    leader: int  # node id of the broker hosting the partition
    # A replicated partition's (DESIGN §5 "Replication"): every replica's broker, the in-sync
    # ones, its leader epoch and the replicas whose broker is not registered. Empty / -1 for a
    # partition of one replica (its leader alone; epoch -1: clients skip epoch validation).
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    leader_epoch: int = -1
    offline: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: tuple[PartitionInfo, ...]
    internal: bool = False
    configs: tuple[tuple[str, str], ...] = ()  # Kafka configs the topic sets (the catalog's)
    topic_id: uuid.UUID | None = None  # its Kafka id (`kafka_topic_id`); None: from the name

    @property
    def kafka_id(self) -> uuid.UUID:
        if self.topic_id is not None:
            return self.topic_id
        return kafka_topic_id(TopicName.parse(self.name).full)


def catalog_topic_info(topic: Topic, name: str | None = None,
                       registered: Container[int] | None = None) -> TopicInfo:
    """A catalog topic as Kafka's Metadata shows it: each partition led by its broker, with
    its replicas, ISR and leader epoch when replicated (offline: replicas whose broker is not
    in `registered`, when given)."""
    partitions = []
    for i, leader in enumerate(topic.locations):
        if not topic.replicas:
            partitions.append(PartitionInfo(i, leader))
            continue
        replicas = topic.replicas[i]
        offline = () if registered is None else tuple(b for b in replicas
                                                        if b not in registered)
        partitions.append(PartitionInfo(i, leader, replicas, topic.isr[i],
                                        topic.leader_epochs[i], offline))
    return TopicInfo(name or topic.short_name, tuple(partitions), internal=topic.internal,
                     configs=topic.configs,
                     topic_id=kafka_topic_id(topic.name, topic.topic_id, topic.created_at_ms))


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int  # of the first appended batch (or of the original, for a duplicate)
    log_start_offset: int
    log_append_time: int = -1  # -1: the topic keeps CreateTime


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    log_start_offset: int
    high_watermark: int  # what consumers may read: acknowledged by the flush policy
    last_stable_offset: int  # no undecided transaction below it (read_committed reads to here)


@dataclass(slots=True)
class PartitionRead:
    """Whole batches from the one holding the fetch offset, as chunks to send unchanged
    (file slices, or bytes), plus the partition's offsets. Close it after sending."""

    offsets: PartitionOffsets
    chunks: list[SizedChunk | bytes] = field(default_factory=list)
    # read_committed: (producer id, first offset) of the aborted transactions in the range
    aborted: list[tuple[int, int]] | None = None

    @property
    def size(self) -> int:
        return sum(len(c) if isinstance(c, bytes) else c.length for c in self.chunks)

    def close(self) -> None:
        for chunk in self.chunks:
            close = getattr(chunk, "close", None)
            if close is not None:
                close()
        self.chunks = []


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config of a topic or broker as DescribeConfigs reports it: Kafka's name, its
    value, where it comes from (Kafka's ConfigSource: 4 STATIC_BROKER_CONFIG, 5
    DEFAULT_CONFIG, ...), its type (ConfigType: 2 STRING, 3 INT, 5 LONG, 7 LIST) and the
    broker setting it defaults to (a synonym), if any."""

    name: str
    value: str
    source: int
    config_type: int
    read_only: bool = True
    synonym: str | None = None


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One committed offset of a group (OffsetCommit value v3 in `__consumer_offsets`)."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1  # ms since the epoch


@dataclass(frozen=True, slots=True)
class GroupMemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # the member's metadata for the chosen protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A group's state after a rebalance (GroupMetadata value v3 in `__consumer_offsets`)."""

    group_id: str
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int  # ms since the epoch
    members: tuple[GroupMemberRecord, ...] = ()


@runtime_checkable
class KafkaBackend(Protocol):
    """The partitions, cluster view and group store behind a Kafka listener."""

    @property
    def cluster_id(self) -> str: ...

    @property
    def controller_id(self) -> int: ...

    @property
    def auto_create_topics(self) -> bool:
        """Whether Metadata (and a producer) may create a topic that does not exist."""
        ...

    def brokers(self) -> Sequence[BrokerInfo]: ...

    # ---- topics -------------------------------------------------------------------------------

    async def topics(self, names: Sequence[str] | None = None) -> list[TopicInfo]:
        """The named topics that exist (all, internal ones included, when `names` is None).
        Names that do not exist are left out; invalid names raise InvalidTopicNameError."""
        ...

    async def create_topic(self, name: str, partitions: int | None = None, *,
                           validate_only: bool = False,
                           replication_factor: int | None = None) -> TopicInfo | None:
        """Create an ingest topic (the backend's default partition count when None) with
        `replication_factor` copies of each partition (None: the cluster's default); with
        `validate_only`, check everything creating it would and create nothing (None).
        TopicExistsError, InvalidTopicNameError, ReservedTopicNameError, InvalidPartitionsError,
        InvalidReplicationFactorError."""
        ...

    async def delete_topic(self, name: str, principal: str) -> None:
        """Delete a topic as `principal` (Kafka's DeleteTopics): UnknownTopicError,
        TopicAuthorizationError unless `principal` writes it or is the admin."""
        ...

    async def create_partitions(self, name: str, count: int, principal: str, *,
                                validate_only: bool = False) -> None:
        """Grow a topic to `count` partitions as `principal` (CreatePartitions):
        InvalidPartitionsError unless it grows, TopicAuthorizationError."""
        ...

    async def alter_topic_configs(self, name: str, changes: Mapping[str, str | None],
                                  principal: str, *, validate_only: bool = False) -> None:
        """Set (None: remove) Kafka configs of a topic as `principal`
        (IncrementalAlterConfigs): InvalidConfigError for one tq does not set per topic."""
        ...

    async def topic_configs(self, name: str) -> list[ConfigEntry]:
        """The configs in force for a topic (DescribeConfigs); UnknownTopicError."""
        ...

    def broker_configs(self) -> list[ConfigEntry]:
        """This broker's defaults for them (DescribeConfigs of a BROKER resource)."""
        ...

    # ---- data ---------------------------------------------------------------------------------

    async def delete_records(self, topic: str, partition: int, offset: int,
                             principal: str) -> int:
        """Move the log start offset of a partition this broker leads up to `offset` (-1: the
        high watermark) as `principal` (DeleteRecords): the new low watermark.
        OffsetOutOfRangeError past the high watermark, TopicAuthorizationError."""
        ...

    async def append(
        self, topic: str, partition: int, batches: Sequence[bytes], *, acks: int,
        principal: str = "anonymous",
    ) -> AppendResult:
        """Append producer batches (RecordBatch v2) to a partition this broker leads, as
        `principal` (the broker admits the writer), with idempotent-producer sequence checks,
        returning once `acks` is met: 0 and 1 when appended, -1 when durable under the flush
        policy."""
        ...

    async def password(self, principal: str) -> str | None:
        """The Kafka SASL password of `principal`, None when no such principal exists now."""
        ...

    async def authorize_group(self, group_id: str, principal: str, *, claim: bool) -> bool:
        """Whether `principal` may use the group; `claim`: make a group nobody has its."""
        ...

    async def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, *,
        committed: bool = False, leader_epoch: int = -1,
    ) -> PartitionRead:
        """Stored batches from the one holding `offset`, up to `max_bytes` (at least one batch
        when there is one), none past the high watermark (`committed`: the last stable
        offset, and the read's `aborted` transactions filled in). OffsetOutOfRangeError
        outside log start .. high watermark. `leader_epoch`, on this and the offset lookups:
        the client's current_leader_epoch (-1: none); a replicated partition this broker does
        not lead is NotLeaderOrFollowerError, one at another epoch FencedLeaderEpochError
        (older) or UnknownLeaderEpochError (newer)."""
        ...

    async def offsets(self, topic: str, partition: int, *,
                      leader_epoch: int = -1) -> PartitionOffsets: ...

    async def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int, *, leader_epoch: int = -1
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms`."""
        ...

    async def epoch_end(self, topic: str, partition: int, epoch: int, *,
                        leader_epoch: int = -1) -> tuple[int, int]:
        """OffsetForLeaderEpoch on the partition's leader: (the largest leader epoch at most
        `epoch` in its log, the offset where it ended; its log end for the current epoch)."""
        ...

    async def offset_of_max_timestamp(
        self, topic: str, partition: int, *, leader_epoch: int = -1
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with the largest timestamp below the high
        watermark (ListOffsets MAX_TIMESTAMP), None when there is none."""
        ...

    async def wait_for_data(
        self, positions: Sequence[tuple[str, int, int]], timeout: float
    ) -> None:
        """Return when one of the (topic, partition, offset) has data at or past `offset`
        below its high watermark, or after `timeout` seconds."""
        ...

    async def allocate_producer_id(self) -> int:
        """A producer id never handed out before on this cluster (InitProducerId)."""
        ...

    @property
    def transactions(self) -> TransactionCoordinator:
        """The transaction coordinator of this listener's transactional ids (`_txn`)."""
        ...

    # ---- groups -------------------------------------------------------------------------------

    async def coordinator(self, group_id: str) -> BrokerInfo:
        """The broker coordinating `group_id`."""
        ...

    async def coordinates(self, group_id: str) -> bool:
        """Whether this listener coordinates `group_id` (else group requests get
        NOT_COORDINATOR and clients ask FindCoordinator again)."""
        ...

    async def store_offsets(self, group_id: str, offsets: Sequence[CommittedOffset]) -> None:
        """Persist committed offsets; durable when this returns."""
        ...

    async def committed_offsets(self, group_id: str) -> Mapping[tuple[str, int], CommittedOffset]:
        ...

    async def store_group(self, record: GroupRecord) -> None:
        """Persist a group's state after a rebalance."""
        ...

    async def delete_offsets(self, group_id: str,
                             partitions: Sequence[tuple[str, int]]) -> None:
        """Delete committed offsets of a group (tombstones); durable when this returns."""
        ...

    async def delete_group(self, group_id: str) -> None:
        """Delete a group's stored state and every offset it committed (tombstones)."""
        ...

    async def stored_groups(self) -> Sequence[GroupRecord]:
        """The groups stored so far (to restore the coordinator on start)."""
        ...
