"""Record batches to Arrow record batches: the Spark reader's hot path.

`ColumnAssembler` takes buffers of whole RecordBatch v2 batches (a slice of a segment file, or
what a broker sent) and yields `pyarrow.RecordBatch`es of about `rows_per_batch` rows in the
source's Arrow schema (`_schema.arrow_schema`, with or without the headers column). Control
batches (frontiers, end of stream) are not rows. Only offsets in [start, stop) become rows.

Runs of uncompressed batches of the regular shape (varints of up to 5 bytes, no headers or
the lone tq.time header) are decoded by numpy over the whole buffer (`_vector`): the fast
path, about 10x the loop below. The loop handles everything else, and names what is wrong with
malformed bytes.

Why the loop looks like this: decoding one `Record` object per record and then transposing
costs about three times what the columns need. It walks each record once and keeps only
positions and small ints in lists; keys, values and header fields never become Python bytes.
Their Arrow arrays are built from the buffer itself: the spans [s0, e0, s1, e1, ...] are the
offsets of a binary array whose even elements are the values (odd ones are the bytes between
them), and one `take` of the even elements copies them out in C. The one header tq writes on
every record (`tq.time`, 8 bytes) is recognised by one comparison and its values are turned
into int64s in C as well. Other headers, and compressed batches (decoded by
`querylib.records.decode_batch`, as their bytes are not in the buffer), take slower paths.

Hostile bytes raise RecordError subclasses: every batch is CRC-checked and every length is
checked against its record before a span is kept. This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator

import crc32c
import pyarrow as pa

from querylib.errors import (
    BadVarintError,
    CorruptRecordError,
    InvalidLengthError,
    InvalidRecordError,
    TruncatedRecordError,
)
from querylib.records import HEADER_SIZE, TIME_HEADER, BatchHeader, decode_batch, read_header
from querylib.records._types import CONTROL_BIT
from querylib.spark._pieces import (
    Columns,
    Piece,
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
_ATTRIBUTES_OFFSET = 21  # Kafka's layout: the CRC-32C covers attributes..end
_COMPRESSION_MASK = 0x07
_LOG_APPEND_TIME_BIT = 0x08
_MIN_RECORD_SIZE = 7
_TIME_KEY = TIME_HEADER.encode()
# headersCount 1, keyLength 7, "tq.time", valueLength 8: then the 8 value bytes end the record.
_TIME_PREFIX = b"\x02\x0e" + _TIME_KEY + b"\x10"
_TIME_RECORD_TAIL = len(_TIME_PREFIX) + 8
# 1-byte zigzag varints by byte; 2-byte ones as _UNZ2[second][first] (first >= 0x80 > second).
_UNZ = tuple((z >> 1) ^ -(z & 1) for z in range(128))
_UNZ2 = tuple(
    tuple((((c << 7) | (b & 0x7F)) >> 1) ^ -(((c << 7) | (b & 0x7F)) & 1) for b in range(256))
    for c in range(128)
)
_UTC_MS = pa.timestamp("ms", tz="UTC")
_UTC_US = pa.timestamp("us", tz="UTC")


def _varlong(buf: bytes, pos: int) -> tuple[int, int]:
    """The general zigzag varint reader (up to 10 bytes): (value, position after it)."""
    z = 0
    shift = 0
    end = min(len(buf), pos + 10)
    p = pos
    while p < end:
        b = buf[p]
        p += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), p
        shift += 7
    raise BadVarintError(f"varint at {pos} is longer than 10 bytes or cut short")


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
        self._piece: Piece | None = None

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
                crc = crc32c.crc32c(memoryview(buf)[pos + _ATTRIBUTES_OFFSET:pos + size])
                if crc != header.crc:
                    raise CorruptRecordError(
                        f"batch at offset {header.base_offset}: CRC-32C {crc:#010x}, "
                        f"header says {header.crc:#010x}")
                if not header.attributes & CONTROL_BIT:
                    if header.attributes & _COMPRESSION_MASK:
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
        log_append = 1 if header.attributes & _LOG_APPEND_TIME_BIT else 0
        if log_append:  # every record carries the batch's maxTimestamp (Kafka's rule)
            self._timestamps[-rows:] = [header.max_timestamp] * rows
        if self._ts_types and self._ts_types[-1][1] == log_append:
            self._ts_types[-1][0] += rows
        else:
            self._ts_types.append([rows, log_append])

    def _piece_for(self, buf: bytes) -> Piece:
        piece = self._piece
        if piece is None or piece.buf is not buf:
            self._close_piece()
            piece = self._piece = Piece(buf)
        return piece

    def _close_piece(self) -> None:
        if self._piece is not None and self._piece.rows:
            self._pieces.append(piece_columns(self._piece))
        self._piece = None

    def _add_plain(self, buf: bytes, pos: int, header: BatchHeader) -> None:  # noqa: C901
        """Walk the records of an uncompressed batch, keeping spans and small ints.

        Deliberately one long function: a call per record or field would cost more than the
        work. Varints of 1 and 2 bytes are read inline through tables, longer ones by
        `_varlong`. `end` is where the current record must end; no span passes it.
        """
        piece = self._piece_for(buf)
        row = piece.rows
        add_offset = self._offsets.append
        add_ts = self._timestamps.append
        add_value = piece.values.append
        add_time_pos = piece.time_pos.append
        add_time_row = piece.time_rows.append
        base = header.base_offset
        base_ts = header.base_timestamp
        lo, hi = self.start, self.stop
        unz, unz2 = _UNZ, _UNZ2
        time_prefix = _TIME_PREFIX
        limit = pos + header.size
        count = header.records_count
        if not 0 <= count <= (header.size - HEADER_SIZE) // _MIN_RECORD_SIZE:
            raise InvalidLengthError(f"batch at offset {base}: recordsCount {count} impossible")
        # A batch wholly inside [lo, hi): its offsets are base + 0..count-1 (the log checks
        # offset deltas 0..n-1 on append, and the CRC holds), so the loop skips them.
        whole = lo <= base and base + count <= hi and header.last_offset_delta == count - 1
        pos += HEADER_SIZE
        try:
            for _ in range(count):
                # length
                b = buf[pos]
                if b < 0x80:
                    p = pos + 1
                    end = p + unz[b]
                else:
                    c = buf[pos + 1]
                    if c < 0x80:
                        p = pos + 2
                        end = p + unz2[c][b]
                    else:
                        length, p = _varlong(buf, pos)
                        end = p + length
                if end > limit or end - p < _MIN_RECORD_SIZE - 1:
                    raise InvalidLengthError(f"record at {pos}: bad length {end - p}")
                # attributes (ignored, as Java does), timestampDelta
                b = buf[p + 1]
                if b < 0x80:
                    ts = base_ts + unz[b]
                    p += 2
                else:
                    c = buf[p + 2]
                    if c < 0x80:
                        ts = base_ts + unz2[c][b]
                        p += 3
                    else:
                        delta, p = _varlong(buf, p + 1)
                        ts = base_ts + delta
                # offsetDelta
                b = buf[p]
                if whole:
                    if b < 0x80:
                        p += 1
                    else:
                        p = _varlong(buf, p)[1]
                else:
                    if b < 0x80:
                        offset = base + unz[b]
                        p += 1
                    else:
                        c = buf[p + 1]
                        if c < 0x80:
                            offset = base + unz2[c][b]
                            p += 2
                        else:
                            delta, p = _varlong(buf, p)
                            offset = base + delta
                    if offset < lo or offset >= hi:
                        pos = end
                        continue
                    add_offset(offset)
                # keyLength, key
                if buf[p] == 1:  # -1: null, the common case
                    p += 1
                else:
                    length, p = _varlong(buf, p)
                    if length < 0 or p + length > end:
                        raise InvalidLengthError(f"record at {pos}: bad key length {length}")
                    piece.key_rows.append(row)
                    piece.keys += (p, p + length)
                    p += length
                # valueLength, value
                b = buf[p]
                if b < 0x80:
                    length = unz[b]
                    p += 1
                else:
                    c = buf[p + 1]
                    if c < 0x80:
                        length = unz2[c][b]
                        p += 2
                    else:
                        length, p = _varlong(buf, p)
                if length >= 0:
                    stop = p + length
                    if stop >= end:
                        raise InvalidLengthError(f"record at {pos}: value runs past its record")
                    add_value(p)
                    add_value(stop)
                    p = stop
                elif length == -1:
                    piece.value_nulls.append(row)
                else:
                    raise InvalidLengthError(f"record at {pos}: bad value length {length}")
                # headers: none, or the lone tq.time header tq writes, are the common cases
                if p + 1 == end and buf[p] == 0:
                    pass
                elif end - p == _TIME_RECORD_TAIL and buf[p:p + 10] == time_prefix:
                    add_time_pos(p)
                    add_time_row(row)
                else:
                    piece.general.append((row, _header_spans(buf, p, end)))
                add_ts(ts)
                row += 1
                pos = end
        except IndexError as exc:
            raise TruncatedRecordError(f"batch at offset {base}: records cut short") from exc
        finally:
            piece.rows = row
        if pos != limit:
            raise InvalidRecordError(f"batch at offset {base}: {limit - pos} bytes after its "
                                     f"{count} records")
        if whole:
            self._offsets.extend(range(base, base + count))

    def _add_decoded(self, buf: bytes, pos: int) -> None:
        """A compressed batch: decode it with the codec, then lay its fields out in a buffer
        of their own so the rest of the path is the same."""
        batch = decode_batch(buf, pos)
        self._close_piece()
        parts: list[bytes] = []
        size = 0
        piece = Piece(b"")
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
            pa.array(self._timestamps, _UTC_MS).cast(_UTC_US),
            concat([constant(v, pa.int32(), n) for n, v in self._ts_types], pa.int32()),
            spread(concat([c.times for c in pieces], pa.int64()), rows,
                    shifted(pieces, "time_rows")),
        ]
        if self.include_headers:
            columns.insert(7, headers_column(pieces, rows))
        self._reset()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _header_spans(buf: bytes, p: int, end: int) -> list[int]:
    """Spans of the headers of the record ending at `end`, from its headersCount at p:
    [key start, key end, value start, value end or -1 for null] per header."""
    count, p = _varlong(buf, p)
    if not 0 <= count <= (end - p) // 2:
        raise InvalidLengthError(f"headersCount {count} impossible in {end - p} bytes")
    fields: list[int] = []
    for _ in range(count):
        length, p = _varlong(buf, p)
        if length < 0 or p + length > end:
            raise InvalidLengthError(f"header key length {length} at {p}")
        fields += (p, p + length)
        length, p = _varlong(buf, p + length)
        if length >= 0:
            if p + length > end:
                raise InvalidLengthError(f"header value length {length} at {p}")
            fields += (p, p + length)
            p += length
        elif length == -1:
            fields += (p, -1)
        else:
            raise InvalidLengthError(f"header value length {length} at {p}")
    if p != end:
        raise InvalidRecordError(f"record ending at {end}: {end - p} bytes after its fields")
    return fields
