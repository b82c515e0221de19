"""Flush policies and the offsets the broker acknowledges by."""

from __future__ import annotations

import time

from querylib.log import LogConfig, PartitionLog
from tests.querylib.log._batches import make_batch


def test_always_flushes_before_append_returns(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig(flush="always")) as log:
        for n in (1, 4, 2):
            log.append(make_batch(n))
            assert log.flushed_end_offset == log.durable_end_offset == log.log_end_offset
        log.append_batches([make_batch(2), make_batch(3)])
        assert log.durable_end_offset == log.log_end_offset == 12


def test_never_acknowledges_everything_and_flushes_on_demand(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig(flush="never")) as log:
        log.append(make_batch(3))
        assert log.durable_end_offset == 3
        assert log.flushed_end_offset == 0
        log.flush()
        assert log.flushed_end_offset == 3


def test_rolling_flushes_the_sealed_segment(tmp_path):
    size = len(make_batch(2))
    with PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=2 * size)) as log:
        for _ in range(5):
            log.append(make_batch(2))
        assert [s.base_offset for s in log.segments] == [0, 4, 8]
        assert log.flushed_end_offset == 8


def test_interval_flushes_when_due(tmp_path):
    config = LogConfig(flush="interval", flush_interval_ms=60_000)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        assert log.flush_due_in() is None  # nothing waiting
        log.append(make_batch(2))
        assert log.durable_end_offset == 0  # not yet flushed: not acknowledged
        now = time.monotonic()
        assert 0 < log.flush_due_in(now) <= 60
        assert not log.flush_if_due(now)
        assert log.flush_if_due(now + 61)
        assert log.durable_end_offset == 2
        assert not log.flush_if_due(now + 200)
        assert log.flush_due_in() is None


def test_interval_zero_flushes_on_every_append(tmp_path):
    config = LogConfig(flush="interval", flush_interval_ms=0)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        log.append(make_batch(2))
        assert log.durable_end_offset == 2


def test_other_policies_never_flush_by_timer(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig(flush="never")) as log:
        log.append(make_batch(2))
        assert not log.flush_if_due(time.monotonic() + 10**6)
        assert log.flush_due_in() is None
