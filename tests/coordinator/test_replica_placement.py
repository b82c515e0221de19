"""Where a replicated topic's replicas go (coordinator/_placement.py, DESIGN §5 "Replication"):
each partition's replicas on distinct executor hosts, led where place_partitions puts the
leader, followers spread over each host's brokers; the default factor is 1 on one host and
min(3, hosts) otherwise; more replicas than hosts is refused."""

from __future__ import annotations

from collections import Counter

import pytest

from catalog import (
    INGEST,
    Broker,
    Catalog,
    Executor,
    InvalidCommandError,
    InvalidReplicationFactorError,
    RegisterBroker,
    RegisterExecutor,
    SessionKind,
)
from coordinator._placement import default_replication_factor, place_partitions, place_replicas
from tests.catalog._helpers import RESOURCES, open_session


def _host(catalog: Catalog, name: str, brokers: int = 2) -> Executor:
    """An executor host with `brokers` brokers (broker 0 and shards), as `--brokers N`."""
    session = open_session(catalog, SessionKind.EXECUTOR)
    ids = []
    for _ in range(brokers):
        broker = catalog.apply(RegisterBroker(host=name, address=f"tcp://{name}:7411",
                                              session_id=session.session_id)).created
        assert isinstance(broker, Broker)
        ids.append(broker.broker_id)
    executor = catalog.apply(RegisterExecutor(
        host=name, broker_id=ids[0], resources=RESOURCES, session_id=session.session_id,
        at_ms=2, shards=tuple(ids[1:]))).created
    assert isinstance(executor, Executor)
    return executor


def _hosts(catalog: Catalog, replicas: tuple[tuple[int, ...], ...],
           executors: list[Executor]) -> list[tuple[int, ...]]:
    host_of = {b: e.executor_id for e in executors for b in (e.broker_id, *e.shards)}
    return [tuple(host_of[b] for b in r) for r in replicas]


def test_replicas_go_to_distinct_hosts_and_spread_over_their_brokers() -> None:
    catalog = Catalog()
    executors = [_host(catalog, f"h{i}") for i in range(3)]
    leaders = place_partitions(catalog, INGEST, 12, 0, None)
    replicas = place_replicas(catalog, leaders, 3, 0)
    assert [r[0] for r in replicas] == list(leaders)
    assert all(len(set(hosts)) == 3 for hosts in _hosts(catalog, replicas, executors))
    # Every broker of every host holds its share: 12 partitions x 3 replicas over 6 brokers.
    assert set(Counter(b for r in replicas for b in r).values()) == {6}
    assert set(Counter(leaders).values()) == {2}  # and leads its share


def test_two_replicas_on_three_hosts() -> None:
    catalog = Catalog()
    executors = [_host(catalog, f"h{i}", brokers=1) for i in range(3)]
    leaders = place_partitions(catalog, INGEST, 3, 0, None)
    replicas = place_replicas(catalog, leaders, 2, 0)
    assert all(len(set(h)) == 2 for h in _hosts(catalog, replicas, executors))
    assert set(Counter(b for r in replicas for b in r).values()) == {2}


def test_the_default_factor_is_one_on_one_host_and_up_to_three_otherwise() -> None:
    catalog = Catalog()
    assert default_replication_factor(catalog) == 1
    _host(catalog, "h0", brokers=4)  # four brokers on one host are still one host
    assert default_replication_factor(catalog) == 1
    assert place_replicas(catalog, (1,), 1, 0) == ()
    _host(catalog, "h1")
    assert default_replication_factor(catalog) == 2
    for i in range(2, 5):
        _host(catalog, f"h{i}")
    assert default_replication_factor(catalog) == 3


def test_more_replicas_than_hosts_is_refused() -> None:
    catalog = Catalog()
    _host(catalog, "h0", brokers=3)
    _host(catalog, "h1", brokers=3)
    with pytest.raises(InvalidReplicationFactorError, match="3 needs as many executor hosts"):
        place_replicas(catalog, (1,), 3, 0)


def test_leaders_spread_over_hosts_first_then_over_each_hosts_brokers() -> None:
    catalog = Catalog()
    executors = [_host(catalog, f"h{i}", brokers=2) for i in range(3)]
    leaders = place_partitions(catalog, INGEST, 6, 0, None)
    host_of = {b: e.executor_id for e in executors for b in (e.broker_id, *e.shards)}
    # Consecutive partitions on consecutive hosts, and every broker leads one.
    assert [host_of[b] for b in leaders] == [e.executor_id for e in executors] * 2
    assert sorted(leaders) == sorted(host_of)


def test_the_coordinators_own_broker_hosts_data_only_without_failover() -> None:
    """Alone (`tq up` before its executor registers) it takes the topic; with coordinator
    failover (`spare=False`) it is refused, saying why: its host's disk is not where a
    coordinator that takes over looks (DESIGN §3 "Coordinator failover")."""
    catalog = Catalog()
    own = catalog.apply(RegisterBroker(host="c", address="tcp://c:7401",
                                       session_id=None)).created
    assert isinstance(own, Broker)
    assert place_partitions(catalog, INGEST, 2, 0, own.broker_id) == (own.broker_id,) * 2
    with pytest.raises(InvalidCommandError, match="start `tq executor` first"):
        place_partitions(catalog, INGEST, 2, 0, own.broker_id, spare=False)
    executor = _host(catalog, "h1", brokers=1)
    assert place_partitions(catalog, INGEST, 2, 0, own.broker_id, spare=False) == \
        (executor.broker_id,) * 2
