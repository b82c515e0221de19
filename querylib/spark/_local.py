"""Read-only access to the partition logs of a data dir, for Spark on the same host.

A data dir holds one directory per partition, `<TopicName.dir_name>-<partition>`, with Kafka
segment files (`<20-digit base offset>.log` and `.index`) as `querylib.log` writes them. This
module reads those files without opening a `PartitionLog`: that would take the log's lock
(held by the broker that owns it) and might recover (write) it. Reads are safe while the owner
appends: the owner writes whole batches and then extends its index, a reader never uses a batch
the file does not hold completely, and an index entry is only a hint, checked against the batch
header it points at. With no cluster to ask, a bare topic name means public/default here,
whatever the default of the cluster whose data dir it is (name other namespaces in full).

Offsets are those on disk now: `offset_range` gives (log start, end of the last whole batch,
or the first record of a Kafka transaction still open there: the last stable offset, as the
broker's readers get).
What a broker has not flushed may already be visible here; what it truncates at recovery may
have been read. A segment removed by retention while a read has it open stays readable (the
open descriptor keeps it); one removed before is DataLossError or, with failOnDataLoss=false,
skipped. Damaged offsets are never skipped: the ranges the broker recorded beside a segment
(`querylib.log.segment_damage`), and any offsets a read cannot get to (bytes that are no batch
before the segment ends, offsets that jump), raise CorruptDataError, as a read through the
broker does. Kafka transactions: `transactions` walks a partition's batch headers once (cached
while its segments do not change) for the open and the aborted ones; reads leave out the
batches of aborted transactions, as the broker does for its subscribers.

Must not: write, lock or rename anything in the data dir.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Generator, Iterator

from catalog import TopicName
from catalog.errors import InvalidTopicNameError, StorageError, UnknownTopicError
from querylib.log import Damage, corrupt_data_error, parse_segment_name, segment_damage
from querylib.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    BatchHeader,
    ControlType,
    control_of,
    decode_batch,
    read_header,
    without_aborted,
)
from querylib.records._types import CONTROL_BIT, TRANSACTIONAL_BIT
from querylib.spark._errors import DataLossError

__all__ = ["LocalDir", "CHUNK_BYTES"]

CHUNK_BYTES = 8 * 1024 * 1024  # bytes read from a segment at a time
_PREFIX = struct.Struct(">qi4xb")  # baseOffset, batchLength, (leader epoch), magic
_LAST_DELTA = struct.Struct(">i")  # lastOffsetDelta, at byte 23 of the header
_LAST_DELTA_AT = 23
_INDEX_ENTRY = struct.Struct(">ii")  # relative (last) offset, position
_MAX_INDEX_BYTES = 64 * 1024 * 1024


class _BatchSpan:
    __slots__ = ("base", "next", "position", "end")

    def __init__(self, base: int, next_offset: int, position: int, end: int) -> None:
        self.base = base
        self.next = next_offset
        self.position = position
        self.end = end


def _batch_at(buf: bytes, pos: int) -> _BatchSpan | None:
    """The whole batch starting at buf[pos], or None when buf does not hold all of it (the
    end of what a writer has written, or of our chunk) or it is not a v2 batch header."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    base, length, magic = _PREFIX.unpack_from(buf, pos)
    if magic != 2 or not HEADER_SIZE - LOG_OVERHEAD <= length <= MAX_BATCH_SIZE:
        return None
    end = pos + LOG_OVERHEAD + length
    if end > len(buf):
        return None
    (delta,) = _LAST_DELTA.unpack_from(buf, pos + _LAST_DELTA_AT)
    return _BatchSpan(base, base + delta + 1, pos, end)


class _Segment:
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
        path = self.path[:-len(".log")] + ".index"
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


def _segments(path: str) -> list[_Segment]:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"{path}: cannot list the partition: {exc}") from exc
    found = []
    for name in names:
        parsed = parse_segment_name(name)
        if parsed is not None and parsed[1] == ".log":
            found.append(_Segment(parsed[0], os.path.join(path, name)))
    return sorted(found, key=lambda s: s.base)


def _pread(fd: int, length: int, position: int) -> bytes:
    parts = []
    while length > 0:
        data = os.pread(fd, length, position)
        if not data:
            break
        parts.append(data)
        length -= len(data)
        position += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class LocalDir:
    """The topics of one data dir, read from their files."""

    def __init__(self, data_dir: str) -> None:
        # partition path -> (its segments' (base, size), its transactions)
        self._txns: dict[str, tuple[list[tuple[int, int]],
                                    tuple[int | None, list[tuple[int, int, int]]]]] = {}
        self.data_dir = os.path.abspath(data_dir)
        if not os.path.isdir(self.data_dir):
            raise StorageError(f"data dir {data_dir} does not exist or is not a directory")

    def topics(self) -> dict[str, int]:
        """Short topic name -> partition count, for every topic with partition directories."""
        counts: dict[str, int] = {}
        for name in os.listdir(self.data_dir):
            try:
                topic, partition = TopicName.parse_partition_dir(name)
            except InvalidTopicNameError:
                continue  # a stray entry (a lock, a metadata file), not a partition
            if os.path.isdir(os.path.join(self.data_dir, name)):
                short = topic.fixed_short
                counts[short] = max(counts.get(short, 0), partition + 1)
        return counts

    def partitions(self, topic: str) -> int:
        """How many partitions `topic` has here; UnknownTopicError when it has none."""
        name = TopicName.parse(topic, fixed=True)
        count = 0
        while os.path.isdir(self._partition_path(name.fixed_short, count)):
            count += 1
        if count == 0:
            raise UnknownTopicError(f"topic {name.fixed_short!r} not found in data dir "
                                    f"{self.data_dir} (no {name.partition_dir(0)} directory)")
        return count

    def _partition_path(self, topic: str, partition: int) -> str:
        return os.path.join(self.data_dir,
                            TopicName.parse(topic, fixed=True).partition_dir(partition))

    def offset_range(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, offset after the last whole batch) of one partition."""
        path = self._partition_path(topic, partition)
        segments = _segments(path)
        if not segments:
            if not os.path.isdir(path):
                raise UnknownTopicError(f"partition {topic}-{partition} not found in data dir "
                                        f"{self.data_dir}")
            return 0, 0
        last = segments[-1]
        end = self._scan_end(last)
        open_first, _ = self.transactions(topic, partition)
        if open_first is not None:
            end = min(end, max(open_first, segments[0].base))
        return segments[0].base, end

    def transactions(self, topic: str, partition: int
                     ) -> tuple[int | None, list[tuple[int, int, int]]]:
        """(first offset of the first Kafka transaction open in the partition, or None; the
        aborted ones as (producer id, first offset, marker offset)), from its batch headers
        and markers. Cached while its segments keep their sizes."""
        path = self._partition_path(topic, partition)
        segments = _segments(path)
        signature = []
        for segment in segments:
            try:
                signature.append((segment.base, os.stat(segment.path).st_size))
            except FileNotFoundError:
                continue
        cached = self._txns.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        opened: dict[int, int] = {}
        aborted: list[tuple[int, int, int]] = []
        for segment in segments:
            for attributes, header, batch in _transactional_batches(segment.path):
                pid = header.producer_id
                if not attributes & CONTROL_BIT:
                    opened.setdefault(pid, header.base_offset)
                    continue
                records = decode_batch(batch, verify_crc=False).records
                kind = control_of(records[0])[0] if records else None
                first = opened.pop(pid, segments[0].base)
                if kind == ControlType.ABORT:
                    aborted.append((pid, first, header.base_offset))
        found = (min(opened.values()) if opened else None, aborted)
        self._txns[path] = (signature, found)
        return found

    def _scan_end(self, segment: _Segment) -> int:
        """The offset after the last whole batch of a segment (its base when empty)."""
        hint = segment.index_hint(2**62)  # before the size: the index trails the log
        try:
            fd = os.open(segment.path, os.O_RDONLY)
        except FileNotFoundError:
            return segment.base  # removed meanwhile: nothing after its base is known
        except OSError as exc:
            raise StorageError(f"{segment.path}: cannot open: {exc}") from exc
        try:
            size = os.fstat(fd).st_size
            found = _walk_to_end(fd, hint, size) if hint else None
            if found is None:
                found = _walk_to_end(fd, 0, size)
            return segment.base if found is None else max(found, segment.base)
        finally:
            os.close(fd)

    def read(self, topic: str, partition: int, start: int, stop: int, *,
             fail_on_data_loss: bool = True,
             chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes | memoryview]:
        """Buffers of whole batches covering offsets [start, stop), in order, from the batch
        holding `start` on. The caller drops offsets outside the range. A buffer is bytes, or
        a memoryview of the start of a bytes (a chunk cut after its last whole batch: not
        copying it saves about a tenth of a read)."""
        _, aborted = self.transactions(topic, partition)
        if not aborted:
            return self._read(topic, partition, start, stop, fail_on_data_loss=fail_on_data_loss,
                              chunk_bytes=chunk_bytes)
        return (without_aborted(bytes(buf), aborted) for buf in self._read(
            topic, partition, start, stop, fail_on_data_loss=fail_on_data_loss,
            chunk_bytes=chunk_bytes))

    def _read(self, topic: str, partition: int, start: int, stop: int, *,
              fail_on_data_loss: bool, chunk_bytes: int) -> Iterator[bytes | memoryview]:
        path = self._partition_path(topic, partition)
        segments = _segments(path)
        if not segments or start < segments[0].base:
            first = segments[0].base if segments else None
            if fail_on_data_loss or first is None:
                raise DataLossError(
                    f"{topic}-{partition}: offset {start} is no longer in the log (it starts "
                    f"at {first}); set failOnDataLoss=false to skip what is gone")
            start = max(start, first)
        next_offset = start
        while next_offset < stop:
            bases = [s.base for s in segments]
            i = bisect_right(bases, next_offset) - 1
            if i < 0:
                raise DataLossError(f"{topic}-{partition}: offset {next_offset} is gone")
            segment = segments[i]
            damaged = next((d for d in segment.damage() if d.holds(next_offset)), None)
            if damaged is not None:
                raise corrupt_data_error(path, segment.path, damaged)
            reached = yield from self._read_segment(segment, next_offset, stop, chunk_bytes)
            if isinstance(reached, Damage):  # offsets jump, where nothing was recorded
                raise corrupt_data_error(path, segment.path, reached)
            if reached >= stop:
                return
            later = [s for s in _segments(path) if s.base > segment.base]
            if reached > next_offset:
                next_offset = reached
            elif later and (reached == segment.base or not os.path.exists(segment.path)):
                next_offset = max(next_offset, later[0].base)  # empty, or gone by retention
            elif later and later[0].base > next_offset:
                # The segment holds bytes up to its end but no batch we can read from here.
                raise corrupt_data_error(path, segment.path, Damage(
                    0, 0, next_offset, later[0].base, "the segment has no readable batch at "
                    f"offset {next_offset} (damaged bytes the broker has not checked yet?)"))
            elif later:
                next_offset = later[0].base
            else:
                raise DataLossError(
                    f"{topic}-{partition}: the log ends at offset {reached}, before {stop} "
                    "that it held when the query was planned (truncated by recovery?)")
            segments = [segment, *later]

    @staticmethod
    def _read_segment(segment: _Segment, offset: int, stop: int,
                      chunk_bytes: int) -> Generator[bytes | memoryview, None, int | Damage]:
        """Yield chunks of whole batches of one segment from the batch holding `offset`, never
        reading into a recorded damaged range; return the offset after the last batch seen
        (`offset` when none), or the offsets found missing where batches jump."""
        try:
            fd = os.open(segment.path, os.O_RDONLY)
        except FileNotFoundError:
            return offset
        except OSError as exc:
            raise StorageError(f"{segment.path}: cannot open: {exc}") from exc
        damage = segment.damage()
        try:
            position = segment.index_hint(offset)
            trust_hint = position > 0
            for d in damage:
                if d.end_offset <= offset and d.end_position > position:
                    position, trust_hint = d.end_position, False
            next_offset = offset
            while next_offset < stop:
                ahead = [d for d in damage if d.position >= position]
                if ahead and ahead[0].position == position:
                    if ahead[0].end_offset > ahead[0].start_offset:
                        return next_offset  # the caller raises for the range
                    position = ahead[0].end_position  # bytes that held no offsets
                    continue
                limit = ahead[0].position - position if ahead else chunk_bytes
                buf = _pread(fd, min(chunk_bytes, limit), position)
                first = _batch_at(buf, 0)
                if first is None and len(buf) == chunk_bytes:
                    length = _batch_length(buf)
                    if length is not None:  # a batch larger than a chunk: read it whole
                        buf = _pread(fd, length, position)
                        first = _batch_at(buf, 0)
                if first is None:
                    if trust_hint and next_offset == offset:
                        # Not a batch start: a stale index entry. Walk from the file's start.
                        position, trust_hint = 0, False
                        continue
                    return next_offset  # the end of the whole batches
                trust_hint = False
                span: _BatchSpan | None = first
                cut = 0
                while span is not None:
                    if span.base > next_offset:
                        if cut:
                            yield memoryview(buf)[:cut]
                        return Damage(position + span.position, position + span.position,
                                      next_offset, span.base, "offsets missing before the "
                                      f"batch at {position + span.position}")
                    cut = span.end
                    next_offset = max(next_offset, span.next)
                    if next_offset >= stop:
                        break
                    span = _batch_at(buf, cut)
                yield buf if cut == len(buf) else memoryview(buf)[:cut]
                position += cut
            return next_offset
        finally:
            os.close(fd)


def _batch_length(buf: bytes) -> int | None:
    """The whole size of the batch whose header starts buf, when plausible."""
    if len(buf) < HEADER_SIZE:
        return None
    _base, length, magic = _PREFIX.unpack_from(buf, 0)
    if magic != 2 or not HEADER_SIZE - LOG_OVERHEAD <= length <= MAX_BATCH_SIZE:
        return None
    return LOG_OVERHEAD + length


def _transactional_batches(path: str) -> Iterator[tuple[int, BatchHeader, bytes]]:
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
            raw = _pread(fd, HEADER_SIZE, position)
            length = _batch_length(raw)
            if length is None or position + length > size:
                return
            header = read_header(raw)
            attributes = header.attributes
            if attributes & TRANSACTIONAL_BIT and header.producer_id >= 0:
                batch = _pread(fd, length, position) if attributes & CONTROL_BIT else b""
                yield attributes, header, batch
            position += length
    finally:
        os.close(fd)


def _walk_to_end(fd: int, position: int, size: int) -> int | None:
    """Walk batch headers from `position` to the end of the whole batches: the offset after
    the last one, or None when there is none there (an empty file, or `position` is not a
    batch start, as after a stale index entry)."""
    next_offset = None
    while position < size:
        header = _pread(fd, HEADER_SIZE, position)
        length = _batch_length(header)
        if length is None or position + length > size:
            break  # not a batch, or one the writer is still appending
        base, _length, _magic = _PREFIX.unpack_from(header, 0)
        (delta,) = _LAST_DELTA.unpack_from(header, _LAST_DELTA_AT)
        next_offset = base + delta + 1
        position += length
    return next_offset
