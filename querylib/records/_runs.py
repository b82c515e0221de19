"""Regular batches read a run of records at a time: the fast path of readers that want values.

Most batches tq reads were written by tq's producers: uncompressed, records of one shape, no key
(or keys of one length), and either no header or exactly the one `tq.time` header. In such a
batch consecutive records usually have one size, so their fields sit one stride apart.
`size_runs` walks the chain of record lengths a run of equal-sized records at a time (a
strided slice and `lstrip` per length byte, not a step per record); `value_runs` then checks
every field of a run at once on strided columns of the buffer (bytes slices with a step,
compared, or translated to continuation bits, in C) and cuts the values out with one
C call (a cached `struct` of "<length>s<gap>x" repeated): making each value's bytes object is
the only per-record step.

Anything else (other headers, a compressed or control batch, lengths that differ inside a run,
offset deltas that are not consecutive) is reported as `Irregular`, and the caller decodes the
batch with the general decoder (`decode_batch`), which also names what is wrong with malformed
bytes. Nothing here trusts a length it has not checked against the batch's end. No I/O.
"""

from __future__ import annotations

import struct
from itertools import compress, islice
from operator import ne

from querylib.records._control import TIME_HEADER_PREFIX, TIME_HEADER_SIZE
from querylib.records._decode import MIN_RECORD_SIZE, verify_batch
from querylib.records._header import ATTRIBUTES_OFFSET, HEADER_SIZE, BatchHeader
from querylib.records._types import CONTROL_BIT
from querylib.records._varint import MAX_VARINT_BYTES

__all__ = ["Irregular", "ValueRun", "size_runs", "value_runs"]

# (time or None for records without a tq.time header, values, offset after the last record,
# whether a value is None: a reader that must replace nulls looks only when told so)
ValueRun = tuple[int | None, list[bytes | None], int, bool]

# attributes, timestampDelta, offsetDelta, keyLength, valueLength, headersCount
_MIN_RECORD = MIN_RECORD_SIZE - 1
_MAX_LENGTH_VARINT = 3  # a record length below 1 MiB
_MAX_VARINT = MAX_VARINT_BYTES
_NON_DATA = CONTROL_BIT | 0x07  # the control bit, and any compression codec
_TIME_PREFIX = TIME_HEADER_PREFIX
_TIME_TAIL = TIME_HEADER_SIZE
_CUTTERS: dict[tuple[int, int, int], struct.Struct] = {}
_CUTTERS_CACHED = 64
_LSTRIP_RUNS = 16  # time runs per batch found by lstrip; more: cut and compare
_CONTINUES = bytes(1 if b >= 0x80 else 0 for b in range(256))  # translate: continuation bit


class Irregular(Exception):
    """Not the regular shape: decode these batches with the general decoder."""


def size_runs(buf: bytes, batches: list[tuple[int, BatchHeader]]
              ) -> tuple[list[int], list[int], list[int]]:
    """(first start, size, count) of each run of consecutive records of one size in the given
    batches (position, header) of buf: the one part that is a chain, walked a run at a time."""
    firsts: list[int] = []
    sizes: list[int] = []
    counts: list[int] = []
    for pos, header in batches:
        limit = pos + header.size
        p = pos + HEADER_SIZE
        left = header.records_count
        if left < 0:
            raise Irregular
        while left > 0:
            if p >= limit:
                raise Irregular
            z = 0
            width = 0
            while True:
                b = buf[p + width]
                z |= (b & 0x7F) << (7 * width)
                width += 1
                if b < 0x80:
                    break
                if width == _MAX_LENGTH_VARINT:
                    raise Irregular
            size = width + ((z >> 1) ^ -(z & 1))
            if size < _MIN_RECORD + 1:
                raise Irregular
            # The length prefixes of the rest of the batch, one stride apart: those before
            # the first mismatch are records of this size.
            same = left - 1
            q = p + size
            for k in range(width):
                column = buf[q + k:q + k + same * size:size]
                same = min(same, len(column) - len(column.lstrip(buf[p + k:p + k + 1])))
            same += 1
            firsts.append(p)
            sizes.append(size)
            counts.append(same)
            p += same * size
            left -= same
        if p != limit:
            raise Irregular
    return firsts, sizes, counts


def _varint(buf: bytes, p: int, end: int) -> tuple[int, int]:
    """(value, width) of the zigzag varint at p, which must end before `end`."""
    z = 0
    for width in range(1, _MAX_VARINT + 1):
        if p >= end:
            raise Irregular
        b = buf[p]
        z |= (b & 0x7F) << (7 * (width - 1))
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), width
        p += 1
    raise Irregular


class _Shape:
    """Where the fields of a run's first record lie, relative to its start."""

    def __init__(self, buf: bytes, p: int, size: int) -> None:
        end = p + size
        _, self.w = _varint(buf, p, end)
        q = p + self.w
        if buf[q] != 0:  # attributes
            raise Irregular
        self.ts_at = q + 1 - p
        _, self.ts_width = _varint(buf, q + 1, end)
        self.od_at = self.ts_at + self.ts_width
        self.offset_delta, self.od_width = _varint(buf, p + self.od_at, end)
        self.key_at = self.od_at + self.od_width
        key_length, key_width = _varint(buf, p + self.key_at, end)
        self.value_len_at = self.key_at + key_width + max(key_length, 0)
        self.value_length, value_width = _varint(buf, p + self.value_len_at, end)
        if key_length < -1 or self.value_length < -1:
            raise Irregular
        self.value_at = self.value_len_at + value_width
        tail_at = self.value_at + max(self.value_length, 0)
        tail = size - tail_at
        if tail == 1 and buf[p + tail_at] == 0:
            self.time_at: int | None = None
        elif tail == _TIME_TAIL and buf[p + tail_at:p + tail_at + len(_TIME_PREFIX)] \
                == _TIME_PREFIX:
            self.time_at = tail_at + len(_TIME_PREFIX)
        else:
            raise Irregular
        self.tail_at = tail_at
        self.key_length_width = key_width


def _same(buf: bytes, start: int, count: int, size: int, width: int) -> bool:
    """Every record of the run has the first one's `width` bytes at `start` (relative)."""
    for k in range(width):
        column = buf[start + k:start + k + count * size:size]
        if column.count(column[:1]) != count:
            return False
    return True


def _check_run(buf: bytes, p: int, size: int, n: int, shape: _Shape) -> None:
    """Every record of the run has the first one's shape (raises Irregular otherwise)."""
    if n == 1:
        return
    span = n * size
    # attributes 0; varints of the same widths for timestampDelta and offsetDelta
    attrs = buf[p + shape.w:p + shape.w + span:size]
    if attrs.count(0) != n:
        raise Irregular
    for at, width in ((shape.ts_at, shape.ts_width), (shape.od_at, shape.od_width)):
        for k in range(width):
            bits = buf[p + at + k:p + at + k + span:size].translate(_CONTINUES)
            if bits.count(1 if k < width - 1 else 0) != n:
                raise Irregular
    # keyLength and valueLength (with the key between them, which only needs its length)
    if not (_same(buf, p + shape.key_at, n, size, shape.key_length_width)
            and _same(buf, p + shape.value_len_at, n, size, shape.value_at - shape.value_len_at)
            and _same(buf, p + shape.tail_at, n, size,
                      1 if shape.time_at is None else len(_TIME_PREFIX))):
        raise Irregular


def value_runs(buf: bytes, pos: int, skip_below: int = 0) -> list[ValueRun]:
    """The values of the data batch at `pos`, as runs of records with one logical time,
    skipping offsets below `skip_below`. The CRC is verified (CorruptRecordError, as
    `decode_batch`); Irregular for anything but the regular shape (see the module docstring)."""
    header = verify_batch(buf, pos)
    if header.magic != 2 or buf[pos + ATTRIBUTES_OFFSET + 1] & _NON_DATA:
        raise Irregular
    try:
        return _value_runs(buf, pos, header, skip_below)
    except (IndexError, struct.error):  # a field past the buffer: the general path names it
        raise Irregular from None


def _value_runs(buf: bytes, pos: int, header: BatchHeader, skip_below: int) -> list[ValueRun]:
    firsts, sizes, counts = size_runs(buf, [(pos, header)])
    runs: list[ValueRun] = []
    expected = None
    for p, size, n in zip(firsts, sizes, counts, strict=True):
        shape = _Shape(buf, p, size)
        _check_run(buf, p, size, n, shape)
        first = shape.offset_delta
        if expected is not None and first != expected:
            raise Irregular
        if n > 1:
            last_at = p + (n - 1) * size + shape.od_at
            last, _ = _varint(buf, last_at, last_at + shape.od_width)
            if last - first != n - 1:  # offset deltas must count up one by one
                raise Irregular
        expected = first + n
        base = header.base_offset + first
        skip = max(0, min(n, skip_below - base))
        if skip == n:
            continue
        start = p + shape.value_at + skip * size
        length = shape.value_length
        if length < 0:
            values: list[bytes | None] = [None] * (n - skip)
        else:
            values = list(_cutter(length, size, n - skip).unpack_from(buf, start))
        _add_runs(runs, buf, p, size, n, skip, shape, values, base)
    return runs


def _cutter(length: int, size: int, count: int) -> struct.Struct:
    """A struct that cuts `count` values of `length` bytes, `size` bytes apart, out of a buffer
    in one C call (several times faster than slicing them one by one)."""
    key = (length, size, count)
    cutter = _CUTTERS.get(key)
    if cutter is None:
        if len(_CUTTERS) >= _CUTTERS_CACHED:
            _CUTTERS.clear()
        gap = f"{size - length}x" if size > length else ""
        cutter = _CUTTERS[key] = struct.Struct(
            "=" + f"{length}s{gap}" * (count - 1) + f"{length}s")
    return cutter


def _add_runs(runs: list[ValueRun], buf: bytes, p: int, size: int, n: int, skip: int,
              shape: _Shape, values: list[bytes | None], base: int) -> None:
    """Append the run's values cut where the logical time changes (merged with the previous
    run when its time is the same)."""
    nulls = shape.value_length < 0
    if shape.time_at is None:
        times: list[int | None] = [None]
        cuts = [0, n - skip]
    else:
        cuts = _time_cuts(buf, p + shape.time_at + skip * size, n - skip, size)
        at = p + shape.time_at + skip * size
        times = [int.from_bytes(buf[at + c * size:at + c * size + 8], "big", signed=True)
                 for c in cuts[:-1]]
    for time, lo, hi in zip(times, cuts, cuts[1:], strict=False):
        next_offset = base + skip + hi
        if runs and runs[-1][0] == time and runs[-1][2] == base + skip + lo:
            runs[-1][1].extend(values[lo:hi])
            runs[-1] = (time, runs[-1][1], next_offset, runs[-1][3] or nulls)
        else:
            runs.append((time, values[lo:hi] if (lo, hi) != (0, len(values)) else values,
                         next_offset, nulls))


def _time_cuts(buf: bytes, at: int, n: int, size: int) -> list[int]:
    """[0, where the 8-byte time changes..., n] for n records `size` bytes apart, their times
    at `at`. A publisher sends a few times per batch, so each time's run is found on byte
    columns: one strided slice per byte of the time (a byte that never changes is done), then
    per run a `lstrip` of the changing columns from where it starts. Many short runs switch to
    cutting every time out and comparing neighbours, which costs the same for any count."""
    columns = []
    for k in range(8):
        column = buf[at + k:at + k + n * size:size]
        if column.count(column[:1]) != n:
            columns.append(column)
    cuts = [0]
    lo = 0
    while lo < n and columns:
        if len(cuts) > _LSTRIP_RUNS:
            raw = _cutter(8, size, n - lo).unpack_from(buf, at + lo * size)
            cuts += [lo + i for i in compress(range(1, len(raw)),
                                              map(ne, raw, islice(raw, 1, None)))]
            break
        lo = min(len(c) - len(c[lo:].lstrip(c[lo:lo + 1])) for c in columns)
        if lo < n:
            cuts.append(lo)
    cuts.append(n)
    return cuts
