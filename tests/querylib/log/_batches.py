"""Record batches for the log tests, built by kafka-python (an independent RecordBatch v2
encoder), so the log is tested against bytes it did not produce."""

from __future__ import annotations

import random
import struct

from kafka.record.default_records import DefaultRecordBatchBuilder

_PREFIX = struct.Struct(">qii")


def make_batch(
    count: int = 1,
    *,
    timestamp: int = 1_000,
    value_size: int = 10,
    seed: int = 0,
    key: bytes | None = b"k",
) -> bytes:
    """`count` records with timestamps timestamp..timestamp+count-1 and values derived from
    `seed`, so a test can rebuild the exact bytes it appended."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 30)
    rng = random.Random(seed)
    for i in range(count):
        value = rng.randbytes(value_size)
        builder.append(i, timestamp=timestamp + i, key=key, value=value, headers=[("h", b"x")])
    return bytes(builder.build())


def as_stored(batch: bytes, base_offset: int) -> bytes:
    """The bytes the log holds for `batch` appended at `base_offset`: base offset and leader
    epoch 0 stamped, the rest unchanged."""
    length = struct.unpack_from(">i", batch, 8)[0]
    return _PREFIX.pack(base_offset, length, 0) + batch[16:]


def split_batches(data: bytes) -> list[bytes]:
    """Cut concatenated batches at their lengths."""
    out, pos = [], 0
    while pos < len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        out.append(data[pos : pos + 12 + length])
        pos += 12 + length
    return out


def base_offset_of(batch: bytes) -> int:
    return struct.unpack_from(">q", batch, 0)[0]
