"""One log segment: a `.log` file of record batches with its offset and time indexes.

The segment appends whole batches, keeps Kafka's index entries (one per
`index_interval_bytes` appended), finds batch positions for readers, validates its bytes when
recovering (remembering damaged ranges, `_damage`), and truncates. It does not decide when to
roll, flush or delete: PartitionLog does; nor what is a torn tail: recovery tells it.

Readers never cross a damaged range: a read stops in front of one, and `damage_holding`
names the range an offset falls in (the log turns it into CorruptDataError).

`size` is the end of the last whole batch the writer has written; it only grows while the
segment is active (truncation aside), and readers never read past the value they sampled, so a
reader on another thread never sees half an append.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from catalog.errors import StorageError
from querylib.log._batch import Span, iter_spans
from querylib.log._config import (
    DAMAGE_SUFFIX,
    INDEX_SUFFIX,
    INT32_MAX,
    LOG_SUFFIX,
    QUARANTINE_INFIX,
    TIME_INDEX_SUFFIX,
    segment_name,
)
from querylib.log._damage import Damage, SegmentWalk, damage_at, load_damage, save_damage
from querylib.log._index import OffsetIndex, TimeIndex
from querylib.records import HEADER_SIZE, BatchHeader

logger = logging.getLogger("querylib.log")

_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
_fdatasync = getattr(os, "fdatasync", os.fsync)  # data and size, not mtime: enough to recover


@dataclass(frozen=True, slots=True)
class PendingBatch:
    """A validated batch about to be written: its new 16-byte prefix and the bytes after it."""

    base_offset: int
    header: BatchHeader
    prefix: bytes
    body: memoryview  # the producer's bytes from offset 16 on (to the end of its header, if split)
    tail: memoryview | bytes | None = None  # a split batch's records (SplitBatch.body)


def _write_all(fd: int, buffers: list[bytes | memoryview]) -> None:
    """writev every buffer, in IOV_MAX slices, resuming after short writes."""
    pending = [memoryview(b) for b in buffers if len(b)]
    while pending:
        chunk = pending[:_IOV_MAX]
        written = os.writev(fd, chunk)
        if written <= 0:
            raise OSError(f"writev wrote {written} bytes")
        done = 0
        while done < len(chunk) and written >= len(chunk[done]):
            written -= len(chunk[done])
            done += 1
        pending = pending[done:]
        if written:
            pending[0] = pending[0][written:]


class LogSegment:
    """A `.log` file and its indexes. Only the writer calls the mutating methods."""

    def __init__(
        self, directory: str, base_offset: int, fd: int, index: OffsetIndex,
        time_index: TimeIndex, index_interval: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.path = os.path.join(directory, segment_name(base_offset, LOG_SUFFIX))
        self.fd = fd  # -1 once closed; readers dup it under PartitionLog's lock
        self.index = index
        self.time_index = time_index
        self.size = 0  # end of the last whole batch
        self.next_offset = base_offset  # offset the next batch appended here would get
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self._interval = index_interval
        self._bytes_since_index = 0
        self.damage_path = os.path.join(directory, segment_name(base_offset, DAMAGE_SUFFIX))
        # Damaged ranges, by position: replaced whole (recovery, truncation), never mutated.
        self.damage: tuple[Damage, ...] = ()

    # ---- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str, base_offset: int, index_interval: int) -> tuple[LogSegment, bool]:
        """Open (or create) the segment's files and load its damaged ranges. True when both
        indexes and the damage file loaded sanely; the caller must still validate or recover
        before using `size` and `next_offset`."""
        path = os.path.join(directory, segment_name(base_offset, LOG_SUFFIX))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            log_size = os.fstat(fd).st_size
            index, index_ok = OffsetIndex.open(
                os.path.join(directory, segment_name(base_offset, INDEX_SUFFIX)),
                base_offset, log_size)
            time_index, time_ok = TimeIndex.open(
                os.path.join(directory, segment_name(base_offset, TIME_INDEX_SUFFIX)),
                base_offset, log_size)
        except BaseException:
            os.close(fd)
            raise
        segment = cls(directory, base_offset, fd, index, time_index, index_interval)
        damage = load_damage(segment.damage_path)
        segment.damage = damage or ()
        return segment, index_ok and time_ok and damage is not None

    @classmethod
    def create(cls, directory: str, base_offset: int, index_interval: int) -> LogSegment:
        """A new, empty segment; leftover files with its name are emptied."""
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            path = os.path.join(directory, segment_name(base_offset, suffix))
            if os.path.exists(path):
                os.truncate(path, 0)
        save_damage(os.path.join(directory, segment_name(base_offset, DAMAGE_SUFFIX)), ())
        segment, _ = cls.open(directory, base_offset, index_interval)
        return segment

    def file_size(self) -> int:
        return os.fstat(self.fd).st_size

    def file_paths(self) -> list[str]:
        """The segment's files: log, indexes, and the damage file when it has one."""
        paths = [self.path, self.index.path, self.time_index.path]
        return [*paths, self.damage_path] if self.damage else paths

    def quarantine_paths(self) -> list[str]:
        """Files `tq log repair` moved this segment's damaged bytes to."""
        prefix = os.path.basename(self.path) + QUARANTINE_INFIX
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted(os.path.join(self.directory, n) for n in names if n.startswith(prefix))

    @property
    def largest_timestamp(self) -> int:
        """The largest batch timestamp in the segment, -1 when it holds none."""
        return self.max_timestamp

    # ---- appending (writer) --------------------------------------------------------------

    def append(self, batches: Sequence[PendingBatch]) -> None:
        """Write the batches with one writev and index them. On an I/O error the file is cut
        back to its previous size and the error propagates; nothing was indexed."""
        start = self.size
        buffers: list[bytes | memoryview] = []
        for batch in batches:
            buffers.append(batch.prefix)
            buffers.append(batch.body)
            if batch.tail is not None:
                buffers.append(batch.tail)
        try:
            _write_all(self.fd, buffers)
        except OSError:
            os.ftruncate(self.fd, start)  # may raise too: the caller then fails the log
            raise
        pos = start
        for batch in batches:
            self._note_batch(pos, batch.base_offset, batch.header)
            pos += batch.header.size
        self.next_offset = batches[-1].base_offset + batches[-1].header.last_offset_delta + 1
        self.size = pos  # published last: readers may now read these batches

    def _note_batch(self, pos: int, base_offset: int, header: BatchHeader) -> None:
        """Kafka's rule: index a batch once more than index_interval bytes were appended since
        the last entry; the time index records the largest timestamp so far at the same time."""
        last_offset = base_offset + header.last_offset_delta
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = last_offset
        if self._bytes_since_index > self._interval:
            self.index.append(last_offset, pos, pos + header.size)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index = 0
        self._bytes_since_index += header.size

    def fits(self, header: BatchHeader, base_offset: int, segment_bytes: int) -> bool:
        """Whether the batch may go in this segment (an empty segment takes any batch)."""
        if self.size == 0:
            return True
        return (
            self.size + header.size <= segment_bytes
            and base_offset + header.last_offset_delta - self.base_offset <= INT32_MAX
        )

    def sync(self) -> None:
        _fdatasync(self.fd)

    def sync_all(self) -> None:
        """Force the log and both indexes to disk."""
        os.fsync(self.fd)
        self.index.sync()
        self.time_index.sync()

    def seal(self) -> None:
        """Record the segment's largest timestamp in its time index (so a reopen finds it) and
        force all three files to disk: when rolling, and as the last step of a clean close."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self.sync_all()

    # ---- reading (any thread, on a dup of fd) ---------------------------------------------

    def damage_holding(self, offset: int) -> Damage | None:
        """The damaged range holding `offset`, if any."""
        return damage_at(self.damage, offset) if self.damage else None

    def clean_end(self, position: int, size: int) -> int:
        """Where the bytes readable from batch start `position` end: `size`, or the start of
        the first damaged range after `position`."""
        for d in self.damage:
            # (An empty range at `position` itself lies before the batch there.)
            if d.position > position:
                return min(size, d.position)
        return size

    def find_batch(self, fd: int, offset: int, size: int) -> Span | None:
        """The batch holding `offset`, below `size`; None when every batch here ends before
        it. Raises RecordError on unparsable bytes. Sequential reads of large batches are
        answered by the index alone, without reading a header. The caller has checked that
        `offset` is in no damaged range."""
        start, limit = self.index.lookup(offset), size
        if self.damage:
            # Walk only the clean bytes between the ranges around `offset`. (The index's
            # shortcut assumes gapless offsets between adjacent entries: not used here.)
            for d in self.damage:
                if d.end_offset <= offset:
                    start = max(start, d.end_position)
                elif d.start_offset > offset:
                    limit = min(limit, d.position)
                    break
        else:
            known = self.index.batch_holding(offset)
            if known is not None and known[3] <= size:
                position, base, next_offset, end = known
                return Span(position, base, next_offset, end - position)
        for span in iter_spans(fd, start, limit, self._scan_chunk):
            if span.position + span.size > limit:
                raise StorageError(
                    f"{self.path}: batch at {span.position} runs past the segment end")
            self.index.learn(span.position, span.position + span.size)
            if span.next_offset > offset:
                return span
        return None

    def batches_end(
        self, fd: int, first: Span, limit: int, size: int, end_offset: int | None
    ) -> int:
        """The end of the longest run of whole batches from `first` that stays within `limit`
        bytes of the file, in front of any damaged range, and holds no batch whose base offset
        is >= `end_offset`. Always includes the first batch."""
        end = first.position + first.size
        if self.damage:
            size = self.clean_end(first.position, size)
            limit = min(limit, size)
        if end >= limit:
            return end
        # Jump by index to a batch start near the limit, then walk the few headers after it.
        jump = self.index.floor_position(limit)
        if end_offset is not None:
            jump = min(jump, self.index.lookup(end_offset))
        end = max(end, jump)
        following = self.index.end_at(end)
        if following is not None and following > limit:
            return end  # the index says the next batch does not fit: no header to read
        for span in iter_spans(fd, end, size, self._scan_chunk):
            self.index.learn(span.position, span.position + span.size)
            if span.position + span.size > limit:
                break
            if end_offset is not None and span.base_offset >= end_offset:
                break
            end = span.position + span.size
        return end

    @property
    def _scan_chunk(self) -> int:
        # From an index entry the wanted header is at most one interval (plus a batch) away.
        return min(max(self._interval + 2 * HEADER_SIZE, 4096), 1 << 16)

    def offset_for_timestamp(self, fd: int, timestamp: int, size: int) -> Span | Damage | None:
        """The first batch here at or after the time index's hint whose maxTimestamp is >=
        `timestamp`; None when there is none; the damaged range met first when the answer
        may lie in it (its timestamps are unknown)."""
        hint = self.time_index.lookup(timestamp)
        damaged = self.damage_holding(hint)
        if damaged is not None:
            return damaged
        found = self.find_batch(fd, hint, size)
        if found is None:
            return None
        position = found.position
        ahead = [d for d in self.damage if d.position > position and d.position < size]
        for d in [*ahead, None]:
            stop = size if d is None else d.position
            for span in iter_spans(fd, position, stop, self._scan_chunk):
                if span.position + span.size > stop:
                    break
                if span.max_timestamp is not None and span.max_timestamp >= timestamp:
                    return span
            if d is None:
                return None
            if not d.repaired and d.end_offset > d.start_offset:
                return d  # its records' timestamps are unknown
            position = d.end_position  # a gap, or bytes that held no offsets: go on after
        return None

    # ---- recovery and truncation (writer) -------------------------------------------------

    def recover(self, resume: bool, *, end_offset: int | None = None,
                torn_tail: bool = False) -> bool:
        """Validate batches (bounds, CRC-32C, magic 2, leader epoch, continuing offsets) and
        rebuild what depends on them. True when any of the segment's files changed.

        Bytes that fail, with valid batches after them, become a damaged range: kept, with
        every valid batch around them (`_damage`). Bad bytes up to the end of the file are
        cut when `torn_tail` (the last segment after an unclean shutdown: a write the crash
        tore), else kept as a damaged range too: nothing else is ever cut. `end_offset`, when
        known (the next segment's base offset, the log end a clean close recorded), is where
        this segment's offsets end: offsets short of it are a gap.

        `resume` trusts the bytes before the last offset index entry and the ranges recorded
        before (a cleanly closed or checkpointed segment) and validates from the batch that
        entry names. Otherwise, or when anything new turns up past that entry, the whole
        segment is validated and both indexes and the damage file are rebuilt from it.
        """
        resume = resume and len(self.index) > 0
        file_size = self.file_size()
        known = self.damage
        if resume:
            start = self.index.last_position
            anchor = self.index.last_offset  # last offset of the batch at `start`
            self.max_timestamp = self.time_index.last_timestamp
            self.offset_of_max_timestamp = self.time_index.last_offset
            carried = [d for d in known if d.position < start]
            trusted = [d for d in known if d.position >= start]
            walk = SegmentWalk(self.fd, self.base_offset, start, file_size, None,
                               end_offset=end_offset, trusted=trusted)
        else:
            start, anchor = 0, -1
            self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
            # Repaired gaps are authoritative: their bytes are gone, the offsets stay a hole.
            carried, trusted = [], [d for d in known if d.repaired]
            walk = SegmentWalk(self.fd, self.base_offset, 0, file_size, self.base_offset,
                               end_offset=end_offset, trusted=trusted,
                               hints=[p for _, p in self.index.entries()])
        time_floor = self.max_timestamp  # time entries must exceed what is indexed already
        index_entries: list[tuple[int, int, int]] = []  # (last offset, position, end)
        time_entries: list[tuple[int, int]] = []
        found: list[Damage] = []
        self._bytes_since_index = 0
        for item in walk:
            if isinstance(item, Damage):
                found.append(item)
                continue
            pos, header = item
            last = header.base_offset + header.last_offset_delta
            if resume and pos == start and last != anchor:
                walk.tail = Damage(pos, file_size, anchor, anchor,
                                   f"batch at {pos} does not hold offset {anchor} as its "
                                   "index says")
                break
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max_timestamp = header.max_timestamp, last
            if self._bytes_since_index > self._interval and not (pos == start and resume):
                index_entries.append((last, pos, pos + header.size))
                if self.max_timestamp > (time_entries[-1][0] if time_entries else time_floor):
                    time_entries.append((self.max_timestamp, self.offset_of_max_timestamp))
                self._bytes_since_index = 0
            self._bytes_since_index += header.size
        tail = walk.tail
        if resume and (tail is not None or any(d not in trusted for d in found)):
            problem = tail or next(d for d in found if d not in trusted)
            logger.warning("%s: invalid bytes after the last index entry (%s); validating the "
                           "whole segment", self.path, problem.reason)
            return self.recover(resume=False, end_offset=end_offset, torn_tail=torn_tail)
        # Like seal(): the time index ends with the segment's largest timestamp, so a reopen
        # (and retention by age) finds it without reading the segment.
        if self.max_timestamp > (time_entries[-1][0] if time_entries else time_floor):
            time_entries.append((self.max_timestamp, self.offset_of_max_timestamp))
        truncated = 0
        if tail is not None and torn_tail:
            truncated = file_size - tail.position
        elif tail is not None:
            found.append(tail)
        if resume:
            modified = bool(index_entries or time_entries)
            for offset, position, end in index_entries:
                self.index.append(offset, position, end)
            for timestamp, offset in time_entries:
                self.time_index.maybe_append(timestamp, offset)
        else:
            modified = self.index.replace(index_entries) or bool(truncated)
            if time_entries != self.time_index.entries():
                self.time_index.rewrite(time_entries)
                modified = True
        if truncated:
            assert tail is not None
            logger.warning(
                "%s: truncated %d bytes at position %d (next offset %d): %s",
                self.path, truncated, tail.position, tail.start_offset, tail.reason)
            os.ftruncate(self.fd, tail.position)
            self.size, self.next_offset = tail.position, tail.start_offset
        elif tail is not None:
            self.size, self.next_offset = file_size, tail.end_offset
        else:
            self.size, self.next_offset = walk.end, walk.next_offset
        damage = tuple(sorted([*carried, *found], key=lambda d: (d.position, d.start_offset)))
        for d in damage:
            if d not in known:
                logger.warning("%s: damaged: %s; every valid batch around it is kept, reads of "
                               "it fail until `tq log repair`", self.path, d.describe())
        if damage != known:
            self.set_damage(damage)
            modified = True
        return modified

    def set_damage(self, damage: Sequence[Damage]) -> None:
        """Replace the damaged ranges and their file (the caller syncs the directory)."""
        save_damage(self.damage_path, damage)
        self.damage = tuple(damage)

    def truncate_to(self, offset: int) -> None:
        """Cut the segment before the batch holding `offset` (so it ends at that batch's base
        offset, like Kafka's LogSegment.truncateTo), or before the damaged range holding it."""
        if offset >= self.next_offset:
            return
        damaged = self.damage_holding(offset)
        if damaged is not None:
            pos, cut = damaged.position, damaged.start_offset
        else:
            found = self.find_batch(self.fd, offset, self.size)
            if found is None:
                return
            pos, cut = found.position, found.base_offset
        if self.damage:
            self.set_damage([d for d in self.damage if d.end_offset <= cut])
        self.index.truncate_to_position(pos)
        self.time_index.truncate_to_offset(cut)
        os.ftruncate(self.fd, pos)
        os.fsync(self.fd)
        self.recover(resume=True)

    # ---- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the three files. The caller holds PartitionLog's lock so no reader dups a
        closed descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.index.close()
        self.time_index.close()

    def delete(self) -> None:
        """Close and remove the files (with any quarantined bytes of it), the .log first: a
        crash in between leaves only stray indexes, which opening removes, never a log without
        its place in the offset order."""
        self.close()
        for path in [*self.file_paths(), *self.quarantine_paths()]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
