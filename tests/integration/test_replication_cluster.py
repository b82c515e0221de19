"""A replicated topic end to end (DESIGN §5 "Replication"): a real coordinator and three `tq
executor` processes (three executor hosts, each with its shards); `tq topic create
--replication-factor 3`; the executors' brokers learn their roles from the catalog, the
followers fetch from the leader, and every replica holds the same bytes once the producer was
answered. Then the leader's executor is SIGKILLed: its lease expires, the controller moves the
leadership to an in-sync replica, and a reader gets every acknowledged record once, in order,
from the new leader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Processes, partition_dir, wait_for
from tests.coordinator._cluster import ROOT, tq, tq_env
from tests.integration._three_hosts import ThreeHosts

pytestmark = pytest.mark.timeout(240)

RECORDS = 2000


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def _log_bytes(executor_data: Path, name: str) -> bytes | None:
    directory = partition_dir(executor_data, name)
    if directory is None:
        return None
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def test_a_replicated_topic_keeps_every_acknowledged_record_when_its_leader_dies(
        processes: Processes, tmp_path: Path) -> None:
    hosts = ThreeHosts(processes, tmp_path)
    _ok(tq(tmp_path, "topic", "create", "kept", "--replication-factor", "3"))
    lines = [f"record {i}" for i in range(RECORDS)]
    produced = subprocess.run(
        [sys.executable, "-m", "querylib.cli", "produce", "kept"],
        input="".join(f"{line}\n" for line in lines), capture_output=True, text=True,
        env=tq_env(tmp_path), cwd=ROOT, timeout=120)
    assert produced.returncode == 0, produced.stderr

    # Answered means on every in-sync replica: the three logs hold the same bytes.
    homes = [tmp_path / f"executor{i}" for i in range(3)]
    leader_bytes = _log_bytes(homes[0], "kept-0") or _log_bytes(homes[1], "kept-0")
    assert leader_bytes
    wait_for(lambda: len({_log_bytes(h, "kept-0") for h in homes}) == 1, timeout=30,
             what="every replica to hold the leader's bytes")
    before = hosts.partition("kept")
    assert before is not None and before["isr"] == before["replicas"]

    # The leader's host dies.
    hosts.kill(before["broker"])
    moved = hosts.wait_moved("kept", before)
    assert moved["leader_epoch"] == before["leader_epoch"] + 1

    read = tq(tmp_path, "consume", "kept", "--json", "--follow", timeout=120)
    assert read.returncode == 0, read.stderr
    values = [e["value"] for e in map(json.loads, read.stdout.splitlines()) if "value" in e]
    assert values == lines  # every acknowledged record, once, in order

