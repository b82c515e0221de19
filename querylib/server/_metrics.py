"""Metrics in Prometheus' text format (DESIGN §13 "Metrics"): what a server process exposes at
`/metrics`, built when scraped from the counters and state its components already keep.

`ProcessMetrics` is the registry of one process: components add sources (functions returning
metric families) with `add`; a scrape runs them all on the event loop that owns the state they
read (`loop`), so nothing is read while that loop changes it, and nothing on the hot paths
pays for metrics but the RPC server's per-message counters (`querylib.rpc.RequestStats`).
prometheus-client's process collector adds CPU, RSS and open files; a logging handler counts
log records by level (`tq_log_messages_total`: errors show there first).

`rpc_families` and `broker_families` describe an RPC server and a broker; the coordinator
and the executor describe themselves (coordinator/_metrics.py, executor/_metrics.py). Names
and labels follow Prometheus' conventions: `tq_` prefix, `_total` counters, `_bytes` and
`_seconds` units. `add_remote` adds families read off the loop, in the scraping thread; they
merge by name with the process's own. `RemoteMetrics` is such a source: a child process's
/metrics on loopback (`tq up`'s executor child; an executor's broker shards), its process-wide
families labelled with the process they came from. `serve_metrics` serves a registry on its own
port, for processes without a console (`tq executor`, `tq broker`, a broker shard).

Must not: read a component's state from another thread, or block its loop for long (a source
builds lists, nothing more).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import start_http_server

from catalog.errors import UserError
from querylib.rpc import LATENCY_BUCKETS, RequestStats

__all__ = ["MetricsUnavailableError", "ProcessMetrics", "RemoteMetrics", "broker_families",
           "rpc_families", "serve_metrics"]

Source = Callable[[], Iterable[Metric]]
SCRAPE_TIMEOUT = 10.0  # seconds a scrape waits for the owning loop


class MetricsUnavailableError(UserError):
    """The metrics port could not be bound."""


class _LogCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname] = self.counts.get(record.levelname, 0) + 1


class ProcessMetrics:
    """The metrics of one process (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sources: list[Source] = []
        self.remote: list[Source] = []  # run in the scraping thread, not on the loop
        self.registry = CollectorRegistry(auto_describe=False)
        self._process = ProcessCollector(registry=None)  # merged into collect()'s families
        self._logs = _LogCounter()
        logging.getLogger().addHandler(self._logs)
        self.registry.register(self)

    def add(self, source: Source) -> None:
        self.sources.append(source)

    def add_remote(self, source: Source) -> None:
        """A source that may block (another process's exposition, read over HTTP): run in the
        scraping thread before the loop's sources, its families merged with theirs by name."""
        self.remote.append(source)

    def close(self) -> None:
        logging.getLogger().removeHandler(self._logs)

    def collect(self) -> Iterable[Metric]:
        """Every source's families, built on the owning loop (the remote ones first, here)."""
        remote = [family for source in self.remote for family in source()]
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            own = self._build()
        else:
            future = asyncio.run_coroutine_threadsafe(self._build_async(), self.loop)
            own = future.result(SCRAPE_TIMEOUT)
        families = {family.name: family for family in own}
        for family in [*self._process.collect(), *remote]:
            known = families.get(family.name)
            if known is None:
                families[family.name] = family
            else:
                known.samples.extend(family.samples)
        return list(families.values())

    async def _build_async(self) -> list[Metric]:
        return self._build()

    def _build(self) -> list[Metric]:
        families: dict[str, Metric] = {}  # one family per name: sources may share names
        for source in self.sources:
            for family in source():
                known = families.get(family.name)
                if known is None:
                    families[family.name] = family
                else:
                    known.samples.extend(family.samples)
        logs = CounterMetricFamily("tq_log_messages", "Log records of this process, by level "
                                   "(WARNING and above)", labels=["level"])
        for level, count in sorted(self._logs.counts.items()):
            logs.add_metric([level], count)
        families[logs.name] = logs
        return list(families.values())

    def text(self) -> bytes:
        """The exposition (call it off the owning loop: it waits for it)."""
        return generate_latest(self.registry)


class RemoteMetrics:
    """Another process's /metrics (a child's, on loopback), read when this process's are
    scraped: a source for `ProcessMetrics.add_remote`. The families every process has
    (`process_*`, `tq_log_messages`, `tq_rpc_*`) would repeat this process's series, so their
    samples get `process=NAME` unless they carry a process already (a grandchild's, merged by
    the child). `url` may be a function: a child restarted elsewhere is read where it is now
    ("" while it has none)."""

    relabelled = ("process_", "tq_log_messages", "tq_rpc_")

    def __init__(self, url: str | Callable[[], str], process: str,
                 timeout: float = 5.0) -> None:
        self.url = url
        self.process = process
        self.timeout = timeout

    def families(self) -> list[Metric]:
        from prometheus_client.parser import text_string_to_metric_families

        url = self.url() if callable(self.url) else self.url
        if not url:
            return []
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as reply:
                text = reply.read().decode()
        except OSError:
            return []  # stopping, restarting or gone: the rest of /metrics still serves
        families = list(text_string_to_metric_families(text))
        for family in families:
            if family.name.startswith(self.relabelled):
                family.samples = [s._replace(labels={"process": self.process, **s.labels})
                                  for s in family.samples]
        return families


def rpc_families(server: str, stats: RequestStats) -> list[Metric]:
    """An RPC server's requests and notifies by message type: counts, errors, handler time."""
    requests = CounterMetricFamily("tq_rpc_requests", "Messages served, by server and type",
                                   labels=["server", "type"])
    errors = CounterMetricFamily("tq_rpc_errors", "Messages answered with an error, by "
                                 "server, type and error", labels=["server", "type", "error"])
    seconds = HistogramMetricFamily("tq_rpc_handler_seconds", "Time from a message's arrival "
                                    "to its handler's end", labels=["server", "type"])
    for tag, entry in sorted(stats.types.items()):
        requests.add_metric([server, tag], entry.count)
        for error, count in sorted(entry.errors.items()):
            errors.add_metric([server, tag, error], count)
        cumulative, buckets = 0, []
        for bound, count in zip((*LATENCY_BUCKETS, float("inf")), entry.buckets, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        seconds.add_metric([server, tag], buckets, entry.seconds)
    return [requests, errors, seconds]


def broker_families(broker: Any, broker_id: int | str) -> list[Metric]:
    """A broker's partitions (offsets, frontier, bytes on disk), sessions and subscriptions
    (with their lag in records: what is visible and not yet delivered). `broker` is a
    `querylib.server.broker.BrokerServer`."""
    label = str(broker_id)
    state = broker.state
    end = GaugeMetricFamily("tq_partition_end_offset", "Next offset visible to subscribers",
                            labels=["broker", "topic", "partition"])
    start = GaugeMetricFamily("tq_partition_start_offset", "First offset still stored",
                              labels=["broker", "topic", "partition"])
    records = CounterMetricFamily("tq_partition_records_in", "Records (offsets) appended to "
                                  "the partition since it was created",
                                  labels=["broker", "topic", "partition"])
    frontier = GaugeMetricFamily("tq_partition_frontier", "Last published frontier (logical "
                                 "time)", labels=["broker", "topic", "partition"])
    size = GaugeMetricFamily("tq_partition_size_bytes", "Bytes of the partition's log on disk",
                             labels=["broker", "topic", "partition"])
    bytes_in = CounterMetricFamily("tq_partition_bytes_in", "Bytes of batches appended since "
                                   "the broker started", labels=["broker", "topic", "partition"])
    bytes_out = CounterMetricFamily("tq_partition_bytes_out", "Bytes delivered to subscribers "
                                    "since the broker started",
                                    labels=["broker", "topic", "partition"])
    records_out = CounterMetricFamily("tq_partition_records_out", "Records (offsets) "
                                      "delivered to subscribers since the broker started",
                                      labels=["broker", "topic", "partition"])
    for (topic, partition), (into, out, offsets) in list(broker.traffic.items()):
        labels = [label, topic, str(partition)]
        bytes_in.add_metric(labels, into)
        bytes_out.add_metric(labels, out)
        records_out.add_metric(labels, offsets)
    lag = GaugeMetricFamily("tq_subscription_lag_records", "Records visible and not yet "
                            "delivered to a subscription", labels=["broker", "topic",
                                                                   "partition", "principal"])
    sizes = broker.partition_sizes()
    for pid, part in list(state.partitions.items()):
        topic, partition = pid
        labels = [label, topic, str(partition)]
        end.add_metric(labels, part.visible_end)
        start.add_metric(labels, part.log_start)
        records.add_metric(labels, part.visible_end)
        frontier.add_metric(labels, part.visible_frontier)
        if pid in sizes:
            size.add_metric(labels, sizes[pid])
        for sub in list(part.subs.values()):
            session = state.sessions.get(sub.session)
            principal = session.principal if session is not None else "?"
            lag.add_metric([label, topic, str(partition), principal],
                           max(0, part.visible_end - sub.next_offset))
    sessions = GaugeMetricFamily("tq_broker_sessions", "Client sessions a broker holds",
                                 labels=["broker"])
    sessions.add_metric([label], len(state.sessions))
    return [end, start, records, frontier, size, bytes_in, bytes_out, records_out, lag,
            sessions]


def serve_metrics(metrics: ProcessMetrics, host: str, port: int, *, fallback: bool
                  ) -> tuple[int, Callable[[], None]]:
    """Serve `metrics` at http://HOST:PORT/metrics on a thread; (the port, stop). A taken
    port falls back to a free one when `fallback`; else MetricsUnavailableError."""
    for candidate in (port, 0) if fallback else (port,):
        try:
            server, thread = start_http_server(candidate, host, registry=metrics.registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and candidate != 0:
                continue
            raise MetricsUnavailableError(f"metrics cannot listen on {host}:{candidate}: "
                                          f"{exc.strerror}") from None

        def stop(server: Any = server, thread: threading.Thread = thread) -> None:
            server.shutdown()
            server.server_close()
            thread.join(5.0)

        return server.server_port, stop
    raise MetricsUnavailableError(f"the metrics port {port} is taken (--metrics-port PORT, "
                                  f"or -1 for none)")
