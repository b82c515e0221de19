"""Spark tasks on a replicated topic follow its leader (DESIGN §5 "Replication", §7 "Spark"):
a real coordinator and three `tq executor` processes, a topic of three replicas, and the
task-side functions the source and sink run (`open_producer`, `broker_read`) with the place
the driver planned: the leader's executor is SIGKILLed; a task writing goes on to the new
leader, and a task reading from the old leader's address reads every record once, in order.
(No SparkSession: a task is these functions in a Python worker, given the place.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from querylib.records import encode_batch, iter_batches
from querylib.spark._cluster import ClusterTopics, broker_read, open_producer
from querylib.spark._options import Location
from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq, tq_env

pytestmark = pytest.mark.timeout(240)


def _partition(home: Path) -> dict | None:
    done = tq(home, "topic", "describe", "moving", "--json", "--timeout", "2")
    return json.loads(done.stdout)["partitions"][0] if done.returncode == 0 else None


def _executors(home: Path) -> int:
    done = tq(home, "status", "--json")
    return len(json.loads(done.stdout)["executors"]) if done.returncode == 0 else 0


def test_spark_tasks_follow_the_leader_of_a_replicated_topic(processes: Processes,
                                                             tmp_path: Path) -> None:
    CoordinatorProcess(processes, tmp_path).start()
    agents = [processes.python(
        "-m", "querylib.cli", "executor", "--data", str(tmp_path / f"executor{i}"),
        "--slots", "1", "--lease", "1", "--grace", "1", env=tq_env(tmp_path), cwd=ROOT,
        stderr=subprocess.DEVNULL) for i in range(3)]
    wait_for(lambda: _executors(tmp_path) == 3, timeout=60, interval=0.2,
             what="three executors to register")
    made = tq(tmp_path, "topic", "create", "moving", "--replication-factor", "3")
    assert made.returncode == 0, made.stderr
    before = wait_for(lambda: (p := _partition(tmp_path)) and p["isr"] == p["replicas"] and p,
                      timeout=60, interval=0.2, what="the replicas in sync")
    info = json.loads((tmp_path / "cluster.json").read_text())
    topics = ClusterTopics(Location(coordinator=info["coordinator"],
                                    secret_file=info["secret_file"], timeout=30))
    try:
        place = topics.place("moving", 0)  # as the driver plans it: the leader of now
    finally:
        topics.close()

    with open_producer(place, "moving", 0) as producer:
        for i in range(100):
            producer.send_batch(encode_batch([(0, None, b"a%d" % i, ())]))
        producer.flush()
        victim = next(a for i, a in enumerate(agents)
                      if (tmp_path / f"executor{i}" / "broker.id").read_text().strip()
                      == str(before["broker"]))
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        for i in range(100):
            producer.send_batch(encode_batch([(0, None, b"b%d" % i, ())]))
        producer.flush()
        producer.close(end=False)
    assert _partition(tmp_path)["broker"] != before["broker"]

    values = []
    for data in broker_read(place, "moving", 0, 0, 200):
        values += [r.value for b in iter_batches(data) if not b.is_control for r in b.records]
    assert values[:200] == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]
