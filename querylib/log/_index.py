"""Kafka's sparse offset index and time index of one segment, in memory and in their files.

    .index      relativeOffset int32, position int32             (8 bytes an entry, big-endian)
    .timeindex  timestamp int64, relativeOffset int32            (12 bytes an entry)

The files hold exactly their entries: Kafka preallocates and mmaps them but trims them to the
same shape on close, so Kafka's tools read ours. Lookups use the in-memory arrays; the files
are written entry by entry as the segment grows and are only read when a log is opened.
Indexes are derived data: a missing or implausible file is rebuilt from the segment by
recovery, never trusted.

Readers on other threads may look up while the writer appends: the writer appends the second
array of a pair before the first one, and readers bound their search by the first one's length.
Truncation requires that no reader is looking (see PartitionLog's thread-safety notes).
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right

from querylib.records import HEADER_SIZE

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class _EntryFile:
    """An append-only file of fixed-size entries."""

    entry_size: int

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    @staticmethod
    def _open(path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)

    def _read_all(self, max_entries: int) -> bytes | None:
        """The file's bytes, or None when its size is not a whole number of plausible entries."""
        size = os.fstat(self._fd).st_size
        if size % self.entry_size or size > max_entries * self.entry_size:
            return None
        return os.pread(self._fd, size, 0)

    def _write(self, data: bytes) -> None:
        written = os.write(self._fd, data)
        if written != len(data):  # a short write to a regular file means the disk is full
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    def _truncate_entries(self, count: int) -> None:
        os.ftruncate(self._fd, count * self.entry_size)

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _max_entries(log_size: int) -> int:
    # Each entry names a distinct batch start, and a batch is at least a header long.
    return log_size // HEADER_SIZE + 1


def _strictly_increasing(values: array) -> bool:
    return all(a < b for a, b in zip(values, values[1:], strict=False))


class OffsetIndex(_EntryFile):
    """relative offset -> file position of a batch start, one entry per index interval."""

    entry_size = _OFFSET_ENTRY.size

    def __init__(self, path: str, fd: int, base_offset: int) -> None:
        super().__init__(path, fd)
        self.base_offset = base_offset
        self._offsets = array("i")  # relative offsets (last offset of the indexed batch)
        self._positions = array("i")
        # Memory only: where the indexed batch ends (its position when not known, for entries
        # loaded from a file), so a lookup past an entry's offset starts at the next batch
        # instead of re-reading the indexed one: one header read per sequential 1 MiB read.
        self._ends = array("i")

    @classmethod
    def open(cls, path: str, base_offset: int, log_size: int) -> tuple[OffsetIndex, bool]:
        """Open or create the index; True when its entries were loaded and look sane, False
        when it is new or implausible (then emptied) and must be rebuilt."""
        existed = os.path.exists(path)
        index = cls(path, cls._open(path), base_offset)
        if not existed:
            return index, False
        data = index._read_all(_max_entries(log_size))
        if data is None:
            index._truncate_entries(0)
            return index, False
        flat = array("i")
        flat.frombytes(data)
        if sys.byteorder == "little":
            flat.byteswap()
        offsets, positions = flat[0::2], flat[1::2]
        sane = (
            (not offsets or (offsets[0] >= 0 and positions[0] >= 0 and positions[-1] < log_size))
            and _strictly_increasing(offsets)
            and _strictly_increasing(positions)
        )
        if not sane:
            index._truncate_entries(0)
            return index, False
        index._offsets, index._positions, index._ends = offsets, positions, array("i", positions)
        return index, True

    def __len__(self) -> int:
        return len(self._offsets)

    def append(self, offset: int, position: int, end: int) -> None:
        """Index the batch at `position` (ending at `end`) whose last offset is `offset`."""
        self._write(_OFFSET_ENTRY.pack(offset - self.base_offset, position))
        self._ends.append(end)
        self._positions.append(position)
        self._offsets.append(offset - self.base_offset)  # last: readers bound by its length

    def lookup(self, offset: int) -> int:
        """A batch start at or before the batch holding `offset`: the last indexed batch whose
        indexed (last) offset is <= `offset`, or the batch after it when that one ends before
        `offset` (Kafka's lookup, one step further); 0 when no entry is <= `offset`."""
        count = len(self._offsets)
        rel = offset - self.base_offset
        i = bisect_right(self._offsets, rel, 0, count)
        if not i:
            return 0
        return self._positions[i - 1] if self._offsets[i - 1] == rel else self._ends[i - 1]

    def batch_holding(self, offset: int) -> tuple[int, int, int, int] | None:
        """(position, base offset, next offset, end) of the batch holding `offset`, when the
        index alone tells: that batch is indexed with a known end and starts where the indexed
        batch before it ends (offsets are gapless, so its base offset is the offset after that
        one's). None otherwise: the caller reads headers."""
        count = len(self._offsets)
        rel = offset - self.base_offset
        i = bisect_left(self._offsets, rel, 0, count)  # first entry whose last offset >= rel
        if i == 0 or i == count:
            return None
        position, end = self._positions[i], self._ends[i]
        if end == position or self._ends[i - 1] != position:
            return None
        base = self.base_offset
        return position, base + self._offsets[i - 1] + 1, base + self._offsets[i] + 1, end

    def learn(self, position: int, end: int) -> None:
        """A reader read the header of the batch at `position`: remember where it ends if it
        is indexed (entries loaded from a file start without ends). Any thread may call this;
        it only fills in a value that is the same whoever computes it."""
        count = len(self._offsets)
        i = bisect_left(self._positions, position, 0, count)
        if i < count and self._positions[i] == position and self._ends[i] == position:
            self._ends[i] = end

    def end_at(self, position: int) -> int | None:
        """Where the batch starting at `position` ends, when the index knows; else None."""
        count = len(self._offsets)
        i = bisect_left(self._positions, position, 0, count)
        if i < count and self._positions[i] == position and self._ends[i] != position:
            return self._ends[i]
        return None

    def floor_position(self, position: int) -> int:
        """The largest indexed batch start <= `position` (else 0)."""
        count = len(self._offsets)
        i = bisect_right(self._positions, position, 0, count)
        return self._positions[i - 1] if i else 0

    @property
    def last_offset(self) -> int:
        """The offset of the last entry (the last offset of the batch it indexes)."""
        count = len(self._offsets)
        return self.base_offset + self._offsets[count - 1] if count else self.base_offset

    @property
    def last_position(self) -> int:
        return self._positions[len(self._offsets) - 1] if len(self._offsets) else 0

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or after `position` (a batch start the segment is cut at)."""
        keep = bisect_right(self._positions, position - 1, 0, len(self._offsets))
        del self._offsets[keep:]
        del self._positions[keep:]
        del self._ends[keep:]
        self._truncate_entries(keep)

    def entries(self) -> list[tuple[int, int]]:
        """(offset, position) pairs."""
        return [(self.base_offset + o, p) for o, p in zip(self._offsets, self._positions,
                                                          strict=False)]

    def replace(self, entries: list[tuple[int, int, int]]) -> bool:
        """Replace every entry with (offset, position, end) triples; the file is rewritten only
        when its (offset, position) pairs differ. True when it was."""
        differs = [(o, p) for o, p, _ in entries] != self.entries()
        self._offsets = array("i", (o - self.base_offset for o, _, _ in entries))
        self._positions = array("i", (p for _, p, _ in entries))
        self._ends = array("i", (e for _, _, e in entries))
        if differs:
            self._truncate_entries(0)
            self._write(b"".join(
                _OFFSET_ENTRY.pack(o - self.base_offset, p) for o, p, _ in entries))
        return differs


class TimeIndex(_EntryFile):
    """timestamp -> offset: the largest timestamp seen so far and the offset where it was seen,
    recorded when the offset index gets an entry and when the segment is sealed."""

    entry_size = _TIME_ENTRY.size

    def __init__(self, path: str, fd: int, base_offset: int) -> None:
        super().__init__(path, fd)
        self.base_offset = base_offset
        self._timestamps = array("q")
        self._offsets = array("i")  # relative offsets

    @classmethod
    def open(cls, path: str, base_offset: int, log_size: int) -> tuple[TimeIndex, bool]:
        """As OffsetIndex.open."""
        existed = os.path.exists(path)
        index = cls(path, cls._open(path), base_offset)
        if not existed:
            return index, False
        data = index._read_all(_max_entries(log_size) + 1)
        if data is None:
            index._truncate_entries(0)
            return index, False
        pairs = list(_TIME_ENTRY.iter_unpack(data))
        timestamps = array("q", (t for t, _ in pairs))
        offsets = array("i", (o for _, o in pairs))
        sane = (
            (not offsets or offsets[0] >= 0)
            and _strictly_increasing(timestamps)
            and all(a <= b for a, b in zip(offsets, offsets[1:], strict=False))
        )
        if not sane:
            index._truncate_entries(0)
            return index, False
        index._timestamps, index._offsets = timestamps, offsets
        return index, True

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def last_timestamp(self) -> int:
        """The largest timestamp indexed, -1 when none."""
        count = len(self._timestamps)
        return self._timestamps[count - 1] if count else -1

    @property
    def last_offset(self) -> int:
        count = len(self._timestamps)
        return self.base_offset + self._offsets[count - 1] if count else self.base_offset

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Record (timestamp, offset) when the timestamp is larger than every one indexed."""
        if timestamp <= self.last_timestamp:
            return
        self._write(_TIME_ENTRY.pack(timestamp, offset - self.base_offset))
        self._offsets.append(offset - self.base_offset)
        self._timestamps.append(timestamp)

    def lookup(self, timestamp: int) -> int:
        """Offset of the last entry whose timestamp is <= `timestamp` (else the base offset):
        every batch before it has a smaller timestamp."""
        count = len(self._timestamps)
        i = bisect_right(self._timestamps, timestamp, 0, count)
        return self.base_offset + self._offsets[i - 1] if i else self.base_offset

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for offsets >= `offset`."""
        rel = offset - self.base_offset
        keep = len(self._offsets)
        while keep and self._offsets[keep - 1] >= rel:
            keep -= 1
        del self._timestamps[keep:]
        del self._offsets[keep:]
        self._truncate_entries(keep)

    def entries(self) -> list[tuple[int, int]]:
        """(timestamp, offset) pairs."""
        return [(t, self.base_offset + o) for t, o in zip(self._timestamps, self._offsets,
                                                          strict=False)]

    def rewrite(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry with (timestamp, offset) pairs."""
        self._timestamps = array("q", (t for t, _ in entries))
        self._offsets = array("i", (o - self.base_offset for _, o in entries))
        self._truncate_entries(0)
        self._write(b"".join(_TIME_ENTRY.pack(t, o - self.base_offset) for t, o in entries))
