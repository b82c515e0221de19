"""Replication in the log (DESIGN §5 "Replication"): a leader stamps its leader epoch on each
batch it appends; a follower appends the leader's stored batches unchanged (offsets, epochs,
bytes), verified and without a gap; both survive a reopen (recovery)."""

from __future__ import annotations

import struct

import pytest

from querylib.errors import CorruptRecordError, RecordError
from querylib.log import PartitionLog
from querylib.records import read_header
from tests.querylib.log._batches import make_batch, split_batches


@pytest.fixture
def leader(tmp_path):
    log = PartitionLog.open(tmp_path / "leader" / "t-0")
    yield log
    log.close()


@pytest.fixture
def follower(tmp_path):
    log = PartitionLog.open(tmp_path / "follower" / "t-0")
    yield log
    log.close()


def epochs(data: bytes) -> list[int]:
    return [read_header(b).partition_leader_epoch for b in split_batches(data)]


def test_leader_stamps_its_epoch_outside_the_crc_and_recovery_keeps_it(tmp_path, leader):
    leader.append_batches([make_batch(2, seed=1)], leader_epoch=3)
    leader.append_batches([make_batch(1, seed=2)], leader_epoch=5)
    data = leader.read(0, 1 << 20)
    assert epochs(data) == [3, 5]
    leader.close()
    reopened = PartitionLog.open(leader.path)
    try:
        assert reopened.log_end_offset == 3
        assert reopened.read(0, 1 << 20) == data
    finally:
        reopened.close()


def test_follower_appends_the_leaders_bytes_unchanged(leader, follower):
    for seed in range(4):
        leader.append_batches([make_batch(seed + 1, seed=seed)], leader_epoch=seed // 2)
    data = leader.read(0, 1 << 20)
    assert follower.append_replica(data) == leader.log_end_offset
    assert follower.read(0, 1 << 20) == data
    assert follower.log_end_offset == leader.log_end_offset


def test_follower_appends_the_frames_of_a_fetch_without_joining_them(tmp_path, leader,
                                                                     follower):
    # A leader answers from memory with a batch a frame (or a read of several): the follower
    # takes the frames as they came; each holds whole batches, and all are checked first.
    for seed in range(4):
        leader.append_batches([make_batch(seed + 1, seed=seed)], leader_epoch=2)
    data = leader.read(0, 1 << 20)
    batches = split_batches(data)
    frames = [batches[0], memoryview(batches[1] + batches[2]), bytearray(batches[3])]
    assert follower.append_replica(frames) == leader.log_end_offset
    assert follower.read(0, 1 << 20) == data
    torn = [batches[0][:30], batches[0][30:]]  # a batch split across frames: refused
    with PartitionLog.open(tmp_path / "other" / "t-0") as other:
        with pytest.raises(RecordError):
            other.append_replica(torn)
        assert other.log_end_offset == 0


def test_follower_refuses_a_gap_an_overlap_and_a_damaged_batch(leader, follower):
    leader.append_batches([make_batch(2, seed=0)], leader_epoch=1)
    leader.append_batches([make_batch(2, seed=1)], leader_epoch=1)
    first, second = split_batches(leader.read(0, 1 << 20))
    with pytest.raises(RecordError):
        follower.append_replica(second)  # offsets 2..3 onto an empty log: a gap
    assert follower.log_end_offset == 0
    follower.append_replica(first)
    with pytest.raises(RecordError):
        follower.append_replica(first)  # offsets 0..1 again
    damaged = bytearray(second)
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        follower.append_replica(bytes(damaged))
    negative = bytearray(second)
    struct.pack_into(">i", negative, 12, -1)
    with pytest.raises(RecordError):
        follower.append_replica(bytes(negative))  # a replicated batch names its epoch
    assert follower.log_end_offset == 2
    follower.append_replica(second)
    assert follower.read(0, 1 << 20) == leader.read(0, 1 << 20)


def test_follower_truncates_a_divergent_tail_and_converges(leader, follower):
    leader.append_batches([make_batch(2, seed=0)], leader_epoch=1)
    follower.append_replica(leader.read(0, 1 << 20))
    follower.append_batches([make_batch(3, seed=9)], leader_epoch=1)  # written as leader, unacked
    leader.append_batches([make_batch(1, seed=2)], leader_epoch=2)
    follower.truncate_to(2)
    follower.append_replica(leader.read(2, 1 << 20))
    assert follower.read(0, 1 << 20) == leader.read(0, 1 << 20)
