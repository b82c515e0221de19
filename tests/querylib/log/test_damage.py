"""Damage in the middle of a log is reported, never silently deleted (issue 13 part 5).

A clean close leaves nothing to cut: bytes that fail their checks are remembered as a damaged
range, every valid batch before and after it stays readable, reads of the range raise
CorruptDataError naming topic, partition and offsets, and the log keeps taking appends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from querylib.errors import CorruptDataError, LogLockedError, QuarantinedDataError, StorageError
from querylib.log import LogConfig, PartitionLog, check_partition, repair_partition
from tests.querylib.log._batches import as_stored, make_batch, split_batches

CONFIG = LogConfig(segment_bytes=20_000, index_interval_bytes=300)
ROOT = Path(__file__).resolve().parents[3]


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


def _damaged_log(tmp_path, damaged: int = 30):
    """A cleanly closed log of 60 batches whose batch `damaged` had 16 bytes flipped."""
    path = tmp_path / "orders-3"
    batches = _batches(60)
    offsets = _write(path, batches)
    segment, position, size = _layout(path)[damaged]
    _flip(segment, position + size // 2 - 8)
    return path, batches, offsets, segment, position, size


def _tq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "querylib.cli", "log", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_log_check_reports_the_damage_and_exits_non_zero(tmp_path):
    path, batches, offsets, segment, position, size = _damaged_log(tmp_path)
    clean = tmp_path / "clean-0"
    _write(clean, _batches(5))
    (finding,) = check_partition(str(path))  # before any broker reopened the log
    assert finding.kind == "damaged" and finding.segment == segment
    damage = finding.damage
    assert (damage.position, damage.end_position) == (position, position + size)
    assert (damage.start_offset, damage.end_offset) == (offsets[30], offsets[31])
    assert "CRC" in damage.reason
    before = sorted(os.listdir(path))
    done = _tq("check", "--data", str(tmp_path))
    assert done.returncode == 1, done.stderr
    assert f"offsets {offsets[30]}..{offsets[31] - 1}" in done.stdout
    assert f"bytes {position}..{position + size - 1}" in done.stdout
    assert "checked 2 partition(s): 1 damaged range(s)" in done.stdout
    rows = [json.loads(line) for line in _tq("check", str(path), "--json").stdout.splitlines()]
    assert [(r["kind"], r["start_offset"], r["end_offset"], r["position"]) for r in rows] == [
        ("damaged", offsets[30], offsets[31], position)]
    assert sorted(os.listdir(path)) == before
    assert _tq("check", str(clean)).returncode == 0


def test_check_and_repair_refuse_a_log_that_is_open(tmp_path):
    path, *_ = _damaged_log(tmp_path)
    with PartitionLog.open(path, CONFIG):
        for run in (check_partition, repair_partition):
            with pytest.raises(LogLockedError, match="stop the broker"):
                run(str(path))
        done = _tq("repair", str(path))
        assert done.returncode == 2 and "stop the broker" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_log_repair_quarantines_the_damage_and_readers_see_the_gap(tmp_path):
    path, batches, offsets, segment, position, size = _damaged_log(tmp_path)
    damaged_bytes = open(segment, "rb").read()[position:position + size]
    with PartitionLog.open(path, CONFIG):
        pass  # a broker reopened it meanwhile: the damage is recorded beside the segment
    done = _tq("repair", str(path))
    assert done.returncode == 0, done.stderr
    assert "1 damaged range(s) quarantined" in done.stdout
    quarantine = f"{segment}.corrupt-{position}"
    assert open(quarantine, "rb").read() == damaged_bytes
    assert damaged_bytes not in open(segment, "rb").read()
    assert _tq("repair", str(path)).stdout.strip().endswith("nothing to repair")
    checked = _tq("check", str(path))
    assert checked.returncode == 0 and "repaired" in checked.stdout, checked.stdout
    # Kafka's tools read the rewritten segment whole
    dumped = _tq("dump", segment)
    assert dumped.returncode == 0 and "Found" not in dumped.stdout, dumped.stdout
    first, end = offsets[30], offsets[31]
    for _reopen in range(2):  # the gap survives a clean reopen with trusted indexes
        with PartitionLog.open(path, CONFIG) as log:
            for i, (batch, offset) in enumerate(zip(batches, offsets, strict=True)):
                if i != 30:
                    assert _read_batch(log, offset) == as_stored(batch, offset)
            with pytest.raises(QuarantinedDataError) as caught:
                log.read(first, 1)
            assert (caught.value.start_offset, caught.value.end_offset) == (first, end)
            assert os.path.basename(quarantine) in str(caught.value)
            # reads from before stop in front of the gap
            assert split_batches(log.read(offsets[29], 1 << 20)) == [
                as_stored(batches[29], offsets[29])]
            end_offset = log.log_end_offset
    with PartitionLog.open(path, CONFIG) as log:
        assert log.log_end_offset == end_offset
        assert log.append(batches[0]) == end_offset


def test_unclean_shutdown_cuts_only_the_torn_tail_and_keeps_mid_damage(tmp_path):
    path = tmp_path / "t-0"
    batches = _batches(40)
    log = PartitionLog.open(path, CONFIG)
    offsets = [log.append(b) for b in batches]
    crash = tmp_path / "crash-0"
    shutil.copytree(path, crash)  # what a crash leaves: no clean-shutdown marker
    log.close()
    layout = _layout(crash)
    segment, position, size = layout[-10]
    assert segment == layout[-1][0]  # the damage is in the last (active) segment
    _flip(segment, position + size // 2 - 8)
    last_segment, last_position, last_size = layout[-1]
    os.truncate(last_segment, last_position + last_size - 5)  # and its last write torn
    with PartitionLog.open(crash, CONFIG) as log:
        assert log.log_end_offset == offsets[-1]  # only the torn batch is cut
        with pytest.raises(CorruptDataError):
            log.read(offsets[-10], 1)
        for i in (-11, -9, -2):
            assert _read_batch(log, offsets[i]) == as_stored(batches[i], offsets[i])
