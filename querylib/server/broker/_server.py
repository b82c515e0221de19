"""The broker's I/O shell: RPC handlers, append lanes, disk reads and the clock around the pure
`BrokerState` (the dask WorkerState/BaseWorker split; DESIGN §5).

Every client request becomes a stimulus carrying a future as its token; the state answers with
instructions that this module performs: resolve the future (the RPC reply), hand an append to
the partition's lane, read from the log on a thread, push a delivery to a client, ask the
broker's directory about a topic, open a partition. Results come back as stimuli. The shell
decides nothing the state decides (admission, credit, acks, frontiers, delivery); it owns
every task, thread pool and log it opens, and closes them.

Requests come through one door (`_serve`), from RPC clients and from `port` (`BrokerPort`,
the public way in for code in the same process: the Kafka listener, the connector endpoint,
tq's own writers). `start(None)` serves the port alone, with no RPC socket (`tq kafka`).

    server = BrokerServer("/data", secret, log_config=LogConfig(flush="always"))
    endpoint = await server.start("tcp://127.0.0.1:7500")
    ...
    await server.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from catalog.errors import StorageError, TqError, UnknownTopicError, UserError
from querylib._keyed_lock import KeyedLock
from querylib._memory import keep_freed_memory, share_arenas
from querylib.broker._errors import (
    BrokerClosedError,
    BrokerProtocolError,
    PrincipalError,
    TopicAuthorizationError,
    UnknownPartitionError,
)
from querylib.broker.messages import (
    AdvanceRequest,
    CloseSessionRequest,
    CreditNotify,
    DeleteRecordsRequest,
    Delivery,
    Done,
    DropPartitionRequest,
    EndStreamRequest,
    EnsurePartition,
    EpochEndRequest,
    HeartbeatRequest,
    Incarnation,
    ListPartitions,
    ListSubscriptions,
    MarkersWritten,
    OpenProducerRequest,
    OpenSessionRequest,
    PartitionInfo,
    PartitionList,
    ProduceBatchesRequest,
    Produced,
    ProducedBatches,
    ProduceRequest,
    ProducerOpened,
    ReplicaFetchRequest,
    SessionOpened,
    Subscribed,
    SubscribeRequest,
    SubscriptionEnded,
    SubscriptionInfo,
    SubscriptionList,
    UnsubscribeRequest,
    WriteMarkersRequest,
)
from querylib.driver import Driver
from querylib.errors import OffsetOutOfRangeError
from querylib.log import FlushPolicy, LogConfig, PartitionLog, appended_batch
from querylib.records import SplitBatch
from querylib.rpc import (
    BROKER,
    AddressError,
    Context,
    ErrorBody,
    InternalServerError,
    Keyring,
    Limits,
    PeerBusyError,
    PeerUnreachableError,
    RequestStats,
    RpcServer,
    error_body,
    payload_digest,
)

from ._appender import AppendLane
from ._bookkeeping import BrokerLimits
from ._cohort_store import CohortSaver, load_cohorts
from ._disk import (
    OpenedPartition,
    find_partitions,
    keep_transaction_history,
    open_partition,
    partition_path,
    purge_deleted,
    remove_partition_dir,
    set_aside,
    stale_incarnation,
    validate_partition,
    write_incarnation,
)
from ._door import LOCAL_SESSIONS, BrokerPort, OpenDirectory, TopicDirectory
from ._events import (
    AdvanceFrontier,
    Append,
    AppendCompleted,
    CloseSession,
    Deliver,
    DropPartition,
    DropSubscription,
    DurableAdvanced,
    EndStream,
    Fail,
    GrantCredit,
    Heartbeat,
    OpenPartition,
    OpenProducer,
    OpenSession,
    PartitionId,
    PartitionOpened,
    PartitionOpenFailed,
    Produce,
    ProposeIsr,
    QueryExits,
    Read,
    ReadCompleted,
    ReadFailed,
    Reply,
    ResolveTopic,
    SaveCohorts,
    SessionExpired,
    Stimulus,
    Subscribe,
    SubscriptionClosed,
    Tick,
    TopicAccess,
    TopicForgotten,
    TopicResolved,
    Unsubscribe,
)
from ._frontier import SavedCohort, query_of_cohort
from ._read_cache import ReadCache, SharedRead, read_shared
from ._replica_shell import ReplicaShell
from ._state import BrokerState
from ._txn_index import TxnHistory
from ._write_access import ADMIN, ANONYMOUS, SYSTEM, admits

# What a producer sends without waiting for answers, and must see appended in that order.
_IN_ARRIVAL_ORDER = (ProduceRequest, ProduceBatchesRequest, AdvanceRequest, EndStreamRequest)

# Partitions one WriteMarkersRequest may name: as many as one Kafka transaction may span.
MAX_MARKER_PARTITIONS = 10_000

__all__ = ["BrokerServer", "server_limits"]

logger = logging.getLogger("querylib.broker")

_LENGTH = struct.Struct(">qi")  # baseOffset, batchLength
RECV_HWM = 32  # messages zmq queues per client connection before it stops reading it
_FRAMES_ROOM = 64 * 1024  # signature, header and body frames beside a Produce's batch


def server_limits(limits: BrokerLimits) -> Limits:
    """What the broker's ROUTER accepts (DESIGN §2 "Limits"). A Produce carries one batch of
    at most `max_batch_bytes` (a ProduceBatches that many bytes of batches in one frame),
    every other request is small: ZMQ_MAXMSGSIZE refuses a bigger frame from its announced
    size, before buffering it, so unsigned garbage costs at most RECV_HWM x that per
    connection. Deliveries are bounded by credit, not by message count (a
    subscriber with 1 MiB of credit and 100-byte batches has ~10k in flight): the send HWM
    stays high."""
    return Limits(hwm=100_000, recv_hwm=RECV_HWM,
                  max_receive_bytes=limits.max_batch_bytes + _FRAMES_ROOM)


def _split_batches(payload: list[Any], count: int) -> list[memoryview]:
    """The `count` batches of a ProduceBatchesRequest's one payload frame, as views (each
    framed by its header's batchLength; its contents are checked when it is appended).
    BrokerProtocolError when the frame does not hold exactly that many."""
    if len(payload) != 1 or count < 1:
        raise BrokerProtocolError(f"a produce of batches carries one payload frame of one or "
                                  f"more batches, not {len(payload)} frames of {count}")
    view = memoryview(payload[0]).cast("B")
    batches: list[memoryview] = []
    at, end = 0, len(view)
    while at < end:
        if end - at < _LENGTH.size or len(batches) == count:
            break
        size = _LENGTH.size + _LENGTH.unpack_from(view, at)[1]
        if size <= _LENGTH.size or at + size > end:
            break
        batches.append(view[at:at + size])
        at += size
    if at != end or len(batches) != count:
        raise BrokerProtocolError(f"a produce of batches does not hold the {count} whole "
                                  f"batches it names ({end} bytes)")
    return batches


def _open_partition(data_dir: str, pid: PartitionId, config: LogConfig,
                    incarnation: Incarnation | None, scan_bytes: int, visible_bound: int | None
                    ) -> tuple[OpenedPartition, tuple[SavedCohort, ...]]:
    """The partition's log, recovered, and the cohorts saved beside it (thread side)."""
    opened = open_partition(data_dir, pid, config, incarnation, producer_scan_bytes=scan_bytes,
                            visible_bound=visible_bound)
    return opened, load_cohorts(partition_path(data_dir, pid))


def incarnation_of(topic_id: int, created_ms: int) -> Incarnation | None:
    """The topic incarnation a request names; None when it names none (no catalog)."""
    return Incarnation(created_ms, topic_id) if topic_id > 0 else None


# Kafka topic configs a topic's directory entry may set, and the LogConfig field of each.
_LOG_CONFIG_FIELDS = {"retention.ms": "retention_ms", "retention.bytes": "retention_bytes",
                      "segment.bytes": "segment_bytes"}


class BrokerServer:
    """A broker hosting the partitions under `data_dir`, serving them over RPC and `port`.
    `directory` says who may write which topic (default `OpenDirectory`: anyone, anything)."""

    def __init__(self, data_dir: str | os.PathLike[str], secret: bytes | Keyring, *,
                 limits: BrokerLimits | None = None, log_config: LogConfig | None = None,
                 rpc_limits: Limits | None = None, max_partitions: int = 10_000,
                 tick_interval: float = 0.1, append_threads: int = 4,
                 read_threads: int = 4, directory: TopicDirectory | None = None,
                 server_key: bytes | None = None, curve: bool | None = None,
                 read_cache_bytes: int = 32 * 1024 * 1024) -> None:
        """`server_key`: what its CURVE keypair derives from when it listens beyond loopback
        (the key its runner holds; default: the cluster secret of a master keyring); `curve`
        forces CURVE on (True) or off (False: a benchmark's baseline) instead.
        `read_cache_bytes`: the most its recent catch-up reads, shared by subscriptions
        reading at the same offset, may hold (`ReadCache`)."""
        keep_freed_memory()  # a batch's megabyte is freed once stored and sent: reuse it
        share_arenas()  # ... in two arenas, not one per read and append thread
        self.data_dir = os.fspath(data_dir)
        self.log_config = log_config or LogConfig()
        self._topic_configs: dict[str, tuple[tuple[str, str], ...]] = {}
        self.max_partitions = max_partitions
        self.tick_interval = tick_interval
        # Tail deliveries hand out the bytes exactly as the log stores them (it stamps more
        # than the base offset), without reading them back.
        self.state = BrokerState(limits, stamp=appended_batch)
        self._rpc = RpcServer(secret, limits=rpc_limits or server_limits(self.state.limits),
                              audience=BROKER, server_key=server_key, curve=curve)
        self.keyring = self._rpc.keyring  # whose keys its clients sign with (DESIGN §12)
        self._append_pool = ThreadPoolExecutor(append_threads, thread_name_prefix="tq-append")
        self._read_pool = ThreadPoolExecutor(read_threads, thread_name_prefix="tq-read")
        self._lanes: dict[PartitionId, AppendLane] = {}
        # Per partition since start: bytes appended, bytes delivered, offsets delivered (the
        # metrics read them; two additions per batch)
        self.traffic: dict[PartitionId, list[int]] = {}
        self._savers: dict[PartitionId, CohortSaver] = {}
        self._opening: KeyedLock[PartitionId] = KeyedLock()
        # The topic incarnation each open partition's directory records (None: none).
        self._incarnations: dict[PartitionId, Incarnation | None] = {}
        self._peers: dict[str, bytes] = {}  # broker session -> ROUTER identity of its client
        self._broken: set[tuple[str, int]] = set()  # subscriptions whose delivery failed
        self._held: list[Append] | None = None  # appends held while a request's batches feed
        self._driver = self._make_driver()
        self._ticker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.endpoint: str | None = None
        # push_digests: payload digests computed for deliveries (one per payload however many
        # subscribers it is pushed to)
        # log_reads: catch-up reads of the disk; shared_reads: catch-up reads answered by
        # another's read (kept, or in flight at the same offset) instead
        self.counters: dict[str, int] = {"delivery_failed": 0, "bugs": 0, "push_digests": 0,
                                         "log_reads": 0, "shared_reads": 0}
        self.read_cache = ReadCache(read_cache_bytes)
        # Catch-up reads of the disk under way, by (partition, offset) -> the reads at the
        # same offset asked meanwhile, answered by it where it serves them.
        self._reading: dict[tuple[PartitionId, int], list[Read]] = {}
        # Payloads pushed (or about to be) in this loop iteration -> (payload, its digest, the
        # frame its pushes share or None yet), by identity (the payload is kept, so its id is
        # not reused); emptied when the iteration ends.
        self._digests: dict[int, tuple[bytes, bytes, Any]] = {}
        self._visible_listeners: list[Callable[[PartitionId], None]] = []
        self.directory: TopicDirectory = directory or OpenDirectory()
        self._tasks: set[asyncio.Task[None]] = set()  # directory questions, partition opens
        self._closing = False
        # Sessions opened through the port: RPC clients may not name them (they write as
        # tq's own writers, and some have well-known ids).
        self._local: set[str] = set()
        # Sessions an RPC client opened as anonymous (a downgrade): session -> that client's
        # principal, the only one that may use them.
        self._downgraded: dict[str, str] = {}
        # Replication (DESIGN §5 "Replication"): roles, fetchers, who may fetch from it and
        # where its ISR proposals go. A broker given the cluster secret fetches with it; one
        # given a keyring (an executor's) is told its credential by whoever sets its roles.
        self.replication = ReplicaShell(
            ensure=lambda topic, partition: self._ensure(topic, partition, True),
            reopen=self._reopen, drop=self.drop_partition, lanes=self._lanes,
            feed=self._feed, limits=self.state.limits,
            append_pool=self._append_pool, read_pool=self._read_pool,
            closing=lambda: self._closing,
            credential=secret if isinstance(secret, bytes) else None)
        self.port = BrokerPort(self)
        self._register()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, listen: str | None = "tcp://127.0.0.1:0", *,
                    prefer: str | None = None) -> str:
        """Open (and recover) every partition under the data directory, then listen: on
        `prefer` if given and free (the address of a previous run, so clients find us where
        they left us), else on `listen` (no RPC socket with `listen` None: the in-process
        `port` only). Returns the RPC endpoint, or "" without one."""
        self._loop = asyncio.get_running_loop()
        # The state's clock starts now, not at the ticker's first run: a session opened in
        # between would otherwise get its lease counted from time 0 and expire at once.
        self._feed(Tick(self._loop.time(), int(time.time() * 1000)))
        os.makedirs(self.data_dir, exist_ok=True)
        await self._loop.run_in_executor(self._append_pool, purge_deleted, self.data_dir)
        pids = await self._loop.run_in_executor(self._append_pool, find_partitions,
                                                self.data_dir)
        await asyncio.gather(*(self._open(pid) for pid in pids))
        self.directory.watch(self._topic_learned, self._topic_forgotten)
        if prefer and listen is not None:
            try:
                self.endpoint = await self._rpc.start(prefer)
            except AddressError as exc:
                # Info, not a warning: the caller reports where it listens (tq up does).
                logger.info("broker: %s; listening on %s instead", exc, listen)
        if self.endpoint is None:
            self.endpoint = await self._rpc.start(listen) if listen is not None else ""
        self._ticker = self._loop.create_task(self._tick_forever(), name="broker ticks")
        logger.info("broker on %s: %d partitions under %s", self.endpoint or "(no RPC)",
                    len(pids), self.data_dir)
        return self.endpoint

    async def close(self) -> None:
        """Stop serving, finish queued appends, close every log. Idempotent."""
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.replication.close()
        await self._rpc.close()
        for lane in list(self._lanes.values()):
            await lane.close()
        for saver in list(self._savers.values()):
            await saver.close()
        loop = asyncio.get_running_loop()
        for pid, lane in self._lanes.items():
            part = self.state.partitions.get(pid)
            # A follower's core never looks into the batches it replicates, so it knows none
            # of their transactions: its history stays as its opening wrote it, and the next
            # opening walks all it replicated since.
            if part is not None and not part.follower:
                # What the core knows of its transactions, through what it saw durable: the
                # next opening walks only the log after it (`_disk.transaction_history`).
                history = TxnHistory(part.visible_end, tuple(part.open_txns.items()),
                                     tuple(part.aborted), tuple(part.marked_epochs.items()))
                await loop.run_in_executor(
                    self._append_pool, keep_transaction_history,
                    partition_path(self.data_dir, pid), history)
            await loop.run_in_executor(self._append_pool, lane.log.close)
        self._lanes.clear()
        self._append_pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=True)

    async def __aenter__(self) -> BrokerServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def public_key(self) -> str:
        """Its CURVE public key (Z85) when it is a CURVE server (it listens beyond loopback,
        or TQ_RPC_CURVE=1), else "": what its catalog record tells clients."""
        return self._rpc.public_key

    @property
    def rpc_counters(self) -> dict[str, int]:
        """Messages the RPC layer dropped or refused, by reason."""
        return self._rpc.counters

    def statistics(self) -> dict[str, int]:
        return {**self.state.statistics(), **self.counters}

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._feed(Tick(loop.time(), int(time.time() * 1000)))
            await asyncio.sleep(self.tick_interval)

    # -- partitions -------------------------------------------------------------------------

    async def _open(self, pid: PartitionId, incarnation: Incarnation | None = None) -> None:
        loop = asyncio.get_running_loop()
        opened, cohorts = await loop.run_in_executor(
            self._append_pool, _open_partition, self.data_dir, pid, self.topic_log_config(pid[0]),
            incarnation, self.state.limits.producer_scan_bytes, self.state.follower_mark(pid))
        self._incarnations[pid] = opened.incarnation
        log = opened.log
        inline = self.log_config.flush is FlushPolicy.NEVER
        self._lanes[pid] = AppendLane(pid, log, self._append_pool, self._feed, inline=inline)
        self._savers[pid] = CohortSaver(pid, partition_path(self.data_dir, pid),
                                        self._append_pool, self._feed)
        self._feed(PartitionOpened(pid, log.log_start_offset, log.log_end_offset,
                                   log.durable_end_offset, opened.frontier, opened.ended,
                                   cohorts, opened.producers, opened.epoch,
                                   opened.epoch_since, *opened.transactions,
                                   at_visible=opened.at_visible))

    # -- replication -------------------------------------------------------------------------

    async def _reopen(self, pid: PartitionId) -> None:
        """Open a promoted follower's partition again: it appended its leader's batches as they
        came, without judging them, so what they say (producers' sequences, the frontier, the
        end of stream, open transactions, cohorts) is learnt from its log, as on a restart,
        before it leads. The partition serves nobody as a follower, so nothing is in flight."""
        async with self._opening.hold(pid):
            incarnation = self._incarnations.get(pid)
            await self._forget(pid, lambda: None)
            await self._open(pid, incarnation)

    # -- what BrokerPort and the executor use ---------------------------------------------------

    async def ensure_partition(self, topic: str, partition: int, *, create: bool,
                               topic_id: int = 0, topic_created_ms: int = 0) -> PartitionId:
        """The partition's id once this broker hosts it, opening (`create`: creating) it.
        InvalidTopicError for a name the broker cannot store, UnknownPartitionError when it
        does not host it and `create` is off. With the catalog's `topic_id` and
        `topic_created_ms`, the partition must belong to that topic (DESIGN §4 "Topic
        incarnations"): an older incarnation's directory is set aside, a newer one's refuses
        (StaleIncarnationError)."""
        return await self._ensure(topic, partition, create,
                                  incarnation_of(topic_id, topic_created_ms))

    def on_visible(self, listener: Callable[[PartitionId], None]) -> Callable[[], None]:
        """Call `listener(pid)` (on the loop; it must be quick) whenever what subscribers may
        read of a partition may have grown. Returns the function that stops it. How a Kafka
        Fetch waiting for data learns of appends without polling."""
        self._visible_listeners.append(listener)
        return lambda: self._visible_listeners.remove(listener)

    def partition_sizes(self) -> dict[PartitionId, int]:
        """Bytes each open partition's log holds on disk (the metrics read it)."""
        return {pid: lane.log.size_in_bytes for pid, lane in list(self._lanes.items())}

    @property
    def request_stats(self) -> RequestStats:
        """What its RPC server served, by message type (the metrics read it)."""
        return self._rpc.stats

    def _sized_info(self, pid: PartitionId) -> PartitionInfo:
        """The core's PartitionInfo with the bytes its log holds on disk."""
        info = self.state.partition_info(pid)
        lane = self._lanes.get(pid)
        if lane is None:
            return info
        return msgspec.structs.replace(info, size=lane.log.size_in_bytes)

    async def may_write(self, topic: str, principal: str) -> bool:
        """Whether the topic's writers rule admits `principal` (asking the directory when the
        core has no rule for it yet): Kafka's DELETE and ALTER on a topic are its writers'."""
        rule = self.state.rule_of(topic)
        if rule is None:
            rule = await self.directory.resolve(topic, 0, create=False)
        return admits(rule.writers, principal)

    async def delete_records(self, pid: PartitionId, offset: int) -> int:
        """Move a hosted partition's log start up to `offset` (Kafka's DeleteRecords), in
        order with its appends; the new log start. UnknownPartitionError if not hosted,
        OffsetOutOfRangeError past its end."""
        lane = self._lanes.get(pid)
        if lane is None:
            raise UnknownPartitionError(f"this broker has no partition {pid[1]} of topic "
                                        f"{pid[0]!r}")
        return await lane.delete_records(offset)

    def partition_log(self, pid: PartitionId) -> PartitionLog:
        """The log of a hosted partition, for reads (thread-safe against the append lane).
        Never append to it: the lane is its one writer. UnknownPartitionError if not hosted."""
        lane = self._lanes.get(pid)
        if lane is None:
            raise UnknownPartitionError(f"this broker has no partition {pid[1]} of topic "
                                        f"{pid[0]!r}")
        return lane.log

    def query_exits(self, query_id: int, exit_codes: tuple[int | None, ...],
                    failed: bool) -> None:
        """What the catalog says of a query's processes (exit code each, None while running;
        `failed`: the query failed or was killed): its cohorts on this broker settle
        (DESIGN §5 "Collective publishing"). Call on the broker's loop."""
        self._feed(QueryExits(query_id, tuple(exit_codes), failed))

    def cohort_queries(self) -> set[int]:
        """The queries some cohort on this broker is waiting for (to join, or to end)."""
        return {q for part in self.state.partitions.values()
                for g in part.frontier.open_cohorts()
                if (q := query_of_cohort(g)) is not None}

    async def _ensure(self, topic: str, partition: int, create: bool,
                      incarnation: Incarnation | None = None) -> PartitionId:
        pid = validate_partition(topic, partition)
        if pid in self.state.partitions and (
                incarnation is None or self._incarnations.get(pid) == incarnation):
            return pid
        if pid not in self.state.partitions and not create and pid not in self._opening:
            # (One being opened, a promoted follower's opened again, is waited for below.)
            raise UnknownPartitionError(f"this broker has no partition {partition} of topic "
                                        f"{topic!r}")
        async with self._opening.hold(pid):
            if pid in self.state.partitions and incarnation is not None:
                await self._check_incarnation(pid, incarnation)
            if pid not in self.state.partitions:
                if not create:
                    raise UnknownPartitionError(f"this broker has no partition {partition} of "
                                                f"topic {topic!r}")
                if len(self.state.partitions) >= self.max_partitions:
                    raise UserError(f"this broker hosts its maximum of {self.max_partitions} "
                                    "partitions")
                await self._open(pid, incarnation)
        return pid

    async def _may_create(self, topic: str, partition: int) -> None:
        """A reader may have a partition created empty only where the directory places it (a
        topic the catalog places here that nobody wrote yet); PartitionNotHereError,
        UnknownPartitionError or the directory's refusal otherwise."""
        if (topic, partition) in self.state.partitions:
            return
        rule = self.state.rule_of(topic)
        if rule is None:
            rule = await self.directory.resolve(topic, partition, create=False)
        rule.check_placed(partition, "read")

    async def _settle_incarnation(self, pid: PartitionId, incarnation: Incarnation) -> None:
        """Check an open partition against the incarnation a writer names, under its opening
        lock (it may be set aside: then it is no longer hosted)."""
        async with self._opening.hold(pid):
            if pid in self.state.partitions:
                await self._check_incarnation(pid, incarnation)

    async def _check_incarnation(self, pid: PartitionId, incarnation: Incarnation) -> None:
        """An open partition asked for as `incarnation` (under its opening lock): take it as
        that one if its directory records none, set it aside if it is an older one (then it
        is no longer hosted), refuse if it is a newer one."""
        held = self._incarnations.get(pid)
        path = partition_path(self.data_dir, pid)
        loop = asyncio.get_running_loop()
        if held == incarnation:
            return
        if held is None:
            await loop.run_in_executor(self._append_pool, write_incarnation, path, pid,
                                       incarnation)
            self._incarnations[pid] = incarnation
        elif held > incarnation:
            raise stale_incarnation(pid, held, incarnation, path)
        else:
            await self._forget(pid, lambda: set_aside(self.data_dir, pid, held))

    async def drop_partition(self, topic: str, partition: int) -> None:
        """Forget a partition and delete its files (its topic was deleted). PartitionBusyError
        while appends or reads on it are in flight; done already if not hosted."""
        pid = validate_partition(topic, partition)
        # Under the partition's opening lock: an open asked for meanwhile (the topic created
        # again) waits and then finds no directory, so a new topic never sees old records.
        async with self._opening.hold(pid):
            await self._forget(pid, lambda: remove_partition_dir(self.data_dir, pid))

    async def _forget(self, pid: PartitionId, then: Callable[[], object]) -> None:
        """Drop the partition from the state, close its log, then run `then` (on the append
        pool) on its closed directory. The caller holds the partition's opening lock."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._feed(DropPartition(future, pid))
        await future
        loop = asyncio.get_running_loop()
        lane = self._lanes.pop(pid, None)
        self.read_cache.forget(pid)
        if lane is not None:
            await lane.close()
            await loop.run_in_executor(self._append_pool, lane.log.close)
        saver = self._savers.pop(pid, None)
        if saver is not None:
            await saver.close()
        self._incarnations.pop(pid, None)
        await loop.run_in_executor(self._append_pool, then)

    # -- the state machine loop -------------------------------------------------------------

    def _feed(self, stimulus: Stimulus) -> None:
        """Hand a stimulus to the state and perform its instructions (`querylib.driver`);
        stimuli raised while performing (a failed delivery) queue behind."""
        self._driver.feed(stimulus)

    def _make_driver(self) -> Driver:
        def finish(instr: Reply | Fail) -> None:
            if not instr.token.done():
                if isinstance(instr, Fail):
                    instr.token.set_exception(instr.error)
                else:
                    instr.token.set_result(instr.value)

        return Driver("broker", self.state.handle, {
            ResolveTopic: lambda instr: self._spawn(self._resolve(instr),
                                                    f"resolve topic {instr.topic}"),
            OpenPartition: lambda instr: self._spawn(
                self._open_for(instr.partition, instr.incarnation), f"open {instr.partition}"),
            Reply: finish,
            Fail: finish,
            Deliver: self._deliver,
            Append: self._append,
            Read: self._read,
            SubscriptionClosed: self._subscription_closed,
            SaveCohorts: lambda instr: self._savers[instr.partition].submit(instr),
            SessionExpired: self._session_expired,
            ProposeIsr: lambda instr: self.replication.on_isr_proposal(instr),
        }, on_bug=self._bug, invariants=self.state.check_invariants, after=self._after,
            # Tuples, not text: formatting would cost every batch a microsecond.
            slim={Produce: lambda s: ("Produce", s.session, s.partition, len(s.batch)),
                  ReadCompleted: lambda s: ("ReadCompleted", s.serial, s.offset, len(s.data),
                                            s.next_offset)},
            logger=logger)

    def _bug(self, stimulus: Stimulus, exc: Exception) -> None:
        """A bug (ours, not a client's) handling `stimulus`: fail its request, serve on."""
        self.counters["bugs"] += 1
        token = getattr(stimulus, "token", None)
        if isinstance(token, asyncio.Future) and not token.done():
            token.set_exception(InternalServerError(f"broker bug: {type(exc).__name__}: {exc}"))

    def _after(self, stimulus: Stimulus) -> None:
        if self._visible_listeners and isinstance(stimulus, AppendCompleted | DurableAdvanced):
            for listener in list(self._visible_listeners):
                listener(stimulus.partition)

    def _subscription_closed(self, instr: SubscriptionClosed) -> None:
        self._broken.discard((instr.session, instr.sub_id))
        error = instr.error if isinstance(instr.error, TqError) else StorageError(
            str(instr.error))
        self._notify(instr.session, SubscriptionEnded(
            sub_id=instr.sub_id, topic=instr.partition[0], partition=instr.partition[1],
            error=error_body(error)))

    def _session_expired(self, instr: SessionExpired) -> None:
        self._peers.pop(instr.session, None)
        self._local.discard(instr.session)
        self._downgraded.pop(instr.session, None)

    def _spawn(self, coro: Any, name: str) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve(self, ask: ResolveTopic) -> None:
        """Ask the directory; its answer (or refusal) goes back to the state."""
        try:
            access = await self.directory.resolve(ask.topic, ask.partition, create=ask.create)
        except TqError as exc:
            self._feed(TopicResolved(ask.ask, error=exc))
        except Exception as exc:  # a bug in the directory: refuse the writers, say so
            self.counters["bugs"] += 1
            logger.exception("broker: the directory failed on topic %r", ask.topic)
            self._feed(TopicResolved(ask.ask, error=InternalServerError(
                f"broker bug resolving {ask.topic!r}: {type(exc).__name__}: {exc}")))
        else:
            self._feed(TopicResolved(ask.ask, access=access))

    async def _open_for(self, pid: PartitionId, incarnation: Incarnation | None) -> None:
        """Open a partition the state admitted a writer to (as the topic incarnation the
        writer named, if it named one); it learns by PartitionOpened."""
        try:
            await self._ensure(pid[0], pid[1], True, incarnation)
        except TqError as exc:
            self._feed(PartitionOpenFailed(pid, exc))
        except OSError as exc:
            self._feed(PartitionOpenFailed(pid, StorageError(f"cannot open {pid}: {exc}")))
        except Exception as exc:  # a bug: refuse the writers waiting for it, say so
            self.counters["bugs"] += 1
            logger.exception("broker: opening %s failed", pid)
            self._feed(PartitionOpenFailed(pid, InternalServerError(
                f"broker bug opening {pid}: {type(exc).__name__}: {exc}")))

    def _topic_learned(self, access: TopicAccess) -> None:
        if self._topic_configs.get(access.topic, ()) != access.configs:
            if access.configs:
                self._topic_configs[access.topic] = access.configs
            else:
                self._topic_configs.pop(access.topic, None)
            config = self.topic_log_config(access.topic)
            for pid, lane in self._lanes.items():
                if pid[0] == access.topic:
                    lane.log.config = config  # read by the lane's roll and retention
                    lane.apply_retention()
        self._feed(access)

    def _topic_forgotten(self, topic: str) -> None:
        self._topic_configs.pop(topic, None)
        self._feed(TopicForgotten(topic))

    def topic_log_config(self, topic: str) -> LogConfig:
        """The broker's log config with the topic's own settings from its directory (the
        catalog's retention.ms, retention.bytes, segment.bytes) over it."""
        configs = self._topic_configs.get(topic)
        if not configs:
            return self.log_config
        fields: dict[str, Any] = {_LOG_CONFIG_FIELDS[name]: int(value)
                                  for name, value in configs if name in _LOG_CONFIG_FIELDS}
        return dataclasses.replace(self.log_config, **fields)

    def _append(self, instr: Append) -> None:
        self._traffic(instr.partition)[0] += len(instr.batch)
        if self._held is not None:  # a ProduceBatches is being fed: its appends go as one
            self._held.append(instr)
            return
        self._lanes[instr.partition].submit(instr.ticket, instr.batch, instr.sync)

    def _feed_held(self, stimuli: list[Stimulus]) -> None:
        """Feed `stimuli` in order, holding the appends they cause and handing them to their
        lanes together afterwards, in the same order: one commit (one writev) for the batches
        of one request rather than one each. Nothing is acknowledged before its append
        completes, as always; holding only moves the write to the end of this call."""
        held: list[Append] = []
        self._held = held
        try:
            for stimulus in stimuli:
                self._feed(stimulus)
        finally:
            self._held = None
            by_lane: dict[PartitionId, list[tuple[int, Any, bool]]] = {}
            for instr in held:
                by_lane.setdefault(instr.partition, []).append(
                    (instr.ticket, instr.batch, instr.sync))
            for pid, items in by_lane.items():
                self._lanes[pid].submit_many(items)

    def _traffic(self, pid: PartitionId) -> list[int]:
        found = self.traffic.get(pid)
        if found is None:
            found = self.traffic[pid] = [0, 0, 0]
        return found

    def _deliver(self, d: Deliver) -> None:
        key = (d.session, d.sub_id)
        if key in self._broken:
            return  # an earlier delivery of this round failed: the subscription is ending
        message = Delivery(sub_id=d.sub_id, topic=d.partition[0], partition=d.partition[1],
                           offset=d.offset, next_offset=d.next_offset)
        try:
            peer = self._peers.get(d.session)
            if peer is None:
                raise PeerUnreachableError(f"no address known for session {d.session!r}")
            if isinstance(d.data, tuple):  # a replicated run: a frame a batch, hashed once
                shared = [self._shared(data) for data in d.data]
                self._rpc.notify(peer, message, payload=[f for f, _ in shared],
                                 digests=[digest for _, digest in shared])
                size = sum(len(data) for data in d.data)
            else:
                frame, digest = self._shared(d.data)
                self._rpc.notify(peer, message, payload=[frame], digests=[digest])
                size = len(d.data)
            traffic = self._traffic(d.partition)
            traffic[1] += size
            traffic[2] += d.next_offset - d.offset
        except (PeerBusyError, PeerUnreachableError) as exc:
            # Delivering out of order or with a hole is never an option: end the subscription;
            # the client resubscribes from the last offset it has.
            self.counters["delivery_failed"] += 1
            self._broken.add(key)
            self._feed(DropSubscription(d.session, d.sub_id, exc))

    def _shared(self, data: bytes) -> tuple[Any, bytes]:
        """`data` as the payload frame every push of it carries (`RpcServer.shared_payload`)
        and its `payload_digest`, made once however many subscribers it goes to: tail
        deliveries of a batch share its stored bytes, a read's digest came with it."""
        found = self._digests.get(id(data))
        if found is not None and found[0] is data:
            frame = found[2]
            if frame is None:
                frame = self._rpc.shared_payload(data)
                self._digests[id(data)] = (data, found[1], frame)
            return frame, found[1]
        # A replicated batch at the tail: its followers fetched these very bytes, hashed then
        # and sent as one zero-copy frame, which the subscribers' pushes share too.
        replicas = self.replication.digests
        if replicas.kept(data) is not None:
            frame, digest = replicas.sendable(data, self._rpc.shared_payload)
        else:
            digest = payload_digest(data)
            self.counters["push_digests"] += 1
            frame = self._rpc.shared_payload(data)
        self._remember_digest(data, digest, frame)
        return frame, digest

    def _remember_digest(self, data: bytes, digest: bytes, frame: Any = None) -> None:
        if not self._digests:
            assert self._loop is not None
            self._loop.call_soon(self._digests.clear)
        self._digests[id(data)] = (data, digest, frame)

    def _notify(self, session: str, message: Any) -> None:
        peer = self._peers.get(session)
        if peer is None:
            return
        try:
            self._rpc.notify(peer, message)
        except (PeerBusyError, PeerUnreachableError):
            self.counters["delivery_failed"] += 1

    def _read(self, instr: Read) -> None:
        """A subscription's catch-up read: answered by a kept read at the same offset, or by
        the read of the disk under way there, or by a read of its own (`ReadCache`)."""
        assert self._loop is not None
        pid, key = instr.partition, (instr.partition, instr.offset)
        lane = self._lanes.get(pid)
        if lane is None:  # closed since the core asked: the subscription is gone with it
            self._feed(ReadFailed(instr.serial, instr.offset, StorageError(
                f"partition {pid} closed")))
            return
        log = lane.log
        kept = self.read_cache.get(pid, instr.offset, log, instr.max_bytes, instr.end_offset)
        if kept is not None:
            # Answered on the loop's next turn, as a read of the disk would be: a subscription
            # with much credit gets one delivery a turn, not its whole credit's worth in one
            # (DESIGN §5 "Fair service").
            self.counters["shared_reads"] += 1
            self._loop.call_soon(self._read_done, instr, kept)
            return
        waiting = self._reading.get(key)
        if waiting is not None:
            waiting.append(instr)
            return
        self._reading[key] = []
        self.counters["log_reads"] += 1
        future = self._loop.run_in_executor(self._read_pool, read_shared, log, instr.offset,
                                            instr.max_bytes, instr.end_offset)

        def done(f: asyncio.Future[SharedRead]) -> None:
            waiters = self._reading.pop(key, [])
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                if not isinstance(exc, TqError):
                    logger.error("broker: read of %s failed: %r", pid, exc)
                self._feed(ReadFailed(instr.serial, instr.offset, exc))
                for waiter in waiters:
                    self._read(waiter)  # each fails (or not) by itself
                return
            read = f.result()
            self.counters["push_digests"] += 1
            self.read_cache.put(pid, instr.offset, read)
            self._read_done(instr, read)
            for waiter in waiters:
                if read.serves(log, waiter.offset, waiter.max_bytes, waiter.end_offset):
                    self.counters["shared_reads"] += 1
                    self._read_done(waiter, read)
                else:
                    self._read(waiter)  # it asked for less than this read holds

        future.add_done_callback(done)

    def _read_done(self, instr: Read, read: SharedRead) -> None:
        if read.frame is None:
            read.frame = self._rpc.shared_payload(read.data)
        self._remember_digest(read.data, read.digest, read.frame)
        self._feed(ReadCompleted(instr.serial, instr.offset, read.data, read.next_offset))

    # -- requests: one door, for RPC clients and the in-process port ------------------------

    async def _serve(self, request: Any, payload: list[Any], *, peer: bytes | None,
                     remote: bool, principal: str | None = None) -> Any:
        """Answer one broker request, from an RPC client (`remote`, its ROUTER identity
        `peer`, authenticated as `principal`) or from `BrokerPort` in this process: the same
        stimuli either way, so the core decides the same. Deliveries go to RPC clients only.
        An RPC client's session writes as the principal it authenticated as (DESIGN §12),
        and a session is used only by its own principal."""
        if self._closing:
            raise BrokerClosedError("the broker is closed")
        handler = self._handlers.get(type(request))
        if handler is None:
            raise BrokerProtocolError(f"the broker serves no {type(request).__name__}")
        if remote:
            session_id = getattr(request, "session", None)
            if session_id:
                self._check_remote_session(session_id, principal)
            if type(request) is ProduceRequest:
                pass  # the usual request (one per batch): none of the checks below is its
            elif isinstance(request, OpenSessionRequest):
                # Itself, or anonymous: a downgrade is never an escalation (DESIGN §12).
                if request.principal == ANONYMOUS and principal:
                    self._downgraded[request.session] = principal
                else:
                    request = msgspec.structs.replace(request, principal=principal or "")
            elif isinstance(request, ListSubscriptions) and principal != ADMIN:
                request = msgspec.structs.replace(request, principal=principal or "?")
            elif isinstance(request, DeleteRecordsRequest) and principal != ADMIN and not (
                    await self.may_write(request.topic, principal or "")):
                raise TopicAuthorizationError(
                    f"{principal} may not delete records of topic {request.topic!r}: only its "
                    "writers and the admin may")
            elif isinstance(request, WriteMarkersRequest) and principal != ADMIN:
                raise PrincipalError(f"{principal} may not write transaction markers: only "
                                     "tq's transaction coordinator does")
            elif isinstance(request, DropPartitionRequest) and principal != ADMIN:
                # Under a coordinator, drops come from the catalog through the executor (in
                # process); over RPC only the holder of the cluster secret drops data.
                raise PrincipalError(f"{principal} may not drop partitions: only the admin may "
                                     "(under a coordinator, `tq topic delete` drops them)")
        return await handler(request, payload, peer, principal if remote else None)

    def _check_remote_session(self, session_id: str, principal: str | None) -> None:
        """An RPC client uses a session of its own: not one of the broker's process, not one
        another principal opened."""
        if session_id in self._local or session_id.startswith(LOCAL_SESSIONS):
            raise PrincipalError("that session belongs to the broker's own process; open one "
                                 "of your own")
        holder = self._holder(session_id)
        if holder is not None and holder != principal:
            raise PrincipalError(f"session {session_id!r} belongs to another principal")

    def _holder(self, session_id: str) -> str | None:
        """The principal that opened a session (for one opened as anonymous, who asked for
        the downgrade); None when there is no such session."""
        session = self.state.sessions.get(session_id)
        if session is None:
            return None
        if session.principal == ANONYMOUS:
            return self._downgraded.get(session_id, ANONYMOUS)
        return session.principal

    def _serve_now(self, request: Any, ctx: Context) -> asyncio.Future[Any]:
        """`_serve` for a producer's pipelined request from an RPC client (Produce, Advance,
        EndStream: `_IN_ARRIVAL_ORDER`), with the same checks, run at once by the RPC server
        (a direct handler: no task per batch). All three are fed to the core as they arrive,
        so a producer's batches and frontiers are appended in the order it sent them."""
        if self._closing:
            raise BrokerClosedError("the broker is closed")
        if request.session:
            self._check_remote_session(request.session, ctx.principal)
        return self._handlers[type(request)](request, ctx.payload, ctx.peer, ctx.principal)

    def _call(self, peer: bytes | None, session: str, make: Callable[[Any], Stimulus],
              remote: str | None) -> asyncio.Future[Any]:
        """Feed the stimulus `make(future)` now; the future resolves to the core's answer (a
        future rather than a coroutine awaiting it: one frame less on every request).
        `remote`: the RPC client's principal (None: this process), whose session is checked
        again here, as it is fed: a request that awaited since the door's check (the
        directory, a partition opening) may find its session opened by another meanwhile."""
        if remote is not None:
            self._check_remote_session(session, remote)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._feed(make(future))
        if peer is not None and session in self.state.sessions:
            self._peers[session] = peer  # the client may have reconnected from a new socket
        return future

    def _register(self) -> None:
        async def open_session(req: OpenSessionRequest, payload: list[Any], peer: bytes | None,
                               remote: str | None) -> SessionOpened:
            if remote and req.principal == SYSTEM:
                raise PrincipalError("the system principal is tq's own writers in the broker's "
                                     "process; an RPC client cannot claim it")
            try:
                opened = await self._call(peer, req.session, lambda t: OpenSession(
                    t, req.session, req.lease, req.principal), remote)
            except BaseException:
                if req.session not in self.state.sessions:
                    self._downgraded.pop(req.session, None)
                raise
            if not remote:
                self._local.add(req.session)
            return opened

        async def heartbeat(req: HeartbeatRequest, payload: list[Any], peer: bytes | None,
                            remote: str | None) -> Done:
            return await self._call(peer, req.session, lambda t: Heartbeat(t, req.session), remote)

        async def close_session(req: CloseSessionRequest, payload: list[Any],
                                peer: bytes | None, remote: str | None) -> Done:
            return await self._call(peer, req.session,
                                    lambda t: CloseSession(t, req.session), remote)

        async def list_partitions(req: ListPartitions, payload: list[Any], peer: bytes | None,
                                  remote: str | None) -> PartitionList:
            pids = sorted(p for p in self.state.partitions if not req.topic or p[0] == req.topic)
            return PartitionList([self._sized_info(p) for p in pids])

        async def list_subscriptions(req: ListSubscriptions, payload: list[Any],
                                     peer: bytes | None, remote: str | None) -> SubscriptionList:
            found = []
            for pid, part in sorted(self.state.partitions.items()):
                if req.topic and pid[0] != req.topic:
                    continue
                for sub in part.subs.values():
                    session = self.state.sessions.get(sub.session)
                    principal = session.principal if session is not None else ""
                    if req.principal and principal != req.principal:
                        continue
                    found.append(SubscriptionInfo(pid[0], pid[1], principal, sub.next_offset,
                                                  part.visible_end, part.visible_frontier))
            return SubscriptionList(found)

        async def ensure(req: EnsurePartition, payload: list[Any], peer: bytes | None,
                         remote: str | None) -> PartitionInfo:
            if remote and req.create:
                await self._may_create(req.topic, req.partition)
            pid = await self._ensure(req.topic, req.partition, req.create,
                                     incarnation_of(req.topic_id, req.topic_created_ms))
            return self.state.partition_info(pid)

        async def drop(req: DropPartitionRequest, payload: list[Any], peer: bytes | None,
                       remote: str | None) -> Done:
            await self.drop_partition(req.topic, req.partition)
            return Done()

        async def delete_records(req: DeleteRecordsRequest, payload: list[Any],
                                 peer: bytes | None, remote: str | None) -> PartitionInfo:
            pid = validate_partition(req.topic, req.partition)
            visible = self.state.partition_info(pid).log_end  # UnknownPartitionError
            offset = visible if req.offset == -1 else req.offset
            if not 0 <= offset <= visible:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {req.topic}-{req.partition} before {offset}: "
                    f"it ends at {visible}")
            await self.delete_records(pid, offset)
            return self._sized_info(pid)

        async def open_producer(req: OpenProducerRequest, payload: list[Any],
                                peer: bytes | None, remote: str | None) -> ProducerOpened:
            pid = validate_partition(req.topic, req.partition)
            incarnation = incarnation_of(req.topic_id, req.topic_created_ms)
            if incarnation is not None and pid in self.state.partitions:
                # The partition open here may be an older topic of the name (DESIGN §4
                # "Topic incarnations"): set aside, the core opens it anew as this one.
                await self._settle_incarnation(pid, incarnation)
            return await self._call(peer, req.session, lambda t: OpenProducer(
                t, req.session, pid, req.cohort, req.writer, req.writers, req.rejoin,
                create=req.create, create_topic=req.create_topic, reopen=req.reopen,
                epoch=req.epoch,
                incarnation=incarnation, producer_id=req.producer_id,
                last_sequence=req.last_sequence, ending=req.ending), remote)

        def produce(req: ProduceRequest, payload: list[Any], peer: bytes | None,
                    remote: str | None) -> asyncio.Future[Produced]:
            # Not a coroutine: `_serve` awaits the core's answer directly (once per batch).
            if len(payload) == 1:
                batch = payload[0]
            elif len(payload) == 2:  # its header apart from its records (a stamped batch)
                batch = SplitBatch(payload[0], payload[1])
            else:
                raise BrokerProtocolError(f"a produce carries one record batch, in one payload "
                                          f"frame or two (header, records), not {len(payload)}")
            # `_call`, inlined: this runs once per batch.
            future: asyncio.Future[Produced] = asyncio.get_running_loop().create_future()
            session = req.session
            self._feed(Produce(future, session, (req.topic, req.partition), batch,
                               req.written))
            if peer is not None and session in self.state.sessions:
                self._peers[session] = peer
            return future

        def produce_batches(req: ProduceBatchesRequest, payload: list[Any], peer: bytes | None,
                            remote: str | None) -> asyncio.Future[ProducedBatches]:
            """Several batches of one partition: each fed as its own Produce, in order (the
            core judges each as if it came alone), their appends written as one commit, one
            reply once all are answered."""
            # Views of the frame (Produce's batch is any buffer, as a SplitBatch is).
            batches: list[Any] = _split_batches(payload, req.batches)
            loop = asyncio.get_running_loop()
            session, pid = req.session, (req.topic, req.partition)
            futures: list[asyncio.Future[Produced]] = []
            stimuli: list[Stimulus] = []
            for i, batch in enumerate(batches):
                future: asyncio.Future[Produced] = loop.create_future()
                futures.append(future)
                stimuli.append(Produce(future, session, pid, batch, follows=i > 0))
            answer: asyncio.Future[ProducedBatches] = loop.create_future()
            waiting = [len(futures)]

            def one_done(_: asyncio.Future[Produced]) -> None:
                waiting[0] -= 1
                if waiting[0] or answer.done():
                    return
                offsets: list[tuple[int, int]] = []
                errors: list[tuple[int, ErrorBody]] = []
                for i, f in enumerate(futures):
                    exc = f.exception()
                    if exc is None:
                        produced = f.result()
                        offsets.append((produced.base_offset, produced.next_offset))
                        continue
                    offsets.append((-1, -1))
                    errors.append((i, error_body(exc if isinstance(exc, TqError) else
                                                 InternalServerError(f"broker bug: {exc!r}"))))
                answer.set_result(ProducedBatches(offsets=offsets, errors=errors))

            for future in futures:
                future.add_done_callback(one_done)
            self._feed_held(stimuli)
            if peer is not None and session in self.state.sessions:
                self._peers[session] = peer
            return answer

        async def write_markers(req: WriteMarkersRequest, payload: list[Any],
                                peer: bytes | None, remote: str | None) -> MarkersWritten:
            """One transaction marker into several partitions, each as a produce of the
            session (its producer opened there first if it is not): answered once all are
            durable, naming the partitions that do not exist; any other refusal raised once
            the rest are written."""
            if len(payload) != 1:
                raise BrokerProtocolError(f"a marker request carries one marker batch, not "
                                          f"{len(payload)}")
            if len(req.partitions) > MAX_MARKER_PARTITIONS:
                raise BrokerProtocolError(f"a marker request names at most "
                                          f"{MAX_MARKER_PARTITIONS} partitions, not "
                                          f"{len(req.partitions)}")

            async def write(topic: str, partition: int) -> tuple[str, int] | None:
                session = self.state.sessions.get(req.session)
                try:
                    if session is None or (topic, partition) not in session.producing:
                        await open_producer(OpenProducerRequest(
                            session=req.session, topic=topic, partition=partition,
                            create=False), [], peer, remote)
                    await produce(ProduceRequest(session=req.session, topic=topic,
                                                 partition=partition), payload, peer, remote)
                except (UnknownPartitionError, UnknownTopicError):
                    return (topic, partition)
                return None

            results = await asyncio.gather(*(write(t, p) for t, p in req.partitions),
                                           return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            return MarkersWritten(gone=[r for r in results if isinstance(r, tuple)])

        # Not coroutines, as produce: `_serve_now` feeds them as they arrive.
        def advance(req: AdvanceRequest, payload: list[Any], peer: bytes | None,
                    remote: str | None) -> asyncio.Future[Done]:
            pid = (req.topic, req.partition)
            return self._call(peer, req.session,
                              lambda t: AdvanceFrontier(t, req.session, pid, req.frontier), remote)

        def end_stream(req: EndStreamRequest, payload: list[Any], peer: bytes | None,
                       remote: str | None) -> asyncio.Future[Done]:
            pid = (req.topic, req.partition)
            return self._call(peer, req.session, lambda t: EndStream(t, req.session, pid), remote)

        async def subscribe(req: SubscribeRequest, payload: list[Any], peer: bytes | None,
                            remote: str | None) -> Subscribed:
            if peer is None:
                raise BrokerProtocolError("subscriptions are served over RPC, not in-process")
            if remote and req.create:
                await self._may_create(req.topic, req.partition)
            pid = await self._ensure(req.topic, req.partition, req.create,
                                     incarnation_of(req.topic_id, req.topic_created_ms))
            return await self._call(peer, req.session, lambda t: Subscribe(
                t, req.session, req.sub_id, pid, req.start, req.credit), remote)

        async def unsubscribe(req: UnsubscribeRequest, payload: list[Any], peer: bytes | None,
                              remote: str | None) -> Done:
            return await self._call(peer, req.session,
                                    lambda t: Unsubscribe(t, req.session, req.sub_id), remote)

        self._handlers: dict[type, Callable[..., Any]] = {
            OpenSessionRequest: open_session, HeartbeatRequest: heartbeat,
            CloseSessionRequest: close_session, ListPartitions: list_partitions,
            ListSubscriptions: list_subscriptions,
            EnsurePartition: ensure, DropPartitionRequest: drop,
            DeleteRecordsRequest: delete_records,
            OpenProducerRequest: open_producer, ProduceRequest: produce,
            ProduceBatchesRequest: produce_batches,
            WriteMarkersRequest: write_markers,
            AdvanceRequest: advance, EndStreamRequest: end_stream,
            SubscribeRequest: subscribe, UnsubscribeRequest: unsubscribe,
        }

        async def over_rpc(req: Any, ctx: Context) -> Any:
            return await self._serve(req, ctx.payload, peer=ctx.peer, remote=True,
                                     principal=ctx.principal)

        for request_type in self._handlers:
            self._rpc.register(request_type, over_rpc)
        # A producer's pipelined requests, the one of every batch among them: the same door's
        # checks, fed as they arrive, without a task per request.
        for request_type in _IN_ARRIVAL_ORDER:
            self._rpc.register_direct(request_type, self._serve_now)

        self._rpc.register(ReplicaFetchRequest, self.replication.serve_fetch)
        self._rpc.register(EpochEndRequest, self.replication.serve_epoch_end)

        @self._rpc.route(CreditNotify)
        async def credit(msg: CreditNotify, ctx: Context) -> None:
            holder = self._holder(msg.session)
            if holder is not None:
                if holder != ctx.principal:
                    return  # not yours: nobody else may steer its deliveries
                self._peers[msg.session] = ctx.peer
            self._feed(GrantCredit(msg.session, msg.sub_id, msg.nbytes))
