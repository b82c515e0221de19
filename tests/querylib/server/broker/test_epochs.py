"""Epochs (DESIGN §5 "Epochs"): a later run of a topic's publisher starts its times again at 0
in a higher epoch, and readers order times by (epoch, time), so the frontier they were
promised still holds. The partition's rule, its control records, recovery from the log, and
the readers' merge."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.broker import EndOfStream, Progress
from querylib.broker._stream import FrontierMerge, PartitionMark, encode_records, events_of
from querylib.errors import InvalidRecordError
from querylib.log import LogConfig, PartitionLog
from querylib.records import (
    decode_batch,
    decode_frontier,
    decode_reopen,
    end_of_stream_batch,
    frontier_batch,
    reopen_batch,
)
from querylib.records._control import control_of
from querylib.server.broker._disk import recover_frontier
from querylib.server.broker._frontier import (
    FrontierAdvanced,
    PartitionFrontier,
    StreamEnded,
    StreamReopened,
)
from tests.querylib.broker.test_stream import entries, stored


def ended_run(frontier: int = 10) -> PartitionFrontier:
    """A partition whose first run published up to `frontier` and ended."""
    f = PartitionFrontier()
    f.join("run1")
    f.advance("run1", frontier)
    assert f.end("run1") == [StreamEnded()]
    return f


# -- the partition's rule --------------------------------------------------------------------


def test_a_later_run_reopening_an_ended_stream_starts_its_epoch_at_zero():
    f = ended_run()
    assert f.join("run2", reopen=True, epoch=7) == [StreamReopened(7)]
    assert (f.epoch, f.frontier, f.ended) == (7, 0, False)
    assert f.producers["run2"] == 0  # it may send at time 0 again
    assert f.advance("run2", 3) == [FrontierAdvanced(3, 7)]
    assert f.end("run2") == [StreamEnded()]
    # A third run goes above it; the same or a lower epoch only goes on (as before epochs).
    assert f.join("run3", reopen=True, epoch=7) == [StreamReopened()]
    assert (f.epoch, f.producers["run3"]) == (7, 3)


def test_a_run_after_a_crash_starts_its_epoch_though_the_stream_never_ended():
    f = PartitionFrontier()
    f.join("run1")
    f.advance("run1", 10)
    f.drop("run1")  # its lease expired: the stream did not end
    assert f.join("run2", reopen=True, epoch=4) == [StreamReopened(4)]
    assert (f.epoch, f.producers["run2"]) == (4, 0)


def test_a_stream_with_a_live_writer_keeps_its_epoch():
    f = PartitionFrontier()
    f.join("a")
    f.advance("a", 10)
    assert f.join("b", reopen=True, epoch=9) == []  # another writer of it is still live
    assert (f.epoch, f.producers["b"]) == (0, 10)


def test_a_writer_cohort_still_waiting_keeps_its_epoch():
    f = ended_run()
    f.join("p0", "q2/t#1", "0", 2, reopen=True, epoch=5)
    assert f.epoch == 5
    f.end("p0")  # writer 1 has not come: the cohort holds
    assert f.held
    # A newer run cannot start while the cohort may still write.
    assert f.join("x", reopen=True, epoch=8) == []
    assert f.epoch == 5


def test_the_first_run_of_a_topic_writes_no_reopen():
    f = PartitionFrontier()
    assert f.join("run1", reopen=True, epoch=0) == []
    assert f.epoch == 0


# -- control records ---------------------------------------------------------------------------


def _value(batch: bytes) -> bytes | None:
    (record,) = decode_batch(batch).records
    return control_of(record)[1]


def test_frontier_and_reopen_records_carry_the_epoch():
    # Epoch 0 keeps the bytes of before: an 8-byte frontier, a null reopen.
    assert len(_value(frontier_batch(5, timestamp=0))) == 8
    assert _value(reopen_batch(timestamp=0)) is None
    assert decode_frontier(_value(frontier_batch(5, timestamp=0))) == (5, 0)
    assert decode_frontier(_value(frontier_batch(5, timestamp=0, epoch=12))) == (5, 12)
    assert decode_reopen(_value(reopen_batch(timestamp=0))) == 0
    assert decode_reopen(_value(reopen_batch(timestamp=0, epoch=12))) == 12
    with pytest.raises(InvalidRecordError):
        decode_reopen((0).to_bytes(8, "big"))
    with pytest.raises(InvalidRecordError):
        decode_frontier(b"\x00" * 12)


def test_readers_see_the_epoch_in_marks():
    data = stored(encode_records(entries([0, 9])), frontier_batch(10, timestamp=0),
                  end_of_stream_batch(timestamp=0), reopen_batch(timestamp=0, epoch=7),
                  encode_records(entries([0])), frontier_batch(1, timestamp=0, epoch=7))
    marks = [m for m in events_of(data, 0) if isinstance(m, PartitionMark)]
    assert marks == [PartitionMark(0, 10, 3), PartitionMark(0, None, 4),
                     PartitionMark(0, None, 5, reopen=True, epoch=7),
                     PartitionMark(0, 1, 7, epoch=7)]


def test_recovery_finds_the_epoch(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig()) as log:
        log.append(frontier_batch(10, timestamp=0))
        log.append(end_of_stream_batch(timestamp=0))
        assert recover_frontier(log) == (10, True, 0, 0)
        log.append(reopen_batch(timestamp=0, epoch=7))
        assert recover_frontier(log) == (0, False, 7, 2)  # the new epoch, from its REOPEN
        log.append(stored(encode_records(entries([0]))))
        log.append(frontier_batch(1, timestamp=0, epoch=7))
        log.append(end_of_stream_batch(timestamp=0))
        assert recover_frontier(log) == (1, True, 7, 4)  # known from its FRONTIER
        log.append(reopen_batch(timestamp=0))  # reopened in its epoch: goes on from 1
        assert recover_frontier(log) == (1, False, 7, 4)


# -- the readers' merge ------------------------------------------------------------------------


def test_a_reader_replaying_two_runs_sees_one_frontier_going_forward():
    # Subscribed after both runs: the first run's end is superseded.
    merge = FrontierMerge({0: 0}, history={0: 8})
    assert merge.mark(PartitionMark(0, 10, 3)) == [Progress(10)]
    assert merge.mark(PartitionMark(0, None, 4)) == []  # superseded
    assert merge.mark(PartitionMark(0, None, 5, reopen=True, epoch=7)) == [Progress(0, 7)]
    assert merge.epochs[0] == 7
    assert merge.mark(PartitionMark(0, 1, 7, epoch=7)) == [Progress(1, 7)]
    assert merge.mark(PartitionMark(0, None, 8)) == [EndOfStream(7)]


def test_partitions_in_different_epochs_merge_by_epoch_then_time():
    merge = FrontierMerge({0: 0, 1: 0})
    assert merge.mark(PartitionMark(0, 10)) == []
    assert merge.mark(PartitionMark(1, 10)) == [Progress(10)]
    assert merge.mark(PartitionMark(0, None)) == []
    assert merge.mark(PartitionMark(0, None, reopen=True, epoch=7)) == []  # 1 is in epoch 0
    assert merge.mark(PartitionMark(0, 4, epoch=7)) == []
    assert merge.mark(PartitionMark(1, 12)) == [Progress(12)]
    # Partition 1 ended in epoch 0: it may yet start epoch 7 at time 0, so nothing is
    # promised of epoch 7 until it has.
    assert merge.mark(PartitionMark(1, None)) == []
    assert merge.mark(PartitionMark(1, None, reopen=True, epoch=7)) == [Progress(0, 7)]
    assert merge.mark(PartitionMark(1, 6, epoch=7)) == [Progress(4, 7)]
    assert merge.mark(PartitionMark(0, None)) == [Progress(6, 7)]
    assert merge.mark(PartitionMark(1, None)) == [EndOfStream(7)]


def test_a_reader_starting_inside_an_epoch_learns_it_from_the_next_frontier():
    merge = FrontierMerge({0: 0})
    assert merge.mark(PartitionMark(0, 3, epoch=7)) == [Progress(3, 7)]
    assert merge.mark(PartitionMark(0, 2, epoch=0)) == []  # never moves back


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["frontier", "end", "reopen"]),
                          st.integers(0, 30)), max_size=50))
def test_the_merged_frontier_only_moves_forward_across_epochs(steps):
    """Each partition's log in order (its epoch only grows, its frontier only grows within an
    epoch): the merged (epoch, frontier) never goes back and is the least live one."""
    merge = FrontierMerge({0: 0, 1: 0, 2: 0})
    epochs = {0: 0, 1: 0, 2: 0}
    last = (0, 0)
    for partition, kind, n in steps:
        if kind == "frontier":
            mark = PartitionMark(partition, max(n, merge.frontiers[partition]),
                                 epoch=epochs[partition])
        elif kind == "end":
            mark = PartitionMark(partition, None)
        else:
            epochs[partition] += n % 3  # the same epoch: goes on; a higher one: starts it
            mark = PartitionMark(partition, None, reopen=True, epoch=epochs[partition])
        for event in merge.mark(mark):
            if isinstance(event, Progress):
                now = (event.epoch, event.frontier)
                assert now > last
                last = now
                live = [(merge.epochs[p], f) for p, f in merge.frontiers.items()
                        if not merge.ended[p]]
                assert now == min(live)
                # and no partition that ended in an earlier epoch may still start this one
                assert all(merge.epochs[p] >= now[0] for p in merge.ended if merge.ended[p])
