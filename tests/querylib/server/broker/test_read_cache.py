"""The broker's kept catch-up reads (`ReadCache`, DESIGN §5 "Flow control"): a kept read
answers only a read the log could have answered the same, and the reads kept stay within
their bound. Real logs on disk, read as the broker's read threads read them."""

from __future__ import annotations

from querylib.broker._stream import encode_records
from querylib.log import PartitionLog
from querylib.server.broker._read_cache import ReadCache, read_shared

PID = ("t", 0)


def _log(tmp_path, name: str = "t-0", batches: int = 5, size: int = 1000) -> PartitionLog:
    log = PartitionLog.open(tmp_path / name)
    for i in range(batches):
        log.append(encode_records([(None, bytes([i]) * size, (), 0, None)]))
    return log


def test_a_kept_read_answers_a_read_the_log_would_answer_the_same(tmp_path):
    log = _log(tmp_path)
    try:
        end = log.log_end_offset
        read = read_shared(log, 0, 1 << 20, end)
        assert (read.batches, read.next_offset) == (5, 5)
        cache = ReadCache(1 << 20)
        cache.put(PID, 0, read)
        assert cache.get(PID, 0, log, 1 << 20, end) is read
        assert cache.get(PID, 0, log, len(read.data), end) is read
        assert cache.get(PID, 0, log, len(read.data) - 1, end) is None  # more than asked
        assert cache.get(PID, 0, log, 1 << 20, end - 1) is None  # past the stable end then
        assert cache.get(PID, 1, log, 1 << 20, end) is None  # another position
        assert cache.get(("t", 1), 0, log, 1 << 20, end) is None
        other = _log(tmp_path, "u-0")
        try:
            assert cache.get(PID, 0, other, 1 << 20, end) is None  # another log
        finally:
            other.close()
    finally:
        log.close()


def test_a_kept_read_of_one_batch_answers_any_size_as_the_log_does(tmp_path):
    log = _log(tmp_path)
    try:
        read = read_shared(log, 2, 1, log.log_end_offset)
        assert (read.batches, read.next_offset) == (1, 3)
        cache = ReadCache(1 << 20)
        cache.put(PID, 2, read)
        assert cache.get(PID, 2, log, 1, log.log_end_offset) is read
    finally:
        log.close()


def test_truncation_and_deleted_records_void_kept_reads(tmp_path):
    log = _log(tmp_path)
    try:
        end = log.log_end_offset
        cache = ReadCache(1 << 20)
        cache.put(PID, 0, read_shared(log, 0, 1 << 20, end))
        cache.put(PID, 4, read_shared(log, 4, 1 << 20, end))
        log.delete_records(3)
        assert cache.get(PID, 0, log, 1 << 20, end) is None  # below the log start now
        assert cache.get(PID, 4, log, 1 << 20, end) is not None
        log.truncate_to(4)
        log.append(encode_records([(None, b"other", (), 0, None)]))
        assert cache.get(PID, 4, log, 1 << 20, end) is None  # offset 4 holds other bytes
        assert read_shared(log, 4, 1 << 20, end).data != b""
    finally:
        log.close()


def test_kept_reads_stay_within_their_bound_least_recently_used_dropped_first(tmp_path):
    log = _log(tmp_path, batches=10)
    try:
        end = log.log_end_offset
        reads = [read_shared(log, i, 1, end) for i in range(10)]  # one batch each
        size = len(reads[0].data)
        cache = ReadCache(3 * size)
        for i in range(3):
            cache.put(PID, i, reads[i])
        assert cache.get(PID, 0, log, 1, end) is reads[0]  # now the most recently used
        cache.put(PID, 3, reads[3])
        assert cache.get(PID, 1, log, 1, end) is None  # the least recently used went
        assert [cache.get(PID, i, log, 1, end) is not None for i in (0, 2, 3)] == [True] * 3
        assert cache.bytes == 3 * size and len(cache) == 3
        cache.put(PID, 0, read_shared(log, 0, 1 << 20, end))  # bigger than the bound: not kept
        assert cache.get(PID, 0, log, 1 << 20, end) is None
        assert cache.bytes == 3 * size
        cache.forget(PID)
        assert (cache.bytes, len(cache)) == (0, 0)
    finally:
        log.close()


def test_a_kept_read_much_shorter_than_asked_for_reads_the_disk_instead(tmp_path):
    """Readers at one offset with little credit and with much do not cut each other's reads
    down: a one-batch read does not answer a read of a megabyte while more is stored, and
    both lengths stay kept, each answering its like."""
    log = _log(tmp_path, batches=10)
    try:
        end = log.log_end_offset
        short, full = read_shared(log, 0, 1, end), read_shared(log, 0, 1 << 20, end)
        cache = ReadCache(1 << 20)
        cache.put(PID, 0, short)
        assert cache.get(PID, 0, log, 1 << 20, end) is None
        assert cache.get(PID, 0, log, 1 << 20, short.next_offset) is short  # all there was
        assert cache.get(PID, 0, log, 2 * len(short.data), end) is short  # half of it
        cache.put(PID, 0, full)
        assert cache.get(PID, 0, log, 1 << 20, end) is full
        assert cache.get(PID, 0, log, 1, end) is short
        assert len(cache) == 2 and cache.bytes == len(short.data) + len(full.data)
    finally:
        log.close()
