"""A 16-byte flip in the middle of a segment of a cleanly stopped broker (issue 13 part 5):
after the restart every other batch is readable, by tq subscribers and by a Kafka client; the
damaged batch's offsets fail with CorruptDataError for tq (`tq consume` says so in one line)
and CORRUPT_MESSAGE (2) for Kafka; the partition keeps taking appends. After `tq log repair`
(broker stopped) Kafka clients step over the quarantined offsets and tq readers are told."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from querylib.broker import Data, EndOfStream, Producer, Subscriber, list_partitions
from querylib.errors import CorruptDataError, QuarantinedDataError
from querylib.rpc import RpcError, load_or_create_secret
from tests.conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 200
PER_BATCH = 10


def _start(processes, data: Path, rpc: int, kafka: int, secret_file: Path,
           secret: bytes) -> subprocess.Popen:
    proc = processes.start(
        [sys.executable, "-m", "querylib.cli", "broker", "--data", str(data), "--listen",
         f"tcp://127.0.0.1:{rpc}", "--kafka-port", str(kafka), "--secret-file",
         str(secret_file), "--segment-bytes", str(64 * 1024)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def answers() -> bool:
        assert proc.poll() is None, f"tq broker exited: {proc.stderr.read().decode()}"
        try:
            list_partitions(f"tcp://127.0.0.1:{rpc}", secret, timeout=0.5)
        except RpcError:
            return False
        return True

    wait_for(answers, timeout=30, what="the broker to answer")
    return proc


def _tq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "querylib.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def _batches(partition_dir: Path) -> list[tuple[Path, int, int, int, int]]:
    """(segment, position, size, base offset, record count) of every batch on disk."""
    out = []
    for log in sorted(partition_dir.glob("*.log")):
        data = log.read_bytes()
        pos = 0
        while pos < len(data):
            size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
            base = int.from_bytes(data[pos:pos + 8], "big")
            count = int.from_bytes(data[pos + 57:pos + 61], "big")
            control = data[pos + 22] & 0x20
            if not control:
                out.append((log, pos, size, base, count))
            pos += size
    return out


def _values(events) -> list[str]:
    return [r.value.decode() for e in events if isinstance(e, Data) for r in e.records]


@pytest.mark.timeout(240)
def test_a_mid_segment_flip_after_a_clean_stop_keeps_every_other_batch(tmp_path, processes):
    secret_file = tmp_path / "secret"
    secret = load_or_create_secret(secret_file)
    data = tmp_path / "data"
    rpc, kafka = free_port(), free_port()
    address = f"tcp://127.0.0.1:{rpc}"
    broker = _start(processes, data, rpc, kafka, secret_file, secret)
    sent = [[f"v:{b}:{i}:" + "x" * 100 for i in range(PER_BATCH)] for b in range(BATCHES)]
    with Producer(address, "t", 0, secret=secret, batch_records=PER_BATCH) as producer:
        for b, values in enumerate(sent):
            producer.send_values([v.encode() for v in values], time=b)
            producer.flush()
    _stop(broker)

    batches = _batches(data / "t-0")
    segments = sorted({b[0] for b in batches})
    assert len(segments) >= 3
    middle = [b for b in batches if b[0] == segments[1]]
    segment, position, size, base, count = middle[len(middle) // 2]
    assert count == PER_BATCH
    with open(segment, "r+b") as f:
        f.seek(position + size // 2 - 8)
        old = f.read(16)
        f.seek(position + size // 2 - 8)
        f.write(bytes(b ^ 0xA5 for b in old))
    damaged_batch = [i for i, b in enumerate(batches) if b[3] == base][0]

    broker = _start(processes, data, rpc, kafka, secret_file, secret)
    # tq: everything up to the damage, then the error naming it, then the rest from after it
    seen = []
    with Subscriber(address, "t", 0, secret=secret) as sub:
        with pytest.raises(CorruptDataError) as caught:
            while (event := sub.next_event(timeout=30)) is not None:
                seen.append(event)
    error = caught.value
    assert (error.kafka_error_code, error.start_offset, error.end_offset) == (
        2, base, base + count)
    assert f"topic 't' partition 0: offsets {base}..{base + count - 1}" in str(error)
    with Subscriber(address, "t", 0, secret=secret, start=error.end_offset) as sub:
        rest = list(sub)
    assert isinstance(rest[-1], EndOfStream)
    expected = [v for i, values in enumerate(sent) if i != damaged_batch for v in values]
    assert _values(seen) + _values(rest) == expected

    # Kafka: the records before the damage, then CORRUPT_MESSAGE for the partition

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{kafka}", "group.id": "g",
                         "enable.auto.commit": False, "fetch.error.backoff.ms": 50})
    try:
        consumer.assign([TopicPartition("t", 0, 0)])
        values, codes = [], []
        deadline = time.monotonic() + 60
        while KafkaError.INVALID_MSG not in codes and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                codes.append(message.error().code())
            else:
                values.append(message.value().decode())
        assert KafkaError.INVALID_MSG in codes  # librdkafka's name for CORRUPT_MESSAGE (2)
        assert values == [v for values in sent[:damaged_batch] for v in values]
        # a Kafka reader that gives the damaged records up goes on after them
        consumer.assign([TopicPartition("t", 0, base + count)])
        after = []
        deadline = time.monotonic() + 60
        while len(after) < len(expected) - len(values) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                after.append(message.value().decode())
        assert values + after == expected
    finally:
        consumer.close()

    consumed = _tq("consume", "t", "--broker", address, "--secret-file", str(secret_file))
    assert consumed.returncode == 1
    assert consumed.stderr.count("\n") == 1 and f"offsets {base}..{base + count - 1}" in (
        consumed.stderr)
    assert consumed.stdout.splitlines() == [v for values in sent[:damaged_batch]
                                            for v in values]

    # the partition keeps taking appends (its stream ended: the writer reopens it)
    end = list_partitions(address, secret, "t", timeout=10)[0].log_end
    with Producer(address, "t", 0, secret=secret, reopen=True) as producer:
        producer.send(b"after the damage", time=BATCHES)
    with Subscriber(address, "t", 0, secret=secret, start=end) as sub:
        assert _values(list(sub)) == ["after the damage"]

    # repair: refused while the broker runs, then quarantined with it stopped
    refused = _tq("log", "repair", str(data / "t-0"))
    assert refused.returncode == 2 and "stop the broker" in refused.stderr
    _stop(broker)
    repaired = _tq("log", "repair", str(data / "t-0"))
    assert repaired.returncode == 0, repaired.stderr
    assert _tq("log", "check", "--data", str(data)).returncode == 0
    broker = _start(processes, data, rpc, kafka, secret_file, secret)
    with Subscriber(address, "t", 0, secret=secret) as sub:
        with pytest.raises(QuarantinedDataError, match="quarantined by `tq log repair`"):
            while sub.next_event(timeout=30) is not None:
                pass
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{kafka}", "group.id": "h",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("t", 0, 0)])
        values, errors = [], []
        deadline = time.monotonic() + 60
        while len(values) < len(expected) + 1 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is not None:
                errors.append(message.error())
            elif message is not None:
                values.append(message.value().decode())
        assert values == [*expected, "after the damage"] and not errors
    finally:
        consumer.close()
