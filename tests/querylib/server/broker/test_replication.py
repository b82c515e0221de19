"""The replication rules of the broker core (`_replication.py`, sans I/O): roles, the
follower's truncation point, the high watermark over the
ISR, ISR change proposals and min.insync.replicas (DESIGN §5 "Replication")."""

from __future__ import annotations

import pytest

from querylib.broker._errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)
from querylib.log import LeaderEpochCache
from querylib.server.broker._replication import (
    LeaderReplication,
    PartitionRole,
    follower_truncation,
)


def role(leader: int = 1, epoch: int = 3, replicas=(1, 2, 3), isr=(1, 2, 3)) -> PartitionRole:
    return PartitionRole(
        topic_id=7, partition=0, leader_id=leader, leader_epoch=epoch,
        replicas=tuple(replicas), isr=tuple(isr),
    )


# --- roles ---------------------------------------------------------------------------------


def test_role_says_who_leads_and_checks_its_shape() -> None:
    r = role()
    assert r.is_leader(1) and not r.is_leader(2)
    assert r.is_follower(2) and not r.is_follower(9)
    with pytest.raises(ValueError):
        role(leader=9)  # a leader outside its replicas
    with pytest.raises(ValueError):
        role(isr=(1, 4))  # an ISR member outside the replicas
    with pytest.raises(ValueError):
        role(isr=(2, 3))  # the leader outside its ISR
    with pytest.raises(ValueError):
        role(epoch=-1)
    with pytest.raises(ValueError):
        role(replicas=(1, 1, 2), isr=(1,))


def test_follower_truncates_to_the_least_of_its_end_and_the_leaders_epoch_end() -> None:
    own = LeaderEpochCache(((0, 0), (3, 10)))
    assert follower_truncation((3, 20), own, log_end=25) == (20, True)  # divergent tail
    assert follower_truncation((3, 20), own, log_end=12) == (12, True)  # behind: keep all
    assert follower_truncation((-1, -1), own, log_end=12) == (0, True)  # no older epoch there


def test_follower_missing_the_leaders_epoch_truncates_where_its_own_next_epoch_began() -> None:
    """KIP-279: the follower led epoch 2 from offset 50 and never heard of epoch 1, which
    the leader wrote from 40 to 60. Its records from 50 are not the leader's: it truncates
    there, asks again for epoch 0, and only then knows where the logs part (40)."""
    own = LeaderEpochCache(((0, 0), (2, 50)))
    assert follower_truncation((1, 60), own, log_end=80) == (50, False)
    own.truncate_from_end(50)
    assert follower_truncation((0, 40), own, log_end=50) == (40, True)
    # every epoch the follower has is newer than the leader's answer: nothing is common
    assert follower_truncation((1, 60), LeaderEpochCache(((2, 0),)), log_end=80) == (0, True)


# --- the leader's view ---------------------------------------------------------------------


def test_high_watermark_is_the_least_log_end_over_the_isr() -> None:
    leader = LeaderReplication(role(), own_id=1, lag_max_ms=30_000, now_ms=0)
    assert leader.high_watermark == 0
    assert leader.durable(10) is None  # followers hold nothing yet
    assert leader.follower_fetch(2, fetch_offset=10, leader_epoch=3, leader_end=10,
                                 now_ms=1) is None
    assert leader.follower_fetch(3, fetch_offset=6, leader_epoch=3, leader_end=10,
                                 now_ms=1) == 6
    assert leader.high_watermark == 6
    assert leader.follower_fetch(3, fetch_offset=12, leader_epoch=3, leader_end=10,
                                 now_ms=2) == 10  # never past the leader's durable end
    assert leader.follower_fetch(2, fetch_offset=12, leader_epoch=3, leader_end=12,
                                 now_ms=2) is None  # the leader's own durable end is 10
    assert leader.durable(12) == 12
    assert leader.follower_fetch(3, fetch_offset=4, leader_epoch=3, leader_end=12,
                                 now_ms=3) is None  # never moves back


def test_single_replica_role_has_hw_equal_to_durable_end() -> None:
    leader = LeaderReplication(role(replicas=(1,), isr=(1,)), own_id=1, lag_max_ms=1, now_ms=0)
    assert leader.durable(5) == 5


def test_replica_fetch_is_fenced_by_epoch_and_membership() -> None:
    leader = LeaderReplication(role(), own_id=1, lag_max_ms=30_000, now_ms=0)
    with pytest.raises(FencedLeaderEpochError):
        leader.follower_fetch(2, fetch_offset=0, leader_epoch=2, leader_end=0, now_ms=1)
    with pytest.raises(NotLeaderOrFollowerError):
        leader.follower_fetch(2, fetch_offset=0, leader_epoch=4, leader_end=0, now_ms=1)
    with pytest.raises(NotLeaderOrFollowerError):
        leader.follower_fetch(9, fetch_offset=0, leader_epoch=3, leader_end=0, now_ms=1)
    with pytest.raises(NotLeaderOrFollowerError):
        leader.follower_fetch(1, fetch_offset=0, leader_epoch=3, leader_end=0, now_ms=1)
    with pytest.raises(ValueError):
        LeaderReplication(role(), own_id=2, lag_max_ms=1, now_ms=0)  # not the leader


def test_isr_shrinks_for_a_follower_lagging_past_the_lag_time_and_grows_once_caught_up() -> None:
    leader = LeaderReplication(role(), own_id=1, lag_max_ms=100, now_ms=0)
    leader.durable(10)
    leader.follower_fetch(2, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=50)
    leader.follower_fetch(3, fetch_offset=4, leader_epoch=3, leader_end=10, now_ms=50)
    assert leader.isr_proposal(now_ms=100) is None  # within the lag time
    leader.follower_fetch(2, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=150)
    assert leader.isr_proposal(now_ms=101) == (1, 2)  # 3 caught up last at 0
    # Only the new role (the catalog's answer) changes the ISR.
    assert leader.role.isr == (1, 2, 3)
    leader.set_role(role(isr=(1, 2)), now_ms=160)
    assert leader.high_watermark == 10
    assert leader.isr_proposal(now_ms=170) is None
    leader.follower_fetch(3, fetch_offset=9, leader_epoch=3, leader_end=10, now_ms=170)
    assert leader.isr_proposal(now_ms=171) is None  # below the high watermark
    leader.follower_fetch(3, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=180)
    assert leader.isr_proposal(now_ms=181) == (1, 2, 3)


def test_a_replica_joins_the_isr_only_past_the_start_of_the_leaders_epoch() -> None:
    """Kafka's rule: a new leader's high watermark may lag what the old leader acknowledged
    (its ISR follower has not fetched yet), so reaching the high watermark is not enough: an
    out-of-sync replica must also hold every record from before this epoch began."""
    leader = LeaderReplication(role(isr=(1, 2)), own_id=1, lag_max_ms=100, now_ms=0,
                               epoch_start=10)
    leader.durable(10)
    assert leader.high_watermark == 0  # 2, in the ISR, has not fetched at this epoch
    leader.follower_fetch(3, fetch_offset=5, leader_epoch=3, leader_end=10, now_ms=1)
    assert leader.isr_proposal(now_ms=2) is None  # 5 >= the high watermark, < the epoch start
    leader.follower_fetch(3, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=3)
    assert leader.isr_proposal(now_ms=4) == (1, 2, 3)


def test_a_replica_proposed_into_the_isr_counts_towards_the_high_watermark_at_once() -> None:
    """Kafka's maximal ISR (KIP-497): the catalog may take a proposed replica into the ISR,
    and elect it when the leader goes, before the leader hears so; had the high watermark
    passed records it lacks meanwhile, they would be acknowledged and then lost. So from the
    proposal on the high watermark waits for it too, until a role with another ISR answers
    (taken in, or not), or it has not caught up for the lag time (no longer proposed)."""
    leader = LeaderReplication(role(isr=(1, 2)), own_id=1, lag_max_ms=100, now_ms=0)
    leader.durable(10)
    leader.follower_fetch(2, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=1)
    leader.follower_fetch(3, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=1)
    assert leader.high_watermark == 10
    assert leader.isr_proposal(now_ms=2) == (1, 2, 3)
    leader.durable(20)
    assert leader.follower_fetch(2, fetch_offset=20, leader_epoch=3, leader_end=20,
                                 now_ms=3) is None  # 3 holds 10 only
    assert leader.high_watermark == 10
    leader.set_role(role(isr=(1, 2)), now_ms=4)  # the same role, told again: still waiting
    assert leader.high_watermark == 10
    assert leader.follower_fetch(3, fetch_offset=20, leader_epoch=3, leader_end=20,
                                 now_ms=5) == 20
    leader.set_role(role(isr=(1, 2, 3)), now_ms=6)  # taken in

    # Proposed, then answered by a role whose ISR does not hold it (refused as stale: the
    # catalog had taken 2 out meanwhile): it counts no more.
    leader = LeaderReplication(role(isr=(1, 2)), own_id=1, lag_max_ms=100, now_ms=0)
    leader.durable(10)
    leader.follower_fetch(3, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=1)
    assert leader.isr_proposal(now_ms=2) == (1, 2, 3)
    leader.set_role(role(isr=(1,)), now_ms=3)
    assert leader.durable(20) == 20

    # Proposed, then silent for the lag time: no longer proposed, no longer waited for.
    leader = LeaderReplication(role(isr=(1, 2)), own_id=1, lag_max_ms=100, now_ms=0)
    leader.durable(10)
    leader.follower_fetch(2, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=1)
    leader.follower_fetch(3, fetch_offset=10, leader_epoch=3, leader_end=10, now_ms=1)
    assert leader.isr_proposal(now_ms=2) == (1, 2, 3)
    leader.durable(20)
    assert leader.follower_fetch(2, fetch_offset=20, leader_epoch=3, leader_end=20,
                                 now_ms=150) is None
    assert leader.isr_proposal(now_ms=200) is None
    assert leader.high_watermark == 20


def test_a_follower_keeping_up_with_a_steady_stream_stays_in_the_isr() -> None:
    # The leader's log grows between every two fetches, so no fetch ever reaches the leader's
    # end at the time it arrives; each reaches the end the leader had at the follower's
    # previous fetch, so the follower was caught up then (Kafka's lastCaughtUpTime rule) and
    # must not be proposed out of the ISR however long the stream lasts.
    leader = LeaderReplication(role(), own_id=1, lag_max_ms=100, now_ms=0)
    end = 10
    for now in range(0, 1000, 50):
        for follower in (2, 3):
            leader.follower_fetch(follower, fetch_offset=end - 10, leader_epoch=3,
                                  leader_end=end, now_ms=now)
        end += 10
        leader.durable(end)
        assert leader.isr_proposal(now_ms=now) is None
    # A follower that stops advancing is still proposed out after the lag time.
    stuck = end
    for now in range(1000, 1300, 50):
        leader.follower_fetch(2, fetch_offset=end - 10, leader_epoch=3, leader_end=end,
                              now_ms=now)
        leader.follower_fetch(3, fetch_offset=stuck, leader_epoch=3, leader_end=end, now_ms=now)
        end += 10
        leader.durable(end)
    assert leader.isr_proposal(now_ms=1300) == (1, 2)


def test_min_insync_replicas_refuses_a_produce_to_a_small_isr() -> None:
    leader = LeaderReplication(role(isr=(1,)), own_id=1, lag_max_ms=100, now_ms=0)
    leader.check_min_insync(1)
    with pytest.raises(NotEnoughReplicasError) as raised:
        leader.check_min_insync(2)
    assert raised.value.kafka_error_code == 19
    assert NotLeaderOrFollowerError.kafka_error_code == 6
    assert FencedLeaderEpochError.kafka_error_code == 74
