"""Kafka clients against the Kafka listener of a real `tq up` (the executor's broker, its
address in cluster.json and in the catalog's broker record): kcat lists a topic a querylib
program published and reads it from beginning to end; confluent-kafka produces into a topic
made with `tq topic create`, and a querylib subscriber reads the same keys, values, headers
and timestamps back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from catalog import Broker
from tests.conftest import free_port
from tests.coordinator._cluster import ROOT
from tests.integration._up_endpoints import UpWithEndpoints
from tests.interop._kafka import T0, run

pytestmark = pytest.mark.timeout(180)

PUBLISHER = textwrap.dedent('''
    import querylib

    def main(ctx):
        with ctx.publish("made-by-tq", serde="bytes") as pub:
            pub.send(1, [b"value-%d" % i for i in range(25)])
            pub.advance_to(2)

    querylib.execute(main)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    # One executor broker (the listeners of broker shards: tests/integration/
    # test_executor_shards.py).
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-kafka"), "--brokers", "1",
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def test_the_kafka_address_is_in_cluster_json_and_the_catalog(up: UpWithEndpoints) -> None:
    address = up.info["kafka"]
    assert address.startswith("127.0.0.1:")
    with up.cluster() as cluster:
        brokers = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                   if isinstance(b, Broker)]
    assert [b.kafka_address for b in brokers if b.session_id is not None] == [address]
    # The coordinator's broker (no session) has its own listener: the group coordinator.
    assert all(b.kafka_address for b in brokers if b.session_id is None)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_lists_and_reads_what_a_query_published(up: UpWithEndpoints) -> None:
    program = up.home / "publisher.py"
    program.write_text(PUBLISHER)
    done = subprocess.run([sys.executable, str(program)], env=up.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    bootstrap = up.info["kafka"]
    listed = run(["kcat", "-b", bootstrap, "-L", "-J"])
    assert listed.returncode == 0, listed.stderr
    metadata = json.loads(listed.stdout)
    (topic,) = [t for t in metadata["topics"] if t["topic"] == "made-by-tq"]
    # Both listeners are brokers in Metadata (the coordinator's coordinates groups), and the
    # executor's leads the data topic.
    coordinator_id, coordinator_kafka = _group_coordinator(up)
    named = {b["id"]: b["name"].split("/")[0] for b in metadata["brokers"]}
    assert sorted(named.values()) == sorted([bootstrap, coordinator_kafka])
    leaders = {p["leader"] for p in topic["partitions"]}
    assert {named[leader] for leader in leaders} == {bootstrap}
    assert coordinator_id not in leaders
    read = run(["kcat", "-b", bootstrap, "-C", "-t", "made-by-tq", "-p", "0", "-o",
                "beginning", "-e", "-f", "%k|%s\\n"])
    assert read.returncode == 0, read.stderr
    assert read.stdout.decode().splitlines() == [f"|value-{i}" for i in range(25)]
    assert [v for _, v in up.read("made-by-tq")] == [b"value-%d" % i for i in range(25)]


def test_confluent_producer_into_a_created_topic_reads_back_in_tq(up: UpWithEndpoints) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    created = up.tq("topic", "create", "from-kafka", "--partitions", "1")
    assert created.returncode == 0, created.stderr
    producer = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"], "acks": "all",
                                         "enable.idempotence": True})
    sent = [(f"k{i}".encode(), f"v{i}".encode(), T0 + i) for i in range(30)]
    for key, value, timestamp in sent:
        producer.produce("from-kafka", value=value, key=key, partition=0, timestamp=timestamp,
                         headers=[("origin", b"confluent")])
    assert producer.flush(30) == 0
    records = up.records("from-kafka", count=len(sent))
    assert [(r.key, r.value, r.timestamp) for r in records] == sent
    assert all(list(r.headers) == [("origin", b"confluent")] for r in records)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_a_standalone_broker_serves_kafka_clients(tmp_path, processes) -> None:
    from tests.conftest import wait_for
    from tests.coordinator._cluster import tq_env

    env = tq_env(tmp_path)
    rpc, kafka = free_port(), free_port()
    proc = processes.start(
        [sys.executable, "-m", "querylib.cli", "broker", "--data", str(tmp_path / "data"),
         "--listen", f"tcp://127.0.0.1:{rpc}", "--kafka-port", str(kafka)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bootstrap = f"127.0.0.1:{kafka}"

    def listed() -> bool:
        assert proc.poll() is None, "tq broker exited"
        return run(["kcat", "-b", bootstrap, "-L"], timeout=10).returncode == 0

    wait_for(listed, timeout=30, what="the broker's Kafka listener")
    produced = run(["kcat", "-b", bootstrap, "-P", "-t", "acme/lab/raw", "-K:", "-X",
                    "acks=all"], input=b"k1:one\nk2:two\n")
    assert produced.returncode == 0, produced.stderr
    read = run(["kcat", "-b", bootstrap, "-C", "-t", "acme/lab/raw", "-o", "beginning", "-e",
                "-f", "%k=%s\\n"])
    assert read.stdout.decode().splitlines() == ["k1=one", "k2=two"]
    consumed = subprocess.run(
        [sys.executable, "-m", "querylib.cli", "consume", "acme/lab/raw", "--broker",
         f"tcp://127.0.0.1:{rpc}", "--json"], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    values = [json.loads(line).get("value") for line in consumed.stdout.splitlines()]
    assert [v for v in values if v is not None] == ["one", "two"]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_every_listener_reports_every_broker_with_a_listener(up: UpWithEndpoints,
                                                             processes) -> None:
    from tests.conftest import wait_for

    port = free_port()
    agent = processes.start(
        [sys.executable, "-m", "querylib.cli", "executor", "--data", str(up.home / "second"),
         "--slots", "1", "--brokers", "1", "--kafka-port", str(port)],
        env=up.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = f"127.0.0.1:{port}"

    def brokers(bootstrap: str) -> set[str]:
        assert agent.poll() is None, "tq executor exited"
        listed = run(["kcat", "-b", bootstrap, "-L", "-J"], timeout=10)
        if listed.returncode != 0:
            return set()
        return {b["name"].split("/")[0] for b in json.loads(listed.stdout)["brokers"]}

    every = {up.info["kafka"], second, _group_coordinator(up)[1]}
    wait_for(lambda: brokers(up.info["kafka"]) == every, timeout=30,
             what="tq up's listener to report every broker")
    wait_for(lambda: brokers(second) == every, timeout=30,
             what="the second listener to report every broker")
    agent.terminate()
    agent.wait(timeout=30)


def _group_coordinator(up: UpWithEndpoints) -> tuple[int, str]:
    """The coordinator's broker: its id and its Kafka listener (the group coordinator)."""
    with up.cluster() as cluster:
        (found,) = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                    if isinstance(b, Broker) and b.session_id is None]
    return found.broker_id, found.kafka_address
