"""Connector streams into partitions on a host's other brokers (issue 17): with `tq up
--brokers 2` the connector endpoint runs with broker 0, and a stream naming a partition the
catalog placed on the shard is written there, through a broker session of the endpoint on the
shard. Every record lands once: when the connector runs again (a reconnect), and when the
shard is SIGKILLed and restarted in the middle of a stream (the stream resumes where the
shard's data says)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from catalog import Executor
from querylib.broker import list_partitions
from querylib.cluster import Cluster
from querylib.rpc import load_or_create_secret
from tests.conftest import free_port, wait_for
from tests.integration._up import Up
from tests.integration.test_executor_shards import _brokers, _executor, _gone, _shard, _topic

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="PR_SET_PDEATHSIG is Linux only")]

TQ = [sys.executable, "-m", "querylib.cli"]


def _ingest(up: Up, name: str, source: Path, *args: str) -> list[str]:
    return [*TQ, "ingest", name, str(source), "--connector", up.info["connector"],
            "--secret-file", up.info["secret_file"], "--instance", "one", *args]


def _values(up: Up, topic: str, partition: int) -> list[str]:
    read = up.tq("consume", topic, "--partition", str(partition), "--json", "--follow")
    assert read.returncode == 0, read.stderr
    return [e["value"] for e in map(json.loads, read.stdout.splitlines()) if "value" in e]


def _split_topic(up: Up, topic: str) -> tuple[Executor, int]:
    """An ingest topic with partition 0 on broker 0 and partition 1 on the shard."""
    executor = _executor(up)
    (shard_id,) = executor.shards
    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as cluster:
        cluster.create_topic(topic, 2, ingest=True, locations=(executor.broker_id, shard_id))
    return executor, shard_id


def test_a_stream_into_a_shards_partition_lands_once_across_reconnects(
        tmp_path: Path) -> None:
    lines = [f"line {i}" for i in range(3000)]
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    with Up(tmp_path / "home", "--brokers", "2", "--connector-port", "0") as up:
        _split_topic(up, "cshard")
        done = up.tq(*_ingest(up, "cshard:1", source)[3:])
        assert done.returncode == 0, done.stderr
        assert _values(up, "cshard", 1) == lines
        again = up.tq(*_ingest(up, "cshard:1", source)[3:])  # a new connection, same instance
        assert again.returncode == 0, again.stderr
        assert _values(up, "cshard", 1) == lines
        done = up.tq(*_ingest(up, "cshard:0", source)[3:])  # broker 0's partition as before
        assert done.returncode == 0, done.stderr
        assert _values(up, "cshard", 0) == lines


def test_a_stream_into_a_shards_partition_survives_the_shard_being_killed(
        tmp_path: Path) -> None:
    count = 200_000
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"line {i}\n" for i in range(count)))
    with Up(tmp_path / "home", "--brokers", "2", "--connector-port", "0") as up:
        _, shard_id = _split_topic(up, "ckill")
        address = _brokers(up)[shard_id].address
        secret = load_or_create_secret(up.info["secret_file"])
        ingest = subprocess.Popen(_ingest(up, "ckill:1", source, "--timeout", "120"),
                                  env=up.env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            def written() -> bool:
                assert ingest.poll() is None, ingest.stderr.read()  # type: ignore[union-attr]
                found = list_partitions(address, secret, "ckill")
                return any(p.partition == 1 and p.log_end > 0 for p in found)

            wait_for(written, timeout=60, interval=0.05, what="the stream to reach the shard")
            shard = _shard(up)
            assert shard is not None
            shard.kill()
            wait_for(lambda: _gone(shard), timeout=30, what="the shard to die")
            _, err = ingest.communicate(timeout=240)
            assert ingest.returncode == 0, err
        finally:
            if ingest.poll() is None:
                ingest.kill()
                ingest.wait()
        assert (s := _shard(up)) is not None and s.pid != shard.pid
        values = _values(up, "ckill", 1)
        assert len(values) == count
        assert values == [f"line {i}" for i in range(count)]


def test_a_connector_reaches_both_brokers_partitions_of_one_topic(tmp_path: Path) -> None:
    lines = [f"fed {i}" for i in range(500)]
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    with Up(tmp_path / "home", "--brokers", "2", "--connector-port", "0") as up:
        executor, shard_id = _split_topic(up, "fed")
        assert set(_topic(up, "fed").locations) == {executor.broker_id, shard_id}
        for partition in (0, 1):
            done = up.tq(*_ingest(up, f"fed:{partition}", source)[3:])
            assert done.returncode == 0, done.stderr
            assert _values(up, "fed", partition) == lines


def test_an_ingest_topic_spreads_over_the_hosts_brokers_and_every_way_in_reaches_them(
        tmp_path: Path) -> None:
    """An ingest topic placed by the coordinator (no `locations`) spreads over the host's
    brokers like any topic, and both ways in that write ingest topics, the connector endpoint
    and Kafka producers, reach every partition: each record is read back once."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    lines = [f"fed {i}" for i in range(200)]
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    with Up(tmp_path / "home", "--brokers", "2", "--connector-port", "0",
            "--kafka-port", str(free_port())) as up:
        executor = _executor(up)
        with Cluster.connect(up.info["coordinator"],
                             secret_file=up.info["secret_file"]) as cluster:
            cluster.create_topic("spread", 4, ingest=True)
        assert set(_topic(up, "spread").locations) == {executor.broker_id, *executor.shards}
        producer = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"],
                                             "acks": "all", "enable.idempotence": True})
        for partition in range(4):
            for i in range(50):
                producer.produce("spread", value=f"kafka {partition} {i}".encode(),
                                 partition=partition)
        assert producer.flush(30) == 0
        for partition in range(4):
            done = up.tq(*_ingest(up, f"spread:{partition}", source)[3:])
            assert done.returncode == 0, done.stderr
        for partition in range(4):  # read back through each partition's Kafka listener
            assert _kafka_values(up, "spread", partition, 50 + len(lines)) == [
                f"kafka {partition} {i}" for i in range(50)] + lines


def test_a_topic_a_stream_creates_spreads_over_the_hosts_brokers(tmp_path: Path) -> None:
    """A stream into a topic nobody created registers it (an ingest topic, partitions up to
    the stream's): its partitions spread over the host's brokers as any topic's do, rather
    than all landing on the broker the connector endpoint runs with."""
    lines = [f"auto {i}" for i in range(300)]
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    with Up(tmp_path / "home", "--brokers", "2", "--connector-port", "0") as up:
        executor = _executor(up)
        done = up.tq(*_ingest(up, "auto:1", source)[3:])
        assert done.returncode == 0, done.stderr
        topic = _topic(up, "auto")
        assert topic.partitions == 2
        assert set(topic.locations) == {executor.broker_id, *executor.shards}
        assert _values(up, "auto", 1) == lines


def _kafka_values(up: Up, topic: str, partition: int, count: int) -> list[str]:
    """The first `count` values of a partition, read by a Kafka consumer (Fetch on the
    partition's broker, as Metadata names it); fails if fewer come within the deadline."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": up.info["kafka"],
                                         "group.id": f"read-{topic}-{partition}",
                                         "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, partition, 0)])
        values: list[str] = []

        def more() -> bool:
            for message in consumer.consume(num_messages=count - len(values), timeout=0.5):
                assert message.error() is None, message.error()
                values.append(message.value().decode())
            return len(values) >= count

        wait_for(more, timeout=60, what=f"{count} records of {topic}:{partition}")
        return values
    finally:
        consumer.close()
