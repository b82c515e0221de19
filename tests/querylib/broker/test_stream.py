"""What a subscriber sees: delivered bytes -> Data runs by logical time, frontier marks,
and the merged frontier over partitions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.broker import Data, EndOfStream, Progress, Values
from querylib.broker._stream import (
    FrontierMerge,
    PartitionMark,
    encode_records,
    encode_runs,
    events_of,
    value_events_of,
)
from querylib.records import end_of_stream_batch, frontier_batch, reopen_batch
from querylib.records._header import stamp_base_offset


def stored(*batches: bytes) -> bytes:
    """Batches as a log serves them: consecutive base offsets stamped."""
    from querylib.records import read_header

    out, offset = [], 0
    for batch in batches:
        out.append(stamp_base_offset(batch, offset))
        offset += read_header(batch).last_offset_delta + 1
    return b"".join(out)


def entries(times: list[int | None]) -> list:
    return [(None, f"v{i}".encode(), (("h", b"x"),), 1000 + i, t) for i, t in enumerate(times)]


def test_records_are_grouped_in_runs_of_equal_time():
    data = stored(encode_records(entries([1, 1, 2, 2, 2, None, 3])))
    runs = list(events_of(data, 4))
    assert [(r.time, [x.offset for x in r.records], r.partition) for r in runs] == [
        (1, [0, 1], 4), (2, [2, 3, 4], 4), (None, [5], 4), (3, [6], 4)]
    first = runs[0].records[0]
    assert first.value == b"v0" and first.timestamp == 1000
    assert first.headers[0][0] == "tq.time" and ("h", b"x") in first.headers


def test_control_batches_become_marks_with_their_end():
    data = stored(encode_records(entries([0, 0])), frontier_batch(1, timestamp=0),
                  end_of_stream_batch(timestamp=0))
    items = list(events_of(data, 0))
    assert items[1:] == [PartitionMark(0, 1, 3), PartitionMark(0, None, 4)]


def test_records_below_the_start_offset_are_skipped():
    data = stored(encode_records(entries([0, 0, 0])), encode_records(entries([1, 1])))
    runs = list(events_of(data, 0, skip_below=2))
    assert [[r.offset for r in run.records] for run in runs] == [[2], [3, 4]]
    assert list(events_of(data, 0, skip_below=5)) == []


def test_merged_frontier_is_the_minimum_and_ends_when_all_end():
    merge = FrontierMerge({0: 0, 1: 0})
    assert merge.mark(PartitionMark(0, 5)) == []
    assert merge.mark(PartitionMark(1, 3)) == [Progress(3)]
    assert merge.mark(PartitionMark(1, 8)) == [Progress(5)]
    assert merge.mark(PartitionMark(0, None)) == [Progress(8)]
    assert merge.mark(PartitionMark(1, None)) == [EndOfStream()]
    merge.data(1)  # a producer came back to partition 1
    assert merge.mark(PartitionMark(1, 9)) == [Progress(9)]


def test_a_reopening_after_an_end_is_a_mark_of_its_own():
    data = stored(end_of_stream_batch(timestamp=0), reopen_batch(timestamp=0),
                  encode_records(entries([2])))
    items = list(events_of(data, 3))
    assert items[:2] == [PartitionMark(3, None, 1), PartitionMark(3, None, 2, reopen=True)]


def test_an_end_superseded_in_the_history_is_read_past_and_the_current_one_ends():
    # Subscribed when the log ended at offset 5: the end at 1 was followed by a reopening.
    merge = FrontierMerge({0: 0}, history={0: 5})
    assert merge.mark(PartitionMark(0, None, 1)) == []  # superseded: read past it
    assert merge.mark(PartitionMark(0, None, 2, reopen=True)) == []
    assert merge.mark(PartitionMark(0, 4, 4)) == [Progress(4)]
    assert merge.mark(PartitionMark(0, None, 5)) == [EndOfStream()]  # the end it found
    # A live reader past that end: a later reopening makes the partition live again.
    assert merge.mark(PartitionMark(0, None, 6, reopen=True)) == []
    assert merge.mark(PartitionMark(0, 7, 7)) == [Progress(7)]
    assert merge.mark(PartitionMark(0, None, 8)) == [EndOfStream()]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 50))),
                max_size=40))
def test_merged_frontier_never_goes_back_and_stays_below_live_partitions(marks):
    merge = FrontierMerge({0: 0, 1: 0, 2: 0})
    last = None
    for partition, frontier in marks:
        for event in merge.mark(PartitionMark(partition, frontier)):
            if isinstance(event, Progress):
                assert last is None or event.frontier > last
                last = event.frontier
                live = [f for p, f in merge.frontiers.items() if not merge.ended[p]]
                assert event.frontier == min(live)


def test_data_events_are_plain_values():
    assert Data(1, [], 0) == Data(1, [], 0)
    assert Progress(2) != Progress(3)


def _as_values(items: list) -> list:
    """events_of's items as a values-only subscriber must see them."""
    return [Values(i.time, [r.value for r in i.records], i.partition, i.records[-1].offset + 1,
                   any(r.value is None for r in i.records))
            if isinstance(i, Data) else i for i in items]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 120), st.booleans()),
                min_size=1, max_size=6), st.integers(0, 300))
def test_value_events_are_events_of_values_only(chunks: list, skip_below: int) -> None:
    """Runs from `encode_runs` (the fast path), records with other headers (the general
    decoder), and control batches, in one delivery: the same as events_of, values only."""
    batches = []
    for t, n, general in chunks:
        values = [bytes([n % 256]) * (n % 7)] * n
        if general:
            batches.append(encode_records([(None, v, (("h", b"x"),), 5, t) for v in values]))
        else:
            batches.append(encode_runs([(5, t, (), values[:n // 2]), (6, t + 1, (), values)]))
        batches.append(frontier_batch(t + 2, timestamp=0))
    data = stored(*batches)
    assert list(value_events_of(data, 3, skip_below=skip_below)) == \
        _as_values(list(events_of(data, 3, skip_below=skip_below)))
    assert list(value_events_of(memoryview(data), 3)) == _as_values(list(events_of(data, 3)))


def test_encode_runs_is_encode_records_of_the_same_records() -> None:
    runs = [(7, 1, (("h", b"x"),), [b"a", b"bb"]), (9, None, (), [b"c"]), (9, 2, (), [None])]
    records = [(None, v, h, ts, t) for ts, t, h, values in runs for v in values]
    assert encode_runs(runs) == encode_records(records)
