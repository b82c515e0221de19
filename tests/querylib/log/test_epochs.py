"""Leader epochs of a replicated partition's log and where a follower parts from its leader
(querylib/log/_epochs.py; Kafka's LeaderEpochFileCache, KIP-101 and KIP-279): the cache's
rules, its checkpoint file (Kafka's format, replaced atomically, refused when malformed), and
the divergence case KIP-101 was written for, on two real logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from querylib.errors import StorageError
from querylib.log import (
    LEADER_EPOCH_FILE,
    EpochEntry,
    LeaderEpochCache,
    LogConfig,
    PartitionLog,
    truncation_point,
)
from querylib.log._epochs import UNDEFINED
from tests.querylib.log._batches import make_batch


def _cache(*entries: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache(None, tuple(EpochEntry(*e) for e in entries))


def test_assigning_epochs_keeps_them_increasing_and_drops_what_a_new_one_contradicts() -> None:
    cache = _cache()
    cache.assign(0, 0)
    cache.assign(0, 5)  # the same epoch's later batches change nothing
    cache.assign(2, 10)
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(2, 10))
    cache.assign(3, 8)  # a later epoch starting before epoch 2 did: epoch 2's tail was cut
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(3, 8))
    assert cache.latest_epoch == 3
    with pytest.raises(ValueError):
        cache.assign(-1, 0)


def test_end_offset_for_an_epoch_is_where_the_next_epoch_starts() -> None:
    cache = _cache((1, 0), (3, 10), (5, 25))
    assert cache.end_offset_for(5, 40) == (5, 40)   # the latest: the log's end
    assert cache.end_offset_for(3, 40) == (3, 25)
    assert cache.end_offset_for(4, 40) == (3, 25)   # unknown here: the largest before it
    assert cache.end_offset_for(0, 40) == (0, 0)    # older than all: the first epoch's start
    assert cache.end_offset_for(6, 40) == (UNDEFINED, UNDEFINED)
    assert cache.end_offset_for(UNDEFINED, 40) == (UNDEFINED, UNDEFINED)
    assert _cache().end_offset_for(0, 0) == (UNDEFINED, UNDEFINED)


def test_truncating_the_log_truncates_its_epochs() -> None:
    cache = _cache((1, 0), (3, 10), (5, 25))
    cache.truncate_from_end(25)
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(3, 10))
    cache.truncate_from_start(12)
    assert cache.entries == (EpochEntry(3, 12),)
    cache.truncate_from_start(5)  # before the start already: nothing to do
    assert cache.entries == (EpochEntry(3, 12),)


def test_the_checkpoint_is_kafkas_format_and_survives_a_reopen(tmp_path: Path) -> None:
    cache = LeaderEpochCache.load(str(tmp_path))
    assert cache.entries == ()
    cache.assign(0, 0)
    cache.assign(4, 17)
    assert (tmp_path / LEADER_EPOCH_FILE).read_text() == "0\n2\n0 0\n4 17\n"
    assert LeaderEpochCache.load(str(tmp_path)).entries == cache.entries
    assert not (tmp_path / (LEADER_EPOCH_FILE + ".tmp")).exists()


@pytest.mark.parametrize("text", ["", "0\n2\n0 0\n", "1\n0\n", "0\n1\nzero 0\n",
                                  "0\n2\n4 0\n2 5\n", "0\n2\n0 9\n1 5\n"])
def test_a_malformed_checkpoint_is_refused_naming_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / LEADER_EPOCH_FILE).write_text(text)
    with pytest.raises(StorageError, match=LEADER_EPOCH_FILE):
        LeaderEpochCache.load(str(tmp_path))


def test_the_follower_cuts_where_its_epoch_ended_on_the_leader() -> None:
    # Same epochs, the follower has more of epoch 2 than the leader kept: cut to the leader's.
    follower = _cache((0, 0), (2, 10))
    assert truncation_point(2, 15, follower, 20, high_watermark=12) == (15, True)
    # The leader answers with an epoch the follower never had (epoch 1: the follower's floor
    # below 2 is epoch 0): it cuts to where its own epoch 0 ended and asks again for epoch 0.
    assert truncation_point(1, 8, follower, 20, high_watermark=5) == (10, False)
    # A leader that knows no epoch this old: fall back to the high watermark.
    assert truncation_point(UNDEFINED, UNDEFINED, follower, 20, high_watermark=5) == (5, True)
    # Never past the follower's own end.
    assert truncation_point(2, 30, follower, 20, high_watermark=5) == (20, True)


def test_kip_101_divergence_on_two_real_logs_converges(tmp_path: Path) -> None:
    """Leader A (epoch 0) writes 3 batches; follower B got only 2 when A died. B leads at
    epoch 1 and takes a batch of its own at offset 2. A returns as a follower: it asks B where
    its epoch 0 ended (offset 2), cuts its own third batch (never acknowledged: B lacked it)
    and then fetches B's, so both logs hold the same records."""
    config = LogConfig(flush="always")
    a = PartitionLog.open(tmp_path / "a" / "t-0", config)
    b = PartitionLog.open(tmp_path / "b" / "t-0", config)
    a_epochs = LeaderEpochCache.load(str(tmp_path / "a" / "t-0"))
    b_epochs = LeaderEpochCache.load(str(tmp_path / "b" / "t-0"))
    try:
        batches = [make_batch(1, seed=i) for i in range(3)]
        a_epochs.assign(0, 0)
        b_epochs.assign(0, 0)
        for batch in batches:
            a.append(batch)
        for batch in batches[:2]:
            b.append(batch)
        b_epochs.assign(1, b.log_end_offset)  # B leads at epoch 1 ...
        b.append(make_batch(1, seed=99))      # ... and writes its own record at offset 2

        reopened = LeaderEpochCache.load(str(tmp_path / "a" / "t-0"))  # A restarted
        leader_epoch, leader_end = b_epochs.end_offset_for(reopened.latest_epoch,
                                                           b.log_end_offset)
        assert (leader_epoch, leader_end) == (0, 2)
        cut, done = truncation_point(leader_epoch, leader_end, reopened, a.log_end_offset,
                                     high_watermark=2)
        assert (cut, done) == (2, True)
        a.truncate_to(cut)
        reopened.truncate_from_end(cut)
        reopened.assign(1, cut)
        a.append(b.read(2, 1 << 20))  # the fetch: B's record at offset 2
        assert a.read(0, 1 << 20) == b.read(0, 1 << 20)  # identical bytes
        assert reopened.entries == b_epochs.entries
    finally:
        a.close()
        b.close()
