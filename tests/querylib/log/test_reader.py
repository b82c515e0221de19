"""The read-only segment reader: what Spark's local reads and `tq log dump` walk a partition's
files with, while the log's owner holds it open and appends."""

from __future__ import annotations

import os

from querylib.log import (
    LogConfig,
    PartitionLog,
    SegmentBatch,
    Unreadable,
    batch_size,
    batch_span,
    list_segments,
    pread_exact,
    segment_batches,
    transactions,
    walk_to_end,
)
from querylib.records import encode_batch, read_header, transaction_marker_batch


def batch(n: int, **kwargs) -> bytes:
    return encode_batch([(i, None, b"v%03d" % i + b"x" * 40, ()) for i in range(n)], **kwargs)


def test_segments_spans_and_the_end_while_the_owner_holds_the_log(tmp_path) -> None:
    path = str(tmp_path / "t-0")
    log = PartitionLog.open(path, LogConfig(segment_bytes=1024, index_interval_bytes=100))
    try:
        for _ in range(20):
            log.append(batch(5))
        segments = list_segments(path)
        assert [s.base for s in segments] == [s.base_offset for s in log.segments]
        assert list_segments(str(tmp_path / "missing")) == []
        last = segments[-1]
        fd = os.open(last.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            assert walk_to_end(fd, 0, size) == 100 == log.log_end_offset
            data = pread_exact(fd, size, 0)
        finally:
            os.close(fd)
        span = batch_span(data, 0)
        assert span is not None and span.base_offset == last.base
        assert span.next_offset == last.base + 5 and span.size == batch_size(data)
        assert batch_span(data[:span.size - 1], 0) is None  # not whole: None, not an error
        assert segments[1].index_hint(segments[1].base + 12) <= os.path.getsize(segments[1].path)
    finally:
        log.close()


def test_segment_batches_stop_at_a_torn_tail(tmp_path) -> None:
    path = str(tmp_path / "t-0")
    with PartitionLog.open(path, LogConfig()) as log:
        log.append(batch(3))
        log.append(batch(2))
    segment = list_segments(path)[0].path
    with open(segment, "ab") as f:
        f.write(batch(4)[:70])  # a batch cut short, as a crash leaves it
    fd = os.open(segment, os.O_RDONLY)
    try:
        items = list(segment_batches(fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)
    whole = [i for i in items if isinstance(i, SegmentBatch)]
    assert [(i.header.base_offset, i.header.records_count) for i in whole] == [(0, 3), (3, 2)]
    assert read_header(bytes(whole[1].data)) == whole[1].header
    assert isinstance(items[-1], Unreadable) and "cut short" in items[-1].reason
    assert items[-1].position == sum(i.header.size for i in whole)


def test_transactions_open_and_aborted(tmp_path) -> None:
    path = str(tmp_path / "t-0")
    with PartitionLog.open(path, LogConfig()) as log:
        log.append(batch(2, producer_id=7, is_transactional=True))  # 0-1
        log.append(transaction_marker_batch(7, 0, False, timestamp=1))  # 2: abort
        log.append(batch(2))  # 3-4
        log.append(batch(2, producer_id=8, is_transactional=True))  # 5-6, still open
    assert transactions(list_segments(path)) == (5, [(7, 0, 2)])
