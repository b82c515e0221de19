"""tq's control records: FRONTIER and END_OF_STREAM batches, parsing Kafka control keys."""

from __future__ import annotations

import pytest
from hypothesis import given

from querylib.errors import InvalidRecordError
from querylib.records import (
    ControlType,
    Record,
    control_of,
    decode_batch,
    decode_int64,
    encode_batch,
    encode_int64,
    end_of_stream_batch,
    frontier_batch,
    frontier_of,
)

from .strategies import INT64


@given(INT64, INT64)
def test_frontier_batch_round_trip(frontier: int, timestamp: int) -> None:
    batch = decode_batch(frontier_batch(frontier, timestamp=timestamp))
    assert batch.is_control and not batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    (record,) = batch.records
    assert record.timestamp == timestamp
    assert control_of(record) == (ControlType.FRONTIER, encode_int64(frontier))
    assert frontier_of(record) == frontier


def test_end_of_stream_batch() -> None:
    batch = decode_batch(end_of_stream_batch(timestamp=123))
    assert batch.is_control and batch.producer_id == -1
    assert control_of(batch.records[0]) == (ControlType.END_OF_STREAM, None)


def test_kafka_transaction_markers_parse() -> None:
    # a COMMIT marker as a Kafka broker writes it: value = version 0, coordinatorEpoch int32
    raw = encode_batch([(0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", ())],
                       is_control=True, is_transactional=True, producer_id=7, producer_epoch=0)
    kind, value = control_of(decode_batch(raw).records[0])
    assert kind == ControlType.COMMIT and value == b"\x00\x00\x00\x00\x00\x05"


def test_a_newer_key_version_is_read_with_the_same_layout() -> None:
    # as Java's ControlRecordType.parse: higher versions keep version and type in front
    record = Record(0, 0, b"\x00\x01\x00\x65extra", None)
    assert control_of(record) == (ControlType.END_OF_STREAM, None)


@pytest.mark.parametrize("key", [None, b"", b"\x00\x00\x00", b"\xff\xff\x00\x64",
                                 b"\x00\x00\x00\x63", b"\x00\x00\x7f\xff"])
def test_bad_control_keys(key: bytes | None) -> None:
    with pytest.raises(InvalidRecordError):
        control_of(Record(0, 0, key, None))


def test_frontier_of_checks_type_and_value() -> None:
    eos = decode_batch(end_of_stream_batch(timestamp=0)).records[0]
    with pytest.raises(InvalidRecordError, match="END_OF_STREAM"):
        frontier_of(eos)
    with pytest.raises(InvalidRecordError):
        frontier_of(Record(0, 0, b"\x00\x00\x00\x64", b"\x00" * 7))
    with pytest.raises(InvalidRecordError):
        frontier_of(Record(0, 0, b"\x00\x00\x00\x64", None))


@given(INT64)
def test_int64_values(n: int) -> None:
    assert decode_int64(encode_int64(n)) == n
    assert len(encode_int64(n)) == 8


def test_int64_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_int64(1 << 63)
    with pytest.raises(ValueError):
        frontier_batch(-(1 << 63) - 1, timestamp=0)
