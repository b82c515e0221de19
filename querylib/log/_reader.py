"""Read-only access to a partition directory's segment files, without opening the log.

What reads the files of a log it does not own uses this: Spark's local reads (a data dir on
the same host, while a broker appends) and `tq log dump`. Opening a `PartitionLog` would take
the log's lock (held by the broker that owns it) and might recover (write) it; nothing here
does either. Reads are safe while the owner appends: the owner writes whole batches and then
extends its index, a reader never uses a batch the file does not hold completely, and an index
entry is only a hint, checked against the batch header it points at.

    list_segments(partition_path) -> [SegmentFile]   # by base offset; .damage(), .index_hint()
    pread_exact(fd, length, position) -> bytes         # (from _batch)
    batch_span(buf, pos) -> Span | None                # a whole v2 batch at buf[pos], or None
    batch_size(buf, pos=0) -> int | None               # the size its header claims, if plausible
    walk_to_end(fd, position, size) -> int | None      # offset after the last whole batch
    segment_batches(fd, size) -> SegmentBatch..., Unreadable?   # each batch with its bytes
    transactional_batches(path) -> (attributes, header, marker bytes)...
    transactions(segments) -> (first offset of the first open one, [(pid, first, marker)])

Must not: write, lock or rename anything; trust a length it has not bounded.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from catalog.errors import StorageError
from querylib.errors import RecordError
from querylib.log._batch import Span, describe, pread_exact
from querylib.log._config import INDEX_SUFFIX, LOG_SUFFIX, parse_segment_name
from querylib.log._damage import Damage, segment_damage
from querylib.records import (
    CONTROL_BIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    TRANSACTIONAL_BIT,
    BatchHeader,
    ControlType,
    control_of,
    decode_batch,
    read_header,
)

__all__ = ["SegmentBatch", "SegmentFile", "Unreadable", "batch_size", "batch_span",
           "list_segments", "segment_batches", "transactional_batches", "transactions",
           "walk_to_end"]

_PREFIX = struct.Struct(">qi4xb")  # baseOffset, batchLength, (leader epoch), magic
_LAST_DELTA = struct.Struct(">i")  # lastOffsetDelta, at byte 23 of the header
_LAST_DELTA_AT = 23
_INDEX_ENTRY = struct.Struct(">ii")  # relative (last) offset, position
_MAX_INDEX_BYTES = 64 * 1024 * 1024
_BLOCK = 8 * 1024 * 1024  # what segment_batches reads at a time


class SegmentFile:
    """One `.log` file of a partition directory, by its base offset."""

    __slots__ = ("base", "path", "_damage")

    def __init__(self, base: int, path: str) -> None:
        self.base = base
        self.path = path
        self._damage: tuple[Damage, ...] | None = None

    def damage(self) -> tuple[Damage, ...]:
        """The damaged ranges the broker recorded for this segment."""
        if self._damage is None:
            self._damage = segment_damage(self.path)
        return self._damage

    def index_hint(self, offset: int) -> int:
        """A file position at or before the batch holding `offset`, from the `.index` file
        (entries: the last offset of a batch, relative, and its position); 0 without one."""
        path = self.path[:-len(LOG_SUFFIX)] + INDEX_SUFFIX
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_INDEX_BYTES)
        except OSError:
            return 0
        flat = array("i")
        flat.frombytes(data[:len(data) - len(data) % _INDEX_ENTRY.size])
        if sys.byteorder == "little":
            flat.byteswap()
        keys = flat[0::2]
        i = bisect_right(keys, offset - self.base)
        # The entry with the largest last offset <= offset: its batch ends at or before it.
        return max(0, flat[2 * i - 1]) if i else 0


def list_segments(path: str) -> list[SegmentFile]:
    """The `.log` segments of a partition directory by base offset; [] when it is missing."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"{path}: cannot list the partition: {exc}") from exc
    found = []
    for name in names:
        parsed = parse_segment_name(name)
        if parsed is not None and parsed[1] == LOG_SUFFIX:
            found.append(SegmentFile(parsed[0], os.path.join(path, name)))
    return sorted(found, key=lambda s: s.base)


def batch_size(buf: bytes | memoryview, pos: int = 0) -> int | None:
    """The whole size of the batch whose header starts at buf[pos], when buf holds its
    header and it is a plausible v2 header (the bytes after it are not looked at)."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    _base, length, magic = _PREFIX.unpack_from(buf, pos)
    if magic != 2 or not HEADER_SIZE - LOG_OVERHEAD <= length <= MAX_BATCH_SIZE:
        return None
    return LOG_OVERHEAD + length


def batch_span(buf: bytes | memoryview, pos: int) -> Span | None:
    """The whole batch starting at buf[pos], or None when buf does not hold all of it (the
    end of what a writer has written, or of a chunk) or it is not a v2 batch header."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    base, length, magic = _PREFIX.unpack_from(buf, pos)
    if magic != 2 or not HEADER_SIZE - LOG_OVERHEAD <= length <= MAX_BATCH_SIZE:
        return None
    size = LOG_OVERHEAD + length
    if pos + size > len(buf):
        return None
    (delta,) = _LAST_DELTA.unpack_from(buf, pos + _LAST_DELTA_AT)
    return Span(pos, base, base + delta + 1, size)


def walk_to_end(fd: int, position: int, size: int) -> int | None:
    """Walk batch headers from `position` to the end of the whole batches: the offset after
    the last one, or None when there is none there (an empty file, or `position` is not a
    batch start, as after a stale index entry)."""
    next_offset = None
    while position < size:
        header = pread_exact(fd, HEADER_SIZE, position)
        length = batch_size(header)
        if length is None or position + length > size:
            break  # not a batch, or one the writer is still appending
        base, _length, _magic = _PREFIX.unpack_from(header, 0)
        (delta,) = _LAST_DELTA.unpack_from(header, _LAST_DELTA_AT)
        next_offset = base + delta + 1
        position += length
    return next_offset


class SegmentBatch(NamedTuple):
    """A whole batch of a segment file: where it starts, its header, its bytes."""

    position: int
    header: BatchHeader
    data: memoryview


class Unreadable(NamedTuple):
    """Bytes from `position` on that are no whole batch, and why."""

    position: int
    reason: str


def segment_batches(fd: int, size: int, position: int = 0
                    ) -> Iterator[SegmentBatch | Unreadable]:
    """Each batch of the first `size` bytes of an open segment file from `position`, read a
    block at a time; the last item is Unreadable when bytes before `size` are no whole batch
    (then nothing after them is read). CRCs and records are not checked."""
    block, block_pos = b"", position
    while position < size:
        if position - block_pos + HEADER_SIZE > len(block):
            block, block_pos = pread_exact(fd, min(_BLOCK, size - position), position), position
        try:
            header = read_header(block, position - block_pos)
        except RecordError as exc:
            yield Unreadable(position, describe(exc))
            return
        if position + header.size > size:
            yield Unreadable(position, f"batch of {header.size} bytes cut short by the end")
            return
        if position - block_pos + header.size > len(block):
            block, block_pos = pread_exact(
                fd, max(header.size, min(_BLOCK, size - position)), position), position
        at = position - block_pos
        yield SegmentBatch(position, header, memoryview(block)[at:at + header.size])
        position += header.size


def transactional_batches(path: str) -> Iterator[tuple[int, BatchHeader, bytes]]:
    """(attributes, header, batch bytes for a marker else b"") of each transactional batch of a
    segment file with a producer id, in order, up to the end of its whole batches."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"{path}: cannot open: {exc}") from exc
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position < size:
            raw = pread_exact(fd, HEADER_SIZE, position)
            length = batch_size(raw)
            if length is None or position + length > size:
                return
            header = read_header(raw)
            attributes = header.attributes
            if attributes & TRANSACTIONAL_BIT and header.producer_id >= 0:
                batch = pread_exact(fd, length, position) if attributes & CONTROL_BIT else b""
                yield attributes, header, batch
            position += length
    finally:
        os.close(fd)


def transactions(segments: Sequence[SegmentFile]
                 ) -> tuple[int | None, list[tuple[int, int, int]]]:
    """(first offset of the first Kafka transaction open in these segments of a partition, or
    None; the aborted ones as (producer id, first offset, marker offset)), from their batch
    headers and markers, walked once."""
    opened: dict[int, int] = {}
    aborted: list[tuple[int, int, int]] = []
    for segment in segments:
        for attributes, header, batch in transactional_batches(segment.path):
            pid = header.producer_id
            if not attributes & CONTROL_BIT:
                opened.setdefault(pid, header.base_offset)
                continue
            records = decode_batch(batch, verify_crc=False).records
            kind = control_of(records[0])[0] if records else None
            first = opened.pop(pid, segments[0].base)
            if kind == ControlType.ABORT:
                aborted.append((pid, first, header.base_offset))
    return (min(opened.values()) if opened else None), aborted
