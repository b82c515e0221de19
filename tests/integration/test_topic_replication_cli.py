"""`tq topic create --replication-factor N` and `tq topic describe` against a real coordinator
and three `tq executor` processes (three executor hosts, DESIGN §5 "Replication"): replicas on
distinct hosts, all in sync at epoch 0; too many refused; and when a leader's executor is
SIGKILLed its lease expires and the controller moves leadership to the next in-sync replica
at the next epoch, as `tq topic describe` then shows."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import querylib
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, tq, tq_env
from tests.integration._three_hosts import ThreeHosts

pytestmark = pytest.mark.timeout(180)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def _describe(home: Path, name: str) -> dict:
    return json.loads(_ok(tq(home, "topic", "describe", name, "--json", "--timeout", "2")))


def test_replicated_topic_is_created_described_and_fails_over(
        processes: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = ThreeHosts(processes, tmp_path)
    host = hosts.hosts()
    said = _ok(tq(tmp_path, "topic", "create", "r", "--partitions", "3",
                  "--replication-factor", "3"))
    assert "replication factor 3" in said
    described = _describe(tmp_path, "r")
    assert described["replication_factor"] == 3
    parts = described["partitions"]
    for part in parts:
        assert len({host[b] for b in part["replicas"]}) == 3  # one on each host
        assert part["isr"] == part["replicas"] and part["leader_epoch"] == 0
        assert part["broker"] == part["replicas"][0]
    assert len({p["broker"] for p in parts}) == 3  # leaders spread over the hosts
    text = _ok(tq(tmp_path, "topic", "describe", "r", "--timeout", "2"))
    assert "replication factor 3" in text and "ISR" in text
    said = _ok(tq(tmp_path, "topic", "alter", "r", "--min-insync-replicas", "2"))
    assert "min.insync.replicas=2" in said
    assert _describe(tmp_path, "r")["configs"] == {"min.insync.replicas": "2"}
    refused = tq(tmp_path, "topic", "create", "many", "--replication-factor", "4")
    assert refused.returncode != 0 and "replication factor 4" in refused.stderr

    # ctx.publish(..., replication=N) creates the topic with N replicas; an existing topic
    # keeps its own.
    for key, value in tq_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    with querylib.connect() as ctx:
        with ctx.publish("twice", replication=2):
            pass
        with ctx.publish("twice", replication=3):
            pass
    assert _describe(tmp_path, "twice")["replication_factor"] == 2

    # The leader of partition 0 goes: its executor's lease expires, the next replica leads.
    gone = parts[0]["broker"]
    hosts.kill(gone)
    moved = wait_for(lambda: (p := _describe(tmp_path, "r")["partitions"][0])["broker"] != gone
                     and p, timeout=60, interval=0.2, what="partition 0's leadership to move")
    assert moved["broker"] == parts[0]["replicas"][1] and moved["leader_epoch"] == 1
    assert moved["isr"] == [b for b in parts[0]["replicas"] if b != gone]
    assert moved["replicas"] == parts[0]["replicas"]


def test_kafka_clients_see_and_create_replicated_topics(processes: Processes,
                                                        tmp_path: Path) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    ports = [free_port() for _ in range(3)]
    host = ThreeHosts(processes, tmp_path,
                      options=lambda i: ("--kafka-port", str(ports[i]))).hosts()
    _ok(tq(tmp_path, "topic", "create", "r", "--partitions", "2", "--replication-factor", "3"))
    described = {p["partition"]: p for p in _describe(tmp_path, "r")["partitions"]}
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports[0]}"})
    meta = admin.list_topics("r", timeout=30).topics["r"]
    assert meta.error is None and sorted(meta.partitions) == [0, 1]
    for index, part in meta.partitions.items():
        assert part.leader == described[index]["broker"]
        assert part.replicas == described[index]["replicas"]
        assert part.isrs == described[index]["isr"]

    futures = admin.create_topics([NewTopic("k3", 2, replication_factor=3),
                                   NewTopic("k9", 1, replication_factor=9)],
                                  operation_timeout=30)
    futures["k3"].result(timeout=60)
    with pytest.raises(KafkaException) as refused:
        futures["k9"].result(timeout=60)
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    created = _describe(tmp_path, "k3")
    assert created["replication_factor"] == 3
    assert all(len({host[b] for b in p["replicas"]}) == 3 for p in created["partitions"])
    futures = admin.create_topics([NewTopic("kd", 1)], operation_timeout=30)  # the default
    futures["kd"].result(timeout=60)
    assert _describe(tmp_path, "kd")["replication_factor"] == 3


def test_tq_produce_and_consume_follow_the_leader_when_its_host_dies(
        processes: Processes, tmp_path: Path) -> None:
    """`tq produce` (lines from a pipe) and `tq consume --follow` on a topic of three replicas:
    the leader's executor is SIGKILLed mid-stream; both find the new leader through the
    catalog and go on: every line produced is consumed once, in order, and both exit 0."""
    hosts = ThreeHosts(processes, tmp_path)
    before = hosts.replicated("moving")
    env = tq_env(tmp_path)
    consumed = tmp_path / "consumed"
    consumer = processes.python("-m", "querylib.cli", "consume", "moving", "--follow",
                                env=env, cwd=ROOT, stdout=consumed.open("w"),
                                stderr=subprocess.PIPE, text=True)
    producer = processes.python("-m", "querylib.cli", "produce", "moving", env=env, cwd=ROOT,
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert producer.stdin is not None
    for i in range(100):
        producer.stdin.write(f"a{i}\n")
    producer.stdin.flush()
    wait_for(lambda: consumed.read_text().count("\n") >= 100, timeout=60, interval=0.2,
             what="the first lines consumed")
    hosts.kill(before["broker"])
    for i in range(100):
        producer.stdin.write(f"b{i}\n")
    producer.stdin.close()
    assert producer.wait(timeout=120) == 0, producer.stderr.read()  # type: ignore[union-attr]
    assert consumer.wait(timeout=120) == 0, consumer.stderr.read()  # type: ignore[union-attr]
    assert _describe(tmp_path, "moving")["partitions"][0]["broker"] != before["broker"]
    lines = consumed.read_text().split()
    assert lines == [f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)]
