"""The coordinator's metrics (DESIGN §13 "Metrics"): sessions by kind, queries by state,
executors, topics, the catalog version, and the consumer groups' committed offsets and lag,
built on its loop when scraped, beside its RPC server's and its catalog broker's
(querylib.server._metrics).

Must not: change anything it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

from catalog import QueryState, Session, SessionKind, Topic, TopicName
from catalog.errors import InvalidTopicNameError
from querylib.server import ProcessMetrics, broker_families, rpc_families

if TYPE_CHECKING:
    from coordinator._server import Coordinator

__all__ = ["coordinator_metrics"]


def coordinator_metrics(coordinator: Coordinator, metrics: ProcessMetrics,
                        ends: Callable[[], dict[tuple[str, int], int]] = dict) -> None:
    """Add the coordinator's sources to `metrics` (the process's registry). `ends`: the end
    offsets of partitions other processes host ((topic, partition) -> offset: `tq up`'s
    executor child's, from its metrics), which give the consumer groups' lag beside the
    catalog broker's partitions."""
    metrics.add(lambda: _families(coordinator))
    metrics.add(lambda: _group_families(coordinator, ends()))
    metrics.add(lambda: rpc_families("coordinator", coordinator.request_stats))
    metrics.add(lambda: [] if coordinator.broker is None
                else broker_families(coordinator.broker, "catalog"))


def _group_families(coordinator: Coordinator,
                    elsewhere: dict[tuple[str, int], int]) -> list[Metric]:
    """The consumer groups this process coordinates: committed offsets, and their lag where
    the catalog broker or `elsewhere` knows the partition's end (else compute it from
    tq_partition_end_offset of the broker that hosts it)."""
    kafka = coordinator.endpoints.kafka if coordinator.endpoints is not None else None
    if kafka is None:
        return []
    committed = GaugeMetricFamily("tq_consumer_group_committed_offset", "A consumer group's "
                                  "committed offset", labels=["group", "topic", "partition"])
    lag = GaugeMetricFamily("tq_consumer_group_lag_records", "Records past a consumer "
                            "group's committed offset", labels=["group", "topic", "partition"])
    ends = dict(elsewhere)
    if coordinator.broker is not None:
        for pid, part in list(coordinator.broker.state.partitions.items()):
            ends[pid] = part.visible_end
    for group, offsets in sorted(kafka.backend.all_committed().items()):
        for (topic, partition), offset in sorted(offsets.items()):
            labels = [group, topic, str(partition)]
            committed.add_metric(labels, offset)
            try:
                local = TopicName.parse(topic).fixed_short  # as brokers name it
            except InvalidTopicNameError:
                continue
            end = ends.get((local, partition))
            if end is not None:
                lag.add_metric(labels, max(0, end - offset))
    return [committed, lag]


def _families(coordinator: Coordinator) -> list[Metric]:
    state = coordinator.state
    if state is None:
        return []
    catalog = state.catalog
    sessions = GaugeMetricFamily("tq_coordinator_sessions", "Open sessions, by kind",
                                 labels=["kind"])
    kinds = {kind.value: 0 for kind in SessionKind}
    for record in catalog.sessions:
        if isinstance(record, Session):
            kinds[record.kind.value] += 1
    for kind, count in sorted(kinds.items()):
        sessions.add_metric([kind], count)
    queries = GaugeMetricFamily("tq_queries", "Queries in the catalog, by state",
                                labels=["state"])
    states = {state.value: 0 for state in QueryState}
    for query in catalog.queries:
        states[query.state.value] += 1
    for name, count in sorted(states.items()):
        queries.add_metric([name], count)
    topics = GaugeMetricFamily("tq_topics", "Topics in the catalog (system topics included)")
    topics.add_metric([], sum(1 for t in catalog.topics if isinstance(t, Topic)))
    executors = GaugeMetricFamily("tq_executors", "Executors registered")
    executors.add_metric([], len(list(catalog.executors)))
    version = GaugeMetricFamily("tq_catalog_version", "The catalog's version (changes so far)")
    version.add_metric([], catalog.version)
    return [sessions, queries, topics, executors, version]
