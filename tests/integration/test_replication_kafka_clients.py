"""Real Kafka clients across a leader change while the old leader lives (DESIGN §5
"Replication", §8 "Kafka listener"): a real coordinator and three `tq executor` processes
with Kafka listeners; a replicated topic; a confluent-kafka producer (acks=all,
enable.idempotence=true) writes while the leader's executor is stopped (SIGSTOP) until the
controller moves the leadership, then resumed: the old leader lives on, deposed, and answers
NOT_LEADER_OR_FOLLOWER; clients find the new leader. A consumer then reads every
acknowledged record once, in order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq, tq_env

pytestmark = pytest.mark.timeout(240)


def _partition(home: Path, name: str) -> dict | None:
    done = tq(home, "topic", "describe", name, "--json", "--timeout", "2")
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)["partitions"][0]


def _hosts(home: Path) -> dict[int, int]:
    done = tq(home, "status", "--json")
    if done.returncode != 0:
        return {}
    return {b: e["executor_id"] for e in json.loads(done.stdout)["executors"]
            for b in (e["broker_id"], *e.get("shards", ()))}


def test_an_idempotent_kafka_producer_and_a_consumer_follow_a_moved_leader(
        processes: Processes, tmp_path: Path) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    CoordinatorProcess(processes, tmp_path).start()
    ports = [free_port() for _ in range(3)]
    agents = [processes.python(
        "-m", "querylib.cli", "executor", "--data", str(tmp_path / f"executor{i}"),
        "--slots", "1", "--brokers", "1", "--lease", "1", "--grace", "1",
        "--kafka-port", str(port), env=tq_env(tmp_path), cwd=ROOT,
        stderr=subprocess.DEVNULL) for i, port in enumerate(ports)]
    wait_for(lambda: len(set(_hosts(tmp_path).values())) == 3, timeout=60, interval=0.2,
             what="three executors to register")
    done = tq(tmp_path, "topic", "create", "kc", "--replication-factor", "3")
    assert done.returncode == 0, done.stderr
    before = wait_for(lambda: (p := _partition(tmp_path, "kc")) and p["isr"] == p["replicas"]
                      and p, timeout=60, interval=0.2, what="the replicas in sync")
    leader = before["broker"]
    victim = next(i for i in range(3)
                  if (tmp_path / f"executor{i}" / "broker.id").read_text().strip()
                  == str(leader))
    bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)

    acked: list[bytes] = []
    failed: list[str] = []
    lock = threading.Lock()

    def delivered(err, msg) -> None:
        with lock:
            if err is None:
                acked.append(msg.value())
            else:
                failed.append(str(err))

    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
        "linger.ms": 5, "message.timeout.ms": 120_000, "topic.metadata.refresh.interval.ms":
        1000})
    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            producer.produce("kc", value=b"v%06d" % sent, partition=0, on_delivery=delivered)
            sent += 1
            producer.poll(0)

    send(200)
    assert producer.flush(60) == 0
    os.killpg(agents[victim].pid, signal.SIGSTOP)
    try:
        send(200)  # in flight to the stopped leader
        moved = wait_for(lambda: (p := _partition(tmp_path, "kc")) and p["broker"] != leader
                         and p, timeout=60, interval=0.2, what="the leadership to move")
        assert moved["leader_epoch"] > before["leader_epoch"]
    finally:
        os.killpg(agents[victim].pid, signal.SIGCONT)  # the old leader lives on, deposed
    send(200)
    assert producer.flush(120) == 0
    assert failed == []
    assert len(acked) == sent

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "kc-check", "auto.offset.reset":
        "earliest", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("kc", 0, 0)])
    read: list[bytes] = []
    try:
        wait_for(lambda: _poll(consumer, read) >= len(acked), timeout=90, interval=0,
                 what="every acknowledged record read")
    finally:
        consumer.close()
    assert read == [b"v%06d" % i for i in range(sent)]  # once each, in order


def _poll(consumer, read: list[bytes]) -> int:
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is None:
        read.append(msg.value())
    return len(read)
