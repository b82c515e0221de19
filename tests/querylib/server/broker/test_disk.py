"""Partitions on disk: which directories are partitions, which names are hostable, and the
frontier recovered from a real log's control batches."""

from __future__ import annotations

import pytest

from querylib.broker._errors import InvalidTopicError
from querylib.broker._stream import encode_records
from querylib.log import LogConfig, PartitionLog
from querylib.records import end_of_stream_batch, frontier_batch
from querylib.server.broker._disk import (
    find_partitions,
    open_partition,
    recover_frontier,
    validate_partition,
)


def data(n: int = 1) -> bytes:
    return encode_records([(None, b"v", (), 0, 1)] * n)


@pytest.mark.parametrize("topic", ["", ".", "..", "a/b", "x" * 250, "é", "a b", "a\0"])
def test_unhostable_topic_names_are_refused(topic):
    with pytest.raises(InvalidTopicError):
        validate_partition(topic, 0)


def test_partition_numbers_are_bounded():
    with pytest.raises(InvalidTopicError):
        validate_partition("t", -1)
    with pytest.raises(InvalidTopicError):
        validate_partition("t", 2**31)
    assert validate_partition("__catalog.topics", 3) == ("__catalog.topics", 3)


def test_find_partitions_ignores_stray_entries(tmp_path):
    (tmp_path / "orders-0").mkdir()
    (tmp_path / "my-topic-12").mkdir()
    (tmp_path / "not a partition").mkdir()
    (tmp_path / ".hidden-0").mkdir()
    (tmp_path / "file-1").write_text("x")
    assert find_partitions(str(tmp_path)) == [("my-topic", 12), ("orders", 0)]
    assert find_partitions(str(tmp_path / "missing")) == []


def test_recovered_frontier_is_the_last_frontier_record(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig()) as log:
        assert recover_frontier(log) == (0, False, 0, 0)
        log.append(data())
        log.append(frontier_batch(4, timestamp=0))
        log.append(data())
        log.append(frontier_batch(9, timestamp=0))
        log.append(data(3))
        assert recover_frontier(log) == (9, False, 0, 0)
        end_at = log.append(end_of_stream_batch(timestamp=0))
        assert recover_frontier(log) == (9, True, 0, 0)
        log.append(data())  # a producer came back after the end
        assert recover_frontier(log) == (9, False, 0, 0)
        # As they stood below an offset (a promoted follower's high watermark): the batches
        # at and after it do not count.
        assert recover_frontier(log, end_at + 1) == (9, True, 0, 0)
        assert recover_frontier(log, end_at) == (9, False, 0, 0)
        assert recover_frontier(log, 2) == (4, False, 0, 0)
        assert recover_frontier(log, 1) == (0, False, 0, 0)


def test_recovery_scans_back_past_a_long_run_of_data(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=64 * 1024)) as log:
        log.append(frontier_batch(7, timestamp=0))
        batch = data(100)
        log.append_batches([batch] * 200)  # 20,000 offsets: several windows, several segments
        assert recover_frontier(log) == (7, False, 0, 0)


def test_open_partition_creates_then_reopens_with_the_frontier(tmp_path):
    opened = open_partition(str(tmp_path), ("t", 2), LogConfig())
    assert (opened.frontier, opened.ended) == (0, False)
    opened.log.append(frontier_batch(5, timestamp=0))
    opened.log.append(end_of_stream_batch(timestamp=0))
    opened.log.close()
    again = open_partition(str(tmp_path), ("t", 2), LogConfig())
    try:
        assert (again.frontier, again.ended) == (5, True)
        assert again.log.log_end_offset == 2
    finally:
        again.log.close()
