"""Cohorts on a partition frontier: the frontier and end-of-stream wait until every
expected writer of a collective publication has joined (DESIGN §5 "Collective publishing")."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.errors import ProtocolError
from querylib.server.broker._frontier import (
    CohortError,
    FrontierAdvanced,
    PartitionFrontier,
    StreamEnded,
)

G = "q1/merged#1"


def test_frontier_waits_for_every_expected_writer():
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    assert f.advance("s0", 10) == []
    assert f.frontier == 0 and f.held
    f.join("s1", G, "1", 2)
    assert f.producers["s1"] == 0  # the late writer starts where the frontier was held
    assert not f.held
    assert f.advance("s1", 4) == [FrontierAdvanced(4)]
    assert f.advance("s1", 12) == [FrontierAdvanced(10)]


def test_no_end_of_stream_before_every_expected_writer_ended():
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    f.advance("s0", 5)
    assert f.end("s0") == []  # writer 1 has not come yet
    assert not f.ended and f.frontier == 0
    f.join("s1", G, "1", 2)
    assert f.producers["s1"] == 0
    assert f.advance("s1", 5) == [FrontierAdvanced(5)]
    assert f.end("s1") == [StreamEnded()]
    assert f.ended


def test_a_restarted_writer_counts_once():
    f = PartitionFrontier()
    f.join("s0", G, "0", 3)
    f.join("s1", G, "1", 3)
    assert f.drop("s1") == []
    f.join("s1b", G, "1", 3)  # process 1 again, under a new session
    f.advance("s0", 3)
    f.advance("s1b", 3)
    assert f.frontier == 0 and f.pending_cohorts() == {G: (2, 3)}
    f.join("s2", G, "2", 3)
    assert f.advance("s2", 3) == [FrontierAdvanced(3)]


def test_a_pending_cohort_whose_producers_vanished_is_released():
    f = PartitionFrontier()
    f.join("plain")
    f.join("s0", G, "0", 2)
    f.advance("plain", 7)
    f.advance("s0", 9)
    assert f.frontier == 0
    assert f.drop("s0") == [FrontierAdvanced(7)]  # the query failed: writer 1 will not come
    assert not f.held and f.pending_cohorts() == {}


def test_a_clean_end_keeps_waiting_for_the_missing_writer():
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    f.join("s1", G, "0", 2)  # a second session of the same writer
    f.end("s0")
    assert f.drop("s1") == []
    assert f.pending_cohorts() == {}  # one of them vanished: released
    g = PartitionFrontier()
    g.join("s0", G, "0", 2)
    g.end("s0")
    assert g.pending_cohorts() == {G: (1, 2)} and not g.ended


def test_rejoin_of_a_complete_or_unknown_cohort_is_a_plain_producer():
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    f.join("s1", G, "1", 2)
    f.drop("s0")
    f.join("s0b", G, "0", 2, rejoin=True)
    assert not f.held
    fresh = PartitionFrontier(4)  # a restarted broker recovered frontier 4, knows no cohort
    fresh.join("s1", G, "1", 2, rejoin=True)
    assert not fresh.held
    assert fresh.advance("s1", 6) == [FrontierAdvanced(6)]


def test_bad_cohorts_are_protocol_errors():
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    for args in [(G, "1", 3), ("x" * 300, "0", 2), ("g", "", 2), ("g", "0", 0),
                 ("g", "0", 10**6)]:
        with pytest.raises(CohortError):
            f.join("s9", *args)
    assert "s9" not in f.producers


def test_cohorts_beyond_the_cap_forget_the_oldest_without_live_producers():
    f = PartitionFrontier(max_cohorts=2)
    f.join("a", "g1", "0", 2)
    f.end("a")                    # g1 pending, nobody live
    f.join("b", "g2", "0", 2)     # g2 pending, b live
    f.join("c", "g3", "0", 1)     # forgets g1; g2 still holds
    assert set(f.pending_cohorts()) == {"g2"}
    with pytest.raises(CohortError):
        f.join("d", "g4", "0", 1)  # g2 and g3 both have live producers


def test_unknown_producer_is_still_a_protocol_error():
    with pytest.raises(ProtocolError):
        PartitionFrontier().end("ghost")


WRITERS = ["0", "1", "2"]
SESSIONS = ["a", "b", "c", "d"]
ops = st.lists(st.tuples(st.sampled_from(SESSIONS), st.sampled_from(WRITERS),
                         st.sampled_from(["join", "adv", "end", "drop"]), st.integers(0, 20)),
               max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 5))
def test_the_frontier_never_passes_what_a_late_writer_may_still_send(steps, start):
    """Model: while an expected writer has not joined, it may still send any time >= the
    frontier at the cohort's start; the published frontier never passes that. End-of-stream
    comes only after every expected writer joined and no producer is live. A cohort is only
    released once one of its producers vanished."""
    f = PartitionFrontier(start)
    joined: set[str] = set()
    vanished = False
    last = start
    for session, writer, op, t in steps:
        try:
            if op == "join":
                if session not in f.producers:  # a second join of a session changes nothing
                    joined.add(writer)
                f.join(session, G, writer, len(WRITERS), reopen=True)
            elif op == "adv":
                f.advance(session, max(t, f.producers.get(session, 0)))
            elif op == "end":
                f.end(session)
            else:
                vanished = vanished or session in f.producers
                f.drop(session)
        except ProtocolError:
            continue
        assert f.frontier >= last
        last = f.frontier
        if f.producers:
            assert f.frontier <= min(f.producers.values())
        if joined and len(joined) < len(WRITERS) and not vanished:
            assert f.frontier == start and not f.ended
            assert f.pending_cohorts() == {G: (len(joined), len(WRITERS))}
        if f.ended:
            assert joined == set(WRITERS) or vanished
            assert not f.producers
