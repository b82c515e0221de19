"""Multisets updated by (record, diff) pairs, and consolidation."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from catalog import (
    Collection,
    CorruptCatalogError,
    Publication,
    QueryRef,
    Update,
    consolidate,
    consolidate_updates,
)


def pub(topic_id: int) -> Publication:
    return Publication(topic_id=topic_id, publisher=QueryRef(1))


def test_consolidate_sums_and_drops_zeros() -> None:
    updates = [(pub(1), 1), (pub(2), 1), (pub(1), -1), (pub(3), 2), (pub(2), 1), (pub(3), -1)]
    assert consolidate(updates) == [(pub(2), 2), (pub(3), 1)]
    assert consolidate([]) == []


def test_consolidate_updates_puts_retractions_first() -> None:
    updates = [
        Update("publications", pub(1), 1),
        Update("publications", pub(2), -1),
        Update("publications", pub(1), 1),
        Update("publications", pub(3), 1),
        Update("publications", pub(3), -1),
    ]
    assert consolidate_updates(updates) == [
        Update("publications", pub(2), -1),
        Update("publications", pub(1), 2),
    ]


def test_apply_contains_count_iterate() -> None:
    c: Collection[Publication] = Collection([(pub(1), 1), (pub(2), 2)])
    assert pub(1) in c and pub(2) in c and pub(3) not in c
    assert c.count(pub(2)) == 2 and c.count(pub(3)) == 0
    assert len(c) == 2
    assert sorted(p.topic_id for p in c) == [1, 2]  # each distinct record once
    c.apply([(pub(2), -2), (pub(3), 1)])
    assert pub(2) not in c
    assert dict(c.items()) == {pub(1): 1, pub(3): 1}


def test_apply_refuses_negative_counts_whole() -> None:
    c = Collection([(pub(1), 1)])
    with pytest.raises(CorruptCatalogError, match="multiplicity 0"):
        c.apply([(pub(1), -1), (pub(2), -1)])
    assert dict(c.items()) == {pub(1): 1}  # nothing of the batch applied
    # Within a batch only the sum counts: insert-then-retract of a new record is fine.
    c.apply([(pub(2), -1), (pub(2), 1)])
    assert dict(c.items()) == {pub(1): 1}


def test_copy_is_independent_and_collections_are_unhashable() -> None:
    c = Collection([(pub(1), 1)])
    d = c.copy()
    d.apply([(pub(2), 1)])
    assert c != d and len(c) == 1
    with pytest.raises(TypeError):
        hash(c)


_updates = st.lists(st.tuples(st.integers(1, 6).map(pub), st.integers(-2, 3)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(_updates, st.randoms(use_true_random=False))
def test_snapshot_is_order_independent(updates: list, rng) -> None:
    consolidated = [(r, d) for r, d in consolidate(updates) if d > 0]
    shuffled = list(consolidated)
    rng.shuffle(shuffled)
    a, b = Collection(consolidated), Collection(shuffled)
    assert a == b
    assert a.snapshot() == b.snapshot()
    assert Collection(a.snapshot()) == a
    assert all(count > 0 for _, count in a.snapshot())


@settings(max_examples=150, deadline=None)
@given(_updates)
def test_apply_equals_consolidated_sum(updates: list) -> None:
    c: Collection[Publication] = Collection()
    try:
        c.apply(updates)
    except CorruptCatalogError:
        assert any(d < 0 for _, d in consolidate(updates))
        assert len(c) == 0
        return
    assert dict(c.items()) == dict(consolidate(updates))
