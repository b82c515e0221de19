"""BrokerBackend: the Kafka endpoint's backend over a live tq broker in the same process, through
its public door (`querylib.broker.BrokerPort`), so every broker serves its own partitions to
Kafka clients (DESIGN §8). `tq kafka` is such a broker with no RPC socket (`_run.py`).

It shares the broker's partition logs and never writes one itself: producer batches and
offset commits are requests of broker sessions (`BrokerPort.link`), Kafka clients' as the
principal SASL authenticated them as, else "anonymous" (one session per principal, DESIGN
§12), `__consumer_offsets` as "system", answered once durable
under the broker's flush policy. So the broker's core admits every Kafka write as it admits
any other (the topic's writers rule, its placement, an ended stream, the batch size: their
errors carry the Kafka codes 29, 6, 44, 10), the append lane stays each log's one writer and
tq subscribers see Kafka-produced records like any others. Reads use the port's log (reads are
thread-safe) up to the durable end (`info().high_watermark`), or for read_committed up to
the last stable offset (`info().log_end`, what tq's subscribers see); `on_visible` wakes
fetches waiting for data.

What it does not know, it asks its `KafkaCluster`: which brokers have Kafka listeners, which
topics exist with how many partitions where, which partitions it leads for reads. Under an
executor that is the catalog (executor/_endpoints.py); a standalone broker uses
`StandaloneCluster`: the broker alone, its hosted partitions are the topics.

Group state and committed offsets live in `__consumer_offsets` partition 0 of the broker that
coordinates groups, in Kafka's formats: the one `KafkaCluster.group_coordinator()` names (the
coordinator's own broker, in a cluster), else this one (a standalone broker). A broker that
does not coordinate names the one that does in FindCoordinator, and its group service
answers group requests with NOT_COORDINATOR. Producer ids are
`node id << 32 | n`, with n reserved in blocks in `<broker data>/.tq-kafka.json`, so brokers
never hand out the same id.

Kafka transactions (`_txn`): the backend is its `TransactionCoordinator`'s `TxnLog`: the
coordinator's records go to `__transaction_state` partition 0 as "system", markers into a
partition this broker hosts as "system" and into another broker's over RPC as the admin
(`secret`; one `WriteMarkersRequest` per broker per completion), the coordinator's pending
offsets into `__consumer_offsets`. A record the coordinator marks not durable (an Ongoing
transition) is answered once written, without an fsync of its own (`ProduceRequest.written`). A
task finishes prepared transactions and aborts timed-out ones every second. Reads for
read_committed fetches stop at the last stable offset and carry the aborted transactions of
their range.

Must not: decide who may write what (the broker's core does), decode or re-encode producer
batches, append to a log directly, or hold state the logs cannot rebuild except
idempotent-producer sequences (lost on restart, as Kafka loses them with its producer
snapshots: a producer then continues as if new).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from catalog import ANONYMOUS, TOPIC_CONFIGS, TopicName, check_topic_config
from catalog.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    ReservedTopicNameError,
    StorageError,
    TopicExistsError,
    TqError,
    UnknownTopicError,
)
from querylib._keyed_lock import KeyedLock
from querylib._state_file import replace_file
from querylib.broker import (
    BrokerLink,
    NotProducerError,
    OpenProducerRequest,
    ProduceRequest,
    SessionLink,
    TopicAuthorizationError,
    WriteMarkersRequest,
)
from querylib.errors import OffsetOutOfRangeError, QuarantinedDataError
from querylib.kafka._apis import ListenerLimits
from querylib.kafka._errors import (
    InvalidTxnStateError,
    NotLeaderError,
    PolicyViolationError,
    UnknownPartitionError,
)
from querylib.log import data_records, record_at_timestamp
from querylib.records import encode_batch, read_header, transaction_marker_batch, verify_batch
from querylib.rpc import kafka_password
from querylib.server.broker import BrokerPort
from querylib.server.kafka._producers import ProducerStateTable

from ._backend import (
    AppendResult,
    BrokerInfo,
    CommittedOffset,
    ConfigEntry,
    GroupRecord,
    PartitionInfo,
    PartitionOffsets,
    PartitionRead,
    TopicInfo,
)
from ._group import GroupConfig
from ._group_store import GroupStore
from ._offsets_format import (
    GroupOwner,
    encode_group,
    encode_group_owner,
    encode_offset,
    group_tombstone_key,
    offset_tombstone_key,
)
from ._txn import TRANSACTIONS_TOPIC, TransactionCoordinator, Txn

__all__ = ["OFFSETS_TOPIC", "BrokerBackend", "StateReplica", "KafkaCluster", "KafkaConfig",
           "StandaloneCluster"]

logger = logging.getLogger("querylib.kafka")

PartitionId = tuple[str, int]
OFFSETS_TOPIC = "__consumer_offsets"
MAX_WRITERS = 256  # principals with a broker session open for their Kafka produces
OFFSETS: PartitionId = (OFFSETS_TOPIC, 0)
TRANSACTIONS: PartitionId = (TRANSACTIONS_TOPIC, 0)
# A partition whose topic was deleted needs no transaction marker.
_GONE = (UnknownTopicError, UnknownPartitionError)
TXN_CHECK_INTERVAL = 1.0  # seconds between looks for transactions past their timeout
META_FILE = ".tq-kafka.json"
_ADOPT_BATCH_BYTES = 1 << 20  # of a replica's group state per batch appended here
PRODUCER_ID_BLOCK = 1000
_MAX_META_BYTES = 4096  # {"next_producer_id": N, "cluster_id": "..."}; more is not ours
MAX_PARTITIONS = 10_000  # per topic created through Kafka
_CLUSTER_ID_LABEL = b"tq kafka cluster id v1"
# Kafka's topic configs tq honours, in the order of `broker_configs`, whose entries they default to.
_TOPIC_CONFIGS = ("retention.ms", "retention.bytes", "segment.bytes", "max.message.bytes",
                  "cleanup.policy", "message.timestamp.type")


@dataclass(frozen=True)
class KafkaConfig:
    """A broker's Kafka listener: where it binds, what it tells clients, what it may create."""

    host: str = "127.0.0.1"
    port: int = 9092  # 0: any free port
    advertised_host: str | None = None  # default: host (127.0.0.1 when host is a wildcard)
    auto_create_topics: bool = True
    default_partitions: int = 1
    limits: ListenerLimits | None = None
    group_config: GroupConfig | None = None
    lease: float = 30.0  # of the backend's broker producer session; heartbeats every lease/3
    # Authentication and encryption (DESIGN §12): SASL mechanisms clients must use (empty:
    # every client is "anonymous"), and a server TLS context.
    sasl: tuple[str, ...] = ()
    ssl_context: Any = None  # an ssl.SSLContext

    @property
    def security_protocol(self) -> str:
        """Kafka's name for what this listener speaks: PLAINTEXT, SSL, SASL_PLAINTEXT or
        SASL_SSL."""
        tls = self.ssl_context is not None
        if self.sasl:
            return "SASL_SSL" if tls else "SASL_PLAINTEXT"
        return "SSL" if tls else "PLAINTEXT"

    @property
    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        return self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"


class StateReplica(Protocol):
    """Where one of the listener's state topics (`__consumer_offsets`, `__transaction_state`:
    compacted, the last value of each key is the state) is kept beyond its broker's disk (the
    coordinator's etcd, with failover: DESIGN §3 "Coordinator failover"): what a group and
    transaction coordinator that takes over starts from."""

    async def read(self) -> dict[bytes, bytes] | None:
        """Every record kept, key -> value; None when nothing was ever kept (this broker's own
        log is then the state, and is `seed`ed)."""
        ...

    async def write(self, records: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Keep `records` (in order; a null value deletes its key) before a write is answered;
        CoordinatorNotAvailableError when this is no longer the coordinator."""
        ...

    async def seed(self, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Keep a whole state for the first time."""
        ...


class KafkaCluster(Protocol):
    """The cluster as a broker's Kafka listener sees it (the catalog, under an executor)."""

    async def node_id(self) -> int:
        """This broker's id (waits until it is known)."""
        ...

    def kafka_brokers(self) -> Sequence[BrokerInfo]:
        """Every broker with a Kafka listener, as last known."""
        ...

    async def kafka_topics(self, names: Sequence[str] | None) -> list[TopicInfo]:
        """The named topics that exist (all when None); InvalidTopicNameError for bad names."""
        ...

    async def create_kafka_topic(self, name: TopicName, partitions: int,
                                 replication_factor: int | None = None) -> TopicInfo:
        """Create an ingest topic, through the catalog's owner (the coordinator), placed on
        brokers with a Kafka listener (an executor's: all on itself, unless replicated), each
        partition copied `replication_factor` times (None: the cluster's default);
        TopicExistsError, InvalidReplicationFactorError."""
        ...

    def controller(self) -> int | None:
        """The broker every listener names as the controller (None: this one)."""
        ...

    def executor_hosts(self) -> int:
        """How many executor hosts there are, as last known: a topic has at most as many
        replicas (DESIGN §5 "Replication")."""
        ...

    async def delete_kafka_topic(self, name: TopicName) -> None:
        """Delete a topic (its owner's or admin's request, checked by the backend)."""
        ...

    async def alter_kafka_topic(self, name: TopicName, partitions: int | None,
                                configs: Mapping[str, str | None]) -> None:
        """Grow a topic to `partitions` and set (None: remove) its configs."""
        ...

    async def placed_here(self, topic: TopicName, partition: int) -> bool:
        """Whether the cluster places `partition` of `topic` on this broker."""
        ...

    async def group_coordinator(self) -> BrokerInfo | None:
        """The broker coordinating every group, or None when it is this one.
        CoordinatorNotAvailableError when there is none to name now."""
        ...

    def broker_address(self, node_id: int) -> str | None:
        """The RPC address of broker `node_id` (where the transaction coordinator writes its
        markers into partitions it does not host), None when unknown."""
        ...

    def state_replica(self, topic: str) -> StateReplica | None:
        """Where the state topic `topic` this listener writes is kept beyond its broker, if
        anywhere."""
        ...


class StandaloneCluster:
    """A broker alone: the topics are the partitions it hosts; it leads them all."""

    def __init__(self, port: BrokerPort, config: KafkaConfig) -> None:
        self.port = port
        self.config = config
        self.me = BrokerInfo(0, config.advertised, config.port)

    async def node_id(self) -> int:
        return 0

    def kafka_brokers(self) -> Sequence[BrokerInfo]:
        return (self.me,)

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for info in self.port.partitions():
            counts[info.topic] = max(counts.get(info.topic, 0), info.partition + 1)
        return counts

    async def kafka_topics(self, names: Sequence[str] | None) -> list[TopicInfo]:
        counts = self._counts()
        wanted = sorted(counts) if names is None else list(names)
        found = []
        for name in wanted:
            parsed = TopicName.parse(name)
            count = counts.get(parsed.short)
            if count is not None:
                found.append(TopicInfo(name, tuple(PartitionInfo(i, 0) for i in range(count)),
                                       internal=parsed.internal))
        return found

    async def create_kafka_topic(self, name: TopicName, partitions: int,
                                 replication_factor: int | None = None) -> TopicInfo:
        if replication_factor not in (None, 1):
            raise InvalidReplicationFactorError(
                f"topic {name.short!r}: a broker alone keeps one replica of each partition, "
                f"not {replication_factor}")
        if name.short in self._counts():
            raise TopicExistsError(f"topic {name.short!r} exists already")
        for index in range(partitions):
            await self.port.ensure(name.short, index, create=True)
        return TopicInfo(name.short, tuple(PartitionInfo(i, 0) for i in range(partitions)))

    async def delete_kafka_topic(self, name: TopicName) -> None:
        for info in self.port.partitions(name.short):
            await self.port.drop(info.topic, info.partition)

    async def alter_kafka_topic(self, name: TopicName, partitions: int | None,
                                configs: Mapping[str, str | None]) -> None:
        if configs:
            raise PolicyViolationError(
                f"topic {name.short!r}: a broker alone has no catalog to keep topic configs "
                "in; its log config (tq broker's flags) is every topic's")
        for index in range(self._counts().get(name.short, 0), partitions or 0):
            await self.port.ensure(name.short, index, create=True)

    async def placed_here(self, topic: TopicName, partition: int) -> bool:
        return False  # hosted partitions are found before this is asked

    def executor_hosts(self) -> int:
        return 1  # a broker alone keeps one replica of each partition

    async def group_coordinator(self) -> BrokerInfo | None:
        return None  # a broker alone coordinates its own groups

    def controller(self) -> int | None:
        return None  # a broker alone is its own controller

    def broker_address(self, node_id: int) -> str | None:
        return None  # no other broker

    def state_replica(self, topic: str) -> StateReplica | None:
        return None  # its groups and transactions live on its disk only



class _Writer:
    """One broker session the backend writes through, as one principal: the producers it has
    open, and its window of unacknowledged bytes (the broker never sees it overdrawn)."""

    def __init__(self, link: SessionLink) -> None:
        self.link = link
        self.producing: set[PartitionId] = set()
        self.inflight = 0
        self.window = asyncio.Condition()
        link.on_reopen.append(self._forgotten)

    async def _forgotten(self) -> None:
        self.producing.clear()  # the broker forgot the session: open producers again

    async def open(self, pid: PartitionId, *, create: bool) -> None:
        """Open this session's producer of `pid` unless it is open: the broker refuses one
        this principal may not write there (TopicAuthorizationError, UnknownPartitionError).
        `create`: creating the topic (Kafka's auto-creation)."""
        if pid not in self.producing:
            await self.link.request(OpenProducerRequest(
                session=self.link.session, topic=pid[0], partition=pid[1], create=create,
                create_topic=create))
            self.producing.add(pid)

    async def produce(self, pid: PartitionId, batch: bytes, *, create: bool,
                      written: bool = False) -> int:
        """Append through the broker; the base offset once durable (`written`: once the log
        has it, durable with the partition's next synced append)."""
        link = self.link
        opened = link.opened  # set once, by the link's start
        assert opened is not None
        for attempt in (1, 2):
            await self.open(pid, create=create)
            async with self.window:
                await self.window.wait_for(lambda: self.inflight < opened.producer_window)
                self.inflight += len(batch)
            try:
                produced = await link.request(ProduceRequest(
                    session=link.session, topic=pid[0], partition=pid[1], written=written),
                    payload=[batch])
                return produced.base_offset
            except NotProducerError:
                # The broker dropped our producer (the topic was deleted and made again):
                # open it again, once, which asks the topic's rule anew.
                self.producing.discard(pid)
                if attempt == 2:
                    raise
            finally:
                async with self.window:
                    self.inflight -= len(batch)
                    self.window.notify_all()
        raise AssertionError("unreachable")

    async def write_markers(self, pids: Sequence[PartitionId], marker: bytes
                            ) -> list[PartitionId]:
        """One transaction marker into every partition of `pids`, in one request (the
        broker opens our producers there); the partitions that do not exist."""
        link, size = self.link, len(marker) * len(pids)
        opened = link.opened  # set once, by the link's start
        assert opened is not None
        async with self.window:
            await self.window.wait_for(lambda: self.inflight < opened.producer_window)
            self.inflight += size
        try:
            written = await link.request(WriteMarkersRequest(
                session=link.session, partitions=list(pids)), payload=[marker])
            return [(t, p) for t, p in written.gone]
        finally:
            async with self.window:
                self.inflight -= size
                self.window.notify_all()


class BrokerBackend:
    """The partitions of one in-process broker, served to Kafka clients. `await open()` first.
    Without a `secret` the cluster id is made once and kept in `<data>/.tq-kafka.json`."""

    def __init__(self, port: BrokerPort, config: KafkaConfig, *, secret: bytes | None = None,
                 cluster: KafkaCluster | None = None) -> None:
        self.port = port
        self.config = config
        self.cluster: KafkaCluster = cluster or StandaloneCluster(port, config)
        self._cluster_id = "" if secret is None else \
            hmac.new(secret, _CLUSTER_ID_LABEL, hashlib.sha256).hexdigest()[:22]
        self._me = BrokerInfo(0, config.advertised, config.port)
        self._node: int | None = None
        # Kafka clients write as the principal SASL authenticated (DESIGN §12), else as
        # "anonymous": one broker session per principal, opened at its first produce and
        # closed when it is the least recently used of MAX_WRITERS. The group store is tq's own.
        self._writers: OrderedDict[str, _Writer] = OrderedDict()
        self._writers_lock = asyncio.Lock()
        self._system = _Writer(port.link("system", lease=config.lease))
        # Idempotent producers' sequences, of the partitions written here; a partition's
        # check, append and record are atomic under its key of `_appending`.
        self._producers: dict[PartitionId, ProducerStateTable] = {}
        self._appending: KeyedLock[PartitionId] = KeyedLock()
        self._waiters: dict[PartitionId, set[asyncio.Future[None]]] = {}
        self._store = GroupStore()
        # Where `__consumer_offsets` and `__transaction_state` are kept beyond this disk.
        self._replica: StateReplica | None = None
        self._txn_replica: StateReplica | None = None
        self._meta_lock = asyncio.Lock()
        self._next_producer_id = self._reserved_producer_ids = 0
        self._unwatch: Any = None
        self._secret = secret
        self._remote: OrderedDict[str, _Writer] = OrderedDict()  # RPC address -> admin link
        self._txns = TransactionCoordinator(self)
        self._expiry: asyncio.Task[None] | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> BrokerBackend:
        """Open the broker sessions, `__consumer_offsets`, and replay it."""
        await self._system.link.start()
        self._unwatch = self.port.on_visible(self._wake)
        pid = await self.port.ensure(*OFFSETS, create=True)
        log = self.port.log(pid)
        end = self.port.info(pid).log_end
        loop = asyncio.get_running_loop()
        self._replica = self.cluster.state_replica(OFFSETS_TOPIC)
        latest: dict[bytes, bytes] | None = None if self._replica is None else {}
        await loop.run_in_executor(None, self._store.replay, log, end, latest)
        if self._replica is not None and latest is not None:
            kept = await self._adopt(OFFSETS, self._replica, latest)
            if kept is not None:
                self._store = GroupStore()
                for key, value in kept.items():
                    self._store.apply(key, value)
        await loop.run_in_executor(None, self._read_meta)
        self._txn_replica = self.cluster.state_replica(TRANSACTIONS_TOPIC)
        try:  # made by the first transactional producer (at once, where it is kept elsewhere)
            txn_pid = await self.port.ensure(*TRANSACTIONS, create=self._txn_replica is not None)
        except UnknownPartitionError:
            pass
        else:
            txn_log, txn_end = self.port.log(txn_pid), self.port.info(txn_pid).high_watermark
            records = await loop.run_in_executor(
                None, lambda: [(r.key, r.value) for r in data_records(txn_log, end=txn_end)])
            # After a reboot that followed an unclean stop, the records answered once written
            # may be lost from its end (a process that merely died lost none).
            complete = txn_log.writes_kept
            if self._txn_replica is not None:
                last: dict[bytes, bytes] = {}
                for txn_id, state in records:
                    if txn_id is not None and state is None:
                        last.pop(txn_id, None)
                    elif txn_id is not None and state is not None:
                        last[txn_id] = state
                kept = await self._adopt(TRANSACTIONS, self._txn_replica, last)
                if kept is not None:  # etcd lost nothing it answered
                    records, complete = list(kept.items()), True
            self._txns.replay(records, complete=complete)
        self._expiry = asyncio.create_task(self._expire_transactions())
        return self

    async def _adopt(self, pid: PartitionId, replica: StateReplica,
                     local: dict[bytes, bytes]) -> dict[bytes, bytes] | None:
        """Take the state of topic `pid` the replica keeps (what the coordinator before this
        one wrote) and make this broker's log say the same: returns it. Or, when the replica
        never kept any, keep this log's state (`local`: its last value of each key) there:
        returns None."""
        kept = await replica.read()
        if kept is None:
            await replica.seed(list(local.items()))
            logger.info("%s: %d record(s) now kept beyond this broker", pid[0], len(local))
            return None
        changed: list[tuple[bytes, bytes | None]] = []
        for key, value in kept.items():
            if local.get(key) != value:
                if key in local:  # a record the log holds otherwise: deleted first (group
                    changed.append((key, None))  # owners are first-claim-wins on replay)
                changed.append((key, value))
        changed.extend((key, None) for key in local if key not in kept)
        now = self._now_ms()
        batch: list[tuple[int, bytes, bytes | None, tuple[()]]] = []
        size = 0
        for key, change in changed:  # batches well under the broker's largest
            if batch and size + len(key) + len(change or b"") > _ADOPT_BATCH_BYTES:
                await self._system.produce(pid, encode_batch(batch), create=True)
                batch, size = [], 0
            batch.append((now, key, change, ()))
            size += len(key) + len(change or b"")
        if batch:
            await self._system.produce(pid, encode_batch(batch), create=True)
        logger.info("%s: took the kept state, %d record(s), %d changed here", pid[0],
                    len(kept), len(changed))
        return kept

    async def _expire_transactions(self) -> None:
        """Finish the transactions being ended (at start: those a stopped broker was ending)
        and abort the ones past their timeout, every TXN_CHECK_INTERVAL."""
        while True:
            try:
                await self._txns.recover()
                await self._txns.expire()
            except TqError as exc:  # a broker holding a partition did not answer: next round
                logger.warning("ending transactions: %s", exc)
            await asyncio.sleep(TXN_CHECK_INTERVAL)

    def advertise(self, port: int) -> None:
        """Set the port clients are told (once the listener has bound)."""
        self._me = BrokerInfo(self._me.node_id, self.config.advertised, port)

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        await self._txns.close()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        for writer in [*self._writers.values(), *self._remote.values()]:
            await writer.link.close()
        self._writers.clear()
        self._remote.clear()
        await self._system.link.close()
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    # ---- cluster ------------------------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def controller_id(self) -> int:
        """One id for the whole cluster: the coordinator's broker (DESIGN §8)."""
        found = self.cluster.controller()
        return self._me.node_id if found is None else found

    @property
    def auto_create_topics(self) -> bool:
        return self.config.auto_create_topics

    async def _known(self) -> None:
        if self._node is None:
            self._node = await self.cluster.node_id()
            self._me = BrokerInfo(self._node, self._me.host, self._me.port)

    def brokers(self) -> Sequence[BrokerInfo]:
        known = list(self.cluster.kafka_brokers())
        if all(b.node_id != self._me.node_id for b in known):
            known.append(self._me)  # the catalog may lag our own registration
        return [self._me if b.node_id == self._me.node_id else b for b in known]

    async def coordinator(self, group_id: str) -> BrokerInfo:
        await self._known()
        found = await self.cluster.group_coordinator()
        return self._me if found is None or found.node_id == self._me.node_id else found

    async def coordinates(self, group_id: str) -> bool:
        await self._known()
        found = await self.cluster.group_coordinator()
        return found is None or found.node_id == self._me.node_id

    async def topics(self, names: Sequence[str] | None = None) -> list[TopicInfo]:
        await self._known()
        return await self.cluster.kafka_topics(names)

    async def create_topic(self, name: str, partitions: int | None = None, *,
                           validate_only: bool = False,
                           replication_factor: int | None = None) -> TopicInfo | None:
        topic = TopicName.parse(name)
        if topic.internal:
            raise ReservedTopicNameError(f"topic {name!r}: names starting with '__' are "
                                         "reserved for tq's own topics")
        count = self.config.default_partitions if partitions is None else partitions
        if not 1 <= count <= MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"topic {name!r}: {count} partitions, expected 1..{MAX_PARTITIONS}")
        hosts = self.cluster.executor_hosts()
        if replication_factor is not None and not 1 <= replication_factor <= max(1, hosts):
            raise InvalidReplicationFactorError(
                f"topic {name!r}: replication factor {replication_factor}; -1 (the default) "
                f"or 1..{max(1, hosts)}: each replica on its own executor host, and "
                f"{hosts} {'is' if hosts == 1 else 'are'} registered")
        await self._known()
        if validate_only:
            if await self.cluster.kafka_topics([topic.short]):
                raise TopicExistsError(f"topic {topic.short!r} exists already")
            return None
        return await self.cluster.create_kafka_topic(topic, count, replication_factor)

    async def _authorize_topic(self, topic: TopicName, principal: str) -> None:
        """Kafka's DELETE and ALTER on a topic: its writers' (the owner, anyone for an ingest
        topic) and the admin's; `__` topics are tq's own (DESIGN §12)."""
        if topic.internal or not (principal == "admin"
                                  or await self.port.may_write(topic.short, principal)):
            raise TopicAuthorizationError(f"{principal} may not change topic {topic.short!r}")

    async def delete_topic(self, name: str, principal: str) -> None:
        topic = TopicName.parse(name)
        if not await self.topics([name]):
            raise UnknownTopicError(f"topic {topic.short!r} not found")
        await self._authorize_topic(topic, principal)
        await self.cluster.delete_kafka_topic(topic)
        for pid in [p for p in self._producers if p[0] == topic.short]:
            del self._producers[pid]  # its idempotent producers' sequences go with it

    async def create_partitions(self, name: str, count: int, principal: str, *,
                                validate_only: bool = False) -> None:
        topic = TopicName.parse(name)
        found = await self.topics([name])
        if not found:
            raise UnknownTopicError(f"topic {topic.short!r} not found")
        await self._authorize_topic(topic, principal)
        have = len(found[0].partitions)
        if not have < count <= MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"topic {topic.short!r} has {have} partitions; it grows to "
                f"{have + 1}..{MAX_PARTITIONS}, not {count}")
        if not validate_only:
            await self.cluster.alter_kafka_topic(topic, count, {})

    async def alter_topic_configs(self, name: str, changes: Mapping[str, str | None],
                                  principal: str, *, validate_only: bool = False) -> None:
        topic = TopicName.parse(name)
        if not await self.topics([name]):
            raise UnknownTopicError(f"topic {topic.short!r} not found")
        await self._authorize_topic(topic, principal)
        checked = {key: None if value is None else check_topic_config(key, value)
                   for key, value in changes.items()}
        for key in checked:
            if key not in TOPIC_CONFIGS:
                check_topic_config(key, "0")  # InvalidConfigError naming those there are
        if not validate_only:
            await self.cluster.alter_kafka_topic(topic, None, checked)

    def broker_configs(self) -> list[ConfigEntry]:
        log = self.port.log_config
        static = 4  # STATIC_BROKER_CONFIG: what this broker was started with
        return [
            ConfigEntry("log.retention.ms", str(log.retention_ms), static, 5),
            ConfigEntry("log.retention.bytes", str(log.retention_bytes), static, 5),
            ConfigEntry("log.segment.bytes", str(log.segment_bytes), static, 3),
            ConfigEntry("message.max.bytes", str(self.port.limits.max_batch_bytes), static, 3),
            ConfigEntry("log.cleanup.policy", "delete", static, 7),
            ConfigEntry("log.message.timestamp.type", "CreateTime", static, 2),
        ]

    async def topic_configs(self, name: str) -> list[ConfigEntry]:
        found = await self.topics([name])
        if not found:
            raise UnknownTopicError(f"topic {TopicName.parse(name).short!r} not found")
        # Each is the topic's own setting (DYNAMIC_TOPIC_CONFIG, in the catalog) or the
        # broker's (its synonym); only TOPIC_CONFIGS may be set.
        own = dict(found[0].configs)
        entries = []
        for topic_name, b in zip(_TOPIC_CONFIGS, self.broker_configs(), strict=True):
            settable = topic_name in TOPIC_CONFIGS
            if topic_name in own:
                entries.append(ConfigEntry(topic_name, own[topic_name], 1, b.config_type,
                                           read_only=False, synonym=b.name))
            else:
                entries.append(ConfigEntry(topic_name, b.value, b.source, b.config_type,
                                           read_only=not settable, synonym=b.name))
        return entries

    # ---- data ---------------------------------------------------------------------------------

    async def delete_records(self, topic: str, partition: int, offset: int,
                             principal: str) -> int:
        pid = await self._hosted(topic, partition)
        await self._authorize_topic(TopicName.parse(topic), principal)
        high_watermark = self._offsets(pid).high_watermark
        if offset == -1:
            offset = high_watermark
        if not 0 <= offset <= high_watermark:
            raise OffsetOutOfRangeError(
                f"cannot delete records of {topic}-{partition} before {offset}: the high "
                f"watermark is {high_watermark}")
        return await self.port.delete_records(pid, offset)

    async def _hosted(self, topic: str, partition: int, leader_epoch: int = -1) -> PartitionId:
        """The broker's id of a partition this broker serves to readers, opened if the
        cluster places it here; NotLeaderError / UnknownPartitionError otherwise. A replicated
        partition is served by its leader only, at the client's `leader_epoch` if it names
        one (`BrokerPort.leader_epoch`)."""
        name = TopicName.parse(topic)
        pid = (name.short, partition)
        if self.port.hosts(pid):
            self.port.leader_epoch(pid, leader_epoch)
            return pid
        if not await self.cluster.placed_here(name, partition):
            known = await self.cluster.kafka_topics([name.short])
            if known and 0 <= partition < len(known[0].partitions):
                raise NotLeaderError(f"this broker does not host {name.short}-{partition}")
            raise UnknownPartitionError(f"topic {topic!r} has no partition {partition} here")
        return await self.port.ensure(name.short, partition, create=True)

    async def _writer(self, principal: str) -> _Writer:
        """The broker session that writes as `principal`, opened on first use."""
        async with self._writers_lock:
            writer = self._writers.get(principal)
            if writer is not None:
                self._writers.move_to_end(principal)
                return writer
            writer = _Writer(self.port.link(principal, lease=self.config.lease))
            await writer.link.start()
            self._writers[principal] = writer
            while len(self._writers) > MAX_WRITERS:
                _, old = self._writers.popitem(last=False)
                await old.link.close()
            return writer

    async def password(self, principal: str) -> str | None:
        """The Kafka SASL password of `principal` (None: no such principal now)."""
        key = await self.port.principal_key(principal)
        return None if key is None else kafka_password(key, broker_key=True)

    async def append(self, topic: str, partition: int, batches: Sequence[bytes], *,
                     acks: int, principal: str = ANONYMOUS) -> AppendResult:
        pid = (TopicName.parse(topic).short, partition)
        writer = await self._writer(principal)
        first: int | None = None
        async with self._appending.hold(pid):
            # Opened first, so the broker refuses a principal that may not write here before
            # a retry of someone else's batch could be acknowledged to it.
            create = await self._creates(pid, writer)
            await writer.open(pid, create=create)
            for batch in batches:
                header = read_header(batch)
                producers = self._producers.get(pid)
                original = None if producers is None else producers.check(header)
                if original is not None:
                    verify_batch(batch)  # acknowledge a retry only if it is intact
                    base = original
                else:
                    base = await writer.produce(pid, batch, create=create)
                    self._producers.setdefault(pid, ProducerStateTable()).record(header, base)
                first = base if first is None else first
        info = self.port.info(pid)
        return AppendResult(first if first is not None else info.log_end, info.log_start)

    async def _creates(self, pid: PartitionId, writer: _Writer) -> bool:
        """Whether a producer of `pid` asks for its topic to be created: Kafka's
        auto-creation makes topics that do not exist, never partitions of one that does."""
        if pid in writer.producing or not self.auto_create_topics:
            return False
        return not await self.cluster.kafka_topics([pid[0]])

    def _offsets(self, pid: PartitionId) -> PartitionOffsets:
        info = self.port.info(pid)
        high = info.high_watermark if info.high_watermark >= 0 else info.log_end
        return PartitionOffsets(info.log_start, high, info.log_end)

    async def read(self, topic: str, partition: int, offset: int,
                   max_bytes: int, *, committed: bool = False,
                   leader_epoch: int = -1) -> PartitionRead:
        pid = await self._hosted(topic, partition, leader_epoch)
        offsets = self._offsets(pid)
        # Out of range past the log end, as Kafka's: above the high watermark (a new leader's
        # may lag its predecessor's, where a consumer goes on) nothing is read yet.
        log_end = max(offsets.high_watermark, self.port.log(pid).log_end_offset)
        if not offsets.log_start_offset <= offset <= log_end:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}-{partition} is outside "
                f"{offsets.log_start_offset}..{log_end}")
        read = PartitionRead(offsets)
        end = offsets.last_stable_offset if committed else offsets.high_watermark
        if committed:
            read.aborted = self.port.aborted_transactions(pid, offset, end)
        if offset < end:
            log = self.port.log(pid)
            while True:
                try:
                    chunk = log.read_slice(offset, max_bytes, end_offset=end)
                    break
                except QuarantinedDataError as exc:
                    # Offsets `tq log repair` quarantined are a gap Kafka clients step over,
                    # as after compaction. (Damage not repaired yet: CORRUPT_MESSAGE.)
                    if exc.end_offset <= offset:
                        raise
                    offset = exc.end_offset
            if chunk.length:
                read.chunks.append(chunk)
            else:
                chunk.close()
        return read

    async def offsets(self, topic: str, partition: int, *,
                      leader_epoch: int = -1) -> PartitionOffsets:
        return self._offsets(await self._hosted(topic, partition, leader_epoch))

    async def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int, *,
                                   leader_epoch: int = -1) -> tuple[int, int] | None:
        pid = await self._hosted(topic, partition, leader_epoch)
        return record_at_timestamp(self.port.log(pid), timestamp_ms,
                                   self._offsets(pid).high_watermark)

    async def epoch_end(self, topic: str, partition: int, epoch: int, *,
                        leader_epoch: int = -1) -> tuple[int, int]:
        pid = await self._hosted(topic, partition, leader_epoch)
        if self.port.leader_epoch(pid) < 0:
            # One replica: every batch is of epoch 0 (no leader stamps it), as Kafka answers
            # a log without epochs: unknown epoch, unknown offset.
            return -1, -1
        return await self.port.epoch_end(pid, epoch)

    async def offset_of_max_timestamp(self, topic: str, partition: int, *,
                                      leader_epoch: int = -1) -> tuple[int, int] | None:
        pid = await self._hosted(topic, partition, leader_epoch)
        log = self.port.log(pid)
        largest = max((s.largest_timestamp for s in log.segments), default=-1)
        if largest < 0:
            return None
        return record_at_timestamp(log, largest, self._offsets(pid).high_watermark)

    async def wait_for_data(self, positions: Sequence[tuple[str, int, int]],
                            timeout: float) -> None:
        watched = []
        for topic, partition, offset in positions:
            try:
                pid = (TopicName.parse(topic).short, partition)
                if self._offsets(pid).high_watermark > offset:
                    return
            except TqError:
                continue
            watched.append(pid)
        if timeout <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for pid in watched:
            self._waiters.setdefault(pid, set()).add(future)
        try:
            # With nothing to watch the fetch just waits out its max_wait, as Kafka's does.
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            for pid in watched:
                waiters = self._waiters.get(pid)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._waiters[pid]

    def _wake(self, pid: PartitionId) -> None:
        for future in self._waiters.pop(pid, ()):
            if not future.done():
                future.set_result(None)

    # ---- producer ids -------------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        await self._known()
        assert self._node is not None
        async with self._meta_lock:
            if self._next_producer_id >= self._reserved_producer_ids:
                reserved = self._next_producer_id + PRODUCER_ID_BLOCK
                await asyncio.get_running_loop().run_in_executor(None, self._write_meta,
                                                                 reserved)
                self._reserved_producer_ids = reserved
            counter = self._next_producer_id
            self._next_producer_id += 1
        return self._node << 32 | counter

    def _meta_path(self) -> str:
        return os.path.join(self.port.data_dir, META_FILE)

    def _read_meta(self) -> None:
        path = self._meta_path()
        try:
            with open(path, "rb") as f:
                meta = json.loads(f.read(_MAX_META_BYTES + 1))
            following = meta["next_producer_id"]
            # A counter below this node's bits (producer id = node << 32 | counter): any
            # other would hand out negative ids or another node's.
            if type(following) is not int or not 0 <= following < 1 << 32:
                raise ValueError(f"next_producer_id {following!r} is no counter")
            self._next_producer_id = self._reserved_producer_ids = following
            if not self._cluster_id:
                if not isinstance(meta["cluster_id"], str) or not meta["cluster_id"]:
                    raise ValueError("cluster_id is not text")
                self._cluster_id = meta["cluster_id"]
        except FileNotFoundError:
            if not self._cluster_id:
                self._cluster_id = uuid.uuid4().hex[:22]
                self._write_meta(0)
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{path}: unreadable ({exc}); it holds the next producer "
                               "id") from exc

    def _write_meta(self, reserved: int) -> None:
        """Durably record the first producer id not yet reserved (ids are never reused), and
        the cluster id where no secret derives it."""
        path = self._meta_path()
        try:
            # The directory is fsynced too: a rename a power loss undid would bring back an
            # older reservation, and ids already handed out with it.
            replace_file(path, json.dumps({"next_producer_id": reserved,
                                           "cluster_id": self._cluster_id}).encode(),
                         mode=0o644)
        except OSError as exc:
            raise StorageError(f"{path}: cannot write: {exc}") from exc

    # ---- transactions (the coordinator's TxnLog) -----------------------------------------------

    @property
    def transactions(self) -> TransactionCoordinator:
        return self._txns

    async def write_txn(self, *txns: Txn, durable: bool = True) -> None:
        now = self._now_ms()
        await self._system.produce(TRANSACTIONS, encode_batch(
            [(now, *txn.encode(), ()) for txn in txns]), create=True, written=not durable)
        if self._txn_replica is not None:  # durable there whatever `durable` says
            await self._txn_replica.write([txn.encode() for txn in txns])

    async def write_markers(self, partitions: Sequence[tuple[str, int]], producer_id: int,
                            epoch: int, commit: bool) -> None:
        """The markers of one transaction, all at once: those of this broker's partitions
        through its port, the others in one request per broker over its admin session."""
        marker = transaction_marker_batch(producer_id, epoch, commit, timestamp=self._now_ms())
        here: list[PartitionId] = []
        away: dict[str, list[PartitionId]] = {}
        for topic, partition in partitions:
            pid = (TopicName.parse(topic).short, partition)
            try:
                if self.port.hosts(pid) or await self.cluster.placed_here(
                        TopicName.parse(topic), partition):
                    here.append(pid)
                else:
                    away.setdefault(await self._leader_address(pid), []).append(pid)
            except _GONE as exc:
                self._no_marker(producer_id, pid, exc)

        async def remote(address: str, pids: list[PartitionId]) -> None:
            writer = await self._remote_writer(address)
            for pid in await writer.write_markers(pids, marker):
                self._no_marker(producer_id, pid, "no such partition on its broker")

        results = await asyncio.gather(*(self._mark(pid, marker, producer_id, epoch)
                                         for pid in here),
                                       *(remote(a, pids) for a, pids in away.items()),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _mark(self, pid: PartitionId, marker: bytes, producer_id: int,
                    epoch: int) -> None:
        """Append a transaction marker to a partition of this broker (opened if it is on
        disk), through its port as "system", and fence the producer's older epochs here."""
        try:
            async with self._appending.hold(pid):
                await self._system.produce(pid, marker, create=False)
                self._producers.setdefault(pid, ProducerStateTable()).fence(producer_id, epoch)
        except _GONE as exc:
            self._no_marker(producer_id, pid, exc)

    @staticmethod
    def _no_marker(producer_id: int, pid: PartitionId, why: object) -> None:
        logger.warning("producer %d: no transaction marker in %s-%d (gone): %s",
                       producer_id, pid[0], pid[1], why)

    async def marks_partition(self, topic: str, partition: int) -> bool:
        pid = (TopicName.parse(topic).short, partition)
        if self.port.hosts(pid):
            return True
        try:
            await self._leader_address(pid)
        except TqError:
            return False
        return True

    async def _leader_address(self, pid: PartitionId) -> str:
        """The RPC address of the broker leading `pid`, which this one may write markers to
        (as the admin: it holds the cluster secret)."""
        known = await self.cluster.kafka_topics([pid[0]])
        if not known or not 0 <= pid[1] < len(known[0].partitions):
            raise UnknownPartitionError(f"topic {pid[0]!r} has no partition {pid[1]}")
        address = self.cluster.broker_address(known[0].partitions[pid[1]].leader)
        if address is None or self._secret is None:
            raise InvalidTxnStateError(
                f"{pid[0]}-{pid[1]} is on a broker the transaction coordinator cannot write to")
        return address

    async def _remote_writer(self, address: str) -> _Writer:
        """An admin session on the broker at `address`, opened on first use (at most
        MAX_WRITERS, the least recently used closed)."""
        async with self._writers_lock:
            writer = self._remote.get(address)
            if writer is not None:
                self._remote.move_to_end(address)
                return writer
            assert self._secret is not None
            writer = _Writer(BrokerLink(address, self._secret, lease=self.config.lease))
            await writer.link.start()
            self._remote[address] = writer
            while len(self._remote) > MAX_WRITERS:
                _, old = self._remote.popitem(last=False)
                await old.link.close()
            return writer

    async def commit_offsets(self, group_id: str, offsets: Sequence[CommittedOffset]) -> None:
        await self.store_offsets(group_id, offsets)

    @staticmethod
    def _now_ms() -> int:
        return int(time.time() * 1000)

    # ---- groups -------------------------------------------------------------------------------

    async def _keep(self, records: Sequence[tuple[int, bytes, bytes | None]]) -> None:
        """Append (timestamp, key, value) records to `__consumer_offsets`, answered once
        durable there and, with a replica, once the replica has them too (the caller changes
        the group store only then)."""
        await self._system.produce(OFFSETS, encode_batch([(t, k, v, ()) for t, k, v in records]),
                                   create=True)
        if self._replica is not None:
            await self._replica.write([(k, v) for _, k, v in records])

    async def store_offsets(self, group_id: str, offsets: Sequence[CommittedOffset]) -> None:
        if not offsets:
            return
        await self._keep([(c.commit_timestamp, *encode_offset(group_id, c)) for c in offsets])
        self._store.committed(group_id, list(offsets))

    async def committed_offsets(self, group_id: str
                                ) -> Mapping[tuple[str, int], CommittedOffset]:
        return dict(self._store.offsets.get(group_id, {}))

    def all_committed(self) -> dict[str, dict[tuple[str, int], int]]:
        """Every group's committed offsets now, by (topic, partition) (the metrics read it)."""
        return {group: {key: c.offset for key, c in list(offsets.items())}
                for group, offsets in list(self._store.offsets.items())}

    async def store_group(self, record: GroupRecord) -> None:
        await self._keep([(record.current_state_timestamp, *encode_group(record))])
        self._store.groups[record.group_id] = record

    async def delete_offsets(self, group_id: str,
                             partitions: Sequence[tuple[str, int]]) -> None:
        if not partitions:
            return
        await self._keep([(0, offset_tombstone_key(group_id, t, p), None) for t, p in partitions])
        stored = self._store.offsets.get(group_id, {})
        for key in partitions:
            stored.pop(key, None)

    async def delete_group(self, group_id: str) -> None:
        committed = sorted(self._store.offsets.get(group_id, {}))
        await self._keep([(0, offset_tombstone_key(group_id, t, p), None) for t, p in committed]
                         + [(0, group_tombstone_key(group_id), None)])
        self._store.offsets.pop(group_id, None)
        self._store.groups.pop(group_id, None)

    async def stored_groups(self) -> Sequence[GroupRecord]:
        return list(self._store.groups.values())

    async def authorize_group(self, group_id: str, principal: str, *, claim: bool) -> bool:
        """Whether `principal` may use group `group_id` (DESIGN §12): a group belongs to the
        first authenticated principal that joins or commits it (`claim`), recorded in
        `__consumer_offsets`; an admin may use any. Unauthenticated clients ("anonymous", on
        a listener without SASL) share groups as before: nothing is recorded for them."""
        if principal in (ANONYMOUS, "admin"):
            return True
        async with self._meta_lock:
            owner = self._store.owners.get(group_id)
            if owner is None and claim:
                await self._keep([(0, *encode_group_owner(GroupOwner(group_id, principal)))])
                self._store.owners[group_id] = owner = principal
        return owner is None or owner == principal
