"""Encode a RecordBatch v2 from runs of values: what tq's publishers send.

A run is `(timestamp_ms, headers, values)`: keyless records sharing a timestamp and headers
(tq's publishers put the logical time in the `tq.time` header, one run per `send(time, ...)`).
The bytes are exactly those of `encode_batch` over the records one by one (property-tested).
`encode_value_runs` encodes a list of runs; `RunBatch` builds a batch run by run as a producer
receives them (each run encoded, and its values copied, when it arrives).

When a run's values are bytes of one length (the common case), its records differ only in
their value and their offsetDelta, so a run is built without Python work per record: one
`join` of the values with the shared bytes between two values (the previous record's headers
and the next record's prefix) as separator, then the offsetDelta bytes written as columns, one
extended-slice assignment per byte of the varint (offset deltas below 64 take one byte, up to
8191 two, so a run splits at most once). Anything else (a None value, lengths that differ,
values whose length is not their byte size) goes through the general record encoder, which
also reports wrong types. No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from querylib.records._encode import (
    _batch,
    _bytes_field,
    _check_timestamp,
    _encode_record,
    _header_name,
)
from querylib.records._types import Header
from querylib.records._varint import TABLE_SIZE, encode_varint, encode_varlong, wrap_int64

__all__ = ["Run", "RunBatch", "encode_value_runs"]

_NULL = b"\x01"  # varint -1: a null key
_ONE_BYTE = 64  # offset deltas below this are 1-byte varints; up to TABLE_SIZE - 1, 2 bytes
# The offsetDelta varints as byte columns: 1-byte ones, and the two bytes of 2-byte ones.
_OD1 = bytes(2 * i for i in range(_ONE_BYTE))
_OD2 = (bytes((2 * i) & 0x7F | 0x80 for i in range(_ONE_BYTE, TABLE_SIZE)),
        bytes((2 * i) >> 7 for i in range(_ONE_BYTE, TABLE_SIZE)))


def encode_value_runs(runs: Sequence[tuple[int, Sequence[Header], Sequence[bytes | None]]]
                      ) -> bytes:
    """One uncompressed RecordBatch v2 of keyless records given as runs `(timestamp_ms,
    headers, values)`: every record of a run shares its timestamp and headers. Raises as
    `encode_batch` does (ValueError for no records or a batch too large, TypeError for values
    that are not bytes)."""
    batch = RunBatch()
    for ts, headers, values in runs:
        batch.add(batch.encode(ts, headers, values))
    return batch.build()


class Run(NamedTuple):
    """A run encoded for the next offset deltas of a RunBatch (see RunBatch.encode)."""

    first: int             # the offset delta of its first record
    timestamp: int
    count: int  # type: ignore[assignment]  # shadows tuple.count(), which no caller uses
    size: int              # bytes of its records
    parts: list[bytes | bytearray]


class RunBatch:
    """A batch of keyless runs built as they come (what a producer fills between sends):
    `encode` a run at the batch's next offset delta, `add` it, `build` the batch.

        batch = RunBatch()
        run = batch.encode(ts, headers, values)   # raises before anything changes
        if run.size <= room: batch.add(run)
        data = batch.build()

    Encoding copies the values, so a caller may change them afterwards."""

    def __init__(self) -> None:
        self.parts: list[bytes | bytearray] = []
        self.count = 0
        self.size = 0  # bytes of the records so far
        self._base_ts = 0
        self._max_ts = 0

    def encode(self, timestamp: int, headers: Sequence[Header], values: Sequence[bytes | None],
               *, allow_none: bool = True) -> Run:
        """`values` as records after those of this batch so far. TypeError for a value that is
        not bytes-like (or None when not `allow_none`), ValueError for a bad timestamp."""
        if not len(values):
            return Run(self.count, 0, 0, 0, [])
        ts = _check_timestamp(timestamp)
        delta = wrap_int64(ts - (self._base_ts if self.count else ts))
        tail = _headers_tail(headers)
        first = self.count
        parts: list[bytes | bytearray] | None = None
        if first + len(values) <= TABLE_SIZE:
            parts = _equal_run(values, delta, tail, first)
        if parts is None:
            if not allow_none and None in values:
                raise TypeError("a record value is None")
            parts = [_encode_record(first + i, delta, None, v, headers)
                     for i, v in enumerate(values)]
        return Run(first, ts, len(values), sum(map(len, parts)), parts)

    def add(self, run: Run) -> None:
        """Append a run encoded by `encode` for where this batch ends now."""
        if run.first != self.count:
            raise ValueError(f"a run encoded for offset delta {run.first} added at {self.count}")
        if not run.count:
            return
        if not self.count:
            self._base_ts = self._max_ts = run.timestamp
        self._max_ts = max(self._max_ts, run.timestamp)
        self.parts += run.parts
        self.count += run.count
        self.size += run.size

    def build(self, *, producer_id: int = -1, producer_epoch: int = -1,
              base_sequence: int = -1) -> bytes:
        """The batch (ValueError when it has no records or is too large). An idempotent
        producer stamps its id, epoch and the batch's first sequence number here: header
        fields, covered by the one CRC pass the batch gets anyway."""
        if not self.count:
            raise ValueError("a record batch needs at least one record")
        return _batch(self.parts, self.count, self._base_ts, self._max_ts,
                      producer_id=producer_id, producer_epoch=producer_epoch,
                      base_sequence=base_sequence)


def _headers_tail(headers: Sequence[Header]) -> bytes:
    """headersCount and the headers: the bytes after a record's value."""
    tail = [encode_varint(len(headers))]
    for name, hvalue in headers:
        tail.append(_header_name(name))
        tail += _bytes_field(hvalue, f"header {name!r} value")
    return b"".join(tail)


def _equal_run(values: Sequence[bytes | None], delta: int, tail: bytes, first: int
               ) -> list[bytes | bytearray] | None:
    """The records of a run whose values are bytes-like of one length, at offset deltas
    first, first + 1, ...; None for any other run (the caller encodes it record by record)."""
    try:
        lengths = set(map(len, values))  # type: ignore[arg-type]  # None raises: caught
    except TypeError:  # a None value
        return None
    if len(lengths) != 1:
        return None
    (length,) = lengths
    head = b"\x00" + encode_varlong(delta)  # attributes, timestampDelta
    mid = _NULL + encode_varint(length)  # keyLength -1, valueLength
    pieces: list[bytes | bytearray] = []
    start, n = 0, len(values)
    while start < n:
        od = first + start
        width = 1 if od < _ONE_BYTE else 2
        stop = min(n, _ONE_BYTE - first) if width == 1 else n
        lead = encode_varint(len(head) + width + len(mid) + length + len(tail))
        prefix = lead + head + bytes(width) + mid
        size = len(prefix) + length + len(tail)
        try:  # tail + prefix between two values; the first tail and last prefix cut off
            piece = bytearray(tail + prefix).join(
                [b"", *values[start:stop], b""])  # type: ignore[list-item]  # None: caught
        except TypeError:  # not bytes-like: the general encoder says what is wrong
            return None
        del piece[:len(tail)]
        del piece[len(piece) - len(prefix):]
        m = stop - start
        if len(piece) != m * size:  # a value whose len() is not its byte size
            return None
        at = len(lead) + len(head)
        if width == 1:
            piece[at::size] = _OD1[od:od + m]
        else:
            piece[at::size] = _OD2[0][od - _ONE_BYTE:od - _ONE_BYTE + m]
            piece[at + 1::size] = _OD2[1][od - _ONE_BYTE:od - _ONE_BYTE + m]
        pieces.append(piece)
        start = stop
    return pieces
