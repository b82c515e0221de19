"""The regular case of `_columns`, decoded by numpy over the whole buffer instead of a Python
loop per field.

Most batches tq reads look alike: uncompressed, short varints, and per record no headers or
exactly the one `tq.time` header tq writes. For a buffer of such batches Python only walks the
chain of record lengths a run of records of one size at a time (`querylib.records`' `size_runs`,
shared with the subscribers' fast path: a few steps per run, not per record); every field is
then decoded for many records at once over views of the buffer (no copy): varints by gathers and
shifts of a uint8 view, positions by addition, tq.time by one gather from the overlapping
big-endian int64 at every byte position. Records are decoded 8192 at a time (`_Records`):
numpy's temporaries then stay small and reused, where arrays of a whole chunk each cost fresh
pages, more than the arithmetic on them.

Binary columns are copied by runs (`_binary`): records whose values have one length and lie
one stride apart, most of a batch, are one strided numpy copy, about 5x Arrow's `take` over
the spans (which copies value by value through a builder). A buffer whose values break into
short runs (lengths that vary record by record) uses that `take`: a Python step per run would
cost more.

Anything else (a varint of more than 5 bytes, other headers, a length that does not fit its
record, a timestamp beyond +-2^52 ms) makes `vector_batch` return None, and the caller decodes
those batches with the general path of `_columns`, which also names what is wrong with
malformed bytes. The format's constants (the tq.time header's bytes, attribute bits, sizes)
come from `querylib.records`; only the numpy gathers are written here. No I/O here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from querylib.records import (
    MAX_VARINT_BYTES,
    MIN_RECORD_SIZE,
    TIME_HEADER,
    TIME_HEADER_PREFIX,
    TIME_HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
)
from querylib.records import Irregular as _Irregular
from querylib.records import size_runs as _walk
from querylib.spark._schema import HEADERS_TYPE, arrow_schema

__all__ = ["vector_batch"]

_TIME_PREFIX = TIME_HEADER_PREFIX
_TIME_TAIL = TIME_HEADER_SIZE
# attributes, timestampDelta, offsetDelta, keyLength, valueLength, headersCount
_MIN_RECORD = MIN_RECORD_SIZE - 1
_MAX_VARINT = MAX_VARINT_BYTES  # 34 bits of zigzag value, far beyond any length or delta seen
_TS_LIMIT = 2**52  # ms; base +- a 5-byte delta, times 1000 (to us), stays inside int64
_MAX_BUFFER = 2**31 - 1  # int32 offsets of binary arrays
_SLICE = 8192  # records decoded at a time (see _Records)
_MIN_RUN = 8  # records per strided copy, on average, below which `take` copies the values
# The prefix as two overlapping big-endian words, compared at value_end and value_end + 2.
_PREFIX_HEAD = int.from_bytes(_TIME_PREFIX[:8], "big", signed=True)
_PREFIX_TAIL = int.from_bytes(_TIME_PREFIX[2:], "big", signed=True)
_UTC_US = pa.timestamp("us", tz="UTC")


def vector_batch(buf: bytes, batches: list[tuple[int, BatchHeader]], topic: str,
                 partition: int, start: int, stop: int,
                 include_headers: bool) -> pa.RecordBatch | None:
    """The rows of `batches` (uncompressed data batches in buf, CRC-checked) with offsets in
    [start, stop), or None when they are not all of the regular shape."""
    if len(buf) > _MAX_BUFFER:
        return None
    try:
        return _decode(buf, batches, topic, partition, start, stop, include_headers)
    except (_Irregular, IndexError):  # IndexError: a position past the buffer
        return None


def _starts(firsts: list[int], sizes: list[int], counts: list[int]) -> np.ndarray:
    """Every record's start, from the runs: first + (i - records before the run) * size."""
    count = np.array(counts, np.int64)
    size = np.array(sizes, np.int64)
    run = np.repeat(np.arange(len(counts)), count)
    origin = np.array(firsts, np.int64) - (np.cumsum(count) - count) * size
    return origin[run] + np.arange(len(run), dtype=np.int64) * size[run]


def _varints(u8: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray | int]:
    """Zigzag varints at `pos`: (values, widths). Widths of 1 and 2 bytes, nearly all of
    them, take a shortcut; longer ones (up to _MAX_VARINT bytes) a loop over byte positions.
    A varint is never a record's last byte, so the byte after one is in the buffer."""
    b0 = u8[pos]
    more = b0 >= 0x80
    if not more.any():
        z = b0.astype(np.int64)
        return (z >> 1) ^ -(z & 1), 1
    b1 = u8[pos + 1]
    if (more & (b1 >= 0x80)).any():
        return _long_varints(u8, pos)
    z = (b0 & 0x7F).astype(np.int64)
    z |= (b1 * more).astype(np.int64) << 7
    return (z >> 1) ^ -(z & 1), 1 + more


def _long_varints(u8: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.zeros(len(pos), np.int64)
    width = np.zeros(len(pos), np.int64)
    more = np.ones(len(pos), bool)
    last = len(u8) - 1
    for k in range(_MAX_VARINT):
        at = pos + k
        if (more & (at > last)).any():
            raise _Irregular
        b = u8[np.minimum(at, last)]
        z |= np.where(more, (b & 0x7F).astype(np.int64) << (7 * k), 0)
        width += more
        more &= b >= 0x80
        if not more.any():
            return (z >> 1) ^ -(z & 1), width
    raise _Irregular


class _Records:
    """What the columns need of each record, decoded `_SLICE` records at a time: numpy's
    temporaries then stay small (cache-sized, reused by malloc) instead of fresh pages."""

    def __init__(self, n: int) -> None:
        self.offsets = np.empty(n, np.int64)
        self.timestamps = np.empty(n, np.int64)  # ms, then us
        self.key_start = np.empty(n, np.int64)
        self.key_length = np.empty(n, np.int64)
        self.value_start = np.empty(n, np.int64)
        self.value_length = np.empty(n, np.int64)
        self.value_end = np.empty(n, np.int64)
        self.has_time = np.empty(n, bool)

    def decode(self, u8: np.ndarray, words: np.ndarray, starts: np.ndarray, base: np.ndarray,
               base_ts: np.ndarray, lo: int) -> None:
        """Records lo.. of the buffer, starting at `starts`, of batches with those base
        offsets and base timestamps."""
        hi = lo + len(starts)
        length, width = _varints(u8, starts)
        end = starts + width + length
        p = starts + width + 1  # past the attributes
        ts_delta, width = _varints(u8, p)
        p += width
        offset_delta, width = _varints(u8, p)
        p += width
        key_length, width = _varints(u8, p)
        key_start = p + width
        key_end = key_start + np.maximum(key_length, 0)
        value_length, width = _varints(u8, key_end)
        value_start = key_end + width
        value_end = value_start + np.maximum(value_length, 0)
        # Every field lies before value_end, so value_end < end keeps them all in the record.
        if not ((length >= _MIN_RECORD) & (key_length >= -1) & (value_length >= -1)
                & (value_end < end)).all():
            raise _Irregular
        tail = end - value_end  # headersCount and headers
        has_time = tail == _TIME_TAIL
        at = value_end[has_time]
        if not ((words[at] == _PREFIX_HEAD) & (words[at + 2] == _PREFIX_TAIL)).all():
            raise _Irregular
        if not (has_time | ((tail == 1) & (u8[value_end] == 0))).all():
            raise _Irregular
        np.add(base, offset_delta, out=self.offsets[lo:hi])
        np.add(base_ts, ts_delta, out=self.timestamps[lo:hi])
        self.key_start[lo:hi] = key_start
        self.key_length[lo:hi] = key_length
        self.value_start[lo:hi] = value_start
        self.value_length[lo:hi] = value_length
        self.value_end[lo:hi] = value_end
        self.has_time[lo:hi] = has_time


def _decode(buf: bytes, batches: list[tuple[int, BatchHeader]], topic: str, partition: int,
            start: int, stop: int, include_headers: bool) -> pa.RecordBatch:
    u8 = np.frombuffer(buf, np.uint8)
    # The big-endian int64 at every byte position (overlapping, unaligned): one gather reads
    # 8 bytes anywhere, about 4x gathering them one by one.
    words = np.ndarray((max(len(buf) - 7, 0),), ">i8", buffer=buf, strides=(1,))
    starts = _starts(*_walk(buf, batches))
    n = len(starts)
    headers = [h for _, h in batches]
    if any(abs(h.base_timestamp) >= _TS_LIMIT or abs(h.max_timestamp) >= _TS_LIMIT
           for h in headers):
        raise _Irregular
    counts = [h.records_count for h in headers]
    base = np.repeat(np.array([h.base_offset for h in headers], np.int64), counts)
    base_ts = np.repeat(np.array([h.base_timestamp for h in headers], np.int64), counts)
    records = _Records(n)
    for lo in range(0, n, _SLICE):
        hi = lo + _SLICE
        records.decode(u8, words, starts[lo:hi], base[lo:hi], base_ts[lo:hi], lo)
    offsets, timestamps, has_time = records.offsets, records.timestamps, records.has_time
    log_append = np.array([bool(h.attributes & TIMESTAMP_TYPE_BIT) for h in headers])
    ts_types = np.repeat(log_append.astype(np.int32), counts)
    if log_append.any():  # every record carries the batch's maxTimestamp (Kafka's rule)
        max_ts = np.repeat(np.array([h.max_timestamp for h in headers], np.int64), counts)
        np.copyto(timestamps, max_ts, where=ts_types == 1)
    timestamps *= 1000  # to us; |ms| < _TS_LIMIT keeps it inside int64
    key_start, key_length = records.key_start, records.key_length
    value_start, value_length = records.value_start, records.value_length
    value_end = records.value_end

    keep = (offsets >= start) & (offsets < stop)
    if not keep.all():
        offsets, timestamps, ts_types = offsets[keep], timestamps[keep], ts_types[keep]
        key_length, key_start = key_length[keep], key_start[keep]
        value_length, value_start = value_length[keep], value_start[keep]
        value_end, has_time = value_end[keep], has_time[keep]
        n = len(offsets)
    at = value_end[has_time]

    key_null = key_length == -1
    keys = (pa.nulls(n, pa.binary()) if key_null.all()
            else _binary(buf, key_start, np.maximum(key_length, 0), key_null))
    values = _binary(buf, value_start, np.maximum(value_length, 0), value_length == -1)
    times = words[at + len(_TIME_PREFIX)].astype(np.int64)
    columns = [
        keys,
        values,
        _repeated_string(topic, n),
        pa.array(np.full(n, partition, np.int32)),
        pa.array(offsets),
        pa.Array.from_buffers(_UTC_US, n, [None, pa.py_buffer(timestamps)]),
        pa.array(ts_types),
        _spread(times, has_time),
    ]
    if include_headers:
        columns.insert(7, _time_headers(times, has_time))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def _validity(present: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(present, bitorder="little"))


def _binary(buf: bytes, starts: np.ndarray, lengths: np.ndarray, null: np.ndarray, *,
            min_run: int = _MIN_RUN) -> pa.Array:
    """binary values buf[starts[i]:starts[i] + lengths[i]] (ascending, non-overlapping; null
    where `null`, length 0 there). A run starts wherever the length or the stride changes."""
    n = len(starts)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    edges = np.flatnonzero(_run_starts(starts, lengths))
    if len(edges) * min_run > n:
        data = _taken(buf, starts, lengths)
    else:
        data = np.empty(int(offsets[-1]), np.uint8)
        bounds = [*edges.tolist(), n]
        firsts = starts[edges].tolist()
        sizes = lengths[edges].tolist()
        strides = np.diff(starts, append=starts[-1:]).astype(np.int64)[edges].tolist()
        dests = offsets[edges].tolist()
        for i, size in enumerate(sizes):
            rows = bounds[i + 1] - bounds[i]
            if size:
                source = np.ndarray((rows, size), np.uint8, buffer=buf, offset=firsts[i],
                                    strides=(strides[i], 1))
                data[dests[i]:dests[i] + rows * size].reshape(rows, size)[...] = source
    validity = _validity(~null) if null.any() else None
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)])


def _run_starts(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """True where a run of one length and one stride starts: within a run [a, b), every
    i in a+2..b-1 has the stride and length of i-1, so all strides of the run are equal."""
    n = len(starts)
    change = np.ones(n, bool)
    if n > 1:
        change[1:] = lengths[1:] != lengths[:-1]
        step = np.diff(starts)
        change[2:] |= step[1:] != step[:-1]
    return change


def _taken(buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> pa.Buffer:
    """The bytes of the spans, concatenated by Arrow's take: the spans [s0, e0, s1, e1, ...]
    are the offsets of a binary array whose even elements are the values."""
    n = len(starts)
    if n == 0:
        return pa.py_buffer(b"")
    spans = np.empty(2 * n, np.int32)
    spans[0::2] = starts
    spans[1::2] = starts + lengths
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * n - 1,
                                        [None, pa.py_buffer(spans), pa.py_buffer(buf)])
    taken = interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    return taken.buffers()[2] or pa.py_buffer(b"")


def _repeated_string(text: str, n: int) -> pa.Array:
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(raw * n)])


def _spread(times: np.ndarray, has_time: np.ndarray) -> pa.Array:
    """tq_time: the k-th row with the header gets times[k]; the others are null."""
    n = len(has_time)
    if len(times) == n:
        return pa.array(times)
    values = np.zeros(n, np.int64)
    values[has_time] = times
    return pa.Array.from_buffers(pa.int64(), n, [_validity(has_time), pa.py_buffer(values)])


def _time_headers(times: np.ndarray, has_time: np.ndarray) -> pa.Array:
    """[{"tq.time": value}] for rows with the header, null for those without."""
    n = len(has_time)
    count = len(times)
    if count == 0:
        return pa.nulls(n, HEADERS_TYPE)
    keys = _repeated_string(TIME_HEADER, count)
    values = pa.Array.from_buffers(pa.binary(), count, [
        None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * 8),
        pa.py_buffer(times.astype(">i8"))])
    items = pa.StructArray.from_arrays([keys, values], fields=list(HEADERS_TYPE.value_type))
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(has_time, out=offsets[1:])
    validity = None if count == n else _validity(has_time)
    return pa.Array.from_buffers(HEADERS_TYPE, n, [validity, pa.py_buffer(offsets)],
                                 children=[items])
