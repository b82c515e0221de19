"""A replicated partition's leader (querylib/server/broker/_replication.py `LeaderProgress`):
the high watermark is the least end over the ISR and never goes back; followers that stop
catching up are proposed out after the lag time and proposed back once they fetch up to the
high watermark; the leader always stays; a stranger's fetch is refused."""

from __future__ import annotations

import pytest

from querylib.server.broker._replication import LeaderProgress

A, B, C = 1, 2, 3


def _leader(**kwargs: int) -> LeaderProgress:
    return LeaderProgress(A, 0, (A, B, C), (A, B, C), now=0.0, lag_ms=10_000, **kwargs)


def test_the_high_watermark_is_the_least_end_over_the_isr() -> None:
    p = _leader()
    assert p.advance(durable_end=10) == 0       # no follower has fetched anything yet
    p.fetched(B, 10, leader_end=10, now=1)
    assert p.advance(10) == 0                   # C still has nothing
    p.fetched(C, 6, leader_end=10, now=1)
    assert p.advance(10) == 6
    assert p.advance(4) == 6                    # never back (the leader's own end counts too)
    p.fetched(C, 10, leader_end=12, now=2)
    assert p.advance(12) == 10                  # B is at 10
    p.set_isr((A, C))                           # B left the ISR: no longer waited for
    p.fetched(C, 12, leader_end=12, now=3)
    assert p.advance(12) == 12


def test_a_follower_that_stops_catching_up_is_proposed_out_after_the_lag_time() -> None:
    p = _leader()
    for second in range(1, 30):
        end = second * 100
        p.fetched(B, end - 100 if second > 1 else 0, leader_end=end, now=second)  # keeps up
        p.advance(end)
        if second < 11:
            assert p.proposal(now=second) is None
    # C never fetched: after 10 s it is proposed out; B, always a fetch behind a busy
    # leader, has asked each time for what the leader had at its previous fetch: in sync.
    assert p.proposal(now=29) == (A, B)


def test_a_follower_back_at_the_high_watermark_is_proposed_in_again() -> None:
    p = LeaderProgress(A, 3, (A, B, C), (A, B), now=0.0, lag_ms=10_000)
    p.fetched(B, 50, leader_end=50, now=1)
    assert p.advance(50) == 50
    assert p.proposal(now=1) is None            # C has not fetched at this epoch yet
    p.fetched(C, 20, leader_end=50, now=2)
    assert p.proposal(now=2) is None            # below the high watermark
    p.fetched(C, 50, leader_end=50, now=3)
    assert p.proposal(now=3) == (A, B, C)       # in replica order


def test_the_leader_stays_in_its_isr_and_strangers_are_refused() -> None:
    p = _leader()
    assert A in (p.proposal(now=100) or ())
    with pytest.raises(ValueError):
        p.fetched(9, 0, leader_end=0, now=1)    # no replica of this partition
    with pytest.raises(ValueError):
        p.fetched(A, 0, leader_end=0, now=1)    # the leader does not fetch from itself
    with pytest.raises(ValueError):
        p.fetched(B, 11, leader_end=10, now=1)  # past the leader's end
    with pytest.raises(ValueError):
        p.set_isr((B, C))
    with pytest.raises(ValueError):
        LeaderProgress(A, 0, (A, B), (B,), now=0.0)
