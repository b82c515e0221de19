"""Uncompressed record batches to positions: the scan a column reader (Spark's) builds on.

`scan_records` walks the records of one batch as `_decode` does (the same checks, the same
int64 timestamp arithmetic as Java's, Kafka's LogAppendTime rule) but makes no `Record` and no
bytes: it keeps offsets and timestamps (ints) and, in a `RecordSpans`, where each key, value
and header lies in the buffer. A reader then copies the bytes out in bulk (Arrow's `take` over
the spans): decoding a `Record` per record and transposing costs about three times that.

The lone `tq.time` header tq writes on every record is recognised by one comparison with
`TIME_HEADER_PREFIX` and kept as one position; other headers become spans (`header_spans`).
Varints of 1 and 2 bytes are read inline through `UNZIGZAG`/`UNZIGZAG2`, longer ones by
`read_varint`/`read_varlong`. Hostile bytes raise RecordError subclasses; every length is
checked against its record's end before a span is kept. No I/O, no third-party imports.
"""

from __future__ import annotations

from querylib.errors import InvalidLengthError, InvalidRecordError, TruncatedRecordError
from querylib.records._control import TIME_HEADER_PREFIX, TIME_HEADER_SIZE
from querylib.records._decode import MIN_HEADER_SIZE, MIN_RECORD_SIZE, SAFE_TS_MAX, SAFE_TS_MIN
from querylib.records._header import HEADER_SIZE, BatchHeader
from querylib.records._types import TIMESTAMP_TYPE_BIT
from querylib.records._varint import UNZIGZAG, UNZIGZAG2, read_varint, read_varlong, wrap_int64

__all__ = ["RecordSpans", "header_spans", "scan_records"]


class RecordSpans:
    """Where the fields of rows whose bytes lie in one buffer are. Rows are counted from the
    first row scanned into it; spans are positions in `buf`."""

    __slots__ = ("buf", "rows", "values", "value_nulls", "keys", "key_rows", "time_pos",
                 "time_rows", "general")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.rows = 0
        self.values: list[int] = []  # s, e per row with a value
        self.value_nulls: list[int] = []  # rows whose value is null
        self.keys: list[int] = []  # s, e per row with a key
        self.key_rows: list[int] = []  # rows that have a key
        # where rows whose headers are exactly the tq.time header have TIME_HEADER_PREFIX
        self.time_pos: list[int] = []
        self.time_rows: list[int] = []
        # rows with other headers: (row, [key start, key end, value start, value end or -1])
        self.general: list[tuple[int, list[int]]] = []


def scan_records(buf: bytes, pos: int, header: BatchHeader, start: int, stop: int,  # noqa: C901
                 spans: RecordSpans, offsets: list[int], timestamps: list[int]) -> int:
    """Scan the records of the uncompressed batch at buf[pos] (header: its `read_header`,
    CRC checked by the caller) whose offsets are in [start, stop): append their offsets and
    timestamps, and their fields' positions to `spans` (whose buf must be `buf`). Returns
    the number of rows added.

    Deliberately one long function: a call per record or field would cost more than the
    work. `end` is where the current record must end; no span passes it.
    """
    row = first_row = spans.rows
    add_offset = offsets.append
    add_ts = timestamps.append
    add_value = spans.values.append
    add_time_pos = spans.time_pos.append
    add_time_row = spans.time_rows.append
    base = header.base_offset
    base_ts = header.base_timestamp
    lo, hi = start, stop
    unz, unz2 = UNZIGZAG, UNZIGZAG2
    time_prefix = TIME_HEADER_PREFIX
    time_size = TIME_HEADER_SIZE
    prefix_size = len(time_prefix)
    limit = pos + header.size
    count = header.records_count
    if not 0 <= count <= (header.size - HEADER_SIZE) // MIN_RECORD_SIZE:
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
                    length, p = read_varint(buf, pos)
                    end = p + length
            if end > limit or end - p < MIN_RECORD_SIZE - 1:
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
                    delta, p = read_varlong(buf, p + 1)
                    ts = wrap_int64(base_ts + delta)
            # offsetDelta
            b = buf[p]
            if whole:
                if b < 0x80:
                    p += 1
                else:
                    p = read_varint(buf, p)[1]
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
                        delta, p = read_varint(buf, p)
                        offset = base + delta
                if offset < lo or offset >= hi:
                    pos = end
                    continue
                add_offset(offset)
            # keyLength, key
            if buf[p] == 1:  # -1: null, the common case
                p += 1
            else:
                length, p = read_varint(buf, p)
                if length < 0 or p + length > end:
                    raise InvalidLengthError(f"record at {pos}: bad key length {length}")
                spans.key_rows.append(row)
                spans.keys += (p, p + length)
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
                    length, p = read_varint(buf, p)
            if length >= 0:
                stop_at = p + length
                if stop_at >= end:
                    raise InvalidLengthError(f"record at {pos}: value runs past its record")
                add_value(p)
                add_value(stop_at)
                p = stop_at
            elif length == -1:
                spans.value_nulls.append(row)
            else:
                raise InvalidLengthError(f"record at {pos}: bad value length {length}")
            # headers: none, or the lone tq.time header tq writes, are the common cases
            if p + 1 == end and buf[p] == 0:
                pass
            elif end - p == time_size and buf[p:p + prefix_size] == time_prefix:
                add_time_pos(p)
                add_time_row(row)
            else:
                spans.general.append((row, header_spans(buf, p, end)))
            add_ts(ts)
            row += 1
            pos = end
    except IndexError as exc:
        raise TruncatedRecordError(f"batch at offset {base}: records cut short") from exc
    finally:
        spans.rows = row
    if pos != limit:
        raise InvalidRecordError(f"batch at offset {base}: {limit - pos} bytes after its "
                                 f"{count} records")
    if whole:
        offsets.extend(range(base, base + count))
    rows = row - first_row
    if rows and header.attributes & TIMESTAMP_TYPE_BIT:
        # LogAppendTime: every record carries the batch's maxTimestamp (Kafka's rule)
        timestamps[-rows:] = [header.max_timestamp] * rows
    elif rows and not SAFE_TS_MIN <= base_ts <= SAFE_TS_MAX:
        # near the int64 bounds base + a short delta wraps, as Java's long arithmetic does
        timestamps[-rows:] = [wrap_int64(t) for t in timestamps[-rows:]]
    return rows


def header_spans(buf: bytes, p: int, end: int) -> list[int]:
    """Spans of the headers of the record ending at `end`, from its headersCount at p:
    [key start, key end, value start, value end or -1 for null] per header. 1-byte varints
    (nearly every count and length) are read inline."""
    if not p < end <= len(buf):
        raise TruncatedRecordError(f"headers at {p}: the record ends at {end}")
    unz = UNZIGZAG
    b = buf[p]
    if b < 0x80:
        count = unz[b]
        p += 1
    else:
        count, p = read_varint(buf, p)
    if not 0 <= count <= (end - p) // MIN_HEADER_SIZE:
        raise InvalidLengthError(f"headersCount {count} impossible in {end - p} bytes")
    fields: list[int] = []
    for _ in range(count):
        if p >= end:
            raise InvalidLengthError(f"headers run past their record at {end}")
        b = buf[p]
        if b < 0x80:
            length = unz[b]
            p += 1
        else:
            length, p = read_varint(buf, p)
        stop = p + length
        if length < 0 or stop >= end:  # the value's length follows inside the record
            raise InvalidLengthError(f"header key length {length} at {p}")
        fields += (p, stop)
        b = buf[stop]
        if b < 0x80:
            length = unz[b]
            p = stop + 1
        else:
            length, p = read_varint(buf, stop)
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
