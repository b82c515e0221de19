"""Where things go: brokers for a new topic's partitions, executors for a new query's processes.

A process slot is one query process: an executor offers `--slots` of them (DESIGN §6), and a
query whose processes do not fit the free ones waits, pending (coordinator/_state.py).

Pure functions of the catalog and a rotating start index (so successive topics spread out).
Deliberately simple; the catalog checks whatever is chosen (brokers up, executors registered).

Must not: change the catalog, read clocks, do I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from catalog import (
    INGEST,
    Broker,
    Catalog,
    Executor,
    InvalidCommandError,
    InvalidReplicationFactorError,
    NotFoundError,
    Owner,
    Query,
    QueryRef,
    Topic,
)
from querylib.cluster.messages import HostLoad

__all__ = ["DecommissionPlan", "default_replication_factor", "free_slots", "host_brokers",
           "place_kafka_partitions", "place_partitions", "place_processes", "place_replicas",
           "plan_decommission", "total_slots", "used_slots"]


def place_partitions(catalog: Catalog, party: Owner, partitions: int, start: int,
                     catalog_broker: int | None, *, spare: bool = True) -> tuple[int, ...]:
    """A broker id for each partition.

    A query's partition i goes to the host of the executor running its process i mod n (a
    per-worker partition lands on its worker's host), and there to one of that host's brokers
    in turn (`host_brokers`: an executor with `--brokers N` runs N, one process each). Anyone
    else's are spread round-robin over the executor hosts and each host's brokers in turn
    (host a's first broker, host b's first, ..., host a's second), else over other brokers; the
    coordinator's own broker (which serves the catalog) hosts data only when there is no other
    broker, and never without `spare` (with coordinator failover: its host's disk is not where
    a coordinator that takes over looks). An ingest topic (anyone may write it) spreads the
    same way: the connector endpoint writes a partition on another broker of its host through
    broker RPC, and Kafka clients reach each broker's own listener.
    """
    if isinstance(party, QueryRef):
        query = catalog.query(party.query_id)
        hosts = [_brokers_of(catalog, e) for e in query.executors]
        if hosts and all(hosts):
            turns: dict[int, int] = {}  # executor -> partitions placed on its host so far
            placed = []
            for i in range(partitions):
                process = i % len(hosts)
                executor = query.executors[process]
                turn = turns.get(executor, 0)
                turns[executor] = turn + 1
                placed.append(hosts[process][turn % len(hosts[process])])
            return tuple(placed)
    # Round-robin over the hosts first (a host's brokers share its fate), then over each
    # host's brokers: host a's first, host b's first, ..., host a's second, ...
    hosts = [host_brokers(catalog, e) for e in
             sorted((e for e in catalog.executors if isinstance(e, Executor)),
                    key=lambda e: e.executor_id)]
    executors = [brokers[k] for k in range(max(map(len, hosts), default=0))
                 for brokers in hosts if k < len(brokers)]
    retired = catalog.retired_brokers()
    candidates = executors or sorted(
        b.broker_id for b in catalog.brokers
        if isinstance(b, Broker) and b.broker_id != catalog_broker
        and b.broker_id not in retired)
    if not candidates:
        if catalog_broker is not None and not spare:
            raise InvalidCommandError(
                "no executor's broker is registered to host the topic; with coordinator "
                "failover the coordinator's own broker holds only the catalog (its host's disk "
                "is not where a coordinator that takes over looks): start `tq executor` first")
        if catalog_broker is None:
            raise InvalidCommandError("no broker is registered to host the topic")
        candidates = [catalog_broker]
    return tuple(candidates[(start + i) % len(candidates)] for i in range(partitions))


def default_replication_factor(catalog: Catalog) -> int:
    """1 where there is one executor host, else min(3, hosts): replicas go to distinct hosts,
    since a host's brokers share its fate (DESIGN §5 "Replication")."""
    hosts = sum(1 for e in catalog.executors if isinstance(e, Executor))
    return 1 if hosts <= 1 else min(3, hosts)


def place_replicas(catalog: Catalog, leaders: tuple[int, ...],
                   factor: int, start: int) -> tuple[tuple[int, ...], ...]:
    """`factor` replicas for each partition led by `leaders[i]` (as `place_partitions` chose),
    on as many distinct executor hosts: the leader's, then the next hosts in executor order,
    each host's brokers taken in turn, so followers spread as leaders do. Empty for one
    replica; InvalidReplicationFactorError when there are fewer hosts than replicas."""
    if factor == 1:
        return ()
    hosts = [host_brokers(catalog, e) for e in
             sorted((e for e in catalog.executors if isinstance(e, Executor)),
                    key=lambda e: e.executor_id)]
    if not 1 <= factor <= len(hosts):
        raise InvalidReplicationFactorError(
            f"replication factor {factor} needs as many executor hosts; "
            f"{len(hosts)} {'is' if len(hosts) == 1 else 'are'} registered")
    host_of = {b: h for h, brokers in enumerate(hosts) for b in brokers}
    turns = [start] * len(hosts)
    placed = []
    for leader in leaders:
        if leader not in host_of:
            raise InvalidReplicationFactorError(
                f"broker {leader} is no executor's: replicas are placed on executor hosts")
        first = host_of[leader]
        replicas = [leader]
        for k in range(1, factor):
            host = (first + k) % len(hosts)
            replicas.append(hosts[host][turns[host] % len(hosts[host])])
            turns[host] += 1
        placed.append(tuple(replicas))
    return tuple(placed)


def place_kafka_partitions(catalog: Catalog, partitions: int, start: int,
                           catalog_broker: int | None, *, spare: bool = True
                           ) -> tuple[int, ...]:
    """A broker id for each partition of a topic a Kafka client creates through the
    coordinator's listener: round-robin over the brokers other than the coordinator's that have
    a Kafka listener (so every partition's leader is one Kafka clients can reach), else as
    `place_partitions` places any topic."""
    retired = catalog.retired_brokers()
    listening = sorted(b.broker_id for b in catalog.brokers
                       if isinstance(b, Broker) and b.kafka_address
                       and b.broker_id != catalog_broker and b.broker_id not in retired)
    if not listening:
        return place_partitions(catalog, INGEST, partitions, start, catalog_broker,
                                spare=spare)
    return tuple(listening[(start + i) % len(listening)] for i in range(partitions))


def host_brokers(catalog: Catalog, executor: Executor) -> tuple[int, ...]:
    """An executor's brokers that may take partitions now: its own first, then its shards
    (one whose process is restarting is left out until it registers again), none that was
    decommissioned (DESIGN §5 "Decommissioning a broker")."""
    live = {b.broker_id for b in catalog.brokers if isinstance(b, Broker)}
    retired = catalog.retired_brokers()
    return tuple(b for b in (executor.broker_id, *executor.shards)
                 if b not in retired and (b == executor.broker_id or b in live))


@dataclass(frozen=True, slots=True)
class DecommissionPlan:
    """Where a decommissioned broker's replicas go: `moves` (topic id, partition, the broker
    taking its place), for the catalog's DecommissionBroker, and `stuck` (topic id,
    partition, why it cannot move), for the operator."""

    moves: tuple[tuple[int, int, int], ...]
    stuck: tuple[tuple[int, int, str], ...]


def plan_decommission(catalog: Catalog, broker_id: int) -> DecommissionPlan:
    """For each partition with a replica on `broker_id` (DESIGN §5 "Decommissioning a
    broker"): a live broker of an executor host holding no replica of it, the least loaded
    (fewest replicas and unreplicated partitions, then the lowest id), counting the moves
    chosen before it, so moves spread as placement does. A partition cannot move when it
    has one replica (its only copy is there), when `broker_id` is its only in-sync replica
    (no unclean election), or when every live host holds a replica of it already."""
    load: Counter[int] = Counter()
    for topic in catalog.topics:
        assert isinstance(topic, Topic)
        for i, leader in enumerate(topic.locations):
            load.update(topic.replicas[i] if topic.replicas else (leader,))
    hosts = [host_brokers(catalog, e) for e in
             sorted((e for e in catalog.executors if isinstance(e, Executor)),
                    key=lambda e: e.executor_id)]
    moves, stuck = [], []
    for topic in sorted((t for t in catalog.topics if isinstance(t, Topic)),
                        key=lambda t: t.topic_id):
        for i, leader in enumerate(topic.locations):
            if not topic.replicas:
                if leader == broker_id:
                    stuck.append((topic.topic_id, i, f"it has one replica, on broker "
                                  f"{broker_id}: nothing holds a copy to rebuild it from"))
                continue
            replicas = topic.replicas[i]
            if broker_id not in replicas:
                continue
            if not any(b != broker_id for b in topic.isr[i]):
                stuck.append((topic.topic_id, i, f"broker {broker_id} is its only in-sync "
                              "replica: its acknowledged records are on no other (no unclean "
                              "election); bring the broker back, or delete the topic"))
                continue
            free = [b for brokers in hosts if not set(brokers).intersection(replicas)
                    for b in brokers]
            if not free:
                stuck.append((topic.topic_id, i, "no live executor host without a replica of "
                              f"it ({len(hosts)} registered): start another executor"))
                continue
            chosen = min(free, key=lambda b: (load[b], b))
            load[chosen] += 1
            moves.append((topic.topic_id, i, chosen))
    return DecommissionPlan(tuple(moves), tuple(stuck))


def _brokers_of(catalog: Catalog, executor_id: int) -> tuple[int, ...]:
    try:
        return host_brokers(catalog, catalog.executor(executor_id))
    except NotFoundError:  # the executor left; the query is failing anyway
        return ()


def place_processes(catalog: Catalog, processes: int,
                    loads: Mapping[int, HostLoad] | None = None, *,
                    only_free: bool = False) -> tuple[int, ...] | None:
    """An executor id for each process: the one with the most free slots each time, ties to
    the least busy CPU (`loads`: executor session -> its last heartbeat's load), then to the
    lowest id. With `only_free`, None unless every process gets a free slot (the query then
    waits, pending). A slot holds one process of a live query that has not exited."""
    executors = sorted((e for e in catalog.executors if isinstance(e, Executor)),
                       key=lambda e: e.executor_id)
    if not executors:
        raise InvalidCommandError("no executor is registered; start one with `tq executor` "
                                  "(or run `tq up`)")
    used = used_slots(catalog)
    if only_free and free_slots(catalog, used) < processes:
        return None
    loads = loads or {}
    cpu = {e.executor_id: (loads[e.session_id].cpu_percent
                           if e.session_id is not None and e.session_id in loads else 0.0)
           for e in executors}
    placement = []
    for _ in range(processes):
        best = max(executors, key=lambda e: (e.resources.slots - used[e.executor_id],
                                             -cpu[e.executor_id], -e.executor_id))
        used[best.executor_id] += 1
        placement.append(best.executor_id)
    return tuple(placement)


def used_slots(catalog: Catalog) -> dict[int, int]:
    """Executor id -> slots its live queries' running processes hold, for every executor."""
    used = {e.executor_id: 0 for e in catalog.executors if isinstance(e, Executor)}
    for query in catalog.queries:
        assert isinstance(query, Query)
        if query.ended or not query.placed:
            continue
        for executor_id, code in zip(query.executors, query.exit_codes, strict=True):
            if code is None and executor_id in used:
                used[executor_id] += 1
    return used


def free_slots(catalog: Catalog, used: Mapping[int, int] | None = None) -> int:
    """Free slots over every executor."""
    used = used_slots(catalog) if used is None else used
    return sum(max(0, e.resources.slots - used.get(e.executor_id, 0))
               for e in catalog.executors if isinstance(e, Executor))


def total_slots(catalog: Catalog) -> int:
    return sum(e.resources.slots for e in catalog.executors if isinstance(e, Executor))
