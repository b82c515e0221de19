"""The public surface of querylib.log, its configuration and its names."""

from __future__ import annotations

import pytest

import querylib.log
from catalog.errors import StorageError, UserError
from querylib.log import (
    FlushPolicy,
    LogConfig,
    parse_partition_dir,
    parse_segment_name,
    partition_dir_name,
    segment_name,
)


def test_public_names():
    assert sorted(querylib.log.__all__) == [
        "Damage", "FileSlice", "Finding", "FlushPolicy",
        "LeaderEpochCache", "LogConfig", "PartitionLog", "SegmentBatch", "SegmentFile",
        "SegmentInfo", "Span", "Unreadable", "appended_batch",
        "batch_size", "batch_span", "check_partition", "corrupt_data_error",
        "data_records", "dump_segment",
        "find_partition_dirs", "list_segments", "parse_partition_dir", "parse_segment_name",
        "partition_dir_name", "pread_exact", "record_at_timestamp", "repair_partition",
        "segment_batches", "segment_damage", "segment_name", "stored_batch",
        "transactional_batches", "transactions", "walk_to_end",
    ]
    for name in querylib.log.__all__:
        assert getattr(querylib.log, name).__module__.startswith("querylib.log")


def test_config_defaults_are_kafkas():
    config = LogConfig()
    assert config.segment_bytes == 1 << 30
    assert config.index_interval_bytes == 4096
    assert (config.retention_bytes, config.retention_ms) == (-1, -1)
    assert config.flush is FlushPolicy.NEVER
    assert LogConfig(flush="always").flush is FlushPolicy.ALWAYS


@pytest.mark.parametrize(
    "kwargs",
    [
        {"flush": "sometimes"},
        {"segment_bytes": 10},
        {"segment_bytes": 1 << 31},
        {"index_interval_bytes": -1},
        {"retention_bytes": -2},
        {"retention_ms": -5},
        {"flush_interval_ms": -1},
    ],
)
def test_bad_config_is_a_user_error(kwargs):
    with pytest.raises(UserError):
        LogConfig(**kwargs)


def test_segment_names():
    assert segment_name(42, ".log") == "00000000000000000042.log"
    assert parse_segment_name("00000000000000000042.timeindex") == (42, ".timeindex")
    for name in ("42.log", "00000000000000000042.txt", "0000000000000000004x.log", ".lock"):
        assert parse_segment_name(name) is None


def test_partition_dir_names():
    assert partition_dir_name("my-topic", 3) == "my-topic-3"
    assert parse_partition_dir("my-topic-3") == ("my-topic", 3)
    assert parse_partition_dir("__catalog.topics-0") == ("__catalog.topics", 0)
    for name in ("topic", "topic-", "-3", "topic-x", "topic-99999999999"):
        with pytest.raises(StorageError):
            parse_partition_dir(name)
    for topic, partition in (("", 0), ("a/b", 0), ("..", 0), ("t", -1)):
        with pytest.raises(UserError):
            partition_dir_name(topic, partition)
