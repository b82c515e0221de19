"""Kafka consumer groups across a coordinator takeover (issue 19, DESIGN §3 "Coordinator
failover", §8 "Consumer groups"): two `tq coordinator --etcd` processes and a real etcd, an
executor given both addresses with its Kafka listener, and confluent-kafka consumers.

After a SIGKILL of the active coordinator, the executor's listener names the new group
coordinator (its catalog view starts over at the new coordinator's catalog broker), and the
group resumes there at the offsets it committed before the kill: the active coordinator kept
them in etcd before answering the commit (coordinator/_etcd_state.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from catalog import Executor
from querylib.cluster import Cluster
from querylib.rpc import load_secret
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq_env
from tests.coordinator._etcd import etcd_server, needs_etcd

confluent_kafka = pytest.importorskip("confluent_kafka")
Consumer, Producer = confluent_kafka.Consumer, confluent_kafka.Producer
TopicPartition = confluent_kafka.TopicPartition
AdminClient = pytest.importorskip("confluent_kafka.admin").AdminClient

pytestmark = [needs_etcd, pytest.mark.timeout(180)]

TOPIC, GROUP, PARTITIONS = "kg-takeover", "kg-takeover-group", 2


def _produce(bootstrap: str, values: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(TOPIC, str(value).encode(), partition=value % PARTITIONS)
    assert producer.flush(30) == 0


def _consumer(bootstrap: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 200,
                     "topic.metadata.refresh.interval.ms": 1000})


def _consume(consumer: Consumer, want: int, timeout: float = 60) -> list[int]:
    got: list[int] = []

    def enough() -> bool:
        message = consumer.poll(0.1)
        if message is not None:
            assert message.error() is None, message.error()
            got.append(int(message.value()))
        return len(got) >= want

    wait_for(enough, timeout=timeout, interval=0, what=f"{want} records")
    return got


@dataclass
class TakenOver:
    bootstrap: str  # the executor's Kafka listener


@pytest.fixture
def taken_over(tmp_path: Path, processes: Processes) -> Iterator[TakenOver]:
    """A group that consumed 100 records and committed, then a SIGKILL of the active
    coordinator; yields once the executor's listener names the new group coordinator."""
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    home_a.mkdir()
    home_b.mkdir()
    with etcd_server(tmp_path / "etcd") as address:
        options = ("--etcd", address, "--cluster-name", "t", "--active-lease", "2",
                   "--kafka-group-initial-delay-ms", "0")
        active = CoordinatorProcess(processes, home_a, extra=(
            *options, "--kafka-port", str(free_port()))).start()
        shutil.copy(home_a / "secret", home_b / "secret")
        secret = load_secret(home_a / "secret")
        standby = CoordinatorProcess(processes, home_b, extra=(
            *options, "--standby", "--kafka-port", str(free_port())))
        standby.start(wait=False)
        both = f"{active.address},{standby.address}"
        processes.python("-m", "querylib.cli", "executor", "--coordinator", both,
                         "--data", str(home_a / "executor"), "--brokers", "1", "--lease", "10",
                         "--kafka-port", str(free_port()), env=tq_env(home_a), cwd=ROOT,
                         stderr=(tmp_path / "executor.err").open("wb"))
        with Cluster(both, secret, session=False) as cluster:
            def executor_listener() -> str:
                snap = cluster.snapshot("executors", "brokers")
                ids = {e.broker_id for e, _ in snap["executors"].records
                       if isinstance(e, Executor)}
                return next((b.kafka_address for b, _ in snap["brokers"].records
                             if b.broker_id in ids and b.kafka_address), "")

            bootstrap = wait_for(executor_listener, timeout=30,
                                 what="the executor's Kafka listener")
        with Cluster(both, secret) as cluster:
            cluster.create_topic(TOPIC, PARTITIONS, ingest=True)
        _produce(bootstrap, range(100))
        first = _consumer(bootstrap)
        try:
            first.subscribe([TOPIC])
            assert sorted(_consume(first, 100)) == list(range(100))
            first.commit(asynchronous=False)
            committed = first.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)],
                                        timeout=10)
            assert sum(tp.offset for tp in committed) == 100
        finally:
            first.close()

        active.kill()
        standby.wait_serving(timeout=60)
        with Cluster(both, secret, session=False) as cluster:
            (coordinator_broker,) = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                                     if b.session_id is None]
        admin = AdminClient({"bootstrap.servers": bootstrap})

        def names_the_new_group_coordinator() -> bool:
            node = admin.list_topics(timeout=10).brokers.get(coordinator_broker.broker_id)
            return node is not None and \
                f"{node.host}:{node.port}" == coordinator_broker.kafka_address

        # The executor's catalog view starts over at the new coordinator's catalog broker
        # (before: it sat on the dead one until its link gave up, 60 s).
        wait_for(names_the_new_group_coordinator, timeout=30, interval=0.2,
                 what="the executor's listener to name the new group coordinator")
        yield TakenOver(bootstrap)


def test_a_group_is_served_by_the_new_group_coordinator(taken_over: TakenOver) -> None:
    _produce(taken_over.bootstrap, range(100, 150))
    consumer = _consumer(taken_over.bootstrap)
    try:
        consumer.subscribe([TOPIC])
        got = _consume(consumer, 50)  # it joins the group there and is assigned partitions
        assert consumer.assignment()
        assert len(got) == 50
    finally:
        consumer.close()


def test_committed_offsets_outlive_a_takeover(taken_over: TakenOver) -> None:
    _produce(taken_over.bootstrap, range(100, 150))
    consumer = _consumer(taken_over.bootstrap)
    try:
        consumer.subscribe([TOPIC])
        # The group resumes at its committed offsets: only the records produced since.
        assert sorted(_consume(consumer, 50)) == list(range(100, 150))
        committed = consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)
        assert sum(tp.offset for tp in committed) == 100
    finally:
        consumer.close()
