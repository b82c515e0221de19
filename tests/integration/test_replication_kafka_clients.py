"""Real Kafka clients across a leader change while the old leader lives (DESIGN §5
"Replication", §8 "Kafka listener"): a real coordinator and three `tq executor` processes
with Kafka listeners; a replicated topic; a confluent-kafka or kafka-python producer
(acks=all, idempotent) writes while the leader's executor is stopped (SIGSTOP) until the
controller moves the leadership, then resumed: the old leader lives on, deposed, and answers
NOT_LEADER_OR_FOLLOWER; clients find the new leader. A consumer then reads every
acknowledged record once, in order."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, free_port, wait_for
from tests.integration._three_hosts import ThreeHosts

pytestmark = pytest.mark.timeout(240)


def _read_until(poll: Callable[[], int], count: int, close: Callable[[], None]) -> None:
    """Poll a consumer until it read `count` records (at most 90 s), then close it."""
    try:
        wait_for(lambda: poll() >= count, timeout=90, interval=0,
                 what="every acknowledged record read")
    finally:
        close()


class _Confluent:
    """confluent-kafka (librdkafka): an idempotent producer, acks=all."""

    def __init__(self, bootstrap: str) -> None:
        self.kafka = pytest.importorskip("confluent_kafka")
        self.bootstrap = bootstrap
        self.producer = self.kafka.Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 120_000,
            "topic.metadata.refresh.interval.ms": 1000})

    def send(self, value: bytes, done: Callable[[str | None, bytes], None]) -> None:
        self.producer.produce("kc", value=value, partition=0, on_delivery=lambda err, msg: done(
            None if err is None else str(err), msg.value()))
        self.producer.poll(0)

    def flush(self, timeout: float) -> bool:
        return self.producer.flush(timeout) == 0

    def read(self, count: int) -> list[bytes]:
        consumer = self.kafka.Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": "kc-check",
            "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.assign([self.kafka.TopicPartition("kc", 0, 0)])
        read: list[bytes] = []

        def poll() -> int:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                read.append(msg.value())
            return len(read)

        _read_until(poll, count, consumer.close)
        return read


class _KafkaPython:
    """kafka-python: an idempotent producer, acks=all (its own retry and metadata code)."""

    def __init__(self, bootstrap: str) -> None:
        self.kafka = pytest.importorskip("kafka")
        self.bootstrap = bootstrap.split(",")
        self.producer = self.kafka.KafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
            linger_ms=5, delivery_timeout_ms=120_000, request_timeout_ms=30_000,
            metadata_max_age_ms=1000, retry_backoff_ms=100)

    def send(self, value: bytes, done: Callable[[str | None, bytes], None]) -> None:
        future = self.producer.send("kc", value=value, partition=0)
        future.add_callback(lambda _meta: done(None, value))
        future.add_errback(lambda exc: done(repr(exc), value))

    def flush(self, timeout: float) -> bool:
        try:
            self.producer.flush(timeout)
        except self.kafka.errors.KafkaTimeoutError:
            return False
        return True

    def read(self, count: int) -> list[bytes]:
        consumer = self.kafka.KafkaConsumer(bootstrap_servers=self.bootstrap,
                                            enable_auto_commit=False)
        partition = self.kafka.TopicPartition("kc", 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        read: list[bytes] = []

        def poll() -> int:
            for records in consumer.poll(timeout_ms=500).values():
                read.extend(r.value for r in records)
            return len(read)

        _read_until(poll, count, consumer.close)
        return read

    def close(self) -> None:
        self.producer.close(timeout=10)


class _AioKafka:
    """aiokafka: an idempotent producer, acks=all, on an event loop of its own thread."""

    def __init__(self, bootstrap: str) -> None:
        self.aiokafka = pytest.importorskip("aiokafka")
        self.bootstrap = bootstrap
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.producer = self._run(self._producer(), 60)

    async def _producer(self) -> Any:
        producer = self.aiokafka.AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
            linger_ms=5, request_timeout_ms=30_000, metadata_max_age_ms=1000,
            retry_backoff_ms=100)
        await producer.start()
        return producer

    def _run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def send(self, value: bytes, done: Callable[[str | None, bytes], None]) -> None:
        async def send() -> None:
            delivery = await self.producer.send("kc", value=value, partition=0)
            delivery.add_done_callback(lambda f: done(
                None if f.exception() is None else repr(f.exception()), value))

        self._run(send(), 60)

    def flush(self, timeout: float) -> bool:
        try:
            self._run(self.producer.flush(), timeout)
        except TimeoutError:
            return False
        return True

    def read(self, count: int) -> list[bytes]:
        async def read() -> list[bytes]:
            consumer = self.aiokafka.AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                                      enable_auto_commit=False)
            await consumer.start()
            partition = self.aiokafka.TopicPartition("kc", 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            read: list[bytes] = []
            try:
                while len(read) < count:
                    batches = await consumer.getmany(timeout_ms=500)
                    read.extend(r.value for records in batches.values() for r in records)
            finally:
                await consumer.stop()
            return read

        return self._run(read(), 90)

    def close(self) -> None:
        self._run(self.producer.stop(), 30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.mark.parametrize("client", [_Confluent, _KafkaPython, _AioKafka],
                         ids=["confluent", "kafka-python", "aiokafka"])
def test_an_idempotent_kafka_producer_and_a_consumer_follow_a_moved_leader(
        processes: Processes, tmp_path: Path,
        client: type[_Confluent | _KafkaPython | _AioKafka]) -> None:
    ports = [free_port() for _ in range(3)]
    hosts = ThreeHosts(processes, tmp_path,
                       options=lambda i: ("--brokers", "1", "--kafka-port", str(ports[i])))
    before = hosts.replicated("kc")
    leader = before["broker"]
    victim = hosts.agent_of(leader)
    kafka = client(",".join(f"127.0.0.1:{p}" for p in ports))

    acked: list[bytes] = []
    failed: list[str] = []
    lock = threading.Lock()

    def delivered(err: str | None, value: bytes) -> None:
        with lock:
            if err is None:
                acked.append(value)
            else:
                failed.append(err)

    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            kafka.send(b"v%06d" % sent, delivered)
            sent += 1

    send(200)
    assert kafka.flush(60)
    os.killpg(victim.pid, signal.SIGSTOP)
    try:
        send(200)  # in flight to the stopped leader
        moved = hosts.wait_moved("kc", before)
        assert moved["leader_epoch"] > before["leader_epoch"]
    finally:
        os.killpg(victim.pid, signal.SIGCONT)  # the old leader lives on, deposed
    send(200)
    assert kafka.flush(120)
    assert failed == []
    assert len(acked) == sent
    try:
        assert kafka.read(len(acked)) == [b"v%06d" % i for i in range(sent)]  # once, in order
    finally:
        if not isinstance(kafka, _Confluent):
            kafka.close()
