"""Segment roll, retention by size and age, truncation, and lookups by timestamp."""

from __future__ import annotations

import os

import pytest

from querylib.errors import OffsetOutOfRangeError
from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch
from tests.querylib.log._batches import as_stored, base_offset_of, make_batch, split_batches

BATCH = len(make_batch(2, value_size=100))


def _fill(log: PartitionLog, count: int, **kw) -> list[bytes]:
    batches = [make_batch(2, value_size=100, seed=i, **kw) for i in range(count)]
    for batch in batches:
        log.append(batch)
    return batches


def test_segments_roll_by_size_and_are_named_by_base_offset(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=3 * BATCH)) as log:
        _fill(log, 10)
        infos = log.segments
        assert [s.base_offset for s in infos] == [0, 6, 12, 18]
        assert [s.next_offset for s in infos] == [6, 12, 18, 20]
        assert all(s.size <= 3 * BATCH for s in infos)
        assert [os.path.basename(s.path) for s in infos][1] == "00000000000000000006.log"
        # a read stays within one segment
        assert [base_offset_of(b) for b in split_batches(log.read(4, 1 << 20))] == [4]
        assert [base_offset_of(b) for b in split_batches(log.read(6, 1 << 20))] == [6, 8, 10]


def test_a_batch_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    big = make_batch(3, value_size=2000)
    with PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1000)) as log:
        log.append(make_batch(1))
        assert log.append(big) == 1
        log.append(make_batch(1))
        assert [(s.base_offset, s.size) for s in log.segments][1] == (1, len(big))
        assert split_batches(log.read(2, 1)) == [as_stored(big, 1)]


def test_append_batches_rolls_between_batches_of_one_call(tmp_path):
    batches = [make_batch(2, value_size=100, seed=i) for i in range(7)]
    with PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=2 * BATCH)) as log:
        assert log.append_batches(batches) == list(range(0, 14, 2))
        assert [s.base_offset for s in log.segments] == [0, 4, 8, 12]
        for i, batch in enumerate(batches):
            assert split_batches(log.read(2 * i, 1)) == [as_stored(batch, 2 * i)]


def test_retention_by_size_removes_oldest_whole_segments(tmp_path):
    config = LogConfig(segment_bytes=3 * BATCH, retention_bytes=7 * BATCH)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        _fill(log, 12)  # segments of 3 batches: 0, 6, 12, 18
        assert log.apply_retention() == 1  # 12 batches - 3 leaves 9 > 7; -6 would leave 6
        assert log.log_start_offset == 6
        assert not os.path.exists(tmp_path / "t-0" / "00000000000000000000.log")
        assert not os.path.exists(tmp_path / "t-0" / "00000000000000000000.index")
        with pytest.raises(OffsetOutOfRangeError):
            log.read(5, 100)
        assert base_offset_of(log.read(6, 1)) == 6
        assert log.apply_retention() == 0
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        assert (log.log_start_offset, log.log_end_offset) == (6, 24)


def test_a_slice_taken_before_retention_stays_readable(tmp_path):
    config = LogConfig(segment_bytes=3 * BATCH, retention_bytes=0)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        batches = _fill(log, 7)
        piece = log.read_slice(0, 1 << 20)
        assert log.apply_retention() == 2
        assert not os.path.exists(piece.path)
        with piece:  # the slice owns its descriptor: the unlinked file still reads
            assert split_batches(piece.read()) == [as_stored(b, 2 * i)
                                                   for i, b in enumerate(batches[:3])]
        with pytest.raises(OffsetOutOfRangeError):
            log.read_slice(0, 100)


def test_retention_never_removes_the_active_segment(tmp_path):
    config = LogConfig(segment_bytes=3 * BATCH, retention_bytes=0, retention_ms=0)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        _fill(log, 8, timestamp=1)
        assert log.apply_retention(now_ms=10**12) == 2
        assert [s.base_offset for s in log.segments] == [12]
        assert log.log_start_offset == 12
        assert log.apply_retention(now_ms=10**12) == 0
        assert log.append(make_batch()) == 16


def test_retention_by_age_uses_each_segments_largest_timestamp(tmp_path):
    config = LogConfig(segment_bytes=2 * BATCH, retention_ms=1000)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        for i in range(8):  # four segments, largest timestamps 1101, 3301, 5501, 7701
            log.append(make_batch(2, value_size=100, timestamp=1100 * i, seed=i))
        assert [s.largest_timestamp for s in log.segments] == [1101, 3301, 5501, 7701]
        assert log.apply_retention(now_ms=3301 + 1000) == 1  # exactly at the limit: kept
        assert log.apply_retention(now_ms=5501 + 1001) == 2
        assert log.log_start_offset == 12
        assert log.apply_retention(now_ms=10**15) == 0  # the active segment stays


def test_retention_by_age_stops_at_the_first_young_segment(tmp_path):
    config = LogConfig(segment_bytes=2 * BATCH, retention_ms=1000)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        for ts in (0, 0, 5000, 5000, 0, 0, 0, 0):
            log.append(make_batch(2, value_size=100, timestamp=ts))
        # segments 0 (old), 4 (young), 8 and 12 (old): only the first goes
        assert log.apply_retention(now_ms=5000) == 1
        assert log.log_start_offset == 4


def test_truncate_to_removes_whole_batches_and_later_segments(tmp_path):
    config = LogConfig(segment_bytes=3 * BATCH)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        batches = _fill(log, 10)
        assert log.truncate_to(9) == 8  # offset 9 is inside batch 8..9
        assert [s.base_offset for s in log.segments] == [0, 6]
        assert not os.path.exists(tmp_path / "t-0" / "00000000000000000012.log")
        assert log.append(batches[0]) == 8
        assert log.truncate_to(6) == 6
        assert log.segments[-1].size == 0
        with pytest.raises(OffsetOutOfRangeError):
            log.truncate_to(7)
        assert log.truncate_to(0) == 0
        assert log.read(0, 100) == b""
        offsets = [log.append(b) for b in batches[:4]]
        assert offsets == [0, 2, 4, 6]
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        assert log.log_end_offset == 8
        assert split_batches(log.read(6, 1)) == [as_stored(batches[3], 6)]


def test_offset_for_timestamp_finds_the_first_record_at_or_after_it(tmp_path):
    # Timestamps go back and forth, as producers' clocks do; Kafka's answer is the first
    # offset whose record timestamp is >= the target.
    timestamps = [100, 90, 300, 250, 260, 500, 400, 400, 900, 50]
    config = LogConfig(segment_bytes=1000, index_interval_bytes=100)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        for i in range(0, len(timestamps), 2):
            entries = [(timestamps[i + j], None, b"v" * 80, []) for j in range(2)]
            log.append(encode_batch(entries))
        assert len(log.segments) > 1
        for target in [0, 50, 90, 91, 100, 101, 250, 255, 300, 301, 400, 401, 500, 900]:
            expected = next(o for o, ts in enumerate(timestamps) if ts >= target)
            assert log.offset_for_timestamp(target) == expected, target
        assert log.offset_for_timestamp(901) is None
    with PartitionLog.open(tmp_path / "t-0", config) as log:  # from the time index files
        assert log.offset_for_timestamp(500) == 5
        assert log.offset_for_timestamp(901) is None


def test_delete_records_moves_the_log_start_removes_whole_segments_and_survives_a_reopen(
        tmp_path):
    """Kafka's DeleteRecords: reads below the new start fail, the segments wholly below it go,
    the one holding it stays, and a reopen keeps the start (log-start-offset-checkpoint)."""
    config = LogConfig(segment_bytes=3 * BATCH)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        _fill(log, 10)  # segments at 0, 6, 12, 18; two records a batch
        assert log.delete_records(14) == 14
        assert log.log_start_offset == 14
        assert [s.base_offset for s in log.segments] == [12, 18]
        with pytest.raises(OffsetOutOfRangeError):
            log.read(12, 1 << 20)
        assert [base_offset_of(b) for b in split_batches(log.read(14, 1 << 20))] == [14, 16]
        assert log.delete_records(3) == 14  # below the start: nothing changes
        with pytest.raises(OffsetOutOfRangeError):
            log.delete_records(21)
    assert not os.path.exists(tmp_path / "t-0" / "00000000000000000006.log")
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        assert log.log_start_offset == 14
        with pytest.raises(OffsetOutOfRangeError):
            log.read(13, 1 << 20)
        assert log.delete_records(20) == 20  # up to the end: every record goes, the
        assert [s.base_offset for s in log.segments] == [18]  # active segment stays
        log.append(make_batch(1))
        assert log.log_end_offset == 21
