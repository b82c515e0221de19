"""ColumnAssembler: record batches to Arrow, checked against the record codec's decoder."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from querylib.errors import CorruptRecordError, RecordError
from querylib.records import (
    TIME_HEADER,
    Compression,
    TimestampType,
    encode_batch,
    end_of_stream_batch,
    frontier_batch,
    iter_batches,
    transaction_marker_batch,
)
from querylib.spark import ARROW_SCHEMA, ARROW_SCHEMA_NO_HEADERS, SCHEMA, SCHEMA_NO_HEADERS
from querylib.spark._columns import ColumnAssembler

pytestmark = pytest.mark.spark

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

header_values = st.one_of(st.none(), st.binary(max_size=12))
headers = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["a", "tq.diff", "ü", TIME_HEADER]), header_values),
        st.tuples(st.just(TIME_HEADER), st.binary(min_size=8, max_size=8)),
    ),
    max_size=3,
)
lone_time = st.integers(-(2**63), 2**63 - 1).map(
    lambda t: ((TIME_HEADER, t.to_bytes(8, "big", signed=True)),))
records = st.tuples(
    st.integers(0, 2**41),
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.just(()), lone_time, headers.map(tuple)),
)
batches = st.tuples(
    st.lists(records, min_size=1, max_size=12),
    st.sampled_from([Compression.NONE, Compression.NONE, Compression.GZIP, Compression.ZSTD]),
    st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]),
    st.booleans(),  # followed by a frontier
)


def build_log(spec: list) -> bytes:
    """Batches with consecutive base offsets, as a log stores them."""
    out = []
    offset = 0
    for entries, compression, ts_type, frontier in spec:
        out.append(encode_batch(entries, base_offset=offset, compression=compression,
                                timestamp_type=ts_type))
        offset += len(entries)
        if frontier:
            control = frontier_batch(offset, timestamp=1)
            out.append(control[:0] + offset.to_bytes(8, "big") + control[8:])
            offset += 1
    return b"".join(out)


def expected_rows(buf: bytes, topic: str, partition: int, start: int, stop: int) -> list[dict]:
    rows = []
    for batch in iter_batches(buf):
        if batch.is_control:
            continue
        for r in batch.records:
            if not start <= r.offset < stop:
                continue
            time_value = next((v for k, v in r.headers
                               if k == TIME_HEADER and v is not None and len(v) == 8), None)
            rows.append({
                "key": r.key, "value": r.value, "topic": topic, "partition": partition,
                "offset": r.offset,
                "timestamp": EPOCH + dt.timedelta(milliseconds=r.timestamp),
                "timestampType": int(batch.timestamp_type),
                "headers": [{"key": k, "value": v} for k, v in r.headers] or None,
                "tq_time": None if time_value is None
                else int.from_bytes(time_value, "big", signed=True),
            })
    return rows


def assemble(buf: bytes, start: int, stop: int, rows_per_batch: int,
             split: int | None = None) -> list[pa.RecordBatch]:
    assembler = ColumnAssembler("t/ns/x", 3, start, stop, rows_per_batch)
    out: list[pa.RecordBatch] = []
    if split is None:
        out += assembler.add(buf)
    else:  # two buffers, cut at a batch boundary
        out += assembler.add(buf[:split])
        out += assembler.add(buf[split:])
    out += assembler.finish()
    return out


def batch_boundary(buf: bytes, index: int) -> int:
    pos = 0
    for i, batch in enumerate(iter_batches(buf)):
        if i == index:
            return pos
        pos += batch.size_in_bytes
    return pos


def test_arrow_schema_is_what_pyspark_expects() -> None:
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
    assert to_arrow_schema(SCHEMA_NO_HEADERS, timezone="UTC").equals(ARROW_SCHEMA_NO_HEADERS)


@given(st.lists(batches, min_size=1, max_size=6), st.data())
def test_columns_equal_the_decoded_records(spec: list, data: st.DataObject) -> None:
    buf = build_log(spec)
    total = sum(len(e) + f for e, _, _, f in spec)
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total + 2))
    rows_per_batch = data.draw(st.sampled_from([1, 3, 64 * 1024]))
    split = data.draw(st.one_of(st.none(), st.integers(0, len(spec))))
    if split is not None:
        split = batch_boundary(buf, split)
    out = assemble(buf, start, stop, rows_per_batch, split)
    for batch in out:
        assert batch.schema.equals(ARROW_SCHEMA)
        assert batch.num_rows > 0
    got = [row for batch in out for row in batch.to_pylist()]
    assert got == expected_rows(buf, "t/ns/x", 3, start, stop)


@given(st.lists(batches, min_size=1, max_size=4))
def test_without_the_headers_column(spec: list) -> None:
    buf = build_log(spec)
    assembler = ColumnAssembler("t", 0, 0, 10**6, include_headers=False)
    out = [*assembler.add(buf), *assembler.finish()]
    for batch in out:
        assert batch.schema.equals(ARROW_SCHEMA_NO_HEADERS)
    expected = expected_rows(buf, "t", 0, 0, 10**6)
    for row in expected:
        del row["headers"]
    assert [row for batch in out for row in batch.to_pylist()] == expected


def test_rows_come_in_batches_of_about_the_asked_size() -> None:
    entries = [(5, None, b"v%d" % i, ()) for i in range(100)]
    buf = b"".join(encode_batch(entries, base_offset=100 * i) for i in range(10))
    out = assemble(buf, 0, 1000, rows_per_batch=250)
    assert [b.num_rows for b in out] == [250, 250, 250, 250]
    odd = b"".join(encode_batch([(5, None, b"v", (("other", b"x"),))] * 100,
                                base_offset=100 * i) for i in range(10))
    out = assemble(odd, 0, 1000, rows_per_batch=250)  # the general loop: whole batches
    assert [b.num_rows for b in out] == [300, 300, 300, 100]


@given(st.lists(st.tuples(st.integers(0, 5000), st.one_of(st.none(), st.binary(max_size=9)),
                          st.one_of(st.none(), st.binary(max_size=200)),
                          st.one_of(st.just(()), lone_time)), min_size=1, max_size=30),
       st.integers(0, 40), st.sampled_from([TimestampType.CREATE_TIME,
                                            TimestampType.LOG_APPEND_TIME]))
def test_regular_batches_take_the_vector_path(entries: list, start: int, ts_type) -> None:
    """Uncompressed, short varints, no headers or the lone tq.time: Arrow kernels decode them
    (and agree with the codec, as every shape does in the test above)."""
    from querylib.records import read_header
    from querylib.spark._vector import vector_batch

    buf = encode_batch(entries, base_offset=3, timestamp_type=ts_type)
    batch = vector_batch(buf, [(0, read_header(buf))], "t", 1, start, 30, True)
    assert batch is not None
    assert batch.to_pylist() == expected_rows(buf, "t", 1, start, 30)


def test_control_batches_are_not_rows() -> None:
    buf = frontier_batch(7, timestamp=1) + end_of_stream_batch(timestamp=2)
    assembler = ColumnAssembler("t", 0, 0, 10)
    assert list(assembler.add(buf)) == [] and list(assembler.finish()) == []
    assert assembler.next_offset == 1  # both control batches have base offset 0 here


def test_a_flipped_bit_is_a_crc_error() -> None:
    buf = bytearray(encode_batch([(1, None, b"hello", ())]))
    buf[-2] ^= 0x10
    with pytest.raises(CorruptRecordError):
        assemble(bytes(buf), 0, 1, 10)


@given(st.binary(min_size=61, max_size=300), st.integers(61, 299))
def test_hostile_bytes_raise_record_errors(junk: bytes, cut: int) -> None:
    """A valid header over garbage records: RecordError, never another exception."""
    good = encode_batch([(1, b"k", b"v" * 40, ((TIME_HEADER, bytes(8)),)), (2, None, b"w", ())])
    body = bytearray(good[:61] + junk)
    body[8:12] = (len(body) - 12).to_bytes(4, "big")
    import crc32c
    body[17:21] = crc32c.crc32c(bytes(body[21:])).to_bytes(4, "big")
    try:
        out = assemble(bytes(body[:max(cut, 61)]), 0, 10, 10)
    except RecordError:
        return
    for batch in out:
        assert batch.schema.equals(ARROW_SCHEMA)


# ---- int64 timestamps: whatever the codec encodes and decodes ------------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Extremes and their neighbours (the deltas between them span all of int64, and wrap as
# Java's long arithmetic does), small values, and anything else.
any_timestamp = st.one_of(
    st.sampled_from([INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, -1, 0,
                     INT64_MAX // 1000, INT64_MAX // 1000 + 1, -(2**52), 2**52]),
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(0, 2**41),
)
any_record = st.tuples(
    any_timestamp,
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.just(()), lone_time, headers.map(tuple)),
)
controls = st.sampled_from(["frontier", "end", "commit", "abort"])
any_batch = st.tuples(
    st.lists(any_record, min_size=1, max_size=12),
    st.sampled_from(list(Compression)),
    st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]),
    st.one_of(st.none(), controls),  # followed by a control batch
)


def micros(ms: int) -> int:
    """The `timestamp` column (microseconds) for a record timestamp in ms: saturated at the
    ends of Spark's timestamp range (int64 microseconds)."""
    return max(INT64_MIN, min(INT64_MAX, ms * 1000))


def control_batch(kind: str, offset: int) -> bytes:
    control = {
        "frontier": lambda: frontier_batch(offset, timestamp=INT64_MAX),
        "end": lambda: end_of_stream_batch(timestamp=INT64_MIN),
        "commit": lambda: transaction_marker_batch(7, 0, True, timestamp=1),
        "abort": lambda: transaction_marker_batch(7, 0, False, timestamp=1),
    }[kind]()
    return offset.to_bytes(8, "big") + control[8:]


def build_any_log(spec: list) -> bytes:
    out = []
    offset = 0
    for entries, compression, ts_type, control in spec:
        out.append(encode_batch(entries, base_offset=offset, compression=compression,
                                timestamp_type=ts_type))
        offset += len(entries)
        if control is not None:
            out.append(control_batch(control, offset))
            offset += 1
    return b"".join(out)


def codec_rows(buf: bytes, start: int, stop: int) -> list[dict]:
    """What querylib.records decodes, as raw column values (timestamp: int64 microseconds)."""
    rows = []
    for batch in iter_batches(buf):
        if batch.is_control:
            continue
        for r in batch.records:
            if start <= r.offset < stop:
                time_value = next((v for k, v in r.headers
                                   if k == TIME_HEADER and v is not None and len(v) == 8), None)
                rows.append({
                    "key": r.key, "value": r.value, "topic": "t", "partition": 2,
                    "offset": r.offset, "timestamp": micros(r.timestamp),
                    "timestampType": int(batch.timestamp_type),
                    "headers": [{"key": k, "value": v} for k, v in r.headers] or None,
                    "tq_time": None if time_value is None
                    else int.from_bytes(time_value, "big", signed=True),
                })
    return rows


def raw_rows(out: list[pa.RecordBatch]) -> list[dict]:
    rows = []
    for batch in out:
        assert batch.schema.equals(ARROW_SCHEMA)
        i = batch.schema.get_field_index("timestamp")
        raw = batch.set_column(i, "timestamp", batch.column(i).cast(pa.int64()))
        rows += raw.to_pylist()
    return rows


def assemble_raw(buf: bytes, start: int, stop: int, rows_per_batch: int = 64 * 1024
                 ) -> list[dict]:
    assembler = ColumnAssembler("t", 2, start, stop, rows_per_batch)
    return raw_rows([*assembler.add(buf), *assembler.finish()])


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZSTD])
@pytest.mark.parametrize("ts_type", list(TimestampType))
def test_int64_extreme_timestamps_come_back_as_the_codec_decodes_them(compression,
                                                                         ts_type) -> None:
    """Timestamps (and deltas, which wrap as Java's long arithmetic does) at the ends of
    int64: the codec encodes and decodes them, so the Spark reader must read them too."""
    spans = [[INT64_MAX, INT64_MIN], [INT64_MIN, INT64_MAX], [0, INT64_MAX, INT64_MIN],
             [INT64_MAX], [INT64_MIN], [INT64_MAX - 1, INT64_MAX, INT64_MAX - 5],
             [INT64_MAX // 1000 + 1, -(INT64_MAX // 1000) - 2, 5]]
    buf = b"".join(
        encode_batch([(t, b"k%d" % i if i % 2 else None, b"v%d" % i, tq_time)
                      for i, t in enumerate(times)], base_offset=10 * n,
                     compression=compression, timestamp_type=ts_type)
        for n, times in enumerate(spans)
        for tq_time in [((TIME_HEADER, bytes(8)),)])
    assert codec_rows(buf, 0, 100)  # the codec decodes it all
    assert assemble_raw(buf, 0, 100) == codec_rows(buf, 0, 100)
    assert assemble_raw(buf, 11, 41, rows_per_batch=2) == codec_rows(buf, 11, 41)


@given(st.lists(any_batch, min_size=1, max_size=5), st.data())
def test_the_column_decoder_agrees_with_the_codec(spec: list, data: st.DataObject) -> None:
    """Any batches querylib.records encodes (timestamps anywhere in int64, keys and values
    null or not, headers, control batches, every compression): the columns hold what
    querylib.records decodes, whatever range of offsets and rows per batch."""
    buf = build_any_log(spec)
    total = sum(len(e) + (c is not None) for e, _, _, c in spec)
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total + 2))
    rows_per_batch = data.draw(st.sampled_from([1, 3, 64 * 1024]))
    assert assemble_raw(buf, start, stop, rows_per_batch) == codec_rows(buf, start, stop)
