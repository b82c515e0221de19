"""The coordinator's metrics (DESIGN §13 "Metrics"): sessions by kind, queries by state,
executors, topics and the catalog version, built on its loop when scraped, beside its RPC
server's and its catalog broker's (querylib.server._metrics).

Must not: change anything it reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

from catalog import Query, QueryState, Session, SessionKind, Topic
from querylib.server import ProcessMetrics, broker_families, rpc_families

if TYPE_CHECKING:
    from coordinator._server import Coordinator

__all__ = ["coordinator_metrics"]


def coordinator_metrics(coordinator: Coordinator, metrics: ProcessMetrics) -> None:
    """Add the coordinator's sources to `metrics` (the process's registry)."""
    metrics.add(lambda: _families(coordinator))
    metrics.add(lambda: rpc_families("coordinator", coordinator.request_stats))
    metrics.add(lambda: [] if coordinator.broker is None
                else broker_families(coordinator.broker, "catalog"))


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
    for record in catalog.queries:
        if isinstance(record, Query):
            states[record.state.value] += 1
    for name, count in sorted(states.items()):
        queries.add_metric([name], count)
    topics = GaugeMetricFamily("tq_topics", "Topics in the catalog (system topics included)")
    topics.add_metric([], sum(1 for t in catalog.topics if isinstance(t, Topic)))
    executors = GaugeMetricFamily("tq_executors", "Executors registered")
    executors.add_metric([], len(list(catalog.executors)))
    version = GaugeMetricFamily("tq_catalog_version", "The catalog's version (changes so far)")
    version.add_metric([], catalog.version)
    return [sessions, queries, topics, executors, version]
