"""Fetch responses framed by hand (for sendfile) are byte for byte what kio encodes for the same
response, at every served version."""

from __future__ import annotations

import uuid

import pytest

from querylib.kafka._apis import ApiKey, build_response, encode_response
from querylib.server.kafka._fetch import FetchedPartition, FetchedTopic, encode_fetch_response


class Slice:
    """Stands for a file slice: only its length is framed, its bytes are sent apart."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)


def _joined(chunks: list) -> bytes:
    return b"".join(c if isinstance(c, bytes) else c.data for c in chunks)


TOPICS = [
    ("numbers", [(0, 0, 10, b"A" * 70 + b"B" * 5), (3, 1, 4, b""), (7, 0, 99, b"C")]),
    ("ü-topic", [(1, 0, 0, b"")]),
]


IDS = {name: uuid.uuid5(uuid.NAMESPACE_URL, name) for name, _ in TOPICS}


@pytest.mark.parametrize("version", range(4, 18))
def test_fetch_response_matches_kio(version: int) -> None:
    ours = [FetchedTopic(name, [
        FetchedPartition(index, error, hw, hw, 2, [Slice(records[:70]), records[70:]]
                         if records else [])
        for index, error, hw, records in partitions], IDS[name].bytes)
        for name, partitions in TOPICS]
    chunks, size = encode_fetch_response(version, ours, throttle_time_ms=5, error_code=0,
                                         session_id=0)
    data = {"throttle_time": 5, "error_code": 0, "session_id": 0, "responses": [
        {"topic": name, "topic_id": IDS[name], "partitions": [
            {"partition_index": index, "error_code": error, "high_watermark": hw,
             "last_stable_offset": hw, "log_start_offset": 2, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": records}
            for index, error, hw, records in partitions]} for name, partitions in TOPICS]}
    expected = encode_response(build_response(ApiKey.FETCH, version, data))
    assert _joined(chunks) == expected
    assert size == len(expected)
    assert any(isinstance(c, Slice) for c in chunks)  # slices stay slices


def test_empty_slices_are_left_out() -> None:
    chunks, size = encode_fetch_response(11, [FetchedTopic("t", [
        FetchedPartition(0, records=[Slice(b"")])])])
    assert all(isinstance(c, bytes) for c in chunks)
    assert size == sum(len(c) for c in chunks)


def test_versions_outside_the_served_range_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_fetch_response(18, [])
    with pytest.raises(ValueError):
        encode_fetch_response(3, [])


def test_flexible_records_over_127_bytes_take_a_two_byte_length() -> None:
    records = b"R" * 300
    ours = [FetchedTopic("t", [FetchedPartition(0, 0, 1, 1, 0, [Slice(records)])],
                         IDS["numbers"].bytes)]
    chunks, size = encode_fetch_response(12, ours)
    expected = encode_response(build_response(ApiKey.FETCH, 12, {
        "throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [
            {"topic": "t", "partitions": [
                {"partition_index": 0, "error_code": 0, "high_watermark": 1,
                 "last_stable_offset": 1, "log_start_offset": 0, "aborted_transactions": None,
                 "preferred_read_replica": -1, "records": records}]}]}))
    assert _joined(chunks) == expected and size == len(expected)
