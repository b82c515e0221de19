"""PartitionLog: one partition's Kafka log on disk, with one writer and any number of readers.

The writer appends validated record batches (stamping base offsets outside the CRC), rolls
segments by size, flushes by policy, applies retention and truncates. Readers on other threads
read whole batches by offset, as bytes or as file slices for sendfile. This module decides
nothing about recovery (see _recovery) and never decodes records except to refine a timestamp
lookup to one record.

Thread-safety: writer operations (append*, flush*, apply_retention, truncate_to, close) are
serialized by a lock; the broker calls them from its own thread. read, read_slice,
offset_for_timestamp and the offset properties are safe from any thread while the writer
appends, rolls, flushes or removes segments by retention:

- a reader samples the log end offset, then the segment list (an immutable tuple replaced
  whole), then the segment's size; the writer publishes in the opposite order (bytes written,
  indexed, size, then log end), so a reader never sees half a batch;
- a reader duplicates the segment's file descriptor under a short lock and reads from its
  copy, so retention or close can close and unlink files while reads are in flight; a read
  of a segment that retention removed raises OffsetOutOfRangeError;
- truncate_to is not safe with concurrent readers of the truncated offsets (tests, recovery).
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import time
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any, NamedTuple

from catalog import TopicName
from catalog.errors import InvalidTopicNameError, StorageError
from querylib.errors import (
    CorruptDataError,
    CorruptRecordError,
    LogClosedError,
    LogLockedError,
    OffsetOutOfRangeError,
    QuarantinedDataError,
    RecordError,
    TruncatedRecordError,
)
from querylib.log._batch import (
    LEADER_EPOCH,
    PREFIX_SIZE,
    Span,
    check_batch,
    describe,
    pread_exact,
    stamp_prefix,
)
from querylib.log._config import (
    CLEAN_SHUTDOWN_FILE,
    EPOCH_CHECKPOINT_FILE,
    INT32_MAX,
    LOCK_FILE,
    LOG_START_FILE,
    LOG_SUFFIX,
    FlushPolicy,
    LogConfig,
)
from querylib.log._damage import Damage
from querylib.log._epochs import (
    LeaderEpochCache,
    read_epoch_checkpoint,
    scan_epochs,
    write_epoch_checkpoint,
)
from querylib.log._recovery import (
    fsync_dir,
    load_segments,
    read_checkpoint,
    write_checkpoint,
    write_clean_marker,
    writes_kept,
)
from querylib.log._segment import LogSegment, PendingBatch
from querylib.records import BatchHeader, SplitBatch, decode_batch

logger = logging.getLogger("querylib.log")

Buffer = bytes | bytearray | memoryview | SplitBatch  # a SplitBatch: header and records apart
Bytes = bytes | bytearray | memoryview


class SegmentInfo(NamedTuple):
    """A segment as seen from outside: for tests, tools and metrics."""

    base_offset: int
    next_offset: int
    size: int
    largest_timestamp: int  # -1 when no batch carries a timestamp
    path: str
    damage: tuple[Damage, ...] = ()  # its damaged ranges (querylib.log._damage)


class FileSlice:
    """A run of whole batches inside one segment file, for sendfile.

    Owns a duplicate of the segment's descriptor, so the slice stays readable even if
    retention removes the segment meanwhile; close it (or use `with`). An empty slice has
    fd -1 and length 0.
    """

    __slots__ = ("fd", "path", "position", "length")

    def __init__(self, fd: int, path: str, position: int, length: int) -> None:
        self.fd = fd
        self.path = path
        self.position = position
        self.length = length

    def read(self) -> bytes:
        """The slice's bytes (what sendfile would send)."""
        if self.length == 0:
            return b""
        data = pread_exact(self.fd, self.length, self.position)
        if len(data) != self.length:
            raise StorageError(f"{self.path}: file ended inside a slice")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileSlice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileSlice({self.path!r}, position={self.position}, length={self.length})"


def _lock_directory(path: str) -> int:
    """Hold an exclusive flock on the directory's lock file for as long as the log is open:
    two writers on one log would interleave appends."""
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogLockedError(f"{path}: the log is open in another PartitionLog or process (a "
                             "running broker?)") from None
    return fd


def partition_of(path: str) -> tuple[str, int]:
    """(topic as a broker names it, partition) of a partition directory, for messages; the
    directory's own name and 0 when it is not named like one."""
    name = os.path.basename(os.path.normpath(path))
    try:
        topic, partition = TopicName.parse_partition_dir(name)
        return topic.short, partition
    except InvalidTopicNameError:
        return name, 0


def corrupt_data_error(path: str, segment_path: str, damage: Damage) -> CorruptDataError:
    """The error for a read of a damaged range of the partition in directory `path`."""
    topic, partition = partition_of(path)
    last = damage.end_offset - 1
    where = f"topic {topic!r} partition {partition}: offsets {damage.start_offset}..{last}"
    fields: dict[str, Any] = {"topic": topic, "partition": partition,
                              "start_offset": damage.start_offset,
                              "end_offset": damage.end_offset, "path": segment_path}
    if damage.repaired:
        kept = f" (their bytes are in {damage.quarantine})" if damage.quarantine else ""
        return QuarantinedDataError(
            f"{where} were damaged on disk and quarantined by `tq log repair`{kept}: they are "
            f"lost; read from offset {damage.end_offset} to go on", **fields)
    return CorruptDataError(
        f"{where} are damaged on disk ({damage.reason}; {segment_path}): reads of them fail; "
        f"read from offset {damage.end_offset} to go on, and see `tq log check {path}`",
        **fields)


class PartitionLog:
    """One partition's log. Create with `PartitionLog.open(path, config)`."""

    def __init__(
        self, path: str, config: LogConfig, lock_fd: int, segments: Sequence[LogSegment]
    ) -> None:
        self.path = path
        self.config = config
        self._lock_fd = lock_fd
        self._writer = threading.Lock()  # serializes writer operations
        self._files = threading.Lock()  # segment list changes and fd closes vs. reader dups
        # (base offsets, segments): replaced whole, never mutated, so readers need no lock.
        self._view: tuple[tuple[int, ...], tuple[LogSegment, ...]] = (
            tuple(s.base_offset for s in segments), tuple(segments))
        self._next_offset = segments[-1].next_offset
        self._flushed_end = self._next_offset  # opening forced everything to disk
        self._last_flush = time.monotonic()
        self._recovery_point = segments[-1].base_offset
        # Where DeleteRecords moved the log start (inside the first segment); 0: never.
        self._start = min(read_checkpoint(path, LOG_START_FILE) or 0, self._next_offset)
        self._closed = False
        self._failure: str | None = None
        # Whether every write before the last close is still here (`_recovery.writes_kept`): a
        # clean close, or an unclean one on the same boot. Else what was appended without an
        # fsync (`sync=False`, or the "never" policy) may have been lost.
        self.writes_kept = True
        # Leader epoch -> its first offset (`leader-epoch-checkpoint`), loaded by `open`.
        self._epochs = LeaderEpochCache()
        # How many times `truncate_to` ran: bytes read before one may be gone or replaced, so
        # whoever keeps a read (the broker's shared reads) keeps this count with it.
        self.truncations = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str], config: LogConfig | None = None) -> PartitionLog:
        """Open the log in directory `path` (created if missing), recovering it if the last
        shutdown was unclean. Raises StorageError when it cannot."""
        path = os.fspath(path)
        config = config or LogConfig()
        try:
            os.makedirs(path, exist_ok=True)
            lock_fd = _lock_directory(path)
        except OSError as exc:
            raise StorageError(f"{path}: cannot open the log directory: {exc}") from exc
        try:
            kept = writes_kept(path, os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
                               or not any(name.endswith(LOG_SUFFIX) for name in os.listdir(path)))
            segments = load_segments(path, config)
        except OSError as exc:
            os.close(lock_fd)
            raise StorageError(f"{path}: cannot open the log: {exc}") from exc
        except BaseException:
            os.close(lock_fd)
            raise
        log = cls(path, config, lock_fd, segments)
        log.writes_kept = kept
        try:
            log._load_epochs()
        except OSError as exc:
            log.close()
            raise StorageError(f"{path}: cannot write {EPOCH_CHECKPOINT_FILE}: {exc}") from exc
        return log

    def _load_epochs(self) -> None:
        """Load the leader epoch checkpoint and fit it to the log: epochs starting at or past
        the log end never reached it (the file is written before a new epoch's first batch),
        the first one starts at the log start. A missing or damaged file is rebuilt from the
        batch headers."""
        try:
            cache = read_epoch_checkpoint(self.path)
        except (OSError, ValueError) as exc:
            logger.warning("%s: %s unreadable (%s); rebuilding it from the batch headers",
                           self.path, EPOCH_CHECKPOINT_FILE, exc)
            cache = None
        if cache is not None:
            changed = cache.truncate_from_end(self._next_offset)
            changed = cache.truncate_from_start(self.log_start_offset) or changed
        elif self._next_offset > self.log_start_offset:
            try:
                cache = scan_epochs(lambda offset: self.read(offset, 1 << 20),
                                    self.log_start_offset)
            except RecordError as exc:  # damage: over-truncation is safe, a wrong epoch is not
                logger.warning("%s: cannot rebuild %s (%s); its epochs stay unknown",
                               self.path, EPOCH_CHECKPOINT_FILE, exc)
                return
            changed = True
        else:
            return
        self._epochs = cache
        if changed:
            write_epoch_checkpoint(self.path, cache)

    @property
    def leader_epochs(self) -> LeaderEpochCache:
        """Leader epoch -> the first offset written at it (safe from any thread: a snapshot)."""
        return self._epochs.copy()

    def _note_epochs(self, epochs: Sequence[tuple[int, int]]) -> None:
        """Add (epoch, start) pairs of batches about to be written; the checkpoint is
        rewritten first when one starts a new epoch (writer lock held)."""
        cache = self._epochs
        changed = False
        for epoch, start in epochs:
            if cache.needs(epoch):
                cache.assign(epoch, start)
                changed = True
        if changed:
            write_epoch_checkpoint(self.path, cache)

    # ---- offsets --------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The first offset still in the log: the first segment's base, or past it where
        `delete_records` moved it."""
        return max(self._view[0][0], self._start)

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._next_offset

    @property
    def flushed_end_offset(self) -> int:
        """Every offset below this one has been forced to disk (fsync)."""
        return self._flushed_end

    @property
    def durable_end_offset(self) -> int:
        """Every offset below this one meets the flush policy: the broker acknowledges up to
        here. Under "never" that is everything appended; otherwise what was fsynced."""
        if self.config.flush is FlushPolicy.NEVER:
            return self._next_offset
        return self._flushed_end

    @property
    def segment_count(self) -> int:
        return len(self._view[0])

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._view[1])

    def may_roll(self, nbytes: int) -> bool:
        """Whether appending `nbytes` more may roll the active segment, which fsyncs the
        segment it seals (however long that takes): a writer that must not wait for the disk
        appends such a commit elsewhere."""
        return self._view[1][-1].size + nbytes > self.config.segment_bytes

    @property
    def segments(self) -> list[SegmentInfo]:
        segments = self._view[1]
        return [
            SegmentInfo(s.base_offset, s.next_offset, s.size, s.largest_timestamp, s.path,
                        s.damage)
            for s in segments
        ]

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- writing ----------------------------------------------------------------------------

    def append(self, batch: Buffer) -> int:
        """Append one RecordBatch v2 (as a producer encoded it); return its base offset.

        The batch is validated first (header bounds, magic 2, CRC-32C, records 0..n-1): a bad
        one raises a RecordError and the log is untouched. The log stamps the base offset and
        leader epoch (both outside the CRC) and writes the rest of the bytes unchanged.
        """
        return self.append_batches((batch,))[0]

    def append_batches(self, batches: Sequence[Buffer], *, sync: bool = True,
                       leader_epoch: int = LEADER_EPOCH) -> list[int]:
        """Append several batches with one write (per segment) and at most one fsync; return
        their base offsets. All are validated before any is written: one bad batch raises its
        RecordError and none is appended.

        `sync=False` under the "always" policy: no fsync now; the batches are written (the OS
        has them) and become durable with the next synced append of this log (the fsync
        covers the file) or flush_interval_ms later (`flush_if_due`), whichever comes first.

        `leader_epoch`: the epoch stamped on each batch (a replicated partition's leader's)."""
        if leader_epoch < 0:
            raise ValueError(f"leader epoch {leader_epoch} is negative")
        views = [b if type(b) is SplitBatch else memoryview(b).cast("B") for b in batches]
        headers = [check_batch(v) for v in views]
        if not views:
            return []
        with self._writer:
            self._check_writable()
            try:
                if self._epochs.needs(leader_epoch):
                    self._note_epochs(((leader_epoch, self._next_offset),))
                return self._append_checked(views, headers, sync, leader_epoch)
            except OSError as exc:
                raise self._fail("append", exc) from exc

    def append_replica(self, data: Bytes | Sequence[Bytes], *, sync: bool = True) -> int:
        """Append a follower's copy of its leader's stored batches (`data`, as the leader's
        `read` served them, or a sequence of such buffers, each of whole batches: the frames
        of a fetch's reply, appended without joining them first): offsets and leader epochs
        kept, bytes unchanged, so the replicas are byte-identical. Every batch is checked
        (header, CRC-32C, an epoch >= 0) and must start where the log (then the batch before
        it) ends: a gap or an overlap raises a RecordError and nothing is appended. Returns the
        new log end offset."""
        frames = data if isinstance(data, (list, tuple)) else (data,)
        with self._writer:
            self._check_writable()
            expected = self._next_offset
            batches: list[tuple[memoryview, BatchHeader]] = []
            for frame in frames:
                view = memoryview(frame).cast("B")
                pos = 0
                while pos < len(view):
                    if len(view) - pos < PREFIX_SIZE:
                        raise TruncatedRecordError(
                            f"replicated data ends {len(view) - pos} bytes into a batch header")
                    length = struct.unpack_from(">i", view, pos + 8)[0] + 12
                    batch = view[pos:pos + length]
                    header = check_batch(batch)
                    if header.base_offset != expected:
                        raise CorruptRecordError(
                            f"replicated batch at offset {header.base_offset}, the log ends at"
                            f" {expected}: a gap or an overlap")
                    if header.partition_leader_epoch < 0:
                        raise CorruptRecordError(
                            f"replicated batch at offset {header.base_offset} has leader epoch"
                            f" {header.partition_leader_epoch}")
                    batches.append((batch, header))
                    expected = header.next_offset
                    pos += length
            if not batches:
                return self._next_offset
            try:
                self._note_epochs([(h.partition_leader_epoch, h.base_offset)
                                   for _b, h in batches])
                self._append_replicated(batches, sync)
            except OSError as exc:
                raise self._fail("append", exc) from exc
            return self._next_offset

    def _append_replicated(self, batches: list[tuple[memoryview, BatchHeader]], sync: bool) -> None:
        segment = self._view[1][-1]
        limit = self.config.segment_bytes
        run: list[PendingBatch] = []
        run_size = segment.size
        for view, header in batches:
            if run_size and (run_size + header.size > limit
                             or header.next_offset - 1 - segment.base_offset > INT32_MAX):
                if run:
                    self._write_run(segment, run)
                    run = []
                segment = self._roll()
                run_size = 0
            run.append(PendingBatch(header.base_offset, header, bytes(view[:PREFIX_SIZE]),
                                    view[PREFIX_SIZE:]))
            run_size += header.size
        self._write_run(segment, run)
        policy = self.config.flush
        if (policy is FlushPolicy.ALWAYS and sync) or (
            policy is FlushPolicy.INTERVAL and self._flush_overdue(time.monotonic())
        ):
            self._flush_locked()

    def _append_checked(
        self, views: list[memoryview | SplitBatch], headers: list[BatchHeader], sync: bool,
        leader_epoch: int = LEADER_EPOCH,
    ) -> list[int]:
        segment = self._view[1][-1]
        limit = self.config.segment_bytes
        offsets: list[int] = []
        run: list[PendingBatch] = []
        run_size = segment.size
        offset = self._next_offset
        for view, header in zip(views, headers, strict=True):
            next_offset = offset + header.last_offset_delta + 1
            if run_size and (run_size + header.size > limit
                             or next_offset - 1 - segment.base_offset > INT32_MAX):
                if run:
                    self._write_run(segment, run)
                    run = []
                segment = self._roll()
                run_size = 0
            if type(view) is SplitBatch:
                run.append(PendingBatch(offset, header, stamp_prefix(offset, header, leader_epoch),
                                        memoryview(view.head)[PREFIX_SIZE:], view.body))
            else:
                run.append(PendingBatch(offset, header, stamp_prefix(offset, header, leader_epoch),
                                        view[PREFIX_SIZE:]))
            offsets.append(offset)
            run_size += header.size
            offset = next_offset
        self._write_run(segment, run)
        policy = self.config.flush
        if (policy is FlushPolicy.ALWAYS and sync) or (
            policy is FlushPolicy.INTERVAL and self._flush_overdue(time.monotonic())
        ):
            self._flush_locked()
        return offsets

    def _write_run(self, segment: LogSegment, run: list[PendingBatch]) -> None:
        segment.append(run)
        self._next_offset = segment.next_offset  # published after the segment's size

    def _roll(self) -> LogSegment:
        """Seal the active segment (its final time index entry, fsync) and start a new one at
        the log end offset; move the recovery point to it."""
        old = self._view[1][-1]
        old.seal()
        new = LogSegment.create(self.path, self._next_offset, self.config.index_interval_bytes)
        bases, segments = self._view
        with self._files:
            self._view = ((*bases, new.base_offset), (*segments, new))
        # also makes the new files' names durable
        write_checkpoint(self.path, new.base_offset, settled=old.file_paths())
        self._recovery_point = new.base_offset
        self._flushed_end = max(self._flushed_end, new.base_offset)
        logger.debug("%s: rolled to segment %d", self.path, new.base_offset)
        return new

    # ---- flushing ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Force every appended byte to disk now, whatever the policy."""
        with self._writer:
            self._check_writable()
            try:
                self._flush_locked()
            except OSError as exc:
                raise self._fail("flush", exc) from exc

    def flush_if_due(self, now: float | None = None) -> bool:
        """Under the "interval" policy, flush when unflushed bytes are flush_interval_ms old
        (the broker calls this from a timer, since appends alone flush only while they keep
        coming); under "always", the same for batches appended with `sync=False`. `now` is
        time.monotonic(). True when it flushed."""
        if self.config.flush is FlushPolicy.NEVER:
            return False
        with self._writer:
            self._check_writable()
            if not self._flush_overdue(time.monotonic() if now is None else now):
                return False
            try:
                self._flush_locked()
            except OSError as exc:
                raise self._fail("flush", exc) from exc
            return True

    def flush_due_in(self, now: float | None = None) -> float | None:
        """Seconds until flush_if_due will flush (0 when overdue); None when nothing waits."""
        if self.config.flush is FlushPolicy.NEVER or self._flushed_end >= self._next_offset:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, self._last_flush + self.config.flush_interval_ms / 1000 - now)

    def _flush_overdue(self, now: float) -> bool:
        return (self._flushed_end < self._next_offset
                and now - self._last_flush >= self.config.flush_interval_ms / 1000)

    def _flush_locked(self) -> None:
        end = self._next_offset
        if self._flushed_end < end:
            # Earlier segments were forced to disk when rolled: only the active one is dirty.
            self._view[1][-1].sync()
        self._flushed_end = end
        self._last_flush = time.monotonic()

    # ---- reading ----------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, end_offset: int | None = None) -> bytes:
        """Whole batches from the one holding `offset`, up to `max_bytes` (but always at least
        that first batch, as Kafka does), all from one segment, none with a base offset at or
        past `end_offset` (e.g. durable_end_offset). b"" at the end of the log; raises
        OffsetOutOfRangeError for an offset below the log start or past the log end."""
        found = self._locate(offset, max_bytes, end_offset)
        if found is None:
            return b""
        fd, segment, start, end = found
        try:
            data = pread_exact(fd, end - start, start)
        except OSError as exc:
            raise StorageError(f"{segment.path}: read failed: {exc}") from exc
        finally:
            os.close(fd)
        if len(data) != end - start:
            raise StorageError(f"{segment.path}: file ends inside batches it indexed")
        return data

    def read_slice(
        self, offset: int, max_bytes: int, *, end_offset: int | None = None
    ) -> FileSlice:
        """As read, but as a slice of the segment file for sendfile. Close the slice."""
        found = self._locate(offset, max_bytes, end_offset)
        if found is None:
            return FileSlice(-1, "", 0, 0)
        fd, segment, start, end = found
        return FileSlice(fd, segment.path, start, end - start)

    def _locate(
        self, offset: int, max_bytes: int, end_offset: int | None
    ) -> tuple[int, LogSegment, int, int] | None:
        """(dup'd fd, segment, start, end) of the batches to serve, or None when none."""
        log_end = self._next_offset  # sampled first: see the module docstring
        bases, segments = self._view
        if self._closed:
            raise LogClosedError(f"{self.path}: log closed")
        start = max(bases[0], self._start)
        if not start <= offset <= log_end:
            raise OffsetOutOfRangeError(
                f"offset {offset} outside the log's range {start}..{log_end}")
        stop = log_end if end_offset is None else min(log_end, end_offset)
        if offset >= stop:
            return None
        for segment in segments[bisect_right(bases, offset) - 1:]:
            damaged = segment.damage_holding(offset)
            if damaged is not None:
                raise corrupt_data_error(self.path, segment.path, damaged)
            fd = self._dup(segment)
            try:
                size = segment.size
                first = segment.find_batch(fd, offset, size)
                if first is None:  # every batch of this segment ends before `offset`
                    os.close(fd)
                    continue
                if first.base_offset >= stop:
                    os.close(fd)
                    return None
                limit = min(first.position + max(max_bytes, 0), size)
                end = segment.batches_end(fd, first, limit, size, end_offset)
                return fd, segment, first.position, end
            except RecordError as exc:
                os.close(fd)
                raise StorageError(
                    f"{segment.path}: corrupt batch on disk: {describe(exc)}") from exc
            except OSError as exc:
                os.close(fd)
                raise StorageError(f"{segment.path}: read failed: {exc}") from exc
            except BaseException:
                os.close(fd)
                raise
        return None

    def _dup(self, segment: LogSegment) -> int:
        with self._files:
            if self._closed:
                raise LogClosedError(f"{self.path}: log closed")
            if segment.fd < 0:
                raise OffsetOutOfRangeError(
                    f"{segment.path}: removed by retention; the log now starts at "
                    f"{self.log_start_offset}")
            return os.dup(segment.fd)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= `timestamp_ms` (Kafka's ListOffsets
        by time), found through the time indexes; None when every record is older."""
        for segment in self._view[1]:
            if segment.largest_timestamp < timestamp_ms:
                continue
            try:
                fd = self._dup(segment)
            except OffsetOutOfRangeError:  # removed by retention since we looked
                continue
            try:
                found = segment.offset_for_timestamp(fd, timestamp_ms, segment.size)
                if isinstance(found, Damage):
                    raise corrupt_data_error(self.path, segment.path, found)
                if found is not None:
                    return _first_record_at(fd, found, timestamp_ms)
            except RecordError as exc:
                raise StorageError(
                    f"{segment.path}: corrupt batch on disk: {describe(exc)}") from exc
            except OSError as exc:
                raise StorageError(f"{segment.path}: read failed: {exc}") from exc
            finally:
                os.close(fd)
        return None

    # ---- retention and truncation -------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Remove whole segments past retention_ms (by their largest timestamp, else their
        file's mtime) or beyond retention_bytes, oldest first, never the active one; advance
        the log start offset. Returns the number of segments removed."""
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        with self._writer:
            self._check_writable()
            segments = self._view[1]
            count = 0
            if retention_ms >= 0:
                now_ms = int(time.time() * 1000) if now_ms is None else now_ms
                while count < len(segments) - 1 and (
                    now_ms - _segment_time(segments[count]) > retention_ms
                ):
                    count += 1
            if retention_bytes >= 0:
                excess = sum(s.size for s in segments[count:]) - retention_bytes
                while count < len(segments) - 1 and excess >= segments[count].size:
                    excess -= segments[count].size
                    count += 1
            if count:
                try:
                    self._remove_oldest(count)
                except OSError as exc:
                    raise self._fail("retention", exc) from exc
            return count

    def delete_records(self, offset: int) -> int:
        """Move the log start offset up to `offset` (Kafka's DeleteRecords): reads below it
        fail with OffsetOutOfRangeError from now on and after a reopen (the offset is kept in
        `log-start-offset-checkpoint`); whole segments below it are removed, never the active
        one. An offset at or below the start changes nothing. Returns the log start offset.
        OffsetOutOfRangeError past the log end."""
        with self._writer:
            self._check_writable()
            if offset > self._next_offset:
                raise OffsetOutOfRangeError(
                    f"cannot delete records before {offset}: the log ends at "
                    f"{self._next_offset}")
            if offset <= self.log_start_offset:
                return self.log_start_offset
            try:
                write_checkpoint(self.path, offset, file=LOG_START_FILE)
                self._start = offset
                if self._epochs.truncate_from_start(offset):
                    write_epoch_checkpoint(self.path, self._epochs)
                segments = self._view[1]
                count = 0
                while count < len(segments) - 1 and segments[count + 1].base_offset <= offset:
                    count += 1
                if count:
                    self._remove_oldest(count)
            except OSError as exc:
                raise self._fail("delete records", exc) from exc
            return self.log_start_offset

    def _remove_oldest(self, count: int) -> None:
        bases, segments = self._view
        removed = segments[:count]
        with self._files:
            self._view = (bases[count:], segments[count:])
            for segment in removed:
                segment.close()
        for segment in removed:
            segment.delete()
        fsync_dir(self.path)
        if self._epochs.truncate_from_start(self.log_start_offset):
            write_epoch_checkpoint(self.path, self._epochs)
        logger.info("%s: retention removed %d segment(s); log starts at %d",
                    self.path, count, self.log_start_offset)

    def truncate_to(self, offset: int) -> int:
        """Remove everything from the batch holding `offset` on; returns the new log end
        offset (<= `offset`: a batch is never split). For tests and recovery; not safe with
        concurrent readers of the removed offsets."""
        with self._writer:
            self._check_writable()
            if not self.log_start_offset <= offset <= self._next_offset:
                raise OffsetOutOfRangeError(
                    f"cannot truncate to {offset}: outside {self.log_start_offset}.."
                    f"{self._next_offset}")
            try:
                self._truncate_locked(offset)
            except OSError as exc:
                raise self._fail("truncate", exc) from exc
            return self._next_offset

    def _truncate_locked(self, offset: int) -> None:
        self.truncations += 1  # first: a read sampling the count after this sees the change
        bases, segments = self._view
        keep = bisect_right(bases, offset)
        dropped = segments[keep:]
        if dropped:
            with self._files:
                self._view = (bases[:keep], segments[:keep])
                for segment in dropped:
                    segment.close()
            for segment in dropped:
                segment.delete()
        active = segments[keep - 1]
        active.truncate_to(offset)
        self._next_offset = active.next_offset
        self._flushed_end = min(self._flushed_end, self._next_offset)
        if active.base_offset != self._recovery_point:
            write_checkpoint(self.path, active.base_offset)
            self._recovery_point = active.base_offset
        fsync_dir(self.path)
        if self._epochs.truncate_from_end(self._next_offset):
            write_epoch_checkpoint(self.path, self._epochs)

    # ---- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Seal the active segment, leave the clean-shutdown marker (so the next open skips
        validation) and close every file. Idempotent."""
        with self._writer:
            if self._closed:
                return
            error: OSError | None = None
            if self._failure is None:
                try:
                    self._view[1][-1].seal()
                    write_clean_marker(self.path, self._next_offset, settled=[
                        p for segment in self._view[1] for p in segment.file_paths()])
                except OSError as exc:
                    error = exc
            with self._files:
                self._closed = True
                for segment in self._view[1]:
                    segment.close()
            os.close(self._lock_fd)  # releases the flock
            if error is not None:
                raise StorageError(f"{self.path}: clean close failed: {error}") from error

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PartitionLog({self.path!r}, start={self.log_start_offset}, "
                f"end={self._next_offset})")

    # ---- failure ------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self.path}: log closed")
        if self._failure is not None:
            raise StorageError(f"{self.path}: log failed earlier ({self._failure}); reopen it")

    def _fail(self, operation: str, exc: OSError) -> StorageError:
        """After an I/O error the in-memory state may not match the files: refuse further
        writes (as Kafka takes a failed log dir offline); reopening recovers."""
        self._failure = f"{operation}: {exc}"
        logger.error("%s: %s failed, log refuses further writes: %s", self.path, operation, exc)
        return StorageError(f"{self.path}: {operation} failed: {exc}")


def _segment_time(segment: LogSegment) -> int:
    """Kafka's segment age: its largest timestamp, else its file's modification time (ms)."""
    if segment.largest_timestamp >= 0:
        return segment.largest_timestamp
    return os.stat(segment.path).st_mtime_ns // 1_000_000


def _first_record_at(fd: int, batch: Span, timestamp_ms: int) -> int:
    """The offset of the first record of `batch` with a timestamp >= `timestamp_ms` (its
    maxTimestamp says there is one)."""
    data = pread_exact(fd, batch.size, batch.position)  # the size was bounded when read
    for record in decode_batch(data, 0).records:
        if record.timestamp >= timestamp_ms:
            return record.offset
    return batch.base_offset
