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

import psutil

from catalog import Resources
from querylib.cluster import HostLoad, ProcessLoad

__all__ = ["HostLoad", "LoadSampler", "ProcessLoad", "host_resources"]


def host_resources(data_dir: str | os.PathLike[str], slots: int) -> Resources:
    """Cores, total memory and total disk of the data directory's file system, and slots."""
    return Resources(cores=psutil.cpu_count(logical=True) or 1,
                     memory=psutil.virtual_memory().total,
                     disk=psutil.disk_usage(os.fspath(data_dir)).total, slots=slots)


class LoadSampler:
    """Samples host and per-process load; call `sample` once per heartbeat."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = os.fspath(data_dir)
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
        return HostLoad(sampled_at_ms=int(time.time() * 1000),
                        cpu_percent=psutil.cpu_percent(interval=None),
                        memory_used=memory.total - memory.available,
                        memory_available=memory.available,
                        disk_free=psutil.disk_usage(self.data_dir).free,
                        running=len(per_process), per_process=tuple(per_process))
