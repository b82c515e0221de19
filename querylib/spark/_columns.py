"""Record batches to Arrow record batches: the Spark reader's hot path.

`ColumnAssembler` takes buffers of whole RecordBatch v2 batches (a slice of a segment file, or
what a broker sent) and yields `pyarrow.RecordBatch`es of about `rows_per_batch` rows in the
source's Arrow schema (`_schema.arrow_schema`, with or without the headers column). Control
batches (frontiers, end of stream) are not rows. Only offsets in [start, stop) become rows.

Runs of uncompressed batches of the regular shape (short varints, no headers or the lone
tq.time header) are decoded by Arrow kernels (`_vector`): the fast path, about 5x the loop
below. The loop handles everything else, and names what is wrong with malformed bytes.

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

import sys
from array import array
from collections.abc import Iterator

import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from querylib.errors import (
    BadVarintError,
    CorruptRecordError,
    InvalidLengthError,
    InvalidRecordError,
    TruncatedRecordError,
)
from querylib.records import HEADER_SIZE, TIME_HEADER, BatchHeader, decode_batch, read_header
from querylib.spark._schema import HEADERS_TYPE, arrow_schema
from querylib.spark._vector import vector_batch

__all__ = ["ColumnAssembler", "ROWS_PER_BATCH"]

ROWS_PER_BATCH = 64 * 1024
_ATTRIBUTES_OFFSET = 21  # Kafka's layout: the CRC-32C covers attributes..end
_COMPRESSION_MASK = 0x07
_LOG_APPEND_TIME_BIT = 0x08
_CONTROL_BIT = 0x20
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
_EVEN = pa.array(range(0, 2 * ROWS_PER_BATCH, 2), pa.int64())
_COUNTING = pa.array(range(ROWS_PER_BATCH + 1), pa.int32())
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


class _Piece:
    """What the loop keeps for rows whose bytes lie in one buffer. Rows are counted from the
    piece's first row; spans are positions in `buf`."""

    __slots__ = ("buf", "rows", "values", "value_nulls", "keys", "key_rows", "time_pos",
                 "time_rows", "general")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.rows = 0
        self.values: list[int] = []  # s, e per row with a value
        self.value_nulls: list[int] = []  # rows whose value is null
        self.keys: list[int] = []  # s, e per row with a key
        self.key_rows: list[int] = []  # rows that have a key
        self.time_pos: list[int] = []  # where rows with exactly one tq.time header have it
        self.time_rows: list[int] = []
        # rows with other headers: (row, [key start, key end, value start, value end or -1])
        self.general: list[tuple[int, list[int]]] = []


class _Columns:
    """One piece's binary and header columns as Arrow arrays."""

    __slots__ = ("rows", "keys", "values", "header_rows", "header_counts", "hkeys", "hvalues",
                 "time_rows", "times")

    def __init__(self, rows: int, keys: pa.Array, values: pa.Array, header_rows: list[int],
                 header_counts: list[int] | None, hkeys: pa.Array, hvalues: pa.Array,
                 time_rows: list[int], times: pa.Array) -> None:
        self.rows = rows
        self.keys = keys
        self.values = values
        self.header_rows = header_rows  # rows with at least one header
        self.header_counts = header_counts  # their header counts; None when all are 1
        self.hkeys = hkeys
        self.hvalues = hvalues
        self.time_rows = time_rows  # rows with a tq.time header, and their times
        self.times = times


def _spans_array(buf: bytes, spans: list[int]) -> pa.Array:
    """The binary values at spans [s0, e0, s1, e1, ...] of buf, copied out in C."""
    count = len(spans) // 2
    if count == 0:
        return pa.array([], pa.binary())
    interleaved = pa.Array.from_buffers(
        pa.large_binary(), len(spans) - 1,
        [None, pa.py_buffer(array("q", spans)), pa.py_buffer(buf)])
    even = _EVEN if count <= len(_EVEN) else pa.array(range(0, 2 * count, 2), pa.int64())
    return pc.take(interleaved, even.slice(0, count)).cast(pa.binary())


def _spread(values: pa.Array, rows: int, present: list[int]) -> pa.Array:
    """`rows` rows: values[j] at row present[j] (ascending), null elsewhere."""
    if len(present) == rows:
        return values
    if not present:
        return pa.nulls(rows, values.type)
    indices: list[int | None] = [None] * rows
    for j, row in enumerate(present):
        indices[row] = j
    return pc.take(values, pa.array(indices, pa.int64()))


def _without(rows: int, absent: list[int]) -> list[int]:
    """The rows 0..rows-1 not in `absent` (ascending)."""
    skip = set(absent)
    return [row for row in range(rows) if row not in skip]


def _times_column(buf: bytes, time_pos: list[int]) -> tuple[pa.Array, pa.Array]:
    """The 8-byte values of lone tq.time headers at `time_pos`, as binary (the header value)
    and as int64 (tq_time): one join of slices, then a byte swap in C."""
    data = b"".join([buf[p + 10:p + 18] for p in time_pos])
    count = len(time_pos)
    offsets = array("i", range(0, 8 * count + 1, 8))
    binary = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])
    ints = array("q")
    ints.frombytes(data)
    if sys.byteorder == "little":
        ints.byteswap()
    return binary, pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(ints)])


def _piece_columns(piece: _Piece) -> _Columns:
    buf = piece.buf
    rows = piece.rows
    values = _spans_array(buf, piece.values)
    if piece.value_nulls:
        values = _spread(values, rows, _without(rows, piece.value_nulls))
    keys = (pa.nulls(rows, pa.binary()) if not piece.key_rows
            else _spread(_spans_array(buf, piece.keys), rows, piece.key_rows))
    if not piece.general:
        # Only tq.time headers (or none): the keys are one constant, the values 8 bytes each.
        hvalues, times = _times_column(buf, piece.time_pos)
        hkeys = _constant(TIME_HEADER, pa.string(), len(hvalues))
        return _Columns(rows, keys, values, piece.time_rows, None, hkeys, hvalues,
                        piece.time_rows, times)
    return _general_headers(piece, rows, keys, values)


def _general_headers(piece: _Piece, rows: int, keys: pa.Array, values: pa.Array) -> _Columns:
    """Headers other than a lone tq.time: merge both kinds of rows, field by field."""
    buf = piece.buf
    by_row: dict[int, list[int]] = {
        row: [p + 2, p + 9, p + 10, p + 18] for row, p in zip(piece.time_rows, piece.time_pos,
                                                            strict=True)}
    by_row.update(piece.general)
    header_rows = sorted(by_row)
    counts: list[int] = []
    key_spans: list[int] = []
    value_spans: list[int] = []
    value_present: list[int] = []
    time_rows: list[int] = []
    times: list[int] = []
    for row in header_rows:
        fields = by_row[row]
        counts.append(len(fields) // 4)
        for i in range(0, len(fields), 4):
            ks, ke, vs, ve = fields[i:i + 4]
            key_spans += (ks, ke)
            if ve >= 0:
                value_present.append(len(key_spans) // 2 - 1)
                value_spans += (vs, ve)
                if ve - vs == 8 and buf[ks:ke] == _TIME_KEY and (
                        not time_rows or time_rows[-1] != row):
                    time_rows.append(row)
                    times.append(int.from_bytes(buf[vs:ve], "big", signed=True))
    try:
        hkeys = _spans_array(buf, key_spans).cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise InvalidRecordError(f"a header key is not UTF-8: {exc}") from exc
    hvalues = _spread(_spans_array(buf, value_spans), len(key_spans) // 2, value_present)
    return _Columns(rows, keys, values, header_rows, counts, hkeys, hvalues, time_rows,
                    pa.array(times, pa.int64()))


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
        self._pieces: list[_Columns] = []
        self._piece: _Piece | None = None

    # ---- input ------------------------------------------------------------------------------

    def add(self, buf: bytes) -> Iterator[pa.RecordBatch]:
        """Decode every batch in buf (whole batches only); yield each full record batch."""
        pos = 0
        end = len(buf)
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
                if not header.attributes & _CONTROL_BIT:
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
        """Uncompressed batches: by Arrow kernels when regular (`_vector`), else by the loop."""
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

    def _piece_for(self, buf: bytes) -> _Piece:
        piece = self._piece
        if piece is None or piece.buf is not buf:
            self._close_piece()
            piece = self._piece = _Piece(buf)
        return piece

    def _close_piece(self) -> None:
        if self._piece is not None and self._piece.rows:
            self._pieces.append(_piece_columns(self._piece))
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
        piece = _Piece(b"")
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
            self._pieces.append(_piece_columns(piece))

    # ---- output -----------------------------------------------------------------------------

    def _flush(self) -> pa.RecordBatch:
        self._close_piece()
        pieces = self._pieces
        rows = len(self._offsets)
        columns = [
            _concat([c.keys for c in pieces], pa.binary()),
            _concat([c.values for c in pieces], pa.binary()),
            _constant(self.topic, pa.string(), rows),
            _constant(self.partition, pa.int32(), rows),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._timestamps, _UTC_MS).cast(_UTC_US),
            _concat([_constant(v, pa.int32(), n) for n, v in self._ts_types], pa.int32()),
            _spread(_concat([c.times for c in pieces], pa.int64()), rows,
                    _shifted(pieces, "time_rows")),
        ]
        if self.include_headers:
            columns.insert(7, _headers_column(pieces, rows))
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


def _shifted(pieces: list[_Columns], attribute: str) -> list[int]:
    """A row list of every piece, as rows of the whole record batch."""
    if len(pieces) == 1:
        return getattr(pieces[0], attribute)
    out: list[int] = []
    first = 0
    for columns in pieces:
        out += [first + row for row in getattr(columns, attribute)]
        first += columns.rows
    return out


def _headers_column(pieces: list[_Columns], rows: int) -> pa.Array:
    """list<struct<key, value>>, null for records without headers (as Spark's Kafka source
    shows them)."""
    header_rows = _shifted(pieces, "header_rows")
    if not header_rows:
        return pa.nulls(rows, HEADERS_TYPE)
    items = pa.StructArray.from_arrays(
        [_concat([c.hkeys for c in pieces], pa.string()),
         _concat([c.hvalues for c in pieces], pa.binary())],
        fields=list(HEADERS_TYPE.value_type))
    if len(header_rows) == rows and all(c.header_counts is None for c in pieces):
        counting = (_COUNTING.slice(0, rows + 1) if rows < len(_COUNTING)
                    else pa.array(range(rows + 1), pa.int32()))
        return pa.ListArray.from_arrays(counting, items, type=HEADERS_TYPE)
    counts: list[int] = []
    for c in pieces:
        counts += c.header_counts if c.header_counts is not None else [1] * len(c.header_rows)
    ends = [0] * (rows + 1)
    mask = [True] * rows
    total = 0
    k = 0
    for row in range(rows):
        if k < len(header_rows) and header_rows[k] == row:
            total += counts[k]
            k += 1
            mask[row] = False
        ends[row + 1] = total
    return pa.ListArray.from_arrays(pa.array(ends, pa.int32()), items, type=HEADERS_TYPE,
                                    mask=pa.array(mask, pa.bool_()))


def _concat(arrays: list[pa.Array], type_: pa.DataType) -> pa.Array:
    if not arrays:
        return pa.array([], type_)
    if len(arrays) == 1:
        return arrays[0]
    return pa.concat_arrays(arrays)


def _constant(value: object, type_: pa.DataType, rows: int) -> pa.Array:
    """`rows` copies of one value, built in C (a one-entry dictionary, decoded)."""
    if rows == 0:
        return pa.array([], type_)
    indices = pa.nulls(rows, pa.int32()).fill_null(0)
    return pa.DictionaryArray.from_arrays(indices, pa.array([value], type_)).dictionary_decode()
