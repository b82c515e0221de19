"""How what the codec's scan keeps per buffer (`querylib.records.RecordSpans`, positions of
keys, values and headers) becomes Arrow columns (`Columns`, then the record batch's key, value,
headers and tq_time): the general path of `_columns`.

Binary columns are copied out of the buffer by the spans trick: the positions
[s0, e0, s1, e1, ...] are the offsets of a binary array whose even elements are the values (odd
ones are the bytes between them), and one `take` of the even elements copies them out in C.
Pure functions over buffers and lists; no I/O.
"""

from __future__ import annotations

import sys
from array import array

import pyarrow as pa
import pyarrow.compute as pc

from querylib.errors import InvalidRecordError
from querylib.records import TIME_HEADER, TIME_HEADER_PREFIX, RecordSpans
from querylib.spark._schema import HEADERS_TYPE

__all__ = ["Columns", "concat", "constant", "headers_column", "piece_columns",
           "shifted", "spread"]

ROWS_PER_BATCH = 64 * 1024
_TIME_KEY = TIME_HEADER.encode()
# In a lone tq.time header at p (TIME_HEADER_PREFIX, then the value): its key and its value.
_TIME_KEY_AT = 2  # after headersCount and headerKeyLength
_TIME_VALUE_AT = len(TIME_HEADER_PREFIX)
_EVEN = pa.array(range(0, 2 * ROWS_PER_BATCH, 2), pa.int64())
_COUNTING = pa.array(range(ROWS_PER_BATCH + 1), pa.int32())


class Columns:
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


def spans_array(buf: bytes, spans: list[int]) -> pa.Array:
    """The binary values at spans [s0, e0, s1, e1, ...] of buf, copied out in C."""
    count = len(spans) // 2
    if count == 0:
        return pa.array([], pa.binary())
    interleaved = pa.Array.from_buffers(
        pa.large_binary(), len(spans) - 1,
        [None, pa.py_buffer(array("q", spans)), pa.py_buffer(buf)])
    even = _EVEN if count <= len(_EVEN) else pa.array(range(0, 2 * count, 2), pa.int64())
    return pc.take(interleaved, even.slice(0, count)).cast(pa.binary())


def spread(values: pa.Array, rows: int, present: list[int]) -> pa.Array:
    """`rows` rows: values[j] at row present[j] (ascending), null elsewhere."""
    if len(present) == rows:
        return values
    if not present:
        return pa.nulls(rows, values.type)
    indices: list[int | None] = [None] * rows
    for j, row in enumerate(present):
        indices[row] = j
    return pc.take(values, pa.array(indices, pa.int64()))


def without(rows: int, absent: list[int]) -> list[int]:
    """The rows 0..rows-1 not in `absent` (ascending)."""
    skip = set(absent)
    return [row for row in range(rows) if row not in skip]


def times_column(buf: bytes, time_pos: list[int]) -> tuple[pa.Array, pa.Array]:
    """The 8-byte values of lone tq.time headers at `time_pos`, as binary (the header value)
    and as int64 (tq_time): one join of slices, then a byte swap in C."""
    data = b"".join([buf[p + _TIME_VALUE_AT:p + _TIME_VALUE_AT + 8] for p in time_pos])
    count = len(time_pos)
    offsets = array("i", range(0, 8 * count + 1, 8))
    binary = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])
    ints = array("q")
    ints.frombytes(data)
    if sys.byteorder == "little":
        ints.byteswap()
    return binary, pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(ints)])


def piece_columns(piece: RecordSpans) -> Columns:
    buf = piece.buf
    rows = piece.rows
    values = spans_array(buf, piece.values)
    if piece.value_nulls:
        values = spread(values, rows, without(rows, piece.value_nulls))
    keys = (pa.nulls(rows, pa.binary()) if not piece.key_rows
            else spread(spans_array(buf, piece.keys), rows, piece.key_rows))
    if not piece.general:
        # Only tq.time headers (or none): the keys are one constant, the values 8 bytes each.
        hvalues, times = times_column(buf, piece.time_pos)
        hkeys = constant(TIME_HEADER, pa.string(), len(hvalues))
        return Columns(rows, keys, values, piece.time_rows, None, hkeys, hvalues,
                        piece.time_rows, times)
    return general_headers(piece, rows, keys, values)


def general_headers(piece: RecordSpans, rows: int, keys: pa.Array, values: pa.Array) -> Columns:
    """Headers other than a lone tq.time: merge both kinds of rows, field by field."""
    buf = piece.buf
    by_row: dict[int, list[int]] = {
        row: [p + _TIME_KEY_AT, p + _TIME_VALUE_AT - 1, p + _TIME_VALUE_AT, p + _TIME_VALUE_AT + 8]
        for row, p in zip(piece.time_rows, piece.time_pos,
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
        hkeys = spans_array(buf, key_spans).cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise InvalidRecordError(f"a header key is not UTF-8: {exc}") from exc
    hvalues = spread(spans_array(buf, value_spans), len(key_spans) // 2, value_present)
    return Columns(rows, keys, values, header_rows, counts, hkeys, hvalues, time_rows,
                    pa.array(times, pa.int64()))


def shifted(pieces: list[Columns], attribute: str) -> list[int]:
    """A row list of every piece, as rows of the whole record batch."""
    if len(pieces) == 1:
        return getattr(pieces[0], attribute)
    out: list[int] = []
    first = 0
    for columns in pieces:
        out += [first + row for row in getattr(columns, attribute)]
        first += columns.rows
    return out


def headers_column(pieces: list[Columns], rows: int) -> pa.Array:
    """list<struct<key, value>>, null for records without headers (as Spark's Kafka source
    shows them)."""
    header_rows = shifted(pieces, "header_rows")
    if not header_rows:
        return pa.nulls(rows, HEADERS_TYPE)
    items = pa.StructArray.from_arrays(
        [concat([c.hkeys for c in pieces], pa.string()),
         concat([c.hvalues for c in pieces], pa.binary())],
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


def concat(arrays: list[pa.Array], type_: pa.DataType) -> pa.Array:
    if not arrays:
        return pa.array([], type_)
    if len(arrays) == 1:
        return arrays[0]
    return pa.concat_arrays(arrays)


def constant(value: object, type_: pa.DataType, rows: int) -> pa.Array:
    """`rows` copies of one value, built in C (a one-entry dictionary, decoded)."""
    if rows == 0:
        return pa.array([], type_)
    indices = pa.nulls(rows, pa.int32()).fill_null(0)
    return pa.DictionaryArray.from_arrays(indices, pa.array([value], type_)).dictionary_decode()
