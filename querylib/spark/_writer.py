"""Writing DataFrames into a tq topic: `df.write` and `df.writeStream` with format "tq".

Columns, as Spark's Kafka sink takes them: `value` (binary or string, required), `key`
(binary or string), `headers` (array<struct<key: string, value: binary>>), `partition` (int),
plus tq's `timestamp` (the record timestamp; now when absent or null) and `tq_time` (long,
written as the `tq.time` header, replacing any such header in `headers`). Other columns are
ignored, so a DataFrame read from tq can be written back as it is. A record goes to its
`partition` column when given, else to murmur2(key) % partitions as Kafka's default
partitioner puts it, else (null key) to one partition per input batch, rotating.

Where it writes: by default into a cluster: the driver asks the coordinator where the topic's
partitions are, and each task publishes its batches through a `Producer` to the broker hosting
each partition (closing without ending the stream). With option path (a data dir) each task
appends to the partition logs directly (`querylib.log.PartitionLog`) instead; that requires
that nothing else writes the data dir: no broker may host it (its log lock refuses us).
Tasks of one host take turns through a lock file in the data dir. A topic that does not
exist is created by the driver first, as Kafka creates one on first produce: an ingest topic
in the cluster, partition logs in a data dir; option partitions (default 1) sizes it.

Delivery: at-least-once. A task appends as it goes (each input Arrow batch, at the latest);
when it fails after appending and Spark runs it again, or a streaming query restarts a
micro-batch that a failure interrupted, the records appended by the failed attempt stay and the
retry appends them again. Nothing a task reported as written is lost: a task returns only after
the log (or the broker) acknowledged every batch. Consumers that need exactly-once deduplicate.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from catalog import TopicName
from catalog.errors import StorageError, UnknownTopicError
from querylib.broker import Producer
from querylib.log import LogConfig, PartitionLog
from querylib.records import MAX_BATCH_SIZE, TIME_HEADER, encode_batch
from querylib.spark._cluster import ClusterTopics, PartitionPlace, open_producer
from querylib.spark._errors import BadOptionError, BadSchemaError
from querylib.spark._local import LocalDir
from querylib.spark._options import WriteOptions

__all__ = ["TqBatchWriter", "TqCommitMessage", "TqStreamWriter", "kafka_partition", "murmur2"]

LOCK_FILE = ".tq-spark-writer.lock"
_BATCH_RECORDS = 4096  # records per encoded batch
_BATCH_BYTES = 1024 * 1024  # and at most about this many bytes (Kafka's default batch limit)
_FLUSH_BYTES = 8 * 1024 * 1024  # appended to the logs in groups of this much
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Utils.murmur2), as a signed 32-bit int."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & _MASK32
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & _MASK32
        k ^= k >> 24
        k = (k * m) & _MASK32
        h = ((h * m) & _MASK32) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass
class TqCommitMessage(WriterCommitMessage):
    """What one task appended: records per partition."""

    topic: str
    appended: dict[int, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(self.appended.values())


_HEADERS = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))
_ALLOWED = {
    "key": (BinaryType(), StringType()),
    "value": (BinaryType(), StringType()),
    "headers": (_HEADERS, ArrayType(_HEADERS.elementType, False)),
    "partition": (IntegerType(), LongType()),
    "timestamp": (TimestampType(),),
    "tq_time": (LongType(), IntegerType()),
}


def check_write_schema(schema: StructType) -> None:
    """BadSchemaError unless the DataFrame has a usable value column and typed extras."""
    names = schema.fieldNames()
    if "value" not in names:
        raise BadSchemaError(f"writing to tq needs a value column (binary or string); the "
                             f"DataFrame has {', '.join(names) or 'no columns'}")
    for f in schema.fields:
        allowed = _ALLOWED.get(f.name)
        if allowed is None:
            continue
        if not any(_same_type(f.dataType, t) for t in allowed):
            wanted = " or ".join(t.simpleString() for t in allowed)
            raise BadSchemaError(f"column {f.name} is {f.dataType.simpleString()}; tq writes "
                                 f"it as {wanted}: cast it first")


def _same_type(a: object, b: object) -> bool:
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        ea, eb = a.elementType, b.elementType
        return isinstance(ea, StructType) and isinstance(eb, StructType) and [
            (f.name, f.dataType) for f in ea.fields] == [(f.name, f.dataType) for f in eb.fields]
    return a == b


class _TopicWriter:
    """One task's rows, partitioned and encoded into batches; `_append` takes them away."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.pending: dict[int, list[bytes]] = {}
        self.pending_bytes = 0
        self.message = TqCommitMessage(topic)
        self._rotation = int.from_bytes(os.urandom(2), "big")

    def write_batch(self, batch: pa.RecordBatch) -> None:
        columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        values = _bytes_list(columns["value"])
        keys = _bytes_list(columns["key"]) if "key" in columns else [None] * len(values)
        parts = columns["partition"].to_pylist() if "partition" in columns else None
        stamps = _millis(columns["timestamp"]) if "timestamp" in columns else None
        times = columns["tq_time"].to_pylist() if "tq_time" in columns else None
        headers = columns["headers"].to_pylist() if "headers" in columns else None
        now = int(time.time() * 1000)
        self._rotation += 1
        sticky = self._rotation % self.partitions
        by_partition: dict[int, list[tuple]] = {}
        for i, value in enumerate(values):
            key = keys[i]
            part = parts[i] if parts is not None else None
            if part is None:
                part = sticky if key is None else kafka_partition(key, self.partitions)
            elif not 0 <= part < self.partitions:
                raise BadSchemaError(f"row partition {part} is outside 0..{self.partitions - 1} "
                                     f"of topic {self.topic!r}")
            record_headers = _record_headers(headers[i] if headers is not None else None,
                                             times[i] if times is not None else None)
            stamp = stamps[i] if stamps is not None and stamps[i] is not None else now
            by_partition.setdefault(part, []).append((stamp, key, value, record_headers))
        for part, entries in by_partition.items():
            for chunk in _chunks(entries):
                encoded = encode_batch(chunk)
                self.pending.setdefault(part, []).append(encoded)
                self.pending_bytes += len(encoded)
                if self.pending_bytes >= _FLUSH_BYTES:
                    self.flush()
        # Each input batch (spark.sql.execution.arrow.maxRecordsPerBatch rows) is handed on
        # before the next is taken: memory stays bounded and progress is visible.
        self.flush()

    def flush(self) -> None:
        if self.pending:
            self._append(self.pending)
            for part, batches in self.pending.items():
                self.message.appended[part] = (self.message.appended.get(part, 0)
                                               + _records_in(batches))
            self.pending = {}
            self.pending_bytes = 0

    def _append(self, pending: dict[int, list[bytes]]) -> None:
        raise NotImplementedError

    def finish(self) -> TqCommitMessage:
        self.flush()
        return self.message


class _LocalTopicWriter(_TopicWriter):
    """Appends to the partition logs of a data dir, taking turns with the other tasks."""

    def __init__(self, data_dir: str, topic: str) -> None:
        self.local = LocalDir(data_dir)
        super().__init__(topic, self.local.partitions(topic))

    def _append(self, pending: dict[int, list[bytes]]) -> None:
        with _writer_lock(self.local.data_dir):
            for part, batches in sorted(pending.items()):
                path = os.path.join(self.local.data_dir,
                                    TopicName.parse(self.topic, fixed=True)
                                    .partition_dir(part))
                try:
                    log = PartitionLog.open(path, LogConfig())
                except StorageError as exc:
                    raise StorageError(
                        f"{exc}; writing with option path needs a data dir no broker hosts: "
                        "stop the broker or write through the cluster") from exc
                try:
                    log.append_batches(batches)
                finally:
                    log.close()


class _ClusterTopicWriter(_TopicWriter):
    """Publishes through the brokers hosting the partitions, one producer per partition."""

    def __init__(self, topic: str, places: list[PartitionPlace]) -> None:
        super().__init__(topic, len(places))
        self.places = places
        self.producers: dict[int, Producer] = {}

    def _append(self, pending: dict[int, list[bytes]]) -> None:
        for part, batches in sorted(pending.items()):
            producer = self.producers.get(part)
            if producer is None:
                producer = self.producers[part] = open_producer(self.places[part], self.topic,
                                                                part)
            for batch in batches:
                producer.send_batch(batch)

    def finish(self) -> TqCommitMessage:
        """Flush, wait for every acknowledgement, and close the producers without ending
        their streams (another task, or a later job, may write on)."""
        try:
            self.flush()
            for producer in self.producers.values():
                producer.flush()
        finally:
            for producer in self.producers.values():
                producer.close(end=False)
        return self.message


class _writer_lock:
    """A blocking flock on the data dir's writer lock file: Spark tasks take turns."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_FILE)
        self.fd = -1

    def __enter__(self) -> None:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            if self.fd >= 0:
                os.close(self.fd)
            raise StorageError(f"{self.path}: cannot take the writer lock: {exc}") from exc

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the flock


def _records_in(batches: list[bytes]) -> int:
    # recordsCount is the header's last int32 (offset 57)
    return sum(int.from_bytes(b[57:61], "big") for b in batches)


def _bytes_list(column: pa.Array) -> list[bytes | None]:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def _millis(column: pa.Array) -> list[int | None]:
    return column.cast(pa.int64()).to_pylist() if column.type.unit == "ms" else (
        column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
        .to_pylist())


def _record_headers(headers: list[dict] | None, tq_time: int | None) -> tuple:
    items = [(h["key"], h["value"]) for h in headers or ()]
    if tq_time is not None:
        items = [(TIME_HEADER, tq_time.to_bytes(8, "big", signed=True))] + [
            (k, v) for k, v in items if k != TIME_HEADER]
    for k, _v in items:
        if k is None:
            raise BadSchemaError("a header key is null; header keys are strings")
    return tuple(items)


def _chunks(entries: list[tuple]) -> Iterator[list[tuple]]:
    """Entries in groups of at most _BATCH_RECORDS and about _BATCH_BYTES."""
    chunk: list[tuple] = []
    size = 0
    for entry in entries:
        _ts, key, value, headers = entry
        n = len(key or b"") + len(value or b"") + sum(
            len(k) + len(v or b"") for k, v in headers) + 16
        if n > MAX_BATCH_SIZE // 2:
            raise BadSchemaError(f"a record of {n} bytes is larger than tq accepts")
        if chunk and (len(chunk) >= _BATCH_RECORDS or size + n > _BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += n
    if chunk:
        yield chunk


def _target(options: WriteOptions) -> list[PartitionPlace] | None:
    """On the driver: make sure the topic exists, creating a missing one of
    `options.partitions` partitions (as Kafka creates a topic on first produce); for a
    cluster, where its partitions are."""
    if options.location.data_dir:
        _ensure_local_topic(options.location.data_dir, options.topic, options.partitions)
        return None
    topics = ClusterTopics(options.location)
    try:
        count = topics.ensure_topic(options.topic, options.partitions)
        return [topics.place(options.topic, p) for p in range(count)]
    finally:
        topics.close()


def _ensure_local_topic(data_dir: str, topic: str, partitions: int) -> None:
    """Create the partition logs of `topic` in `data_dir` unless it has some."""
    local = LocalDir(data_dir)
    with _writer_lock(local.data_dir):
        try:
            local.partitions(topic)
        except UnknownTopicError:
            for part in range(partitions):
                path = os.path.join(local.data_dir,
                                    TopicName.parse(topic, fixed=True).partition_dir(part))
                PartitionLog.open(path, LogConfig()).close()


def _write_all(options: WriteOptions, places: list[PartitionPlace] | None,
               iterator: Iterator[pa.RecordBatch]) -> TqCommitMessage:
    if places is None:
        assert options.location.data_dir is not None
        writer: _TopicWriter = _LocalTopicWriter(options.location.data_dir, options.topic)
    else:
        writer = _ClusterTopicWriter(options.topic, places)
    try:
        for batch in iterator:
            if batch.num_rows:
                writer.write_batch(batch)
    except BaseException:
        if isinstance(writer, _ClusterTopicWriter):
            for producer in writer.producers.values():
                producer.close(end=False)
        raise
    return writer.finish()


class TqBatchWriter(DataSourceArrowWriter):
    """df.write.format("tq"): each task appends its rows; at-least-once on task retries."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise BadOptionError("tq topics are append-only: use .mode(\"append\")")
        check_write_schema(schema)
        self.options = options
        self.places = _target(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TqCommitMessage:
        return _write_all(self.options, self.places, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing left to do: the records were appended by the tasks."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing can be undone: what failed tasks appended stays (at-least-once)."""


class TqStreamWriter(DataSourceStreamArrowWriter):
    """df.writeStream.format("tq"): each micro-batch appended as it is written."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        check_write_schema(schema)
        self.options = options
        self.places = _target(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TqCommitMessage:
        return _write_all(self.options, self.places, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing left to do: the records were appended by the tasks."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be undone: a restarted micro-batch appends again (at-least-once)."""
