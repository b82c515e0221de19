"""RecordBatch v2 round trips (every codec, nulls, headers, int64 extremes, varint boundaries)
and the batch-level API: verify_batch, stamp_base_offset, iter_batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.errors import CorruptRecordError, TruncatedRecordError
from querylib.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    Compression,
    Record,
    TimestampType,
    decode_batch,
    encode_batch,
    iter_batches,
    read_header,
    stamp_base_offset,
    verify_batch,
)
from querylib.records._varint import INT64_MAX, INT64_MIN

from .strategies import batch_params, entries


def expected_records(items, base_offset: int, timestamp_type=TimestampType.CREATE_TIME):
    max_ts = max(ts for ts, *_ in items)
    return [Record(base_offset + i,
                   max_ts if timestamp_type == TimestampType.LOG_APPEND_TIME else ts,
                   key, value, tuple(headers))
            for i, (ts, key, value, headers) in enumerate(items)]


@settings(max_examples=150)
@given(entries, batch_params)
def test_round_trip(items, params) -> None:
    raw = encode_batch(items, **params)
    batch = decode_batch(raw)
    assert batch.records == expected_records(items, params["base_offset"],
                                             params["timestamp_type"])
    assert (batch.base_offset, batch.magic, batch.compression, batch.timestamp_type,
            batch.is_transactional, batch.is_control, batch.producer_id, batch.producer_epoch,
            batch.base_sequence, batch.partition_leader_epoch) == (
        params["base_offset"], 2, params["compression"], params["timestamp_type"],
        params["is_transactional"], params["is_control"], params["producer_id"],
        params["producer_epoch"], params["base_sequence"], params["partition_leader_epoch"])
    assert batch.last_offset_delta == len(items) - 1
    assert batch.next_offset == params["base_offset"] + len(items)
    assert batch.base_timestamp == items[0][0]
    assert batch.max_timestamp == max(ts for ts, *_ in items)
    assert batch.size_in_bytes == len(raw)
    header = verify_batch(raw)
    assert header.crc == batch.crc and header.size == len(raw)
    assert header.records_count == len(items)
    # the same bytes inside a bigger buffer, and as bytearray / memoryview
    assert decode_batch(b"junk" + raw + b"more", 4) == batch
    assert decode_batch(bytearray(raw)) == batch
    assert decode_batch(memoryview(b"x" + raw)[1:]) == batch


@settings(max_examples=25)
@given(st.sampled_from(list(Compression)), st.integers(1, 3000))
def test_many_records_cross_the_table_sizes(codec: Compression, n: int) -> None:
    # offset deltas and timestamp deltas beyond the encoder's lookup tables (8192) included
    items = [(i * 7, None, b"v" * (i % 5), ()) for i in range(n)] + [(10**6, b"k", b"x", ())]
    batch = decode_batch(encode_batch(items, compression=codec))
    assert batch.records == expected_records(items, 0)


def test_offset_deltas_beyond_two_byte_varints() -> None:
    items = [(0, None, None, ())] * 20000
    assert [r.offset for r in decode_batch(encode_batch(items, base_offset=3)).records] == \
        list(range(3, 20003))


@pytest.mark.parametrize("timestamps", [
    [INT64_MIN, INT64_MAX],  # delta 2**64 - 1 wraps to -1, as Java's long arithmetic
    [INT64_MAX, INT64_MIN],
    [INT64_MAX, INT64_MAX - 1, INT64_MAX],
    [INT64_MIN, INT64_MIN + 1, INT64_MIN + 70000],
    [-1, 0, 1],
])
def test_int64_timestamp_extremes(timestamps: list[int]) -> None:
    items = [(ts, None, b"v", ()) for ts in timestamps]
    batch = decode_batch(encode_batch(items))
    assert [r.timestamp for r in batch.records] == timestamps
    assert batch.max_timestamp == max(timestamps)


def test_log_append_time_gives_every_record_the_max_timestamp() -> None:
    items = [(5, None, b"a", ()), (9, None, b"b", ()), (7, None, b"c", ())]
    batch = decode_batch(encode_batch(items, timestamp_type=TimestampType.LOG_APPEND_TIME))
    assert [r.timestamp for r in batch.records] == [9, 9, 9]


@pytest.mark.parametrize(("entries", "error"), [
    ([], ValueError),
    ([(0, "text", None, ())], TypeError),
    ([(0, None, 5, ())], TypeError),
    ([(0, None, None, [(b"bytes-key", None)])], TypeError),
    ([(0, None, None, [("k", "text")])], TypeError),
    ([(1.5, None, None, ())], TypeError),
    ([(INT64_MAX + 1, None, None, ())], ValueError),
    ([(0, None, None, ()), (INT64_MIN - 1, None, None, ())], ValueError),
])
def test_encode_rejects_bad_entries(entries, error) -> None:
    with pytest.raises(error):
        encode_batch(entries)


@pytest.mark.parametrize("field", ["producer_epoch", "base_sequence", "partition_leader_epoch"])
def test_encode_rejects_header_fields_out_of_range(field: str) -> None:
    with pytest.raises(ValueError):
        encode_batch([(0, None, None, ())], **{field: 1 << 40})


def test_encode_rejects_batches_above_the_maximum() -> None:
    with pytest.raises(ValueError, match="MAX_BATCH_SIZE"):
        encode_batch([(0, None, bytes(MAX_BATCH_SIZE), ())])


def test_record_headers_keep_order_duplicates_and_nulls() -> None:
    headers = [("a", b"1"), ("a", None), ("", b""), ("ü", b"\xff")]
    (record,) = decode_batch(encode_batch([(0, None, None, headers)])).records
    assert record.headers == tuple(headers)


def test_stamp_base_offset_keeps_the_crc_valid() -> None:
    raw = encode_batch([(0, b"k", b"v", ())] * 3)
    stamped = stamp_base_offset(raw, 1000)
    assert verify_batch(stamped).base_offset == 1000
    assert [r.offset for r in decode_batch(stamped).records] == [1000, 1001, 1002]


def test_stamp_base_offset_stamps_the_leader_epoch_too_when_given() -> None:
    # A replicated partition's leader makes its stored bytes in one call (one copy).
    raw = encode_batch([(0, b"k", b"v" * 300, ())] * 40)
    stamped = stamp_base_offset(raw, 77, 5)
    header = verify_batch(stamped)
    assert (header.base_offset, header.partition_leader_epoch) == (77, 5)
    assert stamped[16:] == raw[16:] and stamped[8:12] == raw[8:12]
    from querylib.records import stamp_producer_split

    split = stamp_producer_split(raw, 3, 0, 0)
    assert stamp_base_offset(split, 77, 5) == stamp_base_offset(bytes(split), 77, 5)
    assert verify_batch(stamp_base_offset(split, 77, 5)).partition_leader_epoch == 5


def test_verify_batch_checks_crc_and_presence() -> None:
    raw = encode_batch([(0, None, b"value", ())])
    mutated = raw[:-2] + b"X" + raw[-1:]  # the last value byte (headersCount follows)
    with pytest.raises(CorruptRecordError):
        verify_batch(mutated)
    with pytest.raises(CorruptRecordError):
        decode_batch(mutated)
    with pytest.raises(TruncatedRecordError):
        verify_batch(raw[:-1])
    assert decode_batch(mutated, verify_crc=False).records[0].value == b"valuX"


def test_read_header_reads_only_the_header() -> None:
    raw = encode_batch([(7, None, b"v", ())], base_offset=9)
    header = read_header(raw[:HEADER_SIZE])
    assert (header.base_offset, header.magic, header.records_count, header.size) == (
        9, 2, 1, len(raw))
    assert header.size == LOG_OVERHEAD + header.batch_length


def test_iter_batches_walks_a_segment() -> None:
    batches = [encode_batch([(i, None, bytes([i]), ())] * (i + 1), base_offset=i * 10,
                            compression=Compression(i % 5)) for i in range(6)]
    segment = b"".join(batches)
    decoded = list(iter_batches(segment))
    assert [b.base_offset for b in decoded] == [0, 10, 20, 30, 40, 50]
    assert sum(b.size_in_bytes for b in decoded) == len(segment)
    assert list(iter_batches(bytearray(segment))) == decoded
    assert list(iter_batches(b"")) == []


def test_iter_batches_stops_at_a_torn_tail_after_the_valid_prefix() -> None:
    good = encode_batch([(0, None, b"a", ())]) * 2
    torn = encode_batch([(0, None, b"b" * 50, ())])[:-10]
    seen = []
    with pytest.raises(TruncatedRecordError):
        for batch in iter_batches(good + torn):
            seen.append(batch.size_in_bytes)
    assert sum(seen) == len(good)  # where log recovery truncates


def test_stamping_a_producer_without_copying_the_records() -> None:
    """An idempotent producer stamps a batch it did not encode by rewriting its header alone
    (issue 13: stamping by copying each 110 KB batch cost the pre-built path its throughput):
    the records stay the caller's bytes, and the two parts are the batch stamp_producer makes."""
    from querylib.records import SplitBatch, batch_head, stamp_producer, stamp_producer_split

    batch = encode_batch([(7, None, b"v" * 200, [])] * 50)
    split = stamp_producer_split(batch, 1 << 62, 0, 12345)
    assert isinstance(split, SplitBatch) and batch_head(split) is split.head
    assert len(split.head) == 61 and len(split) == len(batch)
    assert split.body.obj is batch  # a view of the caller's records: nothing copied
    assert bytes(split) == bytes(stamp_producer(batch, 1 << 62, 0, 12345))
    header = verify_batch(bytes(split))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == \
        (1 << 62, 0, 12345)
    assert stamp_base_offset(split, 9) == stamp_base_offset(bytes(split), 9)
    with pytest.raises(TruncatedRecordError):
        stamp_producer_split(batch[:40], 1, 0, 0)
