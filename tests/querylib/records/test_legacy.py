"""Legacy message sets (magic 0 and 1): decoded against kafka-python's builder and reader, the
v1 wrapper rules (relative offsets, LogAppendTime), and malformed messages."""

from __future__ import annotations

import struct

import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from querylib.errors import (
    CompressionError,
    CorruptRecordError,
    InvalidLengthError,
    InvalidRecordError,
    TruncatedRecordError,
)
from querylib.records import (
    Compression,
    Record,
    TimestampType,
    decode_legacy,
    encode_batch,
    iter_batches,
)
from querylib.records._compression import compress

from ._build import legacy_message

pytestmark = pytest.mark.usefixtures("snappy_for_kafka_python")

ITEMS = [(1_600_000_000_000 + i, None if i % 3 == 0 else b"key%d" % i,
          None if i % 4 == 1 else b"value-%d" % i * (i + 1)) for i in range(12)]


def kafka_python_message_set(magic: int, codec: int, base: int) -> bytes:
    """A message set as kafka-python's producer builds it, placed at offset `base` the way a
    broker does: uncompressed messages get absolute offsets; a wrapper gets the absolute offset
    of its last inner message (v0 inner offsets are absolute, v1 ones count from 0)."""
    if codec == 0:
        out = b""
        for i, (ts, key, value) in enumerate(ITEMS):
            builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
            builder.append(base + i, ts, key, value)
            out += bytes(builder.build())
        return out
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (ts, key, value) in enumerate(ITEMS):
        builder.append(i if magic == 1 else base + i, ts, key, value)
    wrapper = bytes(builder.build())
    return struct.pack(">q", base + len(ITEMS) - 1) + wrapper[8:]  # offset is outside the CRC


CASES = [(magic, codec) for magic in (0, 1) for codec in (0, 1, 2, 3)
         if (magic, codec) != (0, 3)]  # v0 lz4 used a broken frame checksum: not supported


@pytest.mark.parametrize(("magic", "codec"), CASES)
def test_decode_what_kafka_python_builds(magic: int, codec: int) -> None:
    raw = kafka_python_message_set(magic, codec, base=500)
    ours = list(iter_batches(raw))
    records = [r for batch in ours for r in batch.records]
    assert records == [Record(500 + i, ts if magic == 1 else -1, key, value)
                       for i, (ts, key, value) in enumerate(ITEMS)]
    theirs = [r for batch in MemoryRecords(raw) for r in batch]
    assert [(r.offset, r.key, r.value) for r in theirs] == \
        [(r.offset, r.key, r.value) for r in records]
    assert {b.magic for b in ours} == {magic}
    assert {b.compression for b in ours} == {Compression(codec)}
    assert sum(b.size_in_bytes for b in ours) == len(raw)
    assert ours[-1].next_offset == 500 + len(ITEMS)


def test_v1_wrapper_with_log_append_time_stamps_every_inner_message() -> None:
    inner = b"".join(legacy_message(i, b"v%d" % i, timestamp=i) for i in range(3))
    wrapper = legacy_message(42, compress(Compression.GZIP, inner), attributes=0x08 | 1,
                             timestamp=777)
    (batch,) = iter_batches(wrapper)
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert [(r.offset, r.timestamp) for r in batch.records] == [(40, 777), (41, 777), (42, 777)]
    assert (batch.base_offset, batch.last_offset_delta, batch.max_timestamp) == (40, 2, 777)


def test_segment_mixing_legacy_and_v2() -> None:
    segment = (legacy_message(0, b"v0", magic=0) + legacy_message(1, b"v1", timestamp=5)
               + encode_batch([(6, None, b"v2", ())], base_offset=2))
    batches = list(iter_batches(segment))
    assert [b.magic for b in batches] == [0, 1, 2]
    assert [b.records[0].value for b in batches] == [b"v0", b"v1", b"v2"]
    assert list(iter_batches(bytearray(segment))) == batches
    assert list(iter_batches(memoryview(segment))) == batches


def _wrap(inner: bytes, *, magic: int = 1, codec: int = 1) -> bytes:
    return legacy_message(10, compress(codec, inner), magic=magic, attributes=codec)


BAD = [
    ("crc", legacy_message(0, b"v")[:-1] + b"w", CorruptRecordError),
    ("messageSize below the minimum", struct.pack(">qi", 0, 13) + b"\x00" * 13,
     InvalidLengthError),
    ("messageSize above the maximum", struct.pack(">qi", 0, 1 << 30) + b"\x00" * 20,
     InvalidLengthError),
    ("cut short", legacy_message(0, b"value")[:-2], TruncatedRecordError),
    ("nested compression", _wrap(legacy_message(0, compress(1, b"x"), attributes=1)),
     InvalidRecordError),
    ("inner magic differs", _wrap(legacy_message(0, b"v", magic=0)), InvalidRecordError),
    ("empty wrapper", _wrap(b""), InvalidRecordError),
    ("wrapper with a null value", legacy_message(0, None, attributes=1), InvalidRecordError),
    ("zstd before magic 2", _wrap(legacy_message(0, b"v"), codec=4), CompressionError),
    ("inner message cut short", _wrap(legacy_message(0, b"v")[:-1]), TruncatedRecordError),
    ("inner crc", _wrap(legacy_message(0, b"v")[:-1] + b"w"), CorruptRecordError),
]


@pytest.mark.parametrize(("what", "raw", "error"), BAD, ids=[b[0] for b in BAD])
def test_bad_legacy_messages(what: str, raw: bytes, error: type) -> None:
    with pytest.raises(error):
        decode_legacy(raw)
    with pytest.raises(error):
        list(iter_batches(raw))


def test_lengths_inside_a_message_are_bounded_by_it() -> None:
    body = bytes([1, 0]) + struct.pack(">q", 0) + struct.pack(">i", 1000) + b"\x00" * 8
    import zlib
    raw = struct.pack(">qiI", 0, len(body) + 4, zlib.crc32(body)) + body
    with pytest.raises(InvalidLengthError):
        decode_legacy(raw)
    # bytes after the value are refused too
    good = legacy_message(0, b"v")
    body = good[16:] + b"extra"
    raw = struct.pack(">qiI", 0, len(body) + 4, zlib.crc32(body)) + body
    with pytest.raises(InvalidRecordError):
        decode_legacy(raw)
