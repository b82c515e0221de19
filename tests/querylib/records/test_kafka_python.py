"""Cross-check against an independent implementation, kafka-python's record module: it reads
every batch tq writes (every codec, control batches, headers, nulls) and tq reads every batch it
builds, compressed ones included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from querylib.records import (
    Compression,
    ControlType,
    Record,
    decode_batch,
    encode_batch,
    end_of_stream_batch,
    frontier_batch,
    iter_batches,
)

from .strategies import headers, near, nullable_bytes
from .test_golden import CONTROL_GOLDEN, GOLDEN

pytestmark = pytest.mark.usefixtures("snappy_for_kafka_python")

CODECS = list(Compression)
# compressible values, so kafka-python's builder keeps the codec (it falls back to none when
# compression does not shrink the batch)
compressible = st.none() | st.integers(0, 300).map(lambda n: b"tq-value-" * n)
kp_entries = st.lists(st.tuples(near, nullable_bytes, compressible, headers), min_size=1,
                      max_size=30)


def theirs(raw: bytes) -> list[tuple]:
    batch = DefaultRecordBatch(bytearray(raw))
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]


@settings(max_examples=100)
@given(kp_entries, st.sampled_from(CODECS), st.integers(0, 1 << 40))
def test_kafka_python_reads_what_tq_writes(items, codec, base_offset) -> None:
    raw = encode_batch(items, compression=codec, base_offset=base_offset)
    assert theirs(raw) == [(base_offset + i, ts, key, value, tuple(hs))
                           for i, (ts, key, value, hs) in enumerate(items)]
    batch = DefaultRecordBatch(bytearray(raw))
    assert (batch.base_offset, batch.compression_type, batch.next_offset, batch.size_in_bytes) == \
        (base_offset, codec, base_offset + len(items), len(raw))


def build_with_kafka_python(items, codec: int, *, producer=(-1, -1, -1), transactional=False):
    builder = DefaultRecordBatchBuilder(2, codec, transactional, *producer, batch_size=1 << 26)
    for i, (ts, key, value, hs) in enumerate(items):
        assert builder.append(i, ts, key, value, list(hs)) is not None
    return bytes(builder.build())


@settings(max_examples=100)
@given(kp_entries, st.sampled_from(CODECS))
def test_tq_reads_what_kafka_python_writes(items, codec) -> None:
    raw = build_with_kafka_python(items, codec)
    batch = decode_batch(raw)
    assert batch.records == [Record(i, ts, key, value, tuple(hs))
                             for i, (ts, key, value, hs) in enumerate(items)]
    assert batch.partition_leader_epoch == 0  # kafka-python leaves it to the broker


@pytest.mark.parametrize("codec", CODECS)
def test_big_compressed_batches_both_ways(codec: Compression) -> None:
    items = [(1_700_000_000_000 + i // 50, None, b"%08d" % i * 12, ()) for i in range(8000)]
    ours = encode_batch(items, compression=codec)
    assert len(theirs(ours)) == 8000
    kp = build_with_kafka_python(items, codec)
    assert DefaultRecordBatch(bytearray(kp)).compression_type == codec
    assert [r.value for r in decode_batch(kp).records] == [v for _, _, v, _ in items]


def test_producer_state_and_transactional_flag() -> None:
    items = [(5, b"k", b"v" * 100, ())] * 3
    kp = build_with_kafka_python(items, 0, producer=(77, 3, 1000), transactional=True)
    batch = decode_batch(kp)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence,
            batch.is_transactional) == (77, 3, 1000, True)
    ours = encode_batch(items, producer_id=77, producer_epoch=3, base_sequence=1000,
                        is_transactional=True)
    theirs_batch = DefaultRecordBatch(bytearray(ours))
    assert (theirs_batch.producer_id, theirs_batch.producer_epoch, theirs_batch.base_sequence,
            theirs_batch.is_transactional) == (77, 3, 1000, True)


def test_kafka_python_sees_tq_control_batches_as_control() -> None:
    for raw, kind in ((frontier_batch(99, timestamp=1), ControlType.FRONTIER),
                      (end_of_stream_batch(timestamp=1), ControlType.END_OF_STREAM)):
        batch = DefaultRecordBatch(bytearray(raw))
        assert batch.validate_crc() and batch.is_control_batch
        assert not batch.is_transactional and batch.producer_id == -1
        (record,) = list(batch)
        assert (record.version, record.type) == (0, kind)


def test_memory_records_walks_a_tq_segment() -> None:
    segment = b"".join(encode_batch([(i, None, b"v" * 200, ())] * 5, base_offset=i * 5,
                                    compression=Compression(i % 5)) for i in range(10))
    theirs_offsets = [r.offset for batch in MemoryRecords(segment) for r in batch]
    ours_offsets = [r.offset for batch in iter_batches(segment) for r in batch.records]
    assert theirs_offsets == ours_offsets == list(range(50))


@pytest.mark.parametrize("hexbytes", [g[2] for g in GOLDEN] + [c[1] for c in CONTROL_GOLDEN])
def test_golden_batches_are_valid_for_kafka_python(hexbytes: str) -> None:
    assert DefaultRecordBatch(bytearray.fromhex(hexbytes)).validate_crc()
