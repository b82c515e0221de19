"""Read-only access to the partition logs of a data dir, for Spark on the same host.

A data dir holds one directory per partition, `<TopicName.dir_name>-<partition>`, with Kafka
segment files (`<20-digit base offset>.log` and `.index`) as `querylib.log` writes them. This
module reads those files through the log's read-only segment reader (`querylib.log`'s
`list_segments`, `batch_span`, `walk_to_end`, `transactions`, shared with `tq log dump`),
without opening a `PartitionLog`: that would take the log's lock (held by the broker that owns
it) and might recover (write) it. Reads are safe while the owner appends (see that reader);
this module adds topics, offset ranges, chunked reads and their data-loss and damage rules.
With no cluster to ask, a bare topic name means public/default here,
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
from bisect import bisect_right
from collections.abc import Generator

from catalog import TopicName
from catalog.errors import InvalidTopicNameError, StorageError, UnknownTopicError
from querylib.log import (
    Damage,
    SegmentFile,
    Span,
    batch_size,
    batch_span,
    corrupt_data_error,
    list_segments,
    pread_exact,
    transactions,
    walk_to_end,
)
from querylib.records import without_aborted
from querylib.spark._errors import DataLossError

__all__ = ["LocalDir", "CHUNK_BYTES"]

CHUNK_BYTES = 8 * 1024 * 1024  # bytes read from a segment at a time


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
        segments = list_segments(path)
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
        segments = list_segments(path)
        signature = []
        for segment in segments:
            try:
                signature.append((segment.base, os.stat(segment.path).st_size))
            except FileNotFoundError:
                continue
        cached = self._txns.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        found = transactions(segments)
        self._txns[path] = (signature, found)
        return found

    def _scan_end(self, segment: SegmentFile) -> int:
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
            found = walk_to_end(fd, hint, size) if hint else None
            if found is None:
                found = walk_to_end(fd, 0, size)
            return segment.base if found is None else max(found, segment.base)
        finally:
            os.close(fd)

    def read(self, topic: str, partition: int, start: int, stop: int, *,
             fail_on_data_loss: bool = True,
             chunk_bytes: int = CHUNK_BYTES) -> Generator[bytes | memoryview, None, None]:
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
              fail_on_data_loss: bool, chunk_bytes: int
              ) -> Generator[bytes | memoryview, None, None]:
        path = self._partition_path(topic, partition)
        segments = list_segments(path)
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
            later = [s for s in list_segments(path) if s.base > segment.base]
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
    def _read_segment(segment: SegmentFile, offset: int, stop: int,
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
                buf = pread_exact(fd, min(chunk_bytes, limit), position)
                first = batch_span(buf, 0)
                if first is None and len(buf) == chunk_bytes:
                    length = batch_size(buf)
                    if length is not None:  # a batch larger than a chunk: read it whole
                        buf = pread_exact(fd, length, position)
                        first = batch_span(buf, 0)
                if first is None:
                    if trust_hint and next_offset == offset:
                        # Not a batch start: a stale index entry. Walk from the file's start.
                        position, trust_hint = 0, False
                        continue
                    return next_offset  # the end of the whole batches
                trust_hint = False
                span: Span | None = first
                cut = 0
                while span is not None:
                    if span.base_offset > next_offset:
                        if cut:
                            yield memoryview(buf)[:cut]
                        return Damage(position + span.position, position + span.position,
                                      next_offset, span.base_offset, "offsets missing before the "
                                      f"batch at {position + span.position}")
                    cut = span.position + span.size
                    next_offset = max(next_offset, span.next_offset)
                    if next_offset >= stop:
                        break
                    span = batch_span(buf, cut)
                yield buf if cut == len(buf) else memoryview(buf)[:cut]
                position += cut
            return next_offset
        finally:
            os.close(fd)

