"""The log's leader epoch cache and its `leader-epoch-checkpoint` file (DESIGN §5
"Replication"): kept as batches are appended, replicated, truncated and deleted, written before
a batch of a new epoch, so an open never has to scan the log to answer OffsetForLeaderEpoch."""

from __future__ import annotations

import logging
import os

import pytest

from querylib.log import LeaderEpochCache, PartitionLog, appended_batch
from querylib.log._config import EPOCH_CHECKPOINT_FILE
from querylib.log._epochs import scan_epochs
from tests.querylib.log._batches import make_batch


def _epochs_file(path) -> str:
    return os.path.join(path, EPOCH_CHECKPOINT_FILE)


def test_a_new_epoch_is_in_the_checkpoint_before_its_batch_and_survives_a_reopen(
        tmp_path) -> None:
    path = tmp_path / "t-0"
    with PartitionLog.open(path) as log:
        log.append_batches([make_batch(2, seed=0)], leader_epoch=1)
        log.append_batches([make_batch(3, seed=1)], leader_epoch=1)
        log.append_batches([make_batch(1, seed=2)], leader_epoch=4)
        assert log.leader_epochs.entries == ((1, 0), (4, 5))
        assert log.leader_epochs.end_offset_for(3, log_end=log.log_end_offset) == (1, 5)
    assert LeaderEpochCache.loads(open(_epochs_file(path)).read()).entries == ((1, 0), (4, 5))
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((1, 0), (4, 5))


def test_a_log_of_one_replica_has_epoch_zero_from_its_first_batch(tmp_path) -> None:
    path = tmp_path / "t-0"
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ()
        log.append_batches([make_batch(2)])
        log.append_batches([make_batch(2)])
        assert log.leader_epochs.entries == ((0, 0),)
    assert LeaderEpochCache.loads(open(_epochs_file(path)).read()).entries == ((0, 0),)
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((0, 0),)


def test_replicated_batches_bring_their_epochs(tmp_path) -> None:
    with PartitionLog.open(tmp_path / "leader-0") as leader, \
            PartitionLog.open(tmp_path / "follower-0") as follower:
        leader.append_batches([make_batch(2, seed=0)], leader_epoch=0)
        leader.append_batches([make_batch(2, seed=1)], leader_epoch=2)
        leader.append_batches([make_batch(2, seed=2)], leader_epoch=3)
        follower.append_replica(leader.read(0, 1 << 20))
        assert follower.leader_epochs.entries == ((0, 0), (2, 2), (3, 4))
    with PartitionLog.open(tmp_path / "follower-0") as follower:
        assert follower.leader_epochs.entries == ((0, 0), (2, 2), (3, 4))


def test_appended_batch_at_an_epoch_is_what_the_log_stores(tmp_path) -> None:
    # What a leader hands its followers and subscribers from memory equals what it reads.
    batch = make_batch(3, seed=4)
    with PartitionLog.open(tmp_path / "leader-0") as leader:
        leader.append_batches([make_batch(2, seed=0)], leader_epoch=6)
        leader.append_batches([batch], leader_epoch=6)
        assert appended_batch(batch, 2, 6) == bytes(leader.read(2, 1 << 20))


def test_truncation_forgets_the_epochs_it_removes_on_disk_too(tmp_path) -> None:
    path = tmp_path / "t-0"
    with PartitionLog.open(path) as log:
        for epoch in (1, 2, 3):
            log.append_batches([make_batch(2, seed=epoch)], leader_epoch=epoch)
        log.truncate_to(3)  # inside epoch 2's batch: the batch goes whole
        assert log.log_end_offset == 2
        assert log.leader_epochs.entries == ((1, 0),)
        log.append_batches([make_batch(1)], leader_epoch=5)
        assert log.leader_epochs.entries == ((1, 0), (5, 2))
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((1, 0), (5, 2))


def test_an_epoch_whose_batch_never_reached_the_log_is_dropped_on_open(tmp_path) -> None:
    """The checkpoint is written before its batch: a crash in between leaves an epoch that
    starts at the log end, which the next open forgets."""
    path = tmp_path / "t-0"
    with PartitionLog.open(path) as log:
        log.append_batches([make_batch(2)], leader_epoch=1)
    with open(_epochs_file(path), "w") as f:
        f.write(LeaderEpochCache(((1, 0), (2, 2))).dumps())
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((1, 0),)


def test_a_damaged_or_missing_checkpoint_is_rebuilt_from_the_batch_headers(
        tmp_path, caplog) -> None:
    path = tmp_path / "t-0"
    with PartitionLog.open(path) as log:
        log.append_batches([make_batch(2)], leader_epoch=0)
        log.append_batches([make_batch(2)], leader_epoch=3)
    with open(_epochs_file(path), "w") as f:
        f.write("0\n7\n1 0\n")
    with caplog.at_level(logging.WARNING, logger="querylib.log"), PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((0, 0), (3, 2))
    assert "leader-epoch-checkpoint" in caplog.text
    assert LeaderEpochCache.loads(open(_epochs_file(path)).read()).entries == ((0, 0), (3, 2))
    os.unlink(_epochs_file(path))  # a log written before the checkpoint existed
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((0, 0), (3, 2))


def test_deleting_records_moves_the_first_epoch_to_the_new_start(tmp_path) -> None:
    path = tmp_path / "t-0"
    with PartitionLog.open(path) as log:
        log.append_batches([make_batch(2)], leader_epoch=1)
        log.append_batches([make_batch(2)], leader_epoch=2)
        log.append_batches([make_batch(2)], leader_epoch=4)
        log.delete_records(3)
        assert log.leader_epochs.entries == ((2, 3), (4, 4))
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((2, 3), (4, 4))


# --- the cache alone --------------------------------------------------------------------


def test_epoch_cache_answers_the_end_offset_of_an_epoch_as_offset_for_leader_epoch() -> None:
    cache = LeaderEpochCache()
    cache.assign(0, 0)
    cache.assign(0, 5)  # the same epoch again: its start stays
    cache.assign(2, 10)
    cache.assign(5, 30)
    assert cache.latest_epoch == 5
    assert cache.end_offset_for(0, log_end=40) == (0, 10)
    assert cache.end_offset_for(1, log_end=40) == (0, 10)  # no epoch 1: the one below it
    assert cache.end_offset_for(2, log_end=40) == (2, 30)
    assert cache.end_offset_for(5, log_end=40) == (5, 40)  # the latest epoch ends at the log end
    assert cache.end_offset_for(9, log_end=40) == (5, 40)
    with pytest.raises(ValueError):
        cache.assign(4, 50)  # epochs only grow


def test_epoch_cache_before_its_first_epoch_is_undefined() -> None:
    cache = LeaderEpochCache()
    assert cache.end_offset_for(3, log_end=0) == (-1, -1)
    cache.assign(4, 10)
    assert cache.end_offset_for(3, log_end=20) == (-1, -1)


def test_epoch_cache_truncates_with_the_log() -> None:
    cache = LeaderEpochCache()
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(3, 20)
    cache.truncate_from_end(15)
    assert cache.entries == ((1, 0), (2, 10))
    cache.truncate_from_end(10)
    assert cache.entries == ((1, 0),)
    cache.assign(4, 10)
    assert cache.entries == ((1, 0), (4, 10))


def test_epoch_checkpoint_round_trips_in_kafkas_format_and_refuses_damage() -> None:
    cache = LeaderEpochCache()
    cache.assign(1, 0)
    cache.assign(3, 42)
    text = cache.dumps()
    assert text == "0\n2\n1 0\n3 42\n"
    assert LeaderEpochCache.loads(text).entries == ((1, 0), (3, 42))
    assert LeaderEpochCache.loads("").entries == ()
    for bad in ("1\n0\n", "0\n2\n1 0\n", "0\n1\nx 0\n", "0\n2\n3 0\n1 5\n",
                "0\n2\n1 5\n3 2\n", "0\n1\n-1 0\n"):
        with pytest.raises(ValueError):
            LeaderEpochCache.loads(bad)


def test_scan_epochs_builds_the_cache_from_stored_batch_headers(tmp_path) -> None:
    log = PartitionLog.open(tmp_path / "t-0")
    try:
        log.append_batches([make_batch(2, seed=0)], leader_epoch=1)
        log.append_batches([make_batch(3, seed=1)], leader_epoch=1)
        log.append_batches([make_batch(1, seed=2)], leader_epoch=4)
        cache = scan_epochs(lambda offset: log.read(offset, 100), log.log_start_offset)
        assert cache.entries == ((1, 0), (4, 5))
        assert cache.end_offset_for(3, log_end=log.log_end_offset) == (1, 5)
    finally:
        log.close()
