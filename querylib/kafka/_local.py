"""LocalBackend: the Kafka endpoint's backend for one process hosting every partition of a data
directory, through `querylib.log` directly (development, tests, `tq kafka`).

    <data>/<topic>-<partition>/          partition logs, as the tq broker lays them out
    <data>/__consumer_offsets-0/         committed offsets and group states, Kafka's formats
    <data>/.tq-kafka.json                cluster id and the next unreserved producer id

Appends (producer batches, offset commits) run on one writer thread, so fsyncs never stall the
event loop and each partition sees one append at a time (the idempotence checks rely on it).
Reads, offsets and waits run on the event loop; `PartitionLog` allows reads during appends.
Committed offsets and group states are replayed from `__consumer_offsets` when the backend
opens, and fsynced before a commit is acknowledged.

Must not: decode or re-encode producer batches (they are stored as sent), or hold state that
the logs cannot rebuild except idempotent-producer sequences (lost on restart, as Kafka loses
them with its producer snapshots; a producer then continues as if new).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from catalog import TopicName
from catalog.errors import (
    InvalidPartitionsError,
    ReservedTopicNameError,
    StorageError,
    TopicExistsError,
    TqError,
    UnknownTopicError,
)
from querylib.errors import OffsetOutOfRangeError
from querylib.kafka._backend import (
    AppendResult,
    BrokerInfo,
    CommittedOffset,
    GroupRecord,
    PartitionInfo,
    PartitionOffsets,
    PartitionRead,
    TopicInfo,
)
from querylib.kafka._errors import InvalidTopicError, PolicyViolationError, UnknownPartitionError
from querylib.kafka._group_store import GroupStore
from querylib.kafka._offsets_format import encode_group, encode_offset
from querylib.kafka._producers import ProducerStateTable
from querylib.log import FlushPolicy, LogConfig, PartitionLog, record_at_timestamp
from querylib.records import encode_batch, read_header, verify_batch

__all__ = ["LocalBackend"]

logger = logging.getLogger("querylib.kafka")

OFFSETS_TOPIC = "__consumer_offsets"
META_FILE = ".tq-kafka.json"
PRODUCER_ID_BLOCK = 1000  # ids reserved on disk at a time, as Kafka's controller hands out
MAX_PARTITIONS = 10_000  # per topic
MAX_TOPICS = 10_000  # auto-creation lets any client create topics: bound how many


@dataclass
class _Partition:
    log: PartitionLog
    producers: ProducerStateTable = field(default_factory=ProducerStateTable)
    waiters: set[asyncio.Future[None]] = field(default_factory=set)


class LocalBackend:
    """Every partition under `data_dir`, served by this process (node `broker.node_id`).

    Open with `await LocalBackend.open(data_dir, ...)`; close with `await backend.close()`.
    """

    def __init__(self, data_dir: str, log_config: LogConfig, broker: BrokerInfo,
                 auto_create_topics: bool, default_partitions: int) -> None:
        self.data_dir = data_dir
        self.log_config = log_config
        self._broker = broker
        self._auto_create = auto_create_topics
        self.default_partitions = default_partitions
        self._topics: dict[str, list[_Partition]] = {}  # by TopicName.short
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tq-kafka-writer")
        self._store = GroupStore()
        self._cluster_id = ""
        self._next_producer_id = 0
        self._reserved_producer_ids = 0
        self._flush_timer: asyncio.TimerHandle | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        log_config: LogConfig | None = None,
        broker: BrokerInfo | None = None,
        auto_create_topics: bool = True,
        default_partitions: int = 1,
    ) -> LocalBackend:
        """Open (recovering) every partition of `data_dir` and replay `__consumer_offsets`."""
        backend = cls(os.fspath(data_dir), log_config or LogConfig(),
                      broker or BrokerInfo(0, "127.0.0.1", 9092), auto_create_topics,
                      default_partitions)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(backend._writer, backend._load)
        except BaseException:
            await backend.close()
            raise
        return backend

    # ---- cluster ------------------------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def controller_id(self) -> int:
        return self._broker.node_id

    @property
    def auto_create_topics(self) -> bool:
        return self._auto_create

    def brokers(self) -> Sequence[BrokerInfo]:
        return (self._broker,)

    def advertise(self, broker: BrokerInfo) -> None:
        """Set the address clients are told to connect to (once the listener has bound)."""
        self._broker = broker

    async def coordinator(self, group_id: str) -> BrokerInfo:
        return self._broker

    async def coordinates(self, group_id: str) -> bool:
        return True

    # ---- topics -------------------------------------------------------------------------------

    async def topics(self, names: Sequence[str] | None = None) -> list[TopicInfo]:
        node = self._broker.node_id
        if names is None:
            names = sorted(self._topics)
        found = []
        for name in names:
            parts = self._topics.get(TopicName.parse(name).short)
            if parts is not None:
                found.append(TopicInfo(
                    name, tuple(PartitionInfo(i, node) for i in range(len(parts))),
                    internal=TopicName.parse(name).internal))
        return found

    async def create_topic(self, name: str, partitions: int | None = None) -> TopicInfo:
        topic = TopicName.parse(name)
        if topic.internal:
            raise ReservedTopicNameError(f"topic {name!r}: names starting with '__' are "
                                         "reserved for tq's own topics")
        count = self.default_partitions if partitions is None else partitions
        if not 1 <= count <= MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"topic {name!r}: {count} partitions, expected 1..{MAX_PARTITIONS}")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._create, topic, count)
        return (await self.topics([name]))[0]

    def _create(self, topic: TopicName, count: int) -> None:
        if topic.short in self._topics:
            raise TopicExistsError(f"topic {topic.short!r} exists already")
        if len(self._topics) >= MAX_TOPICS:
            raise PolicyViolationError(f"this endpoint holds {MAX_TOPICS} topics already")
        parts = []
        try:
            for index in range(count):
                path = os.path.join(self.data_dir, topic.partition_dir(index))
                parts.append(_Partition(PartitionLog.open(path, self.log_config)))
        except BaseException:
            for part in parts:
                part.log.close()
            raise
        self._topics[topic.short] = parts
        logger.info("created topic %s with %d partition(s)", topic.short, count)

    def _partition(self, topic: str, partition: int) -> _Partition:
        parts = self._topics.get(TopicName.parse(topic).short)
        if parts is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        if not 0 <= partition < len(parts):
            raise UnknownPartitionError(f"topic {topic!r} has no partition {partition}")
        return parts[partition]

    def log(self, topic: str, partition: int) -> PartitionLog:
        """The partition's log, for in-process readers (tests, tools). Do not append to it
        directly: appends go through `append`, which tells waiting fetches."""
        return self._partition(topic, partition).log

    # ---- data ---------------------------------------------------------------------------------

    async def append(
        self, topic: str, partition: int, batches: Sequence[bytes], *, acks: int
    ) -> AppendResult:
        part = self._partition(topic, partition)
        if TopicName.parse(topic).internal:
            raise InvalidTopicError(f"topic {topic!r} is internal: clients may not write to it")
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._writer, self._append, part, batches, acks)
        self._wake(part)
        self._schedule_flush(part)
        return result

    def _append(self, part: _Partition, batches: Sequence[bytes], acks: int) -> AppendResult:
        log = part.log
        first: int | None = None
        for batch in batches:
            header = read_header(batch)
            original = part.producers.check(header)
            if original is not None:
                verify_batch(batch)  # acknowledge a retry only if it is intact
                base = original
            else:
                base = log.append(batch)
                part.producers.record(header, base)
            first = base if first is None else first
        if acks == -1 and log.config.flush is FlushPolicy.INTERVAL:
            log.flush()  # acks=all: acknowledged means durable under the policy
        return AppendResult(first if first is not None else log.log_end_offset,
                            log.log_start_offset)

    async def read(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> PartitionRead:
        log = self._partition(topic, partition).log
        offsets = _offsets_of(log)
        if not offsets.log_start_offset <= offset <= offsets.high_watermark:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}-{partition} is outside "
                f"{offsets.log_start_offset}..{offsets.high_watermark}")
        read = PartitionRead(offsets)
        if offset < offsets.high_watermark:
            chunk = log.read_slice(offset, max_bytes, end_offset=offsets.high_watermark)
            if chunk.length:
                read.chunks.append(chunk)
            else:
                chunk.close()
        return read

    async def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        return _offsets_of(self._partition(topic, partition).log)

    async def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        log = self._partition(topic, partition).log
        return record_at_timestamp(log, timestamp_ms, log.durable_end_offset)

    async def wait_for_data(
        self, positions: Sequence[tuple[str, int, int]], timeout: float
    ) -> None:
        waiting = []
        for topic, partition, offset in positions:
            try:
                part = self._partition(topic, partition)
            except TqError:
                continue
            if part.log.durable_end_offset > offset:
                return
            waiting.append(part)
        if not waiting or timeout <= 0:
            if timeout > 0:
                await asyncio.sleep(timeout)  # nothing to watch: the fetch just waits
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for part in waiting:
            part.waiters.add(future)
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            for part in waiting:
                part.waiters.discard(future)

    def _wake(self, part: _Partition) -> None:
        for future in part.waiters:
            if not future.done():
                future.set_result(None)
        part.waiters.clear()

    def _schedule_flush(self, part: _Partition) -> None:
        """Under the interval policy, appended data becomes readable once flushed: flush when
        due even if no further append comes."""
        due = part.log.flush_due_in()
        if due is None or self._flush_timer is not None or self._closed:
            return
        loop = asyncio.get_running_loop()
        self._flush_timer = loop.call_later(due, lambda: loop.create_task(self._flush_due()))

    async def _flush_due(self) -> None:
        self._flush_timer = None
        parts = [p for parts in self._topics.values() for p in parts]
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, lambda: [p.log.flush_if_due() for p in parts])
        for part in parts:
            self._wake(part)
            self._schedule_flush(part)

    async def allocate_producer_id(self) -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self._allocate_producer_id)

    def _allocate_producer_id(self) -> int:
        if self._next_producer_id >= self._reserved_producer_ids:
            self._reserved_producer_ids = self._next_producer_id + PRODUCER_ID_BLOCK
            self._write_meta()
        pid = self._next_producer_id
        self._next_producer_id += 1
        return pid

    # ---- groups -------------------------------------------------------------------------------

    async def store_offsets(self, group_id: str, offsets: Sequence[CommittedOffset]) -> None:
        if not offsets:
            return
        entries = [(c.commit_timestamp, *encode_offset(group_id, c), ()) for c in offsets]
        await self._append_offsets(entries)
        self._store.committed(group_id, list(offsets))

    async def committed_offsets(
        self, group_id: str
    ) -> Mapping[tuple[str, int], CommittedOffset]:
        return dict(self._store.offsets.get(group_id, {}))

    async def store_group(self, record: GroupRecord) -> None:
        await self._append_offsets([(record.current_state_timestamp, *encode_group(record), ())])
        self._store.groups[record.group_id] = record

    async def stored_groups(self) -> Sequence[GroupRecord]:
        return list(self._store.groups.values())

    async def _append_offsets(self, entries: list) -> None:
        log = self._topics[OFFSETS_TOPIC][0].log
        batch = encode_batch(entries)

        def write() -> None:
            log.append(batch)
            log.flush()  # a commit is acknowledged only once on disk

        await asyncio.get_running_loop().run_in_executor(self._writer, write)
        self._wake(self._topics[OFFSETS_TOPIC][0])

    # ---- opening and closing ------------------------------------------------------------------

    def _load(self) -> None:
        """On the writer thread: metadata file, partitions, offsets replay."""
        os.makedirs(self.data_dir, exist_ok=True)
        self._read_meta()
        found: dict[str, dict[int, str]] = {}
        for entry in sorted(os.scandir(self.data_dir), key=lambda e: e.name):
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            try:
                topic, index = TopicName.parse_partition_dir(entry.name)
            except TqError:
                logger.warning("%s: ignoring %s, not a partition directory",
                               self.data_dir, entry.name)
                continue
            found.setdefault(topic.short, {})[index] = entry.path
        for name, paths in found.items():
            count = max(paths) + 1
            if sorted(paths) != list(range(count)):
                logger.warning("%s: topic %s lacks partitions %s; creating them empty",
                               self.data_dir, name, sorted(set(range(count)) - set(paths)))
            topic = TopicName.parse(name)
            self._topics[name] = [
                _Partition(PartitionLog.open(os.path.join(self.data_dir, topic.partition_dir(i)),
                                             self.log_config))
                for i in range(count)]
        if OFFSETS_TOPIC not in self._topics:
            path = os.path.join(self.data_dir, f"{OFFSETS_TOPIC}-0")
            self._topics[OFFSETS_TOPIC] = [_Partition(PartitionLog.open(path, self.log_config))]
        self._store.replay(self._topics[OFFSETS_TOPIC][0].log)

    def _read_meta(self) -> None:
        path = os.path.join(self.data_dir, META_FILE)
        try:
            with open(path) as f:
                meta = json.load(f)
            self._cluster_id = str(meta["cluster_id"])
            self._next_producer_id = self._reserved_producer_ids = int(meta["next_producer_id"])
        except FileNotFoundError:
            self._cluster_id = uuid.uuid4().hex[:22]
            self._write_meta()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{path}: unreadable ({exc}); it holds the cluster id and the "
                               "next producer id") from exc

    def _write_meta(self) -> None:
        """Durably record the cluster id and the first producer id not yet reserved, so ids
        are never handed out twice across restarts."""
        path = os.path.join(self.data_dir, META_FILE)
        tmp = path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"cluster_id": self._cluster_id,
                           "next_producer_id": self._reserved_producer_ids}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise StorageError(f"{path}: cannot write: {exc}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        parts = [p for parts in self._topics.values() for p in parts]

        def close_all() -> None:
            for part in parts:
                part.log.close()

        await asyncio.get_running_loop().run_in_executor(self._writer, close_all)
        for part in parts:
            self._wake(part)
        self._writer.shutdown(wait=True)


def _offsets_of(log: PartitionLog) -> PartitionOffsets:
    high_watermark = log.durable_end_offset
    return PartitionOffsets(log.log_start_offset, high_watermark, high_watermark)
