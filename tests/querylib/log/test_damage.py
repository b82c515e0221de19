"""Damage in the middle of a log is reported, never silently deleted (issue 13 part 5).

A clean close leaves nothing to cut: bytes that fail their checks are remembered as a damaged
range, every valid batch before and after it stays readable, reads of the range raise
CorruptDataError naming topic, partition and offsets, and the log keeps taking appends.
"""

from __future__ import annotations

import os

import pytest

from querylib.errors import CorruptDataError, StorageError
from querylib.log import LogConfig, PartitionLog
from tests.querylib.log._batches import as_stored, make_batch, split_batches

CONFIG = LogConfig(segment_bytes=20_000, index_interval_bytes=300)


def _batches(count: int) -> list[bytes]:
    return [make_batch(1 + i % 3, value_size=60 + i % 50, seed=i) for i in range(count)]


def _write(path, batches) -> list[int]:
    with PartitionLog.open(path, CONFIG) as log:
        return [log.append(b) for b in batches]


def _layout(path) -> list[tuple[str, int, int]]:
    """(segment path, position, size) of every batch, in log order."""
    out = []
    for name in sorted(n for n in os.listdir(path) if n.endswith(".log")):
        data = open(os.path.join(path, name), "rb").read()
        pos = 0
        while pos < len(data):
            size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
            out.append((os.path.join(path, name), pos, size))
            pos += size
    return out


def _flip(path: str, position: int, count: int = 16) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        old = f.read(count)
        f.seek(position)
        f.write(bytes(b ^ 0x5A for b in old))


def _read_batch(log: PartitionLog, offset: int) -> bytes:
    return split_batches(log.read(offset, 1))[0]


def test_a_flip_mid_segment_after_a_clean_close_keeps_every_other_batch(tmp_path):
    path = tmp_path / "orders-3"
    batches = _batches(60)
    offsets = _write(path, batches)
    layout = _layout(path)
    damaged = 30
    segment, position, size = layout[damaged]
    _flip(segment, position + size // 2 - 8)  # 16 bytes in the middle of batch 30

    with PartitionLog.open(path, CONFIG) as log:
        assert log.log_end_offset == offsets[-1] + 1 + (len(batches) - 1) % 3
        for i, (batch, offset) in enumerate(zip(batches, offsets, strict=True)):
            if i == damaged:
                continue
            assert _read_batch(log, offset) == as_stored(batch, offset), f"batch {i}"
        first, end = offsets[damaged], offsets[damaged + 1]
        for offset in range(first, end):
            with pytest.raises(CorruptDataError) as caught:
                log.read(offset, 1 << 20)
        error = caught.value
        assert isinstance(error, StorageError) and error.kafka_error_code == 2
        assert (error.topic, error.partition) == ("orders", 3)
        assert (error.start_offset, error.end_offset) == (first, end)
        assert "orders" in str(error) and f"{first}..{end - 1}" in str(error)
        # a read from before the damage stops in front of it
        before = split_batches(log.read(offsets[damaged - 2], 1 << 20))
        assert before == [as_stored(b, o) for b, o in zip(batches[damaged - 2:damaged],
                                                          offsets[damaged - 2:damaged],
                                                          strict=True)]
        # the partition keeps taking appends after its old end
        assert log.append(batches[0]) == log.log_end_offset - 1
