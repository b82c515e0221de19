"""Partition log storage: one Kafka log per topic partition, in Kafka's on-disk format.

A partition lives in `<data>/<topic>-<partition>/` as segments named by their 20-digit base
offset: `.log` (RecordBatch v2, magic 2, CRC-32C), `.index` (relative offset int32, position
int32, one entry per `index_interval_bytes` appended) and `.timeindex` (timestamp int64,
relative offset int32), all big-endian: Kafka's formats, so Kafka's tools can read them.
Next to them: `recovery-point-offset-checkpoint` (Kafka's checkpoint format, one entry),
`clean-shutdown` while closed cleanly (holding the log end offset), `.lock` (flock held while
open), and for a damaged segment `<base>.damage` and `<base>.log.corrupt-<position>` files.

    log = PartitionLog.open(path, LogConfig(flush="always"))   # recovers if needed
    offset = log.append(batch_bytes)          # validated, base offset stamped, returned
    offsets = log.append_batches([b1, b2])    # one write, at most one fsync
    data = log.read(offset, max_bytes, end_offset=None)   # whole batches, >= 1, one segment
    with log.read_slice(offset, max_bytes) as s:          # FileSlice(fd, path, position, length)
        os.sendfile(sock_fd, s.fd, s.position, s.length)
    log.log_start_offset, log.log_end_offset   # first offset kept, next offset to assign
    log.durable_end_offset                     # acknowledge up to here (flush policy met)
    log.flushed_end_offset                     # fsynced up to here
    log.offset_for_timestamp(ts_ms)           # first offset with timestamp >= ts_ms, or None
    log.flush(); log.flush_if_due(now); log.flush_due_in(now)
    log.apply_retention(now_ms=None) -> int   # segments removed
    log.truncate_to(offset) -> int            # new log end offset
    log.append_batches(batches, leader_epoch=E)  # a replicated partition's leader stamps E
    log.append_replica(data) -> int           # a follower: the leader's stored bytes, unchanged
    log.segments -> list[SegmentInfo]; log.size_in_bytes
    log.close()                               # seals, leaves the clean-shutdown marker

    LogConfig(segment_bytes=1 GiB, index_interval_bytes=4096, retention_bytes=-1,
              retention_ms=-1, flush="never" | "interval" | "always", flush_interval_ms=1000)
    parse_partition_dir("orders-3") == ("orders", 3); partition_dir_name("orders", 3)
    dump_segment(path, records=False) -> Iterator[dict]   # what `tq log dump` prints
    stored_batch(batch, base_offset) -> bytes  # the bytes the log stores and serves for it
    appended_batch(batch, base_offset) -> bytes  # the same for a batch appended (not checked again)
    data_records(log, start, end) -> Iterator[Record]  # replay: data records, controls skipped
    record_at_timestamp(log, ts, end) -> (offset, timestamp) | None  # ListOffsets by time

Appends: each batch is checked (header bounds, magic 2, CRC-32C, records with deltas 0..n-1)
before anything is written; a bad one raises a RecordError and leaves the log untouched. The
log stamps the base offset and leader epoch (0, or a replicated partition's leader's; Kafka's
broker overwrites the epoch too) in the 16 bytes before the CRC'd part, and writes the rest as
given. A follower's `append_replica` keeps the leader's offsets and epochs: each batch checked
the same way and starting where the log ends (no gap, no overlap).

Durability: `flush` "always" fsyncs before append returns (`append_batches(sync=False)`: with
the next synced append, or flush_interval_ms later through `flush_if_due`), "interval" at most
flush_interval_ms after (on the next append, or when the owner calls `flush_if_due`), "never"
leaves it to the OS. `writes_kept` says whether every write before the last close survived (a
clean close, or an unclean one on the same boot: only the process died). Rolled segments are
always fsynced. `durable_end_offset` is what the policy guarantees (acknowledge up to it);
`flushed_end_offset` is what was fsynced.

Recovery: see `_recovery`. After an unclean shutdown the segments from the recovery point on
(and any whose files changed or whose indexes are missing) are validated batch by batch, the
last segment's torn tail truncated and indexes rebuilt; what is cut is logged on
`querylib.log`. Bytes that fail their checks anywhere else are never cut: they become a
damaged range (`_damage`, remembered in `<base>.damage`), reads of which raise
CorruptDataError while every batch around it stays readable.

    log.read(offset_in_damaged_range, n)      # CorruptDataError(start_offset, end_offset, ...)
    check_partition(path) -> [Finding]        # what `tq log check` reports; writes nothing
    repair_partition(path) -> [Finding]       # `tq log repair`: quarantine, leave a gap
    segment_damage(log_path) -> (Damage, ...) # for readers of the files (Spark's)

Reading files of a log this process does not own (Spark's local reads, `tq log dump`): the
read-only segment reader of `_reader`, which neither locks nor recovers anything:
    list_segments(partition_path) -> [SegmentFile]   # .base, .path, .damage(), .index_hint(o)
    batch_span(buf, pos) -> Span | None; batch_size(buf, pos) -> int | None; pread_exact(...)
    walk_to_end(fd, position, size); segment_batches(fd, size); transactions(segments)

Thread-safety: one writer (writer methods are serialized by a lock); `read`, `read_slice`,
`offset_for_timestamp` and the offset properties may run on other threads during appends,
rolls, flushes and retention. `truncate_to` must not race readers. Details in `_log`.

Errors: RecordError subclasses for bad batches; OffsetOutOfRangeError, LogClosedError,
LogLockedError (open elsewhere), CorruptDataError / QuarantinedDataError (damaged offsets)
and StorageError (I/O failure) from querylib.errors.
"""

from querylib.log._batch import Span, appended_batch, pread_exact, stored_batch
from querylib.log._check import Finding, check_partition, find_partition_dirs, repair_partition
from querylib.log._config import (
    FlushPolicy,
    LogConfig,
    parse_partition_dir,
    parse_segment_name,
    partition_dir_name,
    segment_name,
)
from querylib.log._damage import Damage, segment_damage
from querylib.log._dump import dump_segment
from querylib.log._epochs import LeaderEpochCache
from querylib.log._log import FileSlice, PartitionLog, SegmentInfo, corrupt_data_error
from querylib.log._reader import (
    SegmentBatch,
    SegmentFile,
    Unreadable,
    batch_size,
    batch_span,
    list_segments,
    segment_batches,
    transactional_batches,
    transactions,
    walk_to_end,
)
from querylib.log._scan import data_records, record_at_timestamp

__all__ = [
    "LeaderEpochCache",
    "SegmentBatch",
    "SegmentFile",
    "Span",
    "Unreadable",
    "batch_size",
    "batch_span",
    "list_segments",
    "pread_exact",
    "segment_batches",
    "transactional_batches",
    "transactions",
    "walk_to_end",
    "Damage",
    "FileSlice",
    "Finding",
    "FlushPolicy",
    "LogConfig",
    "PartitionLog",
    "SegmentInfo",
    "check_partition",
    "corrupt_data_error",
    "data_records",
    "dump_segment",
    "find_partition_dirs",
    "parse_partition_dir",
    "parse_segment_name",
    "partition_dir_name",
    "record_at_timestamp",
    "repair_partition",
    "segment_damage",
    "segment_name",
    "appended_batch",
    "stored_batch",
]
