"""The pure choice of where a decommissioned broker's replicas go (coordinator/_placement.py
`plan_decommission`, DESIGN §5 "Decommissioning a broker"): each to a live broker of an
executor host holding no replica of that partition, the least loaded first; what cannot move
(its only in-sync replica is the leaving broker, it has one replica, no host is free) is listed
with why; retired brokers are never chosen, nor placed on."""

from __future__ import annotations

from catalog import (
    INGEST,
    Catalog,
    CloseSession,
    CreateTopic,
    DecommissionBroker,
    Executor,
    PrincipalRef,
    Topic,
    TopicKind,
)
from coordinator._placement import host_brokers, place_partitions, plan_decommission
from tests.coordinator.test_replica_placement import _host


def _topic(catalog: Catalog, name: str, replicas: tuple[tuple[int, ...], ...]) -> Topic:
    topic = catalog.apply(CreateTopic(
        name=name, partitions=len(replicas), record_type="bytes", kind=TopicKind.STREAM,
        owner=PrincipalRef("admin"), locations=tuple(r[0] for r in replicas), at_ms=4,
        replicas=replicas if len(replicas[0]) > 1 else ())).created
    assert isinstance(topic, Topic)
    return topic


def _kill(catalog: Catalog, executor: Executor) -> None:
    assert executor.session_id is not None
    catalog.apply(CloseSession(session_id=executor.session_id, at_ms=5))


def test_each_replica_goes_to_the_least_loaded_broker_of_a_host_without_one() -> None:
    catalog = Catalog()
    h = [_host(catalog, f"h{i}", brokers=2) for i in range(4)]
    (a0, a1), (b0, b1), (c0, _c1), (d0, d1) = [(e.broker_id, *e.shards) for e in h]
    # d0 already holds a replica of another topic: d1 is the lighter of host d's brokers.
    _topic(catalog, "busy", ((d0, a1, b1),))
    topic = _topic(catalog, "t", ((a0, b0, c0), (b0, c0, a0)))
    _kill(catalog, h[2])
    plan = plan_decommission(catalog, c0)
    assert plan.stuck == ()
    assert plan.moves == ((topic.topic_id, 0, d1), (topic.topic_id, 1, d0))
    # Never on a host that holds a replica already, even a lighter broker of it.
    assert all(to not in (a0, a1, b0, b1) for _, _, to in plan.moves)


def test_what_cannot_move_is_listed_with_why() -> None:
    catalog = Catalog()
    h = [_host(catalog, f"h{i}", brokers=1) for i in range(3)]
    a, b, c = (e.broker_id for e in h)
    single = _topic(catalog, "single", ((c,),))
    offline = _topic(catalog, "offline", ((c, b),))
    full = _topic(catalog, "full", ((a, b, c),))
    _kill(catalog, h[1])  # b leaves every ISR: c is offline's only in-sync replica
    _kill(catalog, h[2])
    plan = plan_decommission(catalog, c)
    assert plan.moves == ()
    why = {(t, p): reason for t, p, reason in plan.stuck}
    assert "one replica" in why[(single.topic_id, 0)]
    assert "only in-sync replica" in why[(offline.topic_id, 0)]
    assert "no live executor host" in why[(full.topic_id, 0)]


def test_a_retired_broker_is_neither_chosen_nor_placed_on() -> None:
    catalog = Catalog()
    h = [_host(catalog, f"h{i}", brokers=1) for i in range(4)]
    a, b, c, d = (e.broker_id for e in h)
    topic = _topic(catalog, "t", ((a, b),))
    # d is live and decommissioned with force: it holds nothing, so it is retired at once.
    catalog.apply(DecommissionBroker(broker_id=d, requester="admin", force=True))
    assert host_brokers(catalog, h[3]) == ()
    assert d not in place_partitions(catalog, INGEST, 8, 0, None)
    _kill(catalog, h[1])
    assert plan_decommission(catalog, b).moves == ((topic.topic_id, 0, c),)
