"""Record batches to Arrow record batches: the Spark reader's hot path.

`ColumnAssembler` takes buffers of whole RecordBatch v2 batches (a slice of a segment file, or
what a broker sent) and yields `pyarrow.RecordBatch`es of about `rows_per_batch` rows in the
source's Arrow schema (`_schema.arrow_schema`, with or without the headers column). Control
batches (frontiers, end of stream) are not rows. Only offsets in [start, stop) become rows.

Runs of uncompressed batches of the regular shape (varints of up to 5 bytes, no headers or
the lone tq.time header) are decoded by numpy over the whole buffer (`_vector`): the fast
path, about 10x the general one. The general path scans each other uncompressed batch with
the record codec's `querylib.records.scan_records`, which keeps only positions and small ints
(`RecordSpans`); keys, values and header fields never become Python bytes: `_pieces` builds
their Arrow arrays from the buffer itself. Compressed batches are decoded by
`querylib.records.decode_batch` (their bytes are not in the buffer) and laid out the same way.
The record format is not read here: only the Arrow assembly is.

`timestamp` is the record's (milliseconds, Kafka's int64) as microseconds, saturated at the
ends of Spark's timestamp range (int64 microseconds, about +-292,000 years): the codec reads
any int64 timestamp, so every record it decodes is a row.

Hostile bytes raise RecordError subclasses: every batch is CRC-checked and the scan checks
every length against its record. This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator

import crc32c
import pyarrow as pa

from querylib.errors import CorruptRecordError, TruncatedRecordError
from querylib.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_BIT,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    RecordSpans,
    decode_batch,
    read_header,
    scan_records,
)
from querylib.spark._pieces import (
    Columns,
    concat,
    constant,
    headers_column,
    piece_columns,
    shifted,
    spread,
)
from querylib.spark._schema import arrow_schema
from querylib.spark._vector import vector_batch

__all__ = ["ColumnAssembler", "ROWS_PER_BATCH"]

ROWS_PER_BATCH = 64 * 1024
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UTC_MS = pa.timestamp("ms", tz="UTC")
_UTC_US = pa.timestamp("us", tz="UTC")


def micros_column(timestamps: list[int]) -> pa.Array:
    """Record timestamps (ms) as the `timestamp` column: microseconds, saturated at the ends of
    int64 (only timestamps beyond about +-292,000 years are)."""
    try:
        return pa.array(timestamps, _UTC_MS).cast(_UTC_US)
    except pa.ArrowInvalid:  # out of the microsecond range: saturate
        return pa.array([max(_INT64_MIN, min(_INT64_MAX, t * 1000)) for t in timestamps],
                        _UTC_US)


class ColumnAssembler:
    """Decode buffers of whole batches of one topic partition into Arrow record batches."""

    def __init__(self, topic: str, partition: int, start: int, stop: int,
                 rows_per_batch: int = ROWS_PER_BATCH, *, include_headers: bool = True) -> None:
        self.topic = topic
        self.include_headers = include_headers
        self.schema = arrow_schema(include_headers)
        self.partition = partition
        self.start = start
        self.stop = stop
        self.rows_per_batch = max(1, min(rows_per_batch, ROWS_PER_BATCH))
        self.next_offset = start  # past the last offset seen (rows and control records)
        self._reset()

    @property
    def done(self) -> bool:
        """Every offset below `stop` has been seen."""
        return self.next_offset >= self.stop

    def _reset(self) -> None:
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._ts_types: list[list[int]] = []  # [rows, timestampType] runs
        self._pieces: list[Columns] = []
        self._piece: RecordSpans | None = None

    # ---- input ------------------------------------------------------------------------------

    def add(self, buf: bytes | memoryview) -> Iterator[pa.RecordBatch]:
        """Decode every batch in buf (whole batches only); yield each full record batch.
        A memoryview must be of the start of a bytes (as `LocalDir.read` gives): the bytes
        are decoded up to the view's end."""
        pos = 0
        end = len(buf)
        if isinstance(buf, memoryview):
            assert isinstance(buf.obj, bytes) and buf.contiguous
            buf = buf.obj
        plain: list[tuple[int, BatchHeader]] = []  # a run of uncompressed data batches
        while pos < end and not self.done:
            header = read_header(buf, pos)
            size = header.size
            if pos + size > end:
                raise TruncatedRecordError(
                    f"batch at {pos}: {end - pos} bytes left, batchLength says {size}")
            last = header.base_offset + header.last_offset_delta
            if last >= self.start and header.base_offset < self.stop:
                crc = crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + size])
                if crc != header.crc:
                    raise CorruptRecordError(
                        f"batch at offset {header.base_offset}: CRC-32C {crc:#010x}, "
                        f"header says {header.crc:#010x}")
                if not header.attributes & CONTROL_BIT:
                    if header.attributes & COMPRESSION_MASK:
                        yield from self._add_run(buf, plain)
                        plain = []
                        rows_before = len(self._offsets)
                        self._add_decoded(buf, pos)
                        self._count_rows(len(self._offsets) - rows_before, header)
                    else:
                        plain.append((pos, header))
            self.next_offset = max(self.next_offset, last + 1)
            pos += size
        yield from self._add_run(buf, plain)

    def _add_run(self, buf: bytes, plain: list[tuple[int, BatchHeader]]
                 ) -> Iterator[pa.RecordBatch]:
        """Uncompressed batches: by numpy when regular (`_vector`), else by the loop."""
        if not plain:
            return
        batch = vector_batch(buf, plain, self.topic, self.partition, self.start, self.stop,
                             self.include_headers)
        if batch is not None:
            if self._offsets:
                yield self._flush()  # rows before these go first
            for first in range(0, batch.num_rows, self.rows_per_batch):
                yield batch.slice(first, self.rows_per_batch)
            return
        for pos, header in plain:
            rows_before = len(self._offsets)
            self._add_plain(buf, pos, header)
            self._count_rows(len(self._offsets) - rows_before, header)
            if len(self._offsets) >= self.rows_per_batch:
                yield self._flush()

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Yield what is left (nothing if no rows are pending)."""
        if self._offsets:
            yield self._flush()

    def _count_rows(self, rows: int, header: BatchHeader) -> None:
        if not rows:
            return
        log_append = 1 if header.attributes & TIMESTAMP_TYPE_BIT else 0
        if self._ts_types and self._ts_types[-1][1] == log_append:
            self._ts_types[-1][0] += rows
        else:
            self._ts_types.append([rows, log_append])

    def _piece_for(self, buf: bytes) -> RecordSpans:
        piece = self._piece
        if piece is None or piece.buf is not buf:
            self._close_piece()
            piece = self._piece = RecordSpans(buf)
        return piece

    def _close_piece(self) -> None:
        if self._piece is not None and self._piece.rows:
            self._pieces.append(piece_columns(self._piece))
        self._piece = None

    def _add_plain(self, buf: bytes, pos: int, header: BatchHeader) -> None:
        """An uncompressed batch: the codec's scan keeps spans and small ints."""
        scan_records(buf, pos, header, self.start, self.stop, self._piece_for(buf),
                     self._offsets, self._timestamps)

    def _add_decoded(self, buf: bytes, pos: int) -> None:
        """A compressed batch: decode it with the codec, then lay its fields out in a buffer
        of their own so the rest of the path is the same."""
        batch = decode_batch(buf, pos)
        self._close_piece()
        parts: list[bytes] = []
        size = 0
        piece = RecordSpans(b"")
        for record in batch.records:
            if not self.start <= record.offset < self.stop:
                continue
            if record.key is not None:
                piece.key_rows.append(piece.rows)
                piece.keys += (size, size + len(record.key))
                parts.append(record.key)
                size += len(record.key)
            if record.value is None:
                piece.value_nulls.append(piece.rows)
            else:
                piece.values += (size, size + len(record.value))
                parts.append(record.value)
                size += len(record.value)
            if record.headers:
                fields: list[int] = []
                for name, value in record.headers:
                    raw = name.encode()
                    parts.append(raw)
                    fields += (size, size + len(raw))
                    size += len(raw)
                    if value is None:
                        fields += (size, -1)
                    else:
                        parts.append(value)
                        fields += (size, size + len(value))
                        size += len(value)
                piece.general.append((piece.rows, fields))
            self._offsets.append(record.offset)
            self._timestamps.append(record.timestamp)
            piece.rows += 1
        if piece.rows:
            piece.buf = b"".join(parts)
            self._pieces.append(piece_columns(piece))

    # ---- output -----------------------------------------------------------------------------

    def _flush(self) -> pa.RecordBatch:
        self._close_piece()
        pieces = self._pieces
        rows = len(self._offsets)
        columns = [
            concat([c.keys for c in pieces], pa.binary()),
            concat([c.values for c in pieces], pa.binary()),
            constant(self.topic, pa.string(), rows),
            constant(self.partition, pa.int32(), rows),
            pa.array(self._offsets, pa.int64()),
            micros_column(self._timestamps),
            concat([constant(v, pa.int32(), n) for n, v in self._ts_types], pa.int32()),
            spread(concat([c.times for c in pieces], pa.int64()), rows,
                    shifted(pieces, "time_rows")),
        ]
        if self.include_headers:
            columns.insert(7, headers_column(pieces, rows))
        self._reset()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

