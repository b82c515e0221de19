"""Planning reads: partitions, offsets, rate limits and task splits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog.errors import UnknownTopicError
from querylib.spark import BadOptionError, DataLossError
from querylib.spark._options import EARLIEST, LATEST, OffsetSpec, Subscription
from querylib.spark._plan import (
    OffsetRange,
    end_offsets,
    from_offsets_dict,
    rate_limit,
    resolve_partitions,
    split_ranges,
    start_offsets,
    to_offsets_dict,
)

pytestmark = pytest.mark.spark


class FakeTopics:
    """Planning's view of topics, in memory: {topic: [(start, end) per partition]}."""

    def __init__(self, ranges: dict[str, list[tuple[int, int]]]) -> None:
        self.ranges = ranges

    def topics(self) -> dict[str, int]:
        return {t: len(r) for t, r in self.ranges.items()}

    def partitions(self, topic: str) -> int:
        if topic not in self.ranges:
            raise UnknownTopicError(f"topic {topic!r} not found")
        return len(self.ranges[topic])

    def offset_range(self, topic: str, partition: int) -> tuple[int, int]:
        return self.ranges[topic][partition]


TOPICS = FakeTopics({"a": [(0, 10), (5, 8)], "ab": [(0, 3)], "b": [(2, 2)]})


def test_subscriptions_resolve_to_sorted_partitions() -> None:
    assert resolve_partitions(Subscription(topics=("b", "a")), TOPICS) == [
        ("a", 0), ("a", 1), ("b", 0)]
    assert resolve_partitions(Subscription(pattern="a.*"), TOPICS) == [
        ("a", 0), ("a", 1), ("ab", 0)]
    assert resolve_partitions(Subscription(pattern="a"), TOPICS) == [("a", 0), ("a", 1)]
    assert resolve_partitions(Subscription(assigned=(("a", 1),)), TOPICS) == [("a", 1)]
    with pytest.raises(UnknownTopicError):
        resolve_partitions(Subscription(topics=("zz",)), TOPICS)
    with pytest.raises(UnknownTopicError, match="partition 2 does not exist"):
        resolve_partitions(Subscription(assigned=(("a", 2),)), TOPICS)


def test_offsets_resolve() -> None:
    parts = [("a", 0), ("a", 1)]
    assert start_offsets(OffsetSpec(EARLIEST), parts, TOPICS, fail_on_data_loss=True) == {
        ("a", 0): 0, ("a", 1): 5}
    assert start_offsets(OffsetSpec(LATEST), parts, TOPICS, fail_on_data_loss=True) == {
        ("a", 0): 10, ("a", 1): 8}
    spec = OffsetSpec(EARLIEST, {("a", 0): 4, ("a", 1): LATEST})
    assert start_offsets(spec, parts, TOPICS, fail_on_data_loss=True) == {
        ("a", 0): 4, ("a", 1): 8}
    assert end_offsets(OffsetSpec(LATEST, {("a", 0): 7}), parts, TOPICS) == {
        ("a", 0): 7, ("a", 1): 8}


def test_offsets_outside_the_log() -> None:
    gone = OffsetSpec(EARLIEST, {("a", 1): 2})
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        start_offsets(gone, [("a", 1)], TOPICS, fail_on_data_loss=True)
    assert start_offsets(gone, [("a", 1)], TOPICS, fail_on_data_loss=False) == {("a", 1): 5}
    with pytest.raises(BadOptionError, match="past the log's end 8"):
        start_offsets(OffsetSpec(EARLIEST, {("a", 1): 9}), [("a", 1)], TOPICS,
                      fail_on_data_loss=True)
    with pytest.raises(BadOptionError, match="past the log's end"):
        end_offsets(OffsetSpec(LATEST, {("a", 0): 11}), [("a", 0)], TOPICS)
    with pytest.raises(BadOptionError, match="does not read"):
        end_offsets(OffsetSpec(LATEST, {("b", 0): 1}), [("a", 0)], TOPICS)


@given(st.dictionaries(st.tuples(st.sampled_from("xyz"), st.integers(0, 3)),
                       st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
       st.integers(1, 3000))
def test_rate_limit_shares_the_cap(ranges: dict, limit: int) -> None:
    start = {p: a for p, (a, _) in ranges.items()}
    latest = {p: a + n for p, (a, n) in ranges.items()}
    capped = rate_limit(start, latest, limit)
    taken = {p: capped[p] - start[p] for p in latest}
    assert all(0 <= taken[p] <= latest[p] - start[p] for p in latest)
    assert sum(taken.values()) == min(limit, sum(latest[p] - start[p] for p in latest))


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 300)), max_size=5),
       st.integers(1, 120), st.integers(1, 9))
def test_splits_cover_each_range_exactly(spans: list, size: int, min_parts: int) -> None:
    ranges = [OffsetRange("t", i, a, a + n) for i, (a, n) in enumerate(spans)]
    tasks = split_ranges(ranges, size, min_parts)
    for r in ranges:
        mine = sorted((t.start, t.stop) for t in tasks if t.partition == r.partition)
        covered = [o for a, b in mine for o in range(a, b)]
        assert covered == list(range(r.start, r.stop))
        assert all(b - a <= size for a, b in mine)
    total = sum(r.stop - r.start for r in ranges)
    by_size = sum(-(-(r.stop - r.start) // size) for r in ranges)
    live = sum(1 for r in ranges if r.stop > r.start)
    assert len(tasks) >= min(min_parts, total)
    if by_size < min(min_parts, total):  # minPartitions decides: exactly that many tasks
        assert len(tasks) == max(min(min_parts, total), live)


def test_offsets_dict_round_trip() -> None:
    offsets = {("b", 1): 7, ("a", 10): 3, ("a", 2): 5}
    as_dict = to_offsets_dict(offsets)
    assert as_dict == {"a": {"2": 5, "10": 3}, "b": {"1": 7}}
    assert list(as_dict) == ["a", "b"]
    assert from_offsets_dict(as_dict) == offsets
    with pytest.raises(BadOptionError, match="not tq offsets"):
        from_offsets_dict({"a": 5})
