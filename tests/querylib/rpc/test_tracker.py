"""RequestTracker: deadlines as data, replies matched in any order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querylib.rpc import RequestTracker


def test_replies_match_by_id_in_any_order() -> None:
    tracker: RequestTracker[str] = RequestTracker(capacity=10)
    ids = [tracker.next_id() for _ in range(5)]
    for rid in ids:
        tracker.add(rid, deadline=100.0, entry=f"call {rid}")
    for rid in [ids[3], ids[0], ids[4], ids[2], ids[1]]:
        assert tracker.pop(rid) == f"call {rid}"
    assert len(tracker) == 0
    assert tracker.pop(ids[0]) is None  # a duplicate or late reply finds nothing


def test_expired_returns_due_requests_once_earliest_first() -> None:
    tracker: RequestTracker[str] = RequestTracker(capacity=10)
    tracker.add(1, 5.0, "a")
    tracker.add(2, 1.0, "b")
    tracker.add(3, 3.0, "c")
    assert tracker.next_deadline() == 1.0
    assert tracker.expired(0.5) == []
    assert tracker.expired(3.0) == [(2, "b"), (3, "c")]
    assert tracker.expired(3.0) == []
    assert tracker.next_deadline() == 5.0
    assert tracker.pop(1) == "a"
    assert tracker.next_deadline() is None
    assert tracker.expired(99.0) == []


def test_answered_requests_never_expire() -> None:
    tracker: RequestTracker[str] = RequestTracker(capacity=10)
    tracker.add(1, 1.0, "a")
    tracker.pop(1)
    assert tracker.expired(2.0) == []


def test_capacity_and_duplicate_ids() -> None:
    tracker: RequestTracker[int] = RequestTracker(capacity=2)
    tracker.add(1, 1.0, 1)
    with pytest.raises(ValueError):
        tracker.add(1, 1.0, 1)
    tracker.add(2, 1.0, 2)
    with pytest.raises(OverflowError):
        tracker.add(3, 1.0, 3)
    assert sorted(tracker.clear()) == [(1, 1), (2, 2)] and len(tracker) == 0


def test_heap_stays_proportional_to_requests_in_flight() -> None:
    tracker: RequestTracker[None] = RequestTracker(capacity=10)
    for n in range(10_000):
        rid = tracker.next_id()
        tracker.add(rid, float(n + 1000), None)
        tracker.pop(rid)
    assert len(tracker._heap) <= 2 * len(tracker) + 65


@given(st.lists(st.tuples(st.sampled_from(["add", "pop", "expire"]), st.integers(0, 20)),
                max_size=200))
def test_tracker_matches_a_dict_model(ops: list[tuple[str, int]]) -> None:
    tracker: RequestTracker[int] = RequestTracker(capacity=1000)
    model: dict[int, float] = {}
    now = 0.0
    for op, value in ops:
        if op == "add":
            rid = tracker.next_id()
            tracker.add(rid, now + value, rid)
            model[rid] = now + value
        elif op == "pop":
            rid = sorted(model)[value % len(model)] if model else 12345
            assert tracker.pop(rid) == (rid if rid in model else None)
            model.pop(rid, None)
        else:
            now += value
            due = sorted((d, r) for r, d in model.items() if d <= now)
            assert [r for r, _ in tracker.expired(now)] == [r for _, r in due]
            for _, rid in due:
                del model[rid]
        assert len(tracker) == len(model)
        assert tracker.next_deadline() == (min(model.values()) if model else None)
