"""scan_records and the scanning primitives: what a column reader (Spark's) builds on, checked
against the codec's own decoder, so the two can never drift apart."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import querylib.records as records
from querylib.records import (
    TIME_HEADER,
    TIME_HEADER_PREFIX,
    TIME_HEADER_SIZE,
    UNZIGZAG,
    UNZIGZAG2,
    Compression,
    RecordSpans,
    TimestampType,
    decode_batch,
    encode_batch,
    read_header,
    read_varlong,
    scan_records,
)
from querylib.records._varint import encode_varlong
from tests.querylib.records.strategies import entries

lone_time = st.integers(-(2**63), 2**63 - 1).map(
    lambda t: ((TIME_HEADER, t.to_bytes(8, "big", signed=True)),))


def _field(buf: bytes, start: int, end: int) -> bytes | None:
    return None if end < 0 else buf[start:end]


def scanned(buf: bytes, start: int, stop: int) -> list[tuple]:
    """Rows as scan_records leaves them, rebuilt into (offset, timestamp, key, value,
    headers) from the spans."""
    spans = RecordSpans(buf)
    offsets: list[int] = []
    timestamps: list[int] = []
    rows = scan_records(buf, 0, read_header(buf), start, stop, spans, offsets, timestamps)
    assert rows == spans.rows == len(offsets) == len(timestamps)
    keys = dict(zip(spans.key_rows, zip(spans.keys[0::2], spans.keys[1::2], strict=True),
                    strict=True))
    nulls = set(spans.value_nulls)
    value_spans = iter(zip(spans.values[0::2], spans.values[1::2], strict=True))
    times = dict(zip(spans.time_rows, spans.time_pos, strict=True))
    general = dict(spans.general)
    out = []
    for row in range(rows):
        key = _field(buf, *keys[row]) if row in keys else None
        value = None if row in nulls else _field(buf, *next(value_spans))
        if row in times:
            p = times[row] + len(TIME_HEADER_PREFIX)
            headers: tuple = ((TIME_HEADER, buf[p:p + 8]),)
        else:
            fields = general.get(row, [])
            headers = tuple((buf[fields[i]:fields[i + 1]].decode(),
                             _field(buf, fields[i + 2], fields[i + 3]))
                            for i in range(0, len(fields), 4))
        out.append((offsets[row], timestamps[row], key, value, headers))
    return out


@given(entries, st.sampled_from(list(TimestampType)), st.integers(0, 30), st.integers(0, 30),
       st.data())
def test_scan_agrees_with_the_decoder(batch_entries: list, ts_type: TimestampType, a: int,
                                      b: int, data: st.DataObject) -> None:
    """Timestamps anywhere in int64 (base + delta wraps as Java's long arithmetic does),
    LogAppendTime, keys and values null or not, any headers or the lone tq.time header."""
    batch_entries = [(t, k, v, data.draw(st.one_of(st.just(h), lone_time)))
                     for t, k, v, h in batch_entries]
    buf = encode_batch(batch_entries, base_offset=5, timestamp_type=ts_type)
    start, stop = 5 + min(a, b), 5 + max(a, b)
    expected = [(r.offset, r.timestamp, r.key, r.value, r.headers)
                for r in decode_batch(buf).records if start <= r.offset < stop]
    assert scanned(buf, start, stop) == expected


def test_extreme_timestamps_wrap_as_the_decoder_does() -> None:
    high, low = 2**63 - 1, -(2**63)
    for times in ([high, low], [low, high], [0, high], [high - 1, high, high - 3]):
        buf = encode_batch([(t, None, b"v", ()) for t in times])
        assert [row[1] for row in scanned(buf, 0, 10)] == times
        assert [r.timestamp for r in decode_batch(buf).records] == times


def test_the_primitives_are_the_formats() -> None:
    assert (records.COMPRESSION_MASK, records.TIMESTAMP_TYPE_BIT, records.TRANSACTIONAL_BIT,
            records.CONTROL_BIT) == (0x07, 0x08, 0x10, 0x20)
    assert records.ATTRIBUTES_OFFSET == 21 and records.MIN_RECORD_SIZE == 7
    assert records.MAX_VARINT_BYTES == 5
    # a record whose only header is tq.time ends with the prefix and its 8 value bytes
    buf = encode_batch([(1, None, b"v", ((TIME_HEADER, b"\x00" * 7 + b"\x2a"),))],
                       compression=Compression.NONE)
    assert buf.endswith(TIME_HEADER_PREFIX + b"\x00" * 7 + b"\x2a")
    assert TIME_HEADER_SIZE == len(TIME_HEADER_PREFIX) + 8
    # the tables give what the general reader gives, for every 1- and 2-byte varint
    for n in range(-(2**13), 2**13):
        raw = encode_varlong(n)
        if len(raw) == 1:
            assert UNZIGZAG[raw[0]] == n == read_varlong(raw, 0)[0]
        else:
            assert len(raw) == 2 and UNZIGZAG2[raw[1]][raw[0]] == n == read_varlong(raw, 0)[0]
