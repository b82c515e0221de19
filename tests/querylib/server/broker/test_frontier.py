"""The partition frontier is the minimum over live producers; ends only when the last one ends."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.errors import ProtocolError
from querylib.broker import StreamEndedError
from querylib.server.broker._frontier import (
    FrontierAdvanced,
    PartitionFrontier,
    StreamEnded,
    StreamReopened,
)


def test_minimum_over_producers():
    f = PartitionFrontier()
    f.join("a")
    f.join("b")
    assert f.advance("a", 5) == []
    assert f.advance("b", 3) == [FrontierAdvanced(3)]
    assert f.advance("b", 9) == [FrontierAdvanced(5)]
    assert f.frontier == 5


def test_dropped_producer_stops_holding_back():
    f = PartitionFrontier()
    f.join("a")
    f.join("slow")
    f.advance("a", 10)
    assert f.frontier == 0
    assert f.drop("slow") == [FrontierAdvanced(10)]
    assert not f.ended


def test_end_of_stream_only_after_last_producer_ends():
    f = PartitionFrontier()
    f.join("a")
    f.join("b")
    f.advance("a", 4)
    f.advance("b", 7)
    assert f.end("a") == [FrontierAdvanced(7)]
    assert f.end("b") == [StreamEnded()]
    assert f.ended


def test_late_joiner_starts_at_published_frontier():
    f = PartitionFrontier()
    f.join("a")
    f.advance("a", 8)
    f.join("b")
    assert f.producers["b"] == 8
    with pytest.raises(ProtocolError):
        f.advance("b", 7)


def test_nobody_joins_an_ended_stream_unless_it_reopens_it():
    f = PartitionFrontier()
    f.join("a")
    f.advance("a", 3)
    assert f.end("a") == [StreamEnded()]
    assert f.ended
    with pytest.raises(StreamEndedError):
        f.join("b")
    with pytest.raises(StreamEndedError):
        PartitionFrontier(5, ended=True).join("after a restart")
    assert f.ended and f.producers == {}
    assert f.join("b", reopen=True) == [StreamReopened()]
    assert not f.ended and f.producers == {"b": 3}  # it goes on from the published frontier
    assert f.join("c", reopen=True) == []  # open streams need no reopening
    with pytest.raises(ProtocolError):
        f.advance("b", 2)


def test_unknown_producer_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        PartitionFrontier().advance("ghost", 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["adv", "end", "drop", "join"]),
                          st.integers(0, 20)), max_size=60))
def test_published_frontier_is_monotone_and_never_above_live_minimum(ops):
    f = PartitionFrontier()
    last = 0
    for name, op, t in ops:
        try:
            if op == "join":
                f.join(name, reopen=True)
            elif op == "adv":
                f.advance(name, max(t, f.producers.get(name, 0)))
            elif op == "end":
                f.end(name)
            else:
                f.drop(name)
        except ProtocolError:
            continue
        assert f.frontier >= last
        last = f.frontier
        if f.producers:
            assert f.frontier <= min(f.producers.values())
