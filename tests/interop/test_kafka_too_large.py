"""Oversized produce requests, as Kafka answers them (issue 15): a record batch over the
broker's maximum (8 MiB) gets MESSAGE_TOO_LARGE (10), not INVALID_RECORD (87); a request over
the listener's frame limit gets a Produce response with MESSAGE_TOO_LARGE for its partitions
before the connection closes, where librdkafka used to see a silent close (and reported a
timeout much later). confluent-kafka and kafka-python producers, a real listener process."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Processes, free_port, wait_for

pytestmark = pytest.mark.timeout(180)

_SERVER = """
import sys
from querylib.kafka import ListenerLimits
from querylib.server import run_kafka
sys.exit(run_kafka(sys.argv[1], "127.0.0.1", int(sys.argv[2]),
                   limits=ListenerLimits(max_frame_bytes=int(sys.argv[3]))))
"""

MiB = 1024 * 1024
FRAME_LIMIT = 3 * MiB  # the small listener's frame limit


def _serve(processes: Processes, data: Path, max_frame_bytes: int) -> Iterator[str]:
    port = free_port()
    log = data.parent / f"listener-{port}.log"
    with open(log, "wb") as out:
        proc: subprocess.Popen[bytes] = processes.python(
            "-c", _SERVER, str(data), str(port), str(max_frame_bytes), stderr=out)

    def accepting() -> bool:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(accepting, timeout=30, what="the Kafka listener")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def listener(tmp_path: Path, processes: Processes) -> Iterator[str]:
    """Kafka's default limits: 100 MiB frames, 8 MiB batches (the broker's)."""
    yield from _serve(processes, tmp_path / "data", 100 * MiB)


@pytest.fixture
def small_frames(tmp_path: Path, processes: Processes) -> Iterator[str]:
    yield from _serve(processes, tmp_path / "small", FRAME_LIMIT)


def _confluent_error(bootstrap: str, topic: str, size: int) -> int | None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "message.max.bytes": 64 * MiB,
        "message.timeout.ms": 30_000, "retries": 0, "linger.ms": 0})
    # A small record first: the topic exists and the partition's leader is known.
    producer.produce(topic, b"small")
    assert producer.flush(30) == 0
    errors: list = []
    producer.produce(topic, b"x" * size,
                     on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(60) == 0
    (error,) = errors
    return None if error is None else error.code()


def _kafka_python_error(bootstrap: str, topic: str, size: int) -> BaseException | None:
    kafka = pytest.importorskip("kafka")
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, max_request_size=64 * MiB,
                                   retries=0,
                                   request_timeout_ms=30_000, acks=1)
    try:
        producer.send(topic, b"small").get(30)
        try:
            producer.send(topic, b"x" * size).get(60)
        except kafka.errors.KafkaError as exc:
            return exc
        return None
    finally:
        producer.close(5)


def test_a_batch_over_the_brokers_maximum_is_message_too_large(listener: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    assert _confluent_error(listener, "big-c", 9 * MiB) == \
        confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    error = _kafka_python_error(listener, "big-k", 9 * MiB)
    assert getattr(error, "errno", None) == 10, repr(error)


def test_a_request_over_the_frame_limit_gets_message_too_large(small_frames: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    assert _confluent_error(small_frames, "frame-c", FRAME_LIMIT + MiB) == \
        confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    error = _kafka_python_error(small_frames, "frame-k", FRAME_LIMIT + MiB)
    assert getattr(error, "errno", None) == 10, repr(error)
