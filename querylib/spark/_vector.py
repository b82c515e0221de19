"""The regular case of `_columns`, decoded by Arrow kernels instead of a Python loop per field.

Most batches tq reads look alike: uncompressed, varints of at most 2 bytes, and per record no
headers or exactly the one `tq.time` header tq writes. For a buffer of such batches, Python
only walks the chain of record lengths (one table lookup and an append per record); every
field is then computed for all records at once with `pyarrow.compute` over a uint8 view of the
buffer: varints from gathered bytes, positions by addition, values and header values copied
out by the spans trick of `_columns`, tq.time turned into int64 by a byte swap.

Anything else (a 3-byte varint, other headers, a length that does not fit its record) makes
`vector_batch` return None, and the caller decodes those batches with the general loop of
`_columns`, which also names what is wrong with malformed bytes. No I/O here.
"""

from __future__ import annotations

import sys
from array import array

import pyarrow as pa
import pyarrow.compute as pc

from querylib.records import HEADER_SIZE, TIME_HEADER, BatchHeader
from querylib.spark._schema import HEADERS_TYPE, arrow_schema

__all__ = ["vector_batch"]

_LOG_APPEND_TIME_BIT = 0x08
_TIME_PREFIX = b"\x02\x0e" + TIME_HEADER.encode() + b"\x10"  # count 1, key 7 bytes, value 8
_TIME_TAIL = len(_TIME_PREFIX) + 8
_MIN_RECORD = 6  # attributes, timestampDelta, offsetDelta, keyLength, valueLength, headersCount
_UNZ = tuple((z >> 1) ^ -(z & 1) for z in range(128))
_UNZ2 = tuple(
    tuple((((c << 7) | (b & 0x7F)) >> 1) ^ -(((c << 7) | (b & 0x7F)) & 1) for b in range(256))
    for c in range(128)
)
_I64 = pa.int64()
_UTC_MS = pa.timestamp("ms", tz="UTC")
_UTC_US = pa.timestamp("us", tz="UTC")


class _Irregular(Exception):
    """Not the regular shape: decode these batches with the general loop."""


def _arange(n: int) -> pa.Array:
    """0, 1, ..., n-1, built in C (a running sum of ones)."""
    if n == 0:
        return pa.array([], _I64)
    return pc.subtract(pc.cumulative_sum(pa.nulls(n, _I64).fill_null(1)), 1)


def _ones(n: int) -> pa.Array:
    return pa.nulls(n, _I64).fill_null(1)


def _all(mask: pa.Array) -> bool:
    return bool(pc.all(mask).as_py()) if len(mask) else True


class _Bytes:
    """Gathers over one buffer, as int64 arrays."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.size = len(buf)
        self.u8 = pa.Array.from_buffers(pa.uint8(), len(buf), [None, pa.py_buffer(buf)])

    def at(self, positions: pa.Array) -> pa.Array:
        try:
            return pc.take(self.u8, positions).cast(_I64)
        except (pa.ArrowIndexError, IndexError) as exc:
            raise _Irregular from exc

    def varint(self, positions: pa.Array) -> tuple[pa.Array, pa.Array]:
        """Zigzag varints of 1 or 2 bytes at `positions`: (values, widths). A varint is never
        a record's last byte, so the byte after one is always in the buffer."""
        b0 = self.at(positions)
        two = pc.greater_equal(b0, 128)
        if not pc.any(two).as_py():  # all 1 byte: the common case of most fields
            z = b0
            widths = _ones(len(b0))
        else:
            b1 = self.at(pc.add(positions, 1))
            if pc.any(pc.and_(two, pc.greater_equal(b1, 128))).as_py():
                raise _Irregular
            z = pc.if_else(two, pc.bit_wise_or(pc.bit_wise_and(b0, 127), pc.shift_left(b1, 7)),
                           b0)
            widths = pc.add(two.cast(_I64), 1)
        values = pc.bit_wise_xor(pc.shift_right(z, 1), pc.negate(pc.bit_wise_and(z, 1)))
        return values, widths

    def spans(self, starts: pa.Array, stops: pa.Array) -> pa.Array:
        """binary values buf[starts[i]:stops[i]] (ascending, non-overlapping), copied in C."""
        n = len(starts)
        if n == 0:
            return pa.array([], pa.binary())
        i = _arange(2 * n)
        order = pc.add(pc.shift_right(i, 1), pc.multiply(pc.bit_wise_and(i, 1), n))
        offsets = pc.take(pa.concat_arrays([starts, stops]), order)
        interleaved = pa.Array.from_buffers(pa.large_binary(), 2 * n - 1,
                                            [None, offsets.buffers()[1], pa.py_buffer(self.buf)],
                                            offset=0)
        even = pc.multiply(_arange(n), 2)
        return pc.take(interleaved, even).cast(pa.binary())


def _per_record(values: list[int], run_ends: pa.Array, type_: pa.DataType) -> pa.Array:
    """One value per batch, repeated for each record of the batch."""
    encoded = pa.RunEndEncodedArray.from_arrays(run_ends, pa.array(values, type_))
    return pc.run_end_decode(encoded)


def _walk(buf: bytes, batches: list[tuple[int, BatchHeader]]) -> list[int]:
    """The start of every record: the one part that is a chain. Records of one size come in
    runs (same value size, same varint widths), so after each record the walk gallops: the
    length prefixes of the next candidates, one stride apart, are compared in C (a strided
    slice and lstrip); every candidate before the first mismatch is a record of that size."""
    starts: list[int] = []
    unz, unz2 = _UNZ, _UNZ2
    try:
        for pos, header in batches:
            limit = pos + header.size
            p = pos + HEADER_SIZE
            left = header.records_count
            while left > 0:
                b = buf[p]
                if b < 0x80:
                    size = 1 + unz[b]
                    second = -1
                else:
                    second = buf[p + 1]
                    if second >= 0x80:
                        raise _Irregular
                    size = 2 + unz2[second][b]
                if size < _MIN_RECORD + 1:
                    raise _Irregular
                first = buf[p:p + 1]
                same = 1
                window = 8
                while same < left:
                    q = p + same * size
                    n = min(window, left - same)
                    firsts = buf[q:q + n * size:size]
                    m = len(firsts) - len(firsts.lstrip(first))
                    if second >= 0 and m:
                        seconds = buf[q + 1:q + 1 + m * size:size]
                        m = min(m, len(seconds) - len(seconds.lstrip(bytes((second,)))))
                    same += m
                    if m < n:
                        break
                    window *= 4
                starts.extend(range(p, p + same * size, size))
                p += same * size
                left -= same
            if p != limit:
                raise _Irregular
    except IndexError as exc:
        raise _Irregular from exc
    return starts


def vector_batch(buf: bytes, batches: list[tuple[int, BatchHeader]], topic: str,
                 partition: int, start: int, stop: int,
                 include_headers: bool) -> pa.RecordBatch | None:
    """The rows of `batches` (uncompressed data batches in buf, CRC-checked) with offsets in
    [start, stop), or None when they are not all of the regular shape."""
    try:
        return _decode(buf, batches, topic, partition, start, stop, include_headers)
    except _Irregular:
        return None


def _decode(buf: bytes, batches: list[tuple[int, BatchHeader]], topic: str, partition: int,
            start: int, stop: int, include_headers: bool) -> pa.RecordBatch | None:
    data = _Bytes(buf)
    starts = _int64s(_walk(buf, batches))
    n = len(starts)
    if n == 0:
        return _empty(include_headers)
    counts = [h.records_count for _, h in batches]
    run_ends = pa.array(_cumulative([c for c in counts if c]), pa.int32())
    nonempty = [h for (_, h), c in zip(batches, counts, strict=True) if c]
    base = _per_record([h.base_offset for h in nonempty], run_ends, _I64)
    base_ts = _per_record([h.base_timestamp for h in nonempty], run_ends, _I64)

    length, width = data.varint(starts)
    end = pc.add(pc.add(starts, width), length)
    ok = pc.greater_equal(length, _MIN_RECORD)
    p = pc.add(pc.add(starts, width), 1)  # past the attributes
    ts_delta, width = data.varint(p)
    p = pc.add(p, width)
    offset_delta, width = data.varint(p)
    p = pc.add(p, width)
    key_length, width = data.varint(p)
    key_start = pc.add(p, width)
    key_end = pc.add(key_start, pc.max_element_wise(key_length, 0))
    value_length, width = data.varint(key_end)
    value_start = pc.add(key_end, width)
    value_end = pc.add(value_start, pc.max_element_wise(value_length, 0))
    tail = pc.subtract(end, value_end)  # headersCount and headers
    for check in (pc.greater_equal(key_length, -1), pc.greater_equal(value_length, -1),
                  pc.less(value_end, end)):
        ok = pc.and_(ok, check)
    if not _all(ok):
        raise _Irregular
    no_headers = pc.and_(pc.equal(tail, 1), pc.equal(data.at(value_end), 0))
    with_time = pc.equal(tail, _TIME_TAIL)
    has_time = pa.array([], pa.bool_())
    if pc.any(with_time).as_py():
        prefix = data.spans(pc.filter(value_end, with_time),
                            pc.add(pc.filter(value_end, with_time), len(_TIME_PREFIX)))
        if not _all(pc.equal(prefix, pa.scalar(_TIME_PREFIX, pa.binary()))):
            raise _Irregular
        has_time = with_time
    if not _all(pc.or_(no_headers, with_time)):
        raise _Irregular

    offsets = pc.add(base, offset_delta)
    timestamps = pc.add(base_ts, ts_delta)
    if any(h.attributes & _LOG_APPEND_TIME_BIT for h in nonempty):
        log_append = _per_record([bool(h.attributes & _LOG_APPEND_TIME_BIT) for h in nonempty],
                                 run_ends, pa.bool_())
        max_ts = _per_record([h.max_timestamp for h in nonempty], run_ends, _I64)
        timestamps = pc.if_else(log_append, max_ts, timestamps)
        ts_types = log_append.cast(pa.int32())
    else:
        ts_types = pa.nulls(n, pa.int32()).fill_null(0)

    keep = pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, stop))
    if not _all(keep):
        def only(a: pa.Array) -> pa.Array:
            return pc.filter(a, keep)
        offsets, timestamps, ts_types = only(offsets), only(timestamps), only(ts_types)
        key_length, key_start, key_end = only(key_length), only(key_start), only(key_end)
        value_length, value_start, value_end = (only(value_length), only(value_start),
                                                only(value_end))
        if len(has_time):
            has_time = only(has_time)
        n = len(offsets)
        if n == 0:
            return _empty(include_headers)

    values = _nullable(data.spans(value_start, value_end), pc.equal(value_length, -1))
    key_null = pc.equal(key_length, -1)
    keys = (pa.nulls(n, pa.binary()) if _all(key_null)
            else _nullable(data.spans(key_start, key_end), key_null))
    time_values, times = _times(data, value_end, has_time, n)
    columns = [
        keys, values,
        pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()).fill_null(0),
                                       pa.array([topic])).dictionary_decode(),
        pa.nulls(n, pa.int32()).fill_null(partition),
        offsets,
        timestamps.cast(_UTC_MS).cast(_UTC_US),
        ts_types,
        times,
    ]
    if include_headers:
        columns.insert(7, _headers(time_values, has_time, n))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def _empty(include_headers: bool) -> pa.RecordBatch:
    schema = arrow_schema(include_headers)
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def _int64s(values: list[int]) -> pa.Array:
    """A list of ints as an int64 array, converted by array.array in C."""
    packed = array("q", values)
    return pa.Array.from_buffers(_I64, len(packed), [None, pa.py_buffer(packed)])


def _cumulative(counts: list[int]) -> list[int]:
    out = []
    total = 0
    for c in counts:
        total += c
        out.append(total)
    return out


def _nullable(values: pa.Array, null: pa.Array) -> pa.Array:
    if not pc.any(null).as_py():
        return values
    return pc.if_else(null, pa.scalar(None, values.type), values)


def _times(data: _Bytes, value_end: pa.Array, has_time: pa.Array,
           n: int) -> tuple[pa.Array, pa.Array]:
    """(tq.time header values as binary, tq_time as int64 with nulls) of the records."""
    if not len(has_time) or not pc.any(has_time).as_py():
        return pa.array([], pa.binary()), pa.nulls(n, _I64)
    at = pc.add(pc.filter(value_end, has_time), len(_TIME_PREFIX))
    raw = data.spans(at, pc.add(at, 8))
    ints = array("q")
    ints.frombytes(raw.buffers()[2].to_pybytes()[:8 * len(raw)])
    if sys.byteorder == "little":
        ints.byteswap()
    present = pa.Array.from_buffers(_I64, len(ints), [None, pa.py_buffer(ints)])
    if len(present) == n:
        return raw, present
    # Spread over the rows: the k-th true of has_time gets present[k].
    index = pc.subtract(pc.cumulative_sum(has_time.cast(_I64)), 1)
    return raw, pc.if_else(has_time, pc.take(present, pc.max_element_wise(index, 0)),
                           pa.scalar(None, _I64))


def _headers(time_values: pa.Array, has_time: pa.Array, n: int) -> pa.Array:
    """[{"tq.time": value}] for records with the header, null for those without."""
    if not len(time_values):
        return pa.nulls(n, HEADERS_TYPE)
    keys = pa.DictionaryArray.from_arrays(pa.nulls(len(time_values), pa.int32()).fill_null(0),
                                          pa.array([TIME_HEADER])).dictionary_decode()
    items = pa.StructArray.from_arrays([keys, time_values],
                                       fields=list(HEADERS_TYPE.value_type))
    ends = pc.cumulative_sum(has_time.cast(pa.int32()))
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), ends])
    return pa.ListArray.from_arrays(offsets, items, type=HEADERS_TYPE,
                                    mask=pc.invert(has_time))
