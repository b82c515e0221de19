"""Kafka transactions against the Kafka endpoint (a broker with only its listener, in a child
process), with confluent-kafka (librdkafka): commit and abort markers, read_committed
consumers, producer fencing by epoch, a transaction timeout, and a consume-transform-produce
loop with send_offsets_to_transaction SIGKILLed mid-transaction and restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import Processes, wait_for
from tests.interop._kafka import KafkaServer, read_batches

confluent_kafka = pytest.importorskip("confluent_kafka")
Consumer, Producer, TopicPartition, KafkaException = (
    confluent_kafka.Consumer, confluent_kafka.Producer, confluent_kafka.TopicPartition,
    confluent_kafka.KafkaException)


def txn_producer(server: KafkaServer, txn_id: str, **extra: object):
    return Producer({"bootstrap.servers": server.bootstrap, "transactional.id": txn_id,
                     "linger.ms": 5, **extra})


def read_all(server: KafkaServer, topic: str, isolation: str, *, partitions: int = 1,
             timeout: float = 20.0) -> list[tuple[int, bytes]]:
    """Every record of `topic` a consumer in `isolation` reads up to the end it sees
    (read_committed: the last stable offset), as (partition, value)."""
    c = Consumer({"bootstrap.servers": server.bootstrap, "group.id": f"reader-{isolation}",
                  "enable.auto.commit": False, "isolation.level": isolation,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    got: list[tuple[int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions and time.monotonic() < deadline:
            message = c.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise AssertionError(message.error())
            at_end.discard(message.partition())
            got.append((message.partition(), message.value()))
        assert len(at_end) == partitions, "the consumer did not reach the end"
    finally:
        c.close()
    return got


def test_commit_and_abort_markers_and_read_committed(kafka_server: KafkaServer) -> None:
    kafka_server.start()
    p = txn_producer(kafka_server, "t1")
    p.init_transactions(20)
    for n, commit in ((0, True), (1, False), (2, True)):
        p.begin_transaction()
        for i in range(5):
            p.produce("txn", value=f"{n}-{i}".encode())
        if commit:
            p.commit_transaction(20)
        else:
            assert p.flush(20) == 0  # in the log, then aborted (not purged by the client)
            p.abort_transaction(20)
    committed = [f"{n}-{i}".encode() for n in (0, 2) for i in range(5)]
    assert [v for _, v in read_all(kafka_server, "txn", "read_committed")] == committed
    uncommitted = [v for _, v in read_all(kafka_server, "txn", "read_uncommitted")]
    assert len(uncommitted) == 15
    del p
    kafka_server.stop()
    batches = read_batches(kafka_server.data_dir, "txn")
    markers = [b for b in batches if b.is_control and b.is_transactional]
    assert len(markers) == 3
    assert all(b.is_transactional for b in batches if b.producer_id >= 0)


def test_open_transaction_holds_read_committed_back(kafka_server: KafkaServer) -> None:
    kafka_server.start()
    p = txn_producer(kafka_server, "t2")
    p.init_transactions(20)
    p.begin_transaction()
    p.produce("open", value=b"first")
    p.commit_transaction(20)
    p.begin_transaction()
    p.produce("open", value=b"pending")
    assert p.flush(20) == 0
    assert [v for _, v in read_all(kafka_server, "open", "read_committed")] == [b"first"]
    assert [v for _, v in read_all(kafka_server, "open", "read_uncommitted")] == [
        b"first", b"pending"]
    p.commit_transaction(20)
    assert [v for _, v in read_all(kafka_server, "open", "read_committed")] == [
        b"first", b"pending"]


def test_a_new_producer_fences_the_old_and_aborts_its_transaction(
        kafka_server: KafkaServer) -> None:
    kafka_server.start()
    old = txn_producer(kafka_server, "t3")
    old.init_transactions(20)
    old.begin_transaction()
    old.produce("fenced", value=b"zombie")
    assert old.flush(20) == 0
    new = txn_producer(kafka_server, "t3")
    new.init_transactions(20)  # aborts the old one's transaction, bumps the epoch
    new.begin_transaction()
    new.produce("fenced", value=b"fresh")
    new.commit_transaction(20)
    with pytest.raises(KafkaException) as raised:
        old.produce("fenced", value=b"late")
        old.commit_transaction(20)
    assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower()
    assert [v for _, v in read_all(kafka_server, "fenced", "read_committed")] == [b"fresh"]


def test_a_zombie_stays_fenced_in_the_partition_after_a_restart(
        kafka_server: KafkaServer) -> None:
    """The partition learns the fencing epoch from the markers in its log when it opens: the
    old producer's next batch (its transaction still open as far as it knows, so it goes
    straight to the partition) is refused after a broker restart as before it."""
    kafka_server.start()
    old = txn_producer(kafka_server, "t7")
    old.init_transactions(20)
    old.begin_transaction()
    old.produce("refenced", value=b"zombie")
    assert old.flush(20) == 0
    new = txn_producer(kafka_server, "t7")
    new.init_transactions(20)  # aborts the old one's transaction (marker at a bumped epoch)
    new.begin_transaction()
    new.produce("refenced", value=b"fresh")
    new.commit_transaction(20)
    del new
    kafka_server.stop()
    kafka_server.start()
    with pytest.raises(KafkaException) as raised:
        old.produce("refenced", value=b"late")
        old.flush(30)  # the partition refuses it (no EndTxn: the coordinator would)
    assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower()
    assert [v for _, v in read_all(kafka_server, "refenced", "read_uncommitted")] == [
        b"zombie", b"fresh"]


def test_a_transaction_past_its_timeout_is_aborted(kafka_server: KafkaServer) -> None:
    kafka_server.start()
    p = txn_producer(kafka_server, "t4", **{"transaction.timeout.ms": 2000})
    p.init_transactions(20)
    p.begin_transaction()
    p.produce("timeout", value=b"abandoned")
    assert p.flush(20) == 0
    # The coordinator aborts it: read_committed reaches the end past its marker.
    wait_for(lambda: read_all(kafka_server, "timeout", "read_committed") == [] and
             _has_marker(kafka_server), timeout=30, what="the transaction to be aborted")


def _has_marker(server: KafkaServer) -> bool:
    c = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "hw"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition("timeout", 0), timeout=10)
        return high >= 2  # the record and the ABORT marker
    finally:
        c.close()


_LOOP = r"""
import sys, time
from confluent_kafka import Consumer, Producer, TopicPartition
bootstrap, stop_after = sys.argv[1], int(sys.argv[2])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "transform",
              "enable.auto.commit": False, "auto.offset.reset": "earliest",
              "isolation.level": "read_committed", "session.timeout.ms": 6000})
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "transformer",
              "linger.ms": 5})
p.init_transactions(30)
c.subscribe(["input"])
done = 0
while True:
    batch = c.consume(10, 0.5)
    batch = [m for m in batch if m.error() is None]
    if not batch:
        continue
    p.begin_transaction()
    for m in batch:
        p.produce("output", value=b"out-" + m.value())
    done += 1
    if done == stop_after:
        p.flush(30)
        print("mid-transaction", flush=True)
        time.sleep(600)  # killed here, its transaction open
    p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
    p.commit_transaction(30)
    print("committed", len(batch), flush=True)
"""


def test_consume_transform_produce_killed_and_restarted(
        kafka_server: KafkaServer, processes: Processes, tmp_path) -> None:
    kafka_server.start()
    source = Producer({"bootstrap.servers": kafka_server.bootstrap, "enable.idempotence": True})
    inputs = [f"r{i}".encode() for i in range(100)]
    for value in inputs:
        source.produce("input", value=value)
    assert source.flush(20) == 0
    out = tmp_path / "loop-1.out"
    with open(out, "wb") as f:
        first = processes.python("-c", _LOOP, kafka_server.bootstrap, "3", stdout=f,
                                 stderr=subprocess.STDOUT)
    wait_for(lambda: b"mid-transaction" in out.read_bytes() or first.poll() is not None,
             timeout=60, what="the loop to stop mid-transaction")
    assert first.poll() is None, out.read_text()
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    # The restarted loop fences the old producer, aborts its transaction and goes on from the
    # committed offsets; the broker restarts too, in between: its transactions survive.
    kafka_server.stop()
    kafka_server.start()
    out2 = tmp_path / "loop-2.out"
    with open(out2, "wb") as f:
        second = processes.python("-c", _LOOP, kafka_server.bootstrap, "0", stdout=f,
                                  stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(read_all(kafka_server, "output", "read_committed")) >= 100
                 or second.poll() is not None, timeout=90, what="every output")
        assert second.poll() is None, out2.read_text()
    finally:
        os.kill(second.pid, signal.SIGKILL)
        second.wait(10)
    outputs = sorted(v for _, v in read_all(kafka_server, "output", "read_committed"))
    assert outputs == sorted(b"out-" + v for v in inputs)  # each once, none aborted
    everything = [v for _, v in read_all(kafka_server, "output", "read_uncommitted")]
    assert len(everything) > 100  # the killed transaction's records are in the log, aborted
    assert sys.version_info >= (3, 11)
