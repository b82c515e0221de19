"""What an executor tells the coordinator about its host (DESIGN §6): the resources it offers
when it registers, and the load it reports with each heartbeat. Measured with psutil; the
structs (HostLoad, ProcessLoad) live with the heartbeat message in `querylib.cluster`, which
carries them as they are.

psutil's CPU percentages are "since the previous call": the sampler keeps one psutil.Process
per pid between samples, so the first sample of a new process reads 0.0. Reading a process
that exits meanwhile is normal and skipped. A sample walks the query processes and their
descendants, O(query processes): cheap at one sample per heartbeat.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import psutil

from catalog import Resources
from querylib.cluster import HostLoad, ProcessLoad

__all__ = ["HostLoad", "LoadSampler", "ProcessLoad", "executor_metrics", "host_resources"]


def host_resources(data_dir: str | os.PathLike[str], slots: int) -> Resources:
    """Cores, total memory and total disk of the data directory's file system, and slots."""
    return Resources(cores=psutil.cpu_count(logical=True) or 1,
                     memory=psutil.virtual_memory().total,
                     disk=psutil.disk_usage(os.fspath(data_dir)).total, slots=slots)


class LoadSampler:
    """Samples host and per-process load; call `sample` once per heartbeat."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = os.fspath(data_dir)
        self.last: HostLoad | None = None  # the latest sample (the metrics read it)
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(interval=None)  # starts the host's "since last call" interval

    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
            proc.cpu_percent(interval=None)
        return proc

    def _one(self, query_id: int, process: int, pid: int) -> ProcessLoad | None:
        try:
            root = self._process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        rss, cpu, alive = 0, 0.0, 0
        for member in family:
            try:
                proc = self._process(member.pid)
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(interval=None)
                alive += 1
            except psutil.NoSuchProcess:
                continue
        return ProcessLoad(query_id=query_id, process=process, pid=pid, rss=rss,
                           cpu_percent=cpu, processes=alive)

    def sample(self, running: Iterable[tuple[int, int, int]]) -> HostLoad:
        """Load of the host and of each (query id, process index, pid) in `running`."""
        per_process = []
        for query_id, process, pid in running:
            load = self._one(query_id, process, pid)
            if load is not None:
                per_process.append(load)
        seen = {p.pid for p in per_process}
        # Forget processes that are gone, so the table does not grow with every query run.
        for pid in [pid for pid, proc in self._procs.items()
                    if pid not in seen and not proc.is_running()]:
            del self._procs[pid]
        memory = psutil.virtual_memory()
        self.last = HostLoad(sampled_at_ms=int(time.time() * 1000),
                             cpu_percent=psutil.cpu_percent(interval=None),
                             memory_used=memory.total - memory.available,
                             memory_available=memory.available,
                             disk_free=psutil.disk_usage(self.data_dir).free,
                             running=len(per_process), per_process=tuple(per_process))
        return self.last


def executor_metrics(agent: Any, metrics: Any) -> None:
    """Add an executor agent's sources to `metrics` (a querylib.server.ProcessMetrics): its
    slots, its host's and its query processes' load as last sampled, its broker, and its
    broker shards' own /metrics (read from the scraping thread, labelled `process="shard-K"`;
    a shard restarting is left out of that scrape)."""
    from querylib.server import RemoteMetrics

    metrics.add(lambda: _families(agent))
    metrics.add(lambda: broker_metrics(agent.broker, agent.broker_id))
    for shard in agent.shards:
        metrics.add_remote(RemoteMetrics(shard.metrics_url, f"shard-{shard.k}").families)


def broker_metrics(broker: Any, broker_id: int | None) -> list[Any]:
    """A host broker's families: its partitions and sessions, and its RPC server's requests
    (`broker`: a querylib.server.broker.BrokerServer, None before it started)."""
    from querylib.server import broker_families, rpc_families

    if broker is None:
        return []
    return [*broker_families(broker, broker_id or "?"),
            *rpc_families("broker", broker.request_stats)]


def _families(agent: Any) -> list[Any]:
    from prometheus_client.core import GaugeMetricFamily

    executor = str(agent.executor_id or "?")
    slots = GaugeMetricFamily("tq_executor_slots", "Process slots, used and free",
                              labels=["executor", "state"])
    slots.add_metric([executor, "used"], agent.slots.used)
    slots.add_metric([executor, "free"], agent.slots.free)
    families = [slots]
    load = agent.last_load
    if load is not None:
        cpu = GaugeMetricFamily("tq_host_cpu_percent", "The host's CPU use (all cores: 100)",
                                labels=["executor"])
        cpu.add_metric([executor], load.cpu_percent)
        memory = GaugeMetricFamily("tq_host_memory_used_bytes", "The host's memory in use",
                                   labels=["executor"])
        memory.add_metric([executor], load.memory_used)
        process_cpu = GaugeMetricFamily("tq_query_process_cpu_percent", "A query process's "
                                        "CPU use with its descendants (one core: 100)",
                                        labels=["executor", "query", "process"])
        process_rss = GaugeMetricFamily("tq_query_process_rss_bytes", "A query process's "
                                        "resident memory with its descendants",
                                        labels=["executor", "query", "process"])
        for process in load.per_process:
            labels = [executor, str(process.query_id), str(process.process)]
            process_cpu.add_metric(labels, process.cpu_percent)
            process_rss.add_metric(labels, process.rss)
        families += [cpu, memory, process_cpu, process_rss]
    return families
