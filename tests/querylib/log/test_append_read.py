"""Appending and reading whole batches, offsets, validation of producer bytes, file slices."""

from __future__ import annotations

import os
import struct
import threading

import pytest

from querylib.errors import (
    CorruptRecordError,
    InvalidLengthError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordError,
    TruncatedRecordError,
    UnsupportedMagicError,
)
from querylib.log import LogConfig, PartitionLog
from querylib.records import decode_batch, encode_batch
from tests.querylib.log._batches import as_stored, base_offset_of, make_batch, split_batches


@pytest.fixture
def log(tmp_path):
    log = PartitionLog.open(tmp_path / "topic-0")
    yield log
    log.close()


def test_new_log_is_empty(log):
    assert (log.log_start_offset, log.log_end_offset, log.durable_end_offset) == (0, 0, 0)
    assert log.read(0, 1000) == b""
    assert os.path.exists(os.path.join(log.path, "00000000000000000000.log"))


def test_append_assigns_offsets_and_read_returns_the_stored_bytes(log):
    batches = [make_batch(n, seed=n) for n in (1, 3, 2)]
    assert [log.append(b) for b in batches] == [0, 1, 4]
    assert log.log_end_offset == 6
    data = log.read(0, 1 << 20)
    assert split_batches(data) == [as_stored(b, o) for b, o in zip(batches, [0, 1, 4], strict=True)]


def test_stored_batch_keeps_the_producer_crc_and_records(log):
    batch = encode_batch([(5, b"k", b"v", [("h", b"x")])], partition_leader_epoch=-1)
    log.append(make_batch(2))
    offset = log.append(batch)
    decoded = decode_batch(log.read(offset, 1))  # verifies the CRC
    assert decoded.base_offset == offset == 2
    assert [(r.offset, r.key, r.value) for r in decoded.records] == [(2, b"k", b"v")]


def test_stored_batch_is_what_the_log_serves(log):
    from querylib.log import stored_batch

    batch = encode_batch([(5, b"k", b"v", [])], partition_leader_epoch=-1)
    log.append(make_batch(2))
    assert log.read(log.append(batch), 1) == stored_batch(batch, 2) == as_stored(batch, 2)
    with pytest.raises(CorruptRecordError):
        stored_batch(_corrupt(batch, len(batch) - 1), 0)


def test_read_from_the_middle_of_a_batch_returns_that_whole_batch(log):
    log.append(make_batch(3, seed=1))
    log.append(make_batch(3, seed=2))
    assert [base_offset_of(b) for b in split_batches(log.read(4, 1))] == [3]


def test_read_returns_at_least_one_batch_and_never_a_partial_one(log):
    batches = [make_batch(1, value_size=100, seed=i) for i in range(10)]
    log.append_batches(batches)
    size = len(as_stored(batches[0], 0))
    assert len(log.read(0, 0)) == size  # at least one whole batch
    assert len(log.read(0, size - 1)) == size
    assert len(log.read(0, 3 * size + size // 2)) == 3 * size
    assert len(log.read(7, 1 << 20)) == 3 * size


def test_read_outside_the_log_raises_and_at_the_end_returns_nothing(log):
    log.append(make_batch(2))
    assert log.read(2, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)


def test_end_offset_bounds_what_is_served(log):
    log.append_batches([make_batch(2, seed=i) for i in range(5)])
    assert [base_offset_of(b) for b in split_batches(log.read(0, 1 << 20, end_offset=6))] == [
        0, 2, 4]
    assert log.read(6, 1 << 20, end_offset=6) == b""
    # a batch holding end_offset - 1 is served whole
    assert [base_offset_of(b) for b in split_batches(log.read(0, 1 << 20, end_offset=5))] == [
        0, 2, 4]


def test_read_slice_names_the_same_bytes_as_read(log):
    log.append_batches([make_batch(2, seed=i) for i in range(5)])
    with log.read_slice(2, 300) as piece:
        assert piece.path.endswith("00000000000000000000.log")
        assert piece.read() == log.read(2, 300)
        assert os.pread(piece.fd, piece.length, piece.position) == piece.read()
    empty = log.read_slice(10, 100)
    assert (empty.fd, empty.length, empty.read()) == (-1, 0, b"")


def test_append_batches_returns_each_base_offset(log):
    assert log.append_batches([make_batch(2), make_batch(1), make_batch(5)]) == [0, 2, 3]
    assert log.append_batches([]) == []
    assert log.log_end_offset == 8


def _corrupt(batch: bytes, at: int) -> bytes:
    return batch[:at] + bytes([batch[at] ^ 0xFF]) + batch[at + 1:]


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda b: _corrupt(b, len(b) - 1), CorruptRecordError),  # a value byte
        (lambda b: _corrupt(b, 21), CorruptRecordError),  # attributes
        (lambda b: b[:-1], TruncatedRecordError),
        (lambda b: b[:30], TruncatedRecordError),
        (lambda b: b + b"\0", InvalidLengthError),  # trailing bytes
        (lambda b: b + b, InvalidLengthError),  # two batches where one is expected
        (lambda b: b[:16] + b"\x01" + b[17:], UnsupportedMagicError),
        (lambda b: b[:8] + struct.pack(">i", -5) + b[12:], InvalidLengthError),
        (lambda b: b[:8] + struct.pack(">i", 1 << 30) + b[12:], InvalidLengthError),
        (lambda b: b"", TruncatedRecordError),
    ],
)
def test_a_bad_batch_raises_and_leaves_the_log_untouched(log, mutate, error):
    log.append(make_batch(3))
    before = open(os.path.join(log.path, "00000000000000000000.log"), "rb").read()
    with pytest.raises(error):
        log.append(mutate(make_batch(2, seed=9)))
    with pytest.raises(error):
        log.append_batches([make_batch(1), mutate(make_batch(2, seed=9))])
    assert log.log_end_offset == 3
    assert open(os.path.join(log.path, "00000000000000000000.log"), "rb").read() == before


def test_a_batch_whose_offset_deltas_do_not_match_its_count_is_refused(log):
    entries = [(1, None, b"a", []), (2, None, b"b", [])]
    batch = bytearray(encode_batch(entries))
    struct.pack_into(">i", batch, 23, 5)  # lastOffsetDelta 5 for 2 records, CRC fixed below
    import crc32c

    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    with pytest.raises(RecordError):
        log.append(bytes(batch))
    assert log.log_end_offset == 0


def test_readers_on_other_threads_see_whole_batches_while_the_writer_appends(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=64 * 1024))
    batches = [make_batch(4, value_size=200, seed=i) for i in range(300)]
    expected: dict[int, bytes] = {}
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            offset = 0
            while not done.is_set() or offset < log.log_end_offset:
                data = log.read(offset, 10_000)
                for piece in split_batches(data):
                    base = base_offset_of(piece)
                    decode_batch(piece)  # whole and CRC-valid
                    assert base == offset
                    offset = base + 4
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for batch in batches:
        expected[log.append(batch)] = batch
    done.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(log.segments) > 1
    for offset, batch in expected.items():
        assert split_batches(log.read(offset, 1))[0] == as_stored(batch, offset)
    log.close()


def test_closed_log_refuses_reads_and_writes(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0")
    log.append(make_batch())
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosedError):
        log.read(0, 100)
    with pytest.raises(LogClosedError):
        log.append(make_batch())


def test_a_second_open_of_the_same_log_is_refused(tmp_path):
    from catalog.errors import StorageError

    with PartitionLog.open(tmp_path / "t-0"):
        with pytest.raises(StorageError, match="open in another"):
            PartitionLog.open(tmp_path / "t-0")
    PartitionLog.open(tmp_path / "t-0").close()


def test_a_batch_split_in_header_and_records_is_stored_as_the_whole_batch(log):
    """A broker receives a batch a producer stamped as two frames (header, records) and
    appends it without joining them: the log stores and serves the same bytes as for the
    whole batch, and checks it the same way."""
    from querylib.log import appended_batch, stored_batch
    from querylib.records import SplitBatch, stamp_producer, stamp_producer_split

    batch = make_batch(3)
    split = stamp_producer_split(batch, 1 << 62, 0, 5)
    whole = bytes(stamp_producer(batch, 1 << 62, 0, 5))
    log.append(make_batch(2))
    assert log.append_batches([split, make_batch(1)]) == [2, 5]
    assert log.read(2, 1) == stored_batch(whole, 2) == stored_batch(split, 2)
    assert appended_batch(split, 2) == appended_batch(whole, 2) == stored_batch(whole, 2)
    decoded = decode_batch(log.read(2, 1))
    assert decoded.producer_id == 1 << 62 and decoded.base_sequence == 5
    damaged = SplitBatch(split.head, _corrupt(bytes(split.body), 10))
    with pytest.raises(CorruptRecordError):
        log.append(damaged)
    with pytest.raises(InvalidLengthError):
        log.append(SplitBatch(bytes(split)[:70], bytes(split)[70:]))
    assert log.log_end_offset == 6
