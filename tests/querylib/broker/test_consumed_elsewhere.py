"""A blocking Subscriber's caller counts what it consumed (`SubscriberCore.consumed_elsewhere`)
and has the loop take it in only when a grant may be due: the grants are the very ones the loop
makes when told of every consumption (`consumed`). Pure logic: the core's subscription state
without a link; the grants it would send are recorded instead."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.broker._subscriber import SubscriberCore, _PartitionSub

CREDIT = 1000


def _core() -> tuple[SubscriberCore, list[int]]:
    core = SubscriberCore(link=None, topic="t", partitions=[0], start="earliest",  # type: ignore[arg-type]
                          credit=CREDIT, sink=lambda item: None)
    sub = _PartitionSub(0, "earliest", sub_id=1, granted=CREDIT)
    core.subs[0] = sub
    core._by_id[1] = sub
    grants: list[int] = []

    def spawn(coro: Any) -> None:  # the grant the loop would send: its size
        grants.append(coro.cr_frame.f_locals["nbytes"])
        coro.close()

    core._spawn = spawn  # type: ignore[method-assign]
    return core, grants


# Steps: ("deliver", size) within the credit the broker has (plus one batch over), or
# ("consume", fraction of what waits for the application).
steps = st.lists(st.one_of(st.tuples(st.just("deliver"), st.integers(1, 400)),
                           st.tuples(st.just("consume"), st.floats(0.0, 1.0))),
                 max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_consumption_counted_elsewhere_grants_what_the_loop_would(plan: list[Any]) -> None:
    direct, direct_grants = _core()
    elsewhere, elsewhere_grants = _core()
    waiting = 0  # delivered, not consumed by the application (the same for both)
    wakes = 0
    for kind, amount in plan:
        if kind == "deliver":
            sub = direct.subs[0]
            if sub.granted - sub.delivered <= 0:
                continue  # the broker sends nothing without credit
            for core in (direct, elsewhere):
                core.subs[0].unconsumed += amount
                core.subs[0].delivered += amount
            waiting += amount
            continue
        nbytes = int(waiting * amount)
        if not nbytes:
            continue
        waiting -= nbytes
        direct.consumed(0, nbytes)
        if elsewhere.consumed_elsewhere(0, nbytes):
            wakes += 1
            elsewhere.take_consumed()
        assert elsewhere_grants == direct_grants  # granted at the same consumption
    assert wakes == len(direct_grants)  # the loop woken for each grant, never otherwise
    assert elsewhere.unconsumed(0) == direct.unconsumed(0) == waiting
