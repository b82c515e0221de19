"""Golden bytes: known batches and their exact encoding, field by field (Kafka's names).

The CRCs were checked against kafka-python's independent CRC-32C (see test_kafka_python.py,
which also decodes these batches with kafka-python)."""

from __future__ import annotations

import pytest

from querylib.records import (
    TIME_HEADER,
    ControlType,
    Record,
    decode_batch,
    encode_batch,
    end_of_stream_batch,
    frontier_batch,
)

HEADER_COMMON = (
    "ffffffff"  # partitionLeaderEpoch -1
    "02"  # magic
)
PRODUCER_NONE = (
    "ffffffffffffffff"  # producerId -1
    "ffff"  # producerEpoch -1
    "ffffffff"  # baseSequence -1
)

GOLDEN = [
    (
        "null key, null value, one header",
        dict(entries=[(1000, None, b"abc", ()), (1001, b"k", None, [("h", b"v")])]),
        "0000000000000000"  # baseOffset 0
        "00000047"  # batchLength 71
        + HEADER_COMMON +
        "3f97ace1"  # crc
        "0000"  # attributes: no compression, CreateTime
        "00000001"  # lastOffsetDelta 1
        "00000000000003e8"  # baseTimestamp 1000
        "00000000000003e9"  # maxTimestamp 1001
        + PRODUCER_NONE +
        "00000002"  # recordsCount 2
        # record 0: length 9, attributes 0, timestampDelta 0, offsetDelta 0, key null,
        # valueLength 3, "abc", headersCount 0
        "12" "00" "00" "00" "01" "06" "616263" "00"
        # record 1: length 11, attributes, timestampDelta 1, offsetDelta 1, keyLength 1 "k",
        # value null, headersCount 1, headerKeyLength 1 "h", headerValueLength 1 "v"
        "16" "00" "02" "02" "02" "6b" "01" "02" "02" "68" "02" "76",
    ),
    (
        "2-byte varints, negative timestamp delta, tq.time header",
        dict(entries=[(1000, b"k", b"a" * 64, ()),
                      (999, None, b"", [(TIME_HEADER, (7).to_bytes(8, "big"))])],
             base_offset=5),
        "0000000000000005"  # baseOffset 5
        "00000093"  # batchLength 147
        + HEADER_COMMON +
        "1c211c46"  # crc
        "0000"  # attributes
        "00000001"  # lastOffsetDelta
        "00000000000003e8"  # baseTimestamp 1000
        "00000000000003e8"  # maxTimestamp 1000 (the second record is older)
        + PRODUCER_NONE +
        "00000002"  # recordsCount
        # record 0: length 72 (2 bytes: 90 01), attributes, delta 0, offsetDelta 0,
        # keyLength 1 "k", valueLength 64 (80 01), 64 x "a", headersCount 0
        "9001" "00" "00" "00" "02" "6b" "8001" + "61" * 64 + "00"
        # record 1: length 23, attributes, timestampDelta -1, offsetDelta 1, key null,
        # valueLength 0, headersCount 1, "tq.time" (7), value length 8, int64 7
        "2e" "00" "01" "02" "01" "00" "02" "0e" "74712e74696d65" "10" "0000000000000007",
    ),
]


@pytest.mark.parametrize(("what", "kwargs", "hexbytes"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_encode_golden(what: str, kwargs: dict, hexbytes: str) -> None:
    assert encode_batch(**kwargs).hex() == hexbytes


@pytest.mark.parametrize(("what", "kwargs", "hexbytes"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_decode_golden(what: str, kwargs: dict, hexbytes: str) -> None:
    batch = decode_batch(bytes.fromhex(hexbytes))
    base = kwargs.get("base_offset", 0)
    assert batch.records == [
        Record(base + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(kwargs["entries"])]
    assert batch.size_in_bytes == len(hexbytes) // 2


CONTROL_GOLDEN = [
    (
        frontier_batch(42, timestamp=5),
        "0000000000000000"  # baseOffset
        "00000044"  # batchLength 68
        + HEADER_COMMON +
        "9db30d68"  # crc
        "0020"  # attributes: control (bit 5), not transactional (bit 4 clear)
        "00000000"  # lastOffsetDelta
        "0000000000000005" "0000000000000005"  # base and max timestamp
        + PRODUCER_NONE +
        "00000001"  # recordsCount
        # length 18, attributes, deltas 0, keyLength 4: version 0, type 100 (FRONTIER),
        # valueLength 8: int64 42, headersCount 0
        "24" "00" "00" "00" "08" "0000" "0064" "10" "000000000000002a" "00",
    ),
    (
        end_of_stream_batch(timestamp=9),
        "0000000000000000"
        "0000003c"  # batchLength 60
        + HEADER_COMMON +
        "6d234598"
        "0020"
        "00000000"
        "0000000000000009" "0000000000000009"
        + PRODUCER_NONE +
        "00000001"
        # length 10, attributes, deltas 0, key: version 0, type 101 (END_OF_STREAM), null value
        "14" "00" "00" "00" "08" "0000" "0065" "01" "00",
    ),
]


@pytest.mark.parametrize(("batch", "hexbytes"), CONTROL_GOLDEN, ids=["frontier", "eos"])
def test_control_golden(batch: bytes, hexbytes: str) -> None:
    assert batch.hex() == hexbytes
    decoded = decode_batch(batch)
    assert decoded.is_control and not decoded.is_transactional and decoded.producer_id == -1
    assert decoded.records[0].key[2:] in (ControlType.FRONTIER.to_bytes(2, "big"),
                                          ControlType.END_OF_STREAM.to_bytes(2, "big"))
