"""Replicated topics in the catalog (DESIGN §5 "Replication"): replicas per partition, all in
sync at epoch 0 when made; a leader's compare-and-set of its ISR (AlterPartition); and the
controller's part when a broker leaves: leadership moves to the next in-sync replica at the
next epoch, the broker leaves every ISR, and a partition with no other in-sync replica stays
with its leader (no unclean election)."""

from __future__ import annotations

import pytest

from catalog import (
    SYSTEM,
    AlterPartition,
    AlterTopic,
    Broker,
    Catalog,
    CloseSession,
    CorruptCatalogError,
    CreateTopic,
    DeleteTopic,
    FencedLeaderEpochError,
    InvalidCommandError,
    InvalidReplicationFactorError,
    NotAuthorizedError,
    PrincipalRef,
    RegisterBroker,
    RemoveBroker,
    Session,
    StaleIsrError,
    Topic,
    TopicKind,
    UnknownBrokerError,
    Update,
)
from tests.catalog._helpers import create_replicated, hosts

OWNER = PrincipalRef("admin")


def _alter(catalog: Catalog, session: Session, topic: Topic, partition: int, broker: int,
           isr: tuple[int, ...], *, epoch: int = 0,
           expected: tuple[int, ...] | None = None) -> Topic:
    altered = catalog.apply(AlterPartition(
        session_id=session.session_id, topic_id=topic.topic_id, partition=partition,
        broker_id=broker, leader_epoch=epoch,
        expected_isr=catalog.topic(topic.topic_id).isr[partition] if expected is None
        else expected, isr=isr)).created
    assert isinstance(altered, Topic)
    catalog.check_invariants()
    return altered


def test_a_replicated_topic_starts_with_every_replica_in_sync_at_epoch_zero() -> None:
    catalog, _, (a, b, c) = hosts(3)
    topic = create_replicated(catalog, ((a, b, c), (b, c, a)))
    assert topic.locations == (a, b)
    assert topic.isr == topic.replicas == ((a, b, c), (b, c, a))
    assert topic.leader_epochs == (0, 0) and topic.replication_factor == 3
    assert Catalog.replay(catalog.snapshot()) == catalog


@pytest.mark.parametrize("replicas", [
    ((1, 1),),          # the same broker twice
    ((1,),),            # one replica is no replication: leave the field empty
    ((2, 1),),          # not led by the partition's location (broker 1)
    ((1, 2), (1, 2, 3)),  # sets of different sizes
])
def test_replicas_that_cannot_be_placed_are_refused(replicas: tuple[tuple[int, ...], ...]) -> None:
    catalog, _, _ = hosts(3)
    with pytest.raises(InvalidReplicationFactorError):
        catalog.apply(CreateTopic(
            name="t", partitions=len(replicas), record_type="bytes", kind=TopicKind.STREAM,
            owner=OWNER, locations=(1,) * len(replicas), at_ms=4, replicas=replicas))
    with pytest.raises(UnknownBrokerError):
        create_replicated(catalog, ((1, 99),))
    with pytest.raises(InvalidReplicationFactorError):  # system topics stay unreplicated
        catalog.apply(CreateTopic(
            name="__sys", partitions=1, record_type="bytes", kind=TopicKind.STREAM,
            owner=SYSTEM, locations=(1,), at_ms=4, replicas=((1, 2),)))
    assert catalog.find_topic("t") is None


def test_the_invariants_refuse_an_isr_without_its_leader() -> None:
    catalog, _, (a, b, _c) = hosts(3)
    topic = create_replicated(catalog, ((a, b),))
    records = {f: getattr(topic, f) for f in topic.__struct_fields__}
    with pytest.raises(CorruptCatalogError):  # a catalog read back from disk is checked
        Catalog.replay([u for u in catalog.snapshot() if u.collection != "topics"]
                       + [Update("topics", Topic(**{**records, "isr": ((b,),)}), 1)])


def test_a_grown_replicated_topic_gives_its_new_partitions_replicas_too() -> None:
    catalog, _, (a, b, c) = hosts(3)
    topic = create_replicated(catalog, ((a, b),))
    grown = catalog.apply(AlterTopic(topic_id=topic.topic_id, partitions=2, locations=(c,),
                                     replicas=((c, a),), principal="admin")).created
    assert isinstance(grown, Topic)
    assert grown.replicas == grown.isr == ((a, b), (c, a))
    assert (grown.locations, grown.leader_epochs) == ((a, c), (0, 0))
    with pytest.raises(InvalidReplicationFactorError):  # as many replicas as the others
        catalog.apply(AlterTopic(topic_id=topic.topic_id, partitions=3, locations=(a,),
                                 principal="admin"))
    catalog.check_invariants()


def test_the_leader_shrinks_and_grows_its_isr_with_a_compare_and_set() -> None:
    catalog, sessions, (a, b, c) = hosts(3)
    topic = create_replicated(catalog, ((a, b, c),))
    assert _alter(catalog, sessions[0], topic, 0, a, (a, c)).isr == ((a, c),)
    # Acting on the old view (it still believed b in sync) is refused, and changes nothing.
    with pytest.raises(StaleIsrError):
        _alter(catalog, sessions[0], topic, 0, a, (a,), expected=(a, b, c))
    # Back in, kept in replica order whatever order it was asked in.
    assert _alter(catalog, sessions[0], topic, 0, a, (c, b, a)).isr == ((a, b, c),)


def test_only_the_leader_at_its_epoch_through_its_own_session_changes_the_isr() -> None:
    catalog, sessions, (a, b, c) = hosts(3)
    topic = create_replicated(catalog, ((a, b, c),))
    with pytest.raises(NotAuthorizedError):  # another host's session
        _alter(catalog, sessions[1], topic, 0, a, (a, b))
    with pytest.raises(FencedLeaderEpochError):  # a follower
        _alter(catalog, sessions[1], topic, 0, b, (b, c))
    with pytest.raises(FencedLeaderEpochError):  # the leader, at an old epoch
        _alter(catalog, sessions[0], topic, 0, a, (a, b), epoch=1)
    with pytest.raises(InvalidCommandError):  # the leader itself must stay
        _alter(catalog, sessions[0], topic, 0, a, (b, c))
    with pytest.raises(InvalidCommandError):  # only replicas
        _alter(catalog, sessions[0], topic, 0, a, (a, 99))
    assert catalog.topic(topic.topic_id).isr == ((a, b, c),)


def test_a_leaving_leader_hands_each_partition_to_the_next_in_sync_replica() -> None:
    catalog, sessions, (a, b, c) = hosts(3)
    topic = create_replicated(catalog, ((a, b, c), (b, a, c), (c, b, a)))
    _alter(catalog, sessions[1], topic, 1, b, (b, c))  # a fell behind on partition 1
    catalog.apply(CloseSession(session_id=sessions[0].session_id, at_ms=9))
    catalog.check_invariants()
    moved = catalog.topic(topic.topic_id)
    assert moved.locations == (b, b, c)          # partition 0 moved to b; 1 and 2 kept theirs
    assert moved.leader_epochs == (1, 0, 0)
    assert moved.isr == ((b, c), (b, c), (c, b))  # a left every ISR
    assert moved.replicas == topic.replicas       # the assignment stays: a catches up later


def test_a_partition_with_no_other_in_sync_replica_stays_offline_with_its_leader() -> None:
    catalog, sessions, (a, b, _c) = hosts(3)
    topic = create_replicated(catalog, ((a, b),))
    _alter(catalog, sessions[0], topic, 0, a, (a,))  # b fell behind
    catalog.apply(CloseSession(session_id=sessions[0].session_id, at_ms=9))
    kept = catalog.topic(topic.topic_id)
    assert (kept.locations, kept.isr, kept.leader_epochs) == ((a,), ((a,),), (0,))
    catalog.check_invariants()


def test_a_broker_removed_cleanly_leaves_its_isrs_too() -> None:
    catalog, sessions, (a,) = hosts(1)
    extra = catalog.apply(RegisterBroker(host="host-x", address="tcp://host-x:7411",
                                         session_id=sessions[0].session_id)).created
    assert isinstance(extra, Broker)
    topic = create_replicated(catalog, ((extra.broker_id, a),))
    catalog.apply(RemoveBroker(broker_id=extra.broker_id))
    catalog.check_invariants()
    moved = catalog.topic(topic.topic_id)
    assert (moved.locations, moved.isr, moved.leader_epochs) == ((a,), ((a,),), (1,))


def test_deleting_a_replicated_topic_drops_it_on_every_replica() -> None:
    catalog, _, (a, b, c) = hosts(3)
    topic = create_replicated(catalog, ((a, b), (b, c)))
    catalog.apply(DeleteTopic(topic_id=topic.topic_id, requester=OWNER, principal="admin"))
    drops = {d.broker_id: d.partitions for d in catalog.pending_drops()}
    assert drops == {a: (0,), b: (0, 1), c: (1,)}
