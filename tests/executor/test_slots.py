"""Slot accounting: a pure class, checked by examples and against a model."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor import NoFreeSlotsError, ProcessExistsError, Slots


def test_reserve_until_full_then_release():
    slots = Slots(2)
    slots.reserve((1, 0))
    slots.reserve((1, 1))
    assert (slots.used, slots.free) == (2, 0)
    with pytest.raises(NoFreeSlotsError) as caught:
        slots.reserve((2, 0))
    assert caught.value.retriable
    assert slots.release((1, 0))
    slots.reserve((2, 0))
    assert slots.held() == {(1, 1), (2, 0)}


def test_a_duplicate_reservation_is_refused_and_takes_nothing():
    slots = Slots(3)
    slots.reserve((1, 0))
    with pytest.raises(ProcessExistsError):
        slots.reserve((1, 0))
    assert slots.used == 1


def test_releasing_what_holds_nothing_is_a_no_op():
    slots = Slots(1)
    assert not slots.release((9, 9))
    assert slots.free == 1


def test_at_least_one_slot():
    with pytest.raises(ValueError):
        Slots(0)


@given(st.integers(1, 4),
       st.lists(st.tuples(st.sampled_from(["reserve", "release"]), st.integers(0, 5)),
                max_size=60))
def test_slots_follow_a_set_model(total, operations):
    slots, model = Slots(total), set()
    for op, key in operations:
        if op == "reserve":
            if key in model:
                with pytest.raises(ProcessExistsError):
                    slots.reserve(key)
            elif len(model) >= total:
                with pytest.raises(NoFreeSlotsError):
                    slots.reserve(key)
            else:
                slots.reserve(key)
                model.add(key)
        else:
            assert slots.release(key) == (key in model)
            model.discard(key)
        assert slots.held() == model
        assert 0 <= slots.free == total - len(model)
