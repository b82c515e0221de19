"""Decode and verify RecordBatch v2 (magic 2): bytes in, a `RecordBatch` out.

The record layout is drawn in `_encode.py`. The hot loop reads 1- and 2-byte varints inline
through tables (`UNZIGZAG`, `UNZIGZAG2`), slices keys and values straight from a bytes object and
builds one `Record` per record without other calls; longer varints and records with headers
take the general readers. Every length is checked against the record's own end before a slice,
so hostile lengths never copy more than the batch holds, and the loop runs at most
recordsCount times, itself bounded by the bytes present. Errors are RecordError subclasses only.

A subscriber's `events_of` also asks for `TimeMarks`: what it needs to cut a batch's records
into runs of equal logical time without reading each record again. Records without headers
(the fast path) add nothing to them; records with headers add to stretches of equal tq.time
values, kept by the general path they take anyway.
"""

from __future__ import annotations

from typing import Any

import crc32c

from querylib.errors import (
    CompressionError,
    CorruptRecordError,
    InvalidLengthError,
    InvalidRecordError,
    TruncatedRecordError,
)
from querylib.records._compression import MAX_DECOMPRESSED_SIZE, decompress
from querylib.records._control import TIME_HEADER, TIME_HEADER_PREFIX, TIME_HEADER_SIZE
from querylib.records._header import (
    ATTRIBUTES_OFFSET,
    HEADER_SIZE,
    BatchHeader,
    read_header,
)
from querylib.records._types import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    Compression,
    Header,
    Record,
    RecordBatch,
    TimestampType,
)
from querylib.records._varint import (
    INT64_MAX,
    INT64_MIN,
    UNZIGZAG,
    UNZIGZAG2,
    UNZIGZAG_SIZE,
    read_varint,
    read_varlong,
    wrap_int64,
)

# The smallest record: length, attributes, timestampDelta, offsetDelta, keyLength, valueLength,
# headersCount, one byte each. recordsCount can never exceed the bytes present / MIN_RECORD_SIZE.
MIN_RECORD_SIZE = 7
# A header is at least a key length and a value length.
MIN_HEADER_SIZE = 2
# decoded header names (see _header_name); bounded, so hostile names cannot grow it without end
_HEADER_NAMES: dict[bytes, str] = {}
_HEADER_NAMES_CACHED = 256
_CODECS = tuple(Compression)  # by id: indexing beats calling the enum, per batch
_TIMESTAMP_TYPES = tuple(TimestampType)
# A base timestamp outside these bounds plus a 1- or 2-byte delta may need Java's wrap-around.
SAFE_TS_MIN, SAFE_TS_MAX = INT64_MIN + UNZIGZAG_SIZE, INT64_MAX - UNZIGZAG_SIZE


TIME_PREFIX_SIZE = len(TIME_HEADER_PREFIX)
# In TimeMarks.timed: records with headers but no tq.time header (their time is None).
UNTIMED: Any = object()


class TimeMarks:
    """Filled in by `decode_batch(..., marks=)`: `timed` holds [start, stop, value] for each
    stretch of consecutive records (by index) that have headers and the same first tq.time
    header value (raw bytes, None for a null value, UNTIMED when there is none); records
    outside every stretch have no headers. `backwards`: some offsetDelta is negative, so the
    records' offsets are not all at or above the batch's base offset."""

    __slots__ = ("backwards", "timed")

    def __init__(self) -> None:
        self.timed: list[list[Any]] = []
        self.backwards = False


def verify_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Check the batch at pos: header bounds, the whole batch present, CRC-32C over
    attributes..end. The records are not decoded. Returns the parsed header."""
    header = read_header(buf, pos)
    end = pos + header.size
    if end > len(buf):
        raise TruncatedRecordError(
            f"batch at {pos}: {len(buf) - pos} bytes left, batchLength says {header.size}")
    actual = crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end])
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch at {pos}: CRC-32C {actual:#010x}, header says {header.crc:#010x}")
    return header


def decode_batch(buf: bytes | bytearray | memoryview, pos: int = 0, *, verify_crc: bool = True,
                 max_decompressed: int = MAX_DECOMPRESSED_SIZE,
                 marks: TimeMarks | None = None) -> RecordBatch:
    """Decode the RecordBatch v2 at pos (magic 2 only), records included; `marks` (empty, if
    given) learns where the records' logical times change.

    Raises TruncatedRecordError, InvalidLengthError, UnsupportedMagicError, CorruptRecordError
    (with verify_crc), BadVarintError, CompressionError (beyond max_decompressed bytes too) or
    InvalidRecordError; never anything else for any input bytes.
    """
    header = read_header(buf, pos)
    records = decode_records(buf, pos, header, verify_crc=verify_crc,
                             max_decompressed=max_decompressed, marks=marks)
    attributes = header.attributes
    log_append = bool(attributes & TIMESTAMP_TYPE_BIT)
    return RecordBatch(
        header.base_offset, header.partition_leader_epoch, 2, header.crc,
        _CODECS[attributes & COMPRESSION_MASK], _TIMESTAMP_TYPES[log_append],
        bool(attributes & TRANSACTIONAL_BIT), bool(attributes & CONTROL_BIT),
        header.last_offset_delta, header.base_timestamp, header.max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence, records,
        header.batch_length)


def decode_records(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, *,
                   verify_crc: bool = True, max_decompressed: int = MAX_DECOMPRESSED_SIZE,
                   marks: TimeMarks | None = None) -> list[Record]:
    """The records of the batch at pos, whose header `read_header(buf, pos)` returned: what
    `decode_batch` does, for a caller that walked the batches and has the header already
    (the same checks in the same order, the same errors), without a RecordBatch."""
    size = header.size
    if pos + size > len(buf):
        raise TruncatedRecordError(
            f"batch at {pos}: {len(buf) - pos} bytes left, batchLength says {size}")
    if verify_crc:
        actual = crc32c.crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + size])
        if actual != header.crc:
            raise CorruptRecordError(
                f"batch at {pos}: CRC-32C {actual:#010x}, header says {header.crc:#010x}")
    if type(buf) is not bytes:
        # The hot loop needs bytes (fast indexing, slices that are bytes): copy this batch only.
        buf = bytes(memoryview(buf)[pos:pos + size])
        pos = 0
    attributes = header.attributes
    codec = attributes & COMPRESSION_MASK
    if codec > Compression.ZSTD:
        raise CompressionError(f"batch at {pos}: unknown compression codec {codec}")
    count = header.records_count
    start, end = pos + HEADER_SIZE, pos + size
    if codec:
        buf = decompress(codec, memoryview(buf)[start:end], max_decompressed)
        start, end = 0, len(buf)
    if not 0 <= count <= (end - start) // MIN_RECORD_SIZE:
        raise InvalidLengthError(
            f"batch at {pos}: recordsCount {count} impossible in {end - start} bytes")
    log_append = attributes & TIMESTAMP_TYPE_BIT
    records = _decode_records(buf, start, end, count, header.base_offset, header.base_timestamp,
                              marks)
    if log_append or not SAFE_TS_MIN <= header.base_timestamp <= SAFE_TS_MAX:
        records = _fix_timestamps(records, header.max_timestamp if log_append else None)
    return records


def _fix_timestamps(records: list[Record], log_append_time: int | None) -> list[Record]:
    """LogAppendTime: every record carries maxTimestamp. Near the int64 bounds: wrap base +
    delta like Java's long arithmetic. Both rare, so kept out of the hot loop."""
    if log_append_time is not None:
        return [Record(r.offset, log_append_time, r.key, r.value, r.headers) for r in records]
    return [Record(r.offset, wrap_int64(r.timestamp), r.key, r.value, r.headers)
            for r in records]


def _read_bytes(buf: bytes, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    """A nullable bytes field (varint length, -1 for null) that must end by `end`."""
    length, pos = read_varint(buf, pos)
    if length < 0:
        if length != -1:
            raise InvalidLengthError(f"{what} length {length} at {pos}")
        return None, pos
    stop = pos + length
    if stop > end:
        raise InvalidLengthError(f"{what} length {length} at {pos} runs past its record")
    return buf[pos:stop], stop


def _read_headers(buf: bytes, pos: int, end: int) -> tuple[tuple[Header, ...], int]:
    """headersCount and the headers, which must end by `end`. Short lengths are read inline
    and header names come from a small cache: tq writes the same names on every record."""
    names = _HEADER_NAMES
    if buf[pos] == 2:
        # One header with short key and value lengths: what tq writes (a TIME_HEADER).
        b = buf[pos + 1]
        stop = pos + 2 + (b >> 1)
        if b < 0x80 and not b & 1 and stop < end:
            name = names.get(buf[pos + 2:stop])
            b = buf[stop]
            if name is not None and b < 0x80 and not b & 1:
                pos = stop + 1 + (b >> 1)
                if pos <= end:
                    return ((name, buf[stop + 1:pos]),), pos
    b = buf[pos]
    if b < 0x80:
        count = UNZIGZAG[b]
        pos += 1
    else:
        count, pos = read_varint(buf, pos)
    if not 0 <= count <= (end - pos) // MIN_HEADER_SIZE:
        raise InvalidLengthError(f"headersCount {count} impossible in {end - pos} bytes")
    headers: list[Header] = []
    for _ in range(count):
        b = buf[pos]
        if b < 0x80:
            length = UNZIGZAG[b]
            pos += 1
        else:
            length, pos = read_varint(buf, pos)
        stop = pos + length
        if length < 0 or stop > end:
            raise InvalidLengthError(f"header key length {length} at {pos}")
        raw = buf[pos:stop]
        try:
            name = names[raw]
        except KeyError:
            name = _header_name(raw, pos)
        b = buf[stop]
        if b < 0x80:
            length = UNZIGZAG[b]
            pos = stop + 1
        else:
            length, pos = read_varint(buf, stop)
        if length >= 0:
            stop = pos + length
            if stop > end:
                raise InvalidLengthError(f"header value length {length} at {pos}")
            headers.append((name, buf[pos:stop]))
            pos = stop
        elif length == -1:
            headers.append((name, None))
        else:
            raise InvalidLengthError(f"header value length {length} at {pos}")
    return tuple(headers), pos


def _header_name(raw: bytes, pos: int) -> str:
    try:
        name = raw.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRecordError(f"header key at {pos} is not UTF-8") from exc
    if len(_HEADER_NAMES) < _HEADER_NAMES_CACHED:
        _HEADER_NAMES[raw] = name
    return name


def _decode_records(buf: bytes, pos: int, limit: int, count: int, base_offset: int,
                    base_ts: int, marks: TimeMarks | None = None) -> list[Record]:
    """Decode `count` records from buf[pos:limit], which they must fill exactly.

    Deliberately one long function: per-record calls would cost more than the work itself.
    Each varint is read inline when it is 1 byte (b < 0x80) or 2 bytes (second byte c < 0x80,
    value UNZIGZAG2[c][b]), else by the general reader. `end` is where the current record must
    end; every slice stops before it.
    """
    records: list[Record] = []
    append = records.append
    unzigzag = UNZIGZAG
    unzigzag2 = UNZIGZAG2
    new_record = Record
    signs = 0  # the offsetDeltas' first bytes or'ed: bit 0 is set if one is negative (zigzag)
    # the last tq.time header seen in its whole-record form (TIME_HEADER_PREFIX and the value,
    # ending the record), and its headers: the next records of the same time share them
    time_tail = None
    time_headers: tuple[Header, ...] = ()
    # the current stretch of TimeMarks.timed: its list, value and end (written back as it
    # closes), so that a record that continues it costs two comparisons
    stretch: list[Any] = [-1, -1, None]
    stretch_time: Any = None
    stretch_stop = -1
    try:
        for i in range(count):
            # length
            b = buf[pos]
            if b < 0x80:
                p = pos + 1
                end = p + unzigzag[b]
            else:
                c = buf[pos + 1]
                if c < 0x80:
                    p = pos + 2
                    end = p + unzigzag2[c][b]
                else:
                    length, p = read_varint(buf, pos)
                    end = p + length
            if end > limit:
                raise InvalidLengthError(f"record length {end - p} at {pos} runs past the batch")
            # attributes (p): none are defined; ignored, as Java does. timestampDelta:
            b = buf[p + 1]
            if b < 0x80:
                ts = base_ts + unzigzag[b]
                p += 2
            else:
                c = buf[p + 2]
                if c < 0x80:
                    ts = base_ts + unzigzag2[c][b]
                    p += 3
                else:
                    delta, p = read_varlong(buf, p + 1)
                    ts = wrap_int64(base_ts + delta)
            # offsetDelta
            b = buf[p]
            signs |= b
            if b < 0x80:
                offset = base_offset + unzigzag[b]
                p += 1
            else:
                c = buf[p + 1]
                if c < 0x80:
                    offset = base_offset + unzigzag2[c][b]
                    p += 2
                else:
                    delta, p = read_varint(buf, p)
                    offset = base_offset + delta
            # keyLength, key
            if buf[p] == 1:  # varint -1: a null key, the common case
                key = None
                p += 1
            else:
                key, p = _read_bytes(buf, p, end, "key")
            # valueLength
            b = buf[p]
            if b < 0x80:
                length = unzigzag[b]
                p += 1
            else:
                c = buf[p + 1]
                if c < 0x80:
                    length = unzigzag2[c][b]
                    p += 2
                else:
                    length, p = read_varint(buf, p)
            # value, then headersCount 0 as the record's last byte: the common case
            stop = p + length
            if stop + 1 == end and length >= 0 and buf[stop] == 0:
                append(new_record(offset, ts, key, buf[p:stop]))
                pos = end
                continue
            # value, then the tq.time header alone: what tq's producers write (a record the
            # same time as the last one reuses its headers)
            if end - stop == TIME_HEADER_SIZE and length >= 0:
                tail = buf[stop:end]
                if tail == time_tail or tail[:TIME_PREFIX_SIZE] == TIME_HEADER_PREFIX:
                    if tail != time_tail:
                        time_tail = tail
                        time_headers = ((TIME_HEADER, tail[TIME_PREFIX_SIZE:]),)
                    append(new_record(offset, ts, key, buf[p:stop], time_headers))
                    pos = end
                    if marks is not None:
                        if stretch_stop == i and stretch_time is time_tail:
                            stretch_stop = i + 1
                        else:
                            stretch[1] = stretch_stop
                            stretch_time, stretch_stop = time_tail, i + 1
                            stretch = [i, i + 1, time_headers[0][1]]
                            marks.timed.append(stretch)
                    continue
            if length >= 0:
                if stop >= end:
                    raise InvalidLengthError(f"value length {length} at {p} runs past record")
                value = buf[p:stop]
                p = stop
            elif length == -1:
                value = None
            else:
                raise InvalidLengthError(f"value length {length} at {p}")
            headers, p = _read_headers(buf, p, end)
            if p != end:
                raise InvalidRecordError(f"record ending at {end}: {end - p} bytes left "
                                         f"after its fields")
            if headers:
                if marks is not None:
                    name, raw_time = headers[0]
                    if name != TIME_HEADER:
                        raw_time = next((v for n, v in headers if n == TIME_HEADER), UNTIMED)
                    # (a new stretch each time: this path is rare in tq's own batches)
                    stretch[1] = stretch_stop
                    stretch_time, stretch_stop = None, i + 1
                    stretch = [i, i + 1, raw_time]
                    marks.timed.append(stretch)
                append(new_record(offset, ts, key, value, headers))
            else:
                append(new_record(offset, ts, key, value))
            pos = end
    except IndexError as exc:
        raise TruncatedRecordError(f"records cut short at {pos}") from exc
    if pos != limit:
        raise InvalidRecordError(f"{limit - pos} bytes after the last of {count} records")
    if marks is not None:
        stretch[1] = stretch_stop
        marks.backwards = bool(signs & 1)
    return records
