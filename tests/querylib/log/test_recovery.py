"""Reopening a log: the clean fast path, and recovery from torn, corrupt or missing files.

An unclean shutdown is simulated by copying the directory of a log that is still open: the
copy holds what a crash would leave (no clean-shutdown marker, the page cache's bytes).
"""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from querylib.errors import CorruptDataError
from querylib.log import LogConfig, PartitionLog
from querylib.records import decode_batch
from tests.querylib.log._batches import as_stored, make_batch, split_batches

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=300)


def _batches(count: int) -> list[bytes]:
    return [make_batch(1 + i % 3, value_size=60 + i % 50, seed=i) for i in range(count)]


def _write(path, batches, *, close: bool = True, crash_to=None) -> list[int]:
    log = PartitionLog.open(path, CONFIG)
    offsets = [log.append(b) for b in batches]
    if crash_to is not None:
        shutil.copytree(path, crash_to)
    log.close() if close else None
    return offsets


def _all_batches(log: PartitionLog, *, skip_damage: bool = False) -> list[bytes]:
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        try:
            pieces = split_batches(log.read(offset, 1 << 20))
        except CorruptDataError as exc:
            if not skip_damage:
                raise
            offset = exc.end_offset
            continue
        out += pieces
        last = pieces[-1]
        offset = int.from_bytes(last[:8], "big") + int.from_bytes(last[23:27], "big") + 1
    return out


def _expected(batches, offsets):
    return [as_stored(b, o) for b, o in zip(batches, offsets, strict=True)]


def _seg(path, base: int, suffix: str = ".log") -> str:
    return os.path.join(path, f"{base:020d}{suffix}")


def _flip(path: str, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x40]))


def test_clean_reopen_validates_nothing_and_keeps_everything(tmp_path, caplog):
    batches = _batches(60)
    offsets = _write(tmp_path / "t-0", batches)
    assert os.path.exists(tmp_path / "t-0" / "clean-shutdown")
    caplog.set_level(logging.INFO, logger="querylib.log")
    with PartitionLog.open(tmp_path / "t-0", CONFIG) as log:
        assert not os.path.exists(tmp_path / "t-0" / "clean-shutdown")
        assert _all_batches(log) == _expected(batches, offsets)
        assert len(log.segments) > 3
    assert not [r for r in caplog.records if "validat" in r.getMessage()]


def test_unclean_reopen_validates_and_keeps_every_whole_batch(tmp_path, caplog):
    batches = _batches(60)
    offsets = _write(tmp_path / "t-0", batches, crash_to=tmp_path / "crash")
    assert not os.path.exists(tmp_path / "crash" / "clean-shutdown")
    caplog.set_level(logging.INFO, logger="querylib.log")
    with PartitionLog.open(tmp_path / "crash", CONFIG) as log:
        assert _all_batches(log) == _expected(batches, offsets)
        assert log.durable_end_offset == log.log_end_offset
        # later appends continue the offsets
        assert log.append(batches[0]) == log.log_end_offset - 1
    assert any("no clean shutdown" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cut", [1, 12, 60, 61, 100, -1])
def test_a_torn_last_batch_is_truncated_and_logged(tmp_path, caplog, cut):
    batches = _batches(40)
    offsets = _write(tmp_path / "t-0", batches, close=False, crash_to=tmp_path / "crash")
    with PartitionLog.open(tmp_path / "crash", CONFIG) as log:
        last = log.segments[-1]
    size_of_last = len(batches[-1])
    cut_at = last.size - size_of_last + (cut if cut > 0 else size_of_last + cut)
    os.truncate(last.path, cut_at)
    os.unlink(tmp_path / "crash" / "clean-shutdown")  # the torn write came with a crash
    caplog.set_level(logging.WARNING, logger="querylib.log")
    with PartitionLog.open(tmp_path / "crash", CONFIG) as log:
        assert log.log_end_offset == offsets[-1]
        assert _all_batches(log) == _expected(batches[:-1], offsets[:-1])
        assert log.append(batches[-1]) == offsets[-1]
    assert any("truncated" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("tail", [b"\0" * 5000, b"\xff" * 70, os.urandom(3000)])
def test_garbage_after_the_last_batch_is_truncated(tmp_path, tail):
    batches = _batches(30)
    offsets = _write(tmp_path / "t-0", batches, crash_to=tmp_path / "crash")
    log = PartitionLog.open(tmp_path / "crash", CONFIG)
    path = log.segments[-1].path
    log.close()
    os.unlink(tmp_path / "crash" / "clean-shutdown")
    with open(path, "ab") as f:
        f.write(tail)
    with PartitionLog.open(tmp_path / "crash", CONFIG) as log:
        assert _all_batches(log) == _expected(batches, offsets)


def test_a_corrupt_batch_in_a_sealed_segment_is_reported_and_the_rest_kept(tmp_path, caplog):
    batches = _batches(60)
    offsets = _write(tmp_path / "t-0", batches)
    path = tmp_path / "t-0"
    with PartitionLog.open(path, CONFIG) as log:
        second = log.segments[1]
        bases = [s.base_offset for s in log.segments]
    # a value byte of the third batch of the second segment
    positions = [0]
    first_index = offsets.index(second.base_offset)
    for b in batches[first_index:first_index + 3]:
        positions.append(positions[-1] + len(b))
    _flip(second.path, positions[2] + len(batches[first_index + 2]) - 3)
    caplog.set_level(logging.WARNING, logger="querylib.log")
    damaged = first_index + 2
    with PartitionLog.open(path, CONFIG) as log:
        assert [s.base_offset for s in log.segments] == bases
        assert log.log_end_offset == offsets[-1] + len(decode_batch(batches[-1]).records)
        with pytest.raises(CorruptDataError):
            log.read(offsets[damaged], 1)
        kept = _all_batches(log, skip_damage=True)
        assert kept == [b for i, b in enumerate(_expected(batches, offsets)) if i != damaged]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "CRC" in messages and "damaged" in messages and "truncated" not in messages


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_missing_index_files_are_rebuilt_identically(tmp_path, suffix):
    batches = _batches(80)
    offsets = _write(tmp_path / "t-0", batches)
    path = tmp_path / "t-0"
    files = sorted(n for n in os.listdir(path) if n.endswith((".index", ".timeindex")))
    before = {n: open(path / n, "rb").read() for n in files}
    assert any(before.values())
    for name in files:
        if name.endswith(suffix):
            os.unlink(path / name)
    with PartitionLog.open(path, CONFIG) as log:
        assert _all_batches(log) == _expected(batches, offsets)
    assert {n: open(path / n, "rb").read() for n in files} == before


def test_implausible_index_files_are_rebuilt(tmp_path):
    batches = _batches(80)
    offsets = _write(tmp_path / "t-0", batches)
    path = tmp_path / "t-0"
    index = _seg(path, 0, ".index")
    good = open(index, "rb").read()
    assert len(good) >= 16
    # swap two entries: positions no longer increase
    open(index, "wb").write(good[8:16] + good[0:8] + good[16:])
    open(_seg(path, 0, ".timeindex"), "ab").write(b"\x01\x02\x03")  # not whole entries
    with PartitionLog.open(path, CONFIG) as log:
        assert _all_batches(log) == _expected(batches, offsets)
    assert open(index, "rb").read() == good


def test_a_changed_index_that_still_looks_sane_is_not_trusted(tmp_path):
    batches = _batches(80)
    offsets = _write(tmp_path / "t-0", batches)
    index = _seg(tmp_path / "t-0", 0, ".index")
    good = open(index, "rb").read()
    wrong = bytearray(good)
    wrong[7] ^= 0x01  # the first entry's position is now one byte off, still increasing
    open(index, "wb").write(bytes(wrong))
    with PartitionLog.open(tmp_path / "t-0", CONFIG) as log:
        assert _all_batches(log) == _expected(batches, offsets)
        for offset in offsets:
            log.read(offset, 1)
    assert open(index, "rb").read() == good


def test_without_a_checkpoint_every_segment_is_validated(tmp_path):
    batches = _batches(60)
    offsets = _write(tmp_path / "t-0", batches, crash_to=tmp_path / "crash")
    path = tmp_path / "crash"
    first = _seg(path, 0)
    stat = os.stat(first)
    _flip(first, 100)  # silent damage: same mtime as before
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.unlink(path / "recovery-point-offset-checkpoint")
    with PartitionLog.open(path, CONFIG) as log:
        (damage,) = [d for s in log.segments for d in s.damage]
        assert damage.position == 0 and damage.start_offset == 0
        assert damage.end_offset == offsets[1]
        assert _all_batches(log, skip_damage=True) == _expected(batches, offsets)[1:]


def test_a_missing_middle_segment_is_a_gap_and_later_segments_stay(tmp_path, caplog):
    batches = _batches(60)
    offsets = _write(tmp_path / "t-0", batches)
    path = tmp_path / "t-0"
    with PartitionLog.open(path, CONFIG) as log:
        bases = [s.base_offset for s in log.segments]
    os.unlink(_seg(path, bases[2]))
    caplog.set_level(logging.WARNING, logger="querylib.log")
    with PartitionLog.open(path, CONFIG) as log:
        assert [s.base_offset for s in log.segments] == bases[:2] + bases[3:]
        for offset in (bases[2], bases[3] - 1):
            with pytest.raises(CorruptDataError) as caught:
                log.read(offset, 1)
            assert (caught.value.start_offset, caught.value.end_offset) == tuple(bases[2:4])
        n, m = offsets.index(bases[2]), offsets.index(bases[3])
        expected = _expected(batches, offsets)
        assert _all_batches(log, skip_damage=True) == expected[:n] + expected[m:]
    assert "offsets missing" in " ".join(r.getMessage() for r in caplog.records)


def test_leftover_files_are_removed(tmp_path):
    batches = _batches(10)
    _write(tmp_path / "t-0", batches)
    path = tmp_path / "t-0"
    for name in ("00000000000000000500.index", "00000000000000000500.timeindex",
                 "recovery-point-offset-checkpoint.tmp", "leader-epoch-checkpoint.tmp",
                 "00000000000000000000.log.deleted"):
        open(path / name, "wb").write(b"x")
    open(path / "notes.txt", "wb").write(b"kept")
    with PartitionLog.open(path, CONFIG) as log:
        bases = [s.base_offset for s in log.segments]
    assert sorted(os.listdir(path)) == sorted(
        [".lock", "boot-id", "clean-shutdown", "recovery-point-offset-checkpoint", "notes.txt",
         "leader-epoch-checkpoint"]
        + [f"{b:020d}{s}" for b in bases for s in (".log", ".index", ".timeindex")])


def test_an_unreadable_checkpoint_means_validate_everything(tmp_path):
    batches = _batches(30)
    offsets = _write(tmp_path / "t-0", batches, crash_to=tmp_path / "crash")
    open(tmp_path / "crash" / "recovery-point-offset-checkpoint", "wb").write(b"\xff" * 10000)
    with PartitionLog.open(tmp_path / "crash", CONFIG) as log:
        assert _all_batches(log) == _expected(batches, offsets)
    text = open(tmp_path / "crash" / "recovery-point-offset-checkpoint").read().split("\n")
    assert text[:2] == ["0", "1"] and text[2].startswith("crash 0 ")


def test_writes_are_kept_after_a_clean_close_or_a_process_death_on_the_same_boot(tmp_path):
    """`writes_kept`: a new log and a clean close keep everything; an unclean close (the
    process died, no marker) keeps everything while the same kernel runs (its page cache has
    every write); after a reboot, or where no boot id can be read, what was not fsynced may
    be gone."""
    from querylib.log import _recovery
    from querylib.log._config import BOOT_ID_FILE, CLEAN_SHUTDOWN_FILE

    path = tmp_path / "p"
    with PartitionLog.open(path) as log:
        assert log.writes_kept  # new
        log.append(make_batch())
    with PartitionLog.open(path) as log:
        assert log.writes_kept  # clean close
    (path / CLEAN_SHUTDOWN_FILE).unlink()
    with PartitionLog.open(path) as log:
        assert log.writes_kept  # the process died, the kernel did not
    (path / CLEAN_SHUTDOWN_FILE).unlink()
    (path / BOOT_ID_FILE).write_text("an earlier boot\n")
    with PartitionLog.open(path) as log:
        assert not log.writes_kept  # a reboot since
    assert (path / BOOT_ID_FILE).read_text().strip() == _recovery.current_boot_id()
    (path / CLEAN_SHUTDOWN_FILE).unlink()
    saved = list(_recovery._BOOT_ID)
    _recovery._BOOT_ID[:] = [None]
    try:
        with PartitionLog.open(path) as log:
            assert not log.writes_kept  # cannot tell
    finally:
        _recovery._BOOT_ID[:] = saved
