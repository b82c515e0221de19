"""Reading a log back as records: data records in an offset range with control batches
skipped, across segments and read chunks; the first record at or after a timestamp."""

from __future__ import annotations

from pathlib import Path

from querylib.log import LogConfig, PartitionLog, _scan, data_records, record_at_timestamp
from querylib.records import encode_batch, frontier_batch


def _log(tmp_path: Path) -> PartitionLog:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=600))
    for b in range(6):  # 6 batches of 4 records, each followed by a frontier
        log.append(encode_batch([(1000 + 10 * (4 * b + i), None, b"v%d" % (4 * b + i), ())
                                 for i in range(4)]))
        log.append(frontier_batch(b + 1, timestamp=1))
    return log


def test_data_records_cover_a_range_and_skip_controls(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_scan, "SCAN_CHUNK", 100)  # many reads, batches cut across them
    log = _log(tmp_path)
    try:
        assert len(log.segments) > 1
        everything = list(data_records(log))
        assert [r.value for r in everything] == [b"v%d" % i for i in range(24)]
        offsets = [r.offset for r in everything]
        start, end = offsets[5], offsets[17]
        assert [r.offset for r in data_records(log, start, end)] == offsets[5:17]
        assert list(data_records(log, end, end)) == []
    finally:
        log.close()


def test_record_at_timestamp(tmp_path) -> None:
    log = _log(tmp_path)
    try:
        end = log.log_end_offset
        offset, stamp = record_at_timestamp(log, 1055, end)
        record = next(r for r in data_records(log) if r.offset == offset)
        assert (record.timestamp, stamp) == (1060, 1060)
        assert record_at_timestamp(log, 999_999, end) is None
        assert record_at_timestamp(log, 1000, 0) is None  # nothing below `end`
    finally:
        log.close()
