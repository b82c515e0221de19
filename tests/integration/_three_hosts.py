"""Three executor hosts on loopback for the replicated-topic tests (DESIGN §5 "Replication"):
a real `tq coordinator` and three `tq executor` processes under one home, each with its own
data dir (`executor0..2`), a 1 s lease so a killed one's leadership moves fast (`hosts=N`
for another number of them).

    hosts = ThreeHosts(processes, tmp_path)
    before = hosts.replicated("kept")              # created with 3 replicas, all in sync
    hosts.kill(before["broker"])                   # SIGKILL the executor of the leader
    hosts.wait_moved("kept", before)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq, tq_env


class ThreeHosts:
    """The coordinator and three executors (or `hosts`); `options(i)` adds to executor i's
    command line."""

    def __init__(self, processes: Processes, home: Path, *,
                 options: Callable[[int], Sequence[str]] = lambda i: (), hosts: int = 3) -> None:
        self.home = home
        CoordinatorProcess(processes, home).start()
        self.agents = [processes.python(
            "-m", "querylib.cli", "executor", "--data", str(self.data(i)), "--slots", "1",
            "--lease", "1", "--grace", "1", *options(i), env=tq_env(home), cwd=ROOT,
            stderr=subprocess.DEVNULL) for i in range(hosts)]
        wait_for(lambda: len(set(self.hosts().values())) == hosts, timeout=60, interval=0.2,
                 what=f"{hosts} executors to register")

    def data(self, i: int) -> Path:
        return self.home / f"executor{i}"

    def hosts(self) -> dict[int, int]:
        """broker id -> executor id, for every broker of the registered executors (their own
        and their shards)."""
        done = tq(self.home, "status", "--json")
        if done.returncode != 0:
            return {}
        return {b: e["executor_id"] for e in json.loads(done.stdout)["executors"]
                for b in (e["broker_id"], *e.get("shards", ()))}

    def partition(self, topic: str, index: int = 0) -> dict[str, Any] | None:
        """Partition `index` as `tq topic describe` shows it (None while it cannot answer)."""
        done = tq(self.home, "topic", "describe", topic, "--json", "--timeout", "2")
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)["partitions"][index]  # type: ignore[no-any-return]

    def replicated(self, topic: str) -> dict[str, Any]:
        """`topic` created with three replicas; its partition 0 once all are in sync."""
        done = tq(self.home, "topic", "create", topic, "--replication-factor", "3")
        assert done.returncode == 0, done.stderr
        return self.in_sync(topic)

    def in_sync(self, topic: str) -> dict[str, Any]:
        found: dict[str, Any] = wait_for(
            lambda: (p := self.partition(topic)) and p["isr"] == p["replicas"] and p,
            timeout=60, interval=0.2, what="every replica in sync")
        return found

    def agent_of(self, broker_id: int) -> subprocess.Popen[Any]:
        """The executor process whose brokers (its own or a shard) include `broker_id`."""
        (i,) = [i for i in range(len(self.agents)) if broker_id in broker_ids(self.data(i))]
        return self.agents[i]

    def kill(self, broker_id: int) -> None:
        """SIGKILL the executor (and its shards) holding `broker_id`: its host dies."""
        agent = self.agent_of(broker_id)
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)

    def wait_moved(self, topic: str, before: dict[str, Any]) -> dict[str, Any]:
        """Partition 0 once the controller moved its leadership off `before`'s leader."""
        moved: dict[str, Any] = wait_for(
            lambda: (p := self.partition(topic)) and p["broker"] != before["broker"] and p,
            timeout=60, interval=0.2, what="the leadership to move")
        return moved


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP), as /proc says."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def broker_ids(executor_data: Path) -> set[int]:
    """The broker ids an executor's brokers remember (broker 0's and each shard's)."""
    ids = set()
    for path in [executor_data / "broker.id", *executor_data.glob("broker-*/broker.id")]:
        if path.exists():
            ids.add(int(path.read_text().strip()))
    return ids
