"""Kafka endpoint throughput: `python -m querylib.bench kafka`.

Workload: one partition of TQ_BENCH_KAFKA_MB megabytes (default 1024) written through
querylib.log, records with a null key and a 1 KiB value in batches of 1000 (about 1 MB
each). Rows:

- raw: reading the segment files with os.read into one buffer (page cache warm: the same run
  just wrote them), the ceiling for serving them;
- confluent-kafka: a Consumer with assign() reading the whole partition from a `tq kafka`
  listener (a separate process, so client and server do not share a GIL) with `consume()` in
  batches of 10,000, once with librdkafka's defaults and once tuned (fetch.queue.backoff.ms
  5 instead of 1000, so the fetcher does not sleep a second whenever the Python side lets its
  queue fill; max.partition.fetch.bytes 8 MiB). MB/s counts log bytes delivered (batch
  framing included); value_mb_s counts record values only.

Goal: >= 200 MB/s for the tuned consumer. Needs confluent-kafka (the `test` extra).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch

TOPIC = "bench"
RECORDS_PER_BATCH = 1000
VALUE_SIZE = 1024
GOAL_MB_S = 200
_READY_TIMEOUT = 30.0

TUNED = {"fetch.queue.backoff.ms": 5, "max.partition.fetch.bytes": 8 * 1024 * 1024}


def _write_topic(data_dir: str, megabytes: int) -> tuple[int, int]:
    """(records, log bytes) of the partition written."""
    value = bytes(range(256)) * (VALUE_SIZE // 256)
    t0 = 1_700_000_000_000
    batch = encode_batch([(t0 + i, None, value, ()) for i in range(RECORDS_PER_BATCH)])
    batches = max(1, megabytes * 1_000_000 // len(batch))
    log = PartitionLog.open(os.path.join(data_dir, f"{TOPIC}-0"), LogConfig())
    try:
        for _ in range(batches):
            log.append(batch)
        size = log.size_in_bytes
    finally:
        log.close()
    return batches * RECORDS_PER_BATCH, size


def _raw_read(data_dir: str) -> tuple[int, float]:
    """(bytes, seconds) reading every segment file of the partition once."""
    directory = os.path.join(data_dir, f"{TOPIC}-0")
    buffer = bytearray(1024 * 1024)
    total = 0
    start = time.perf_counter()
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(directory, name), "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total, time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_listener(data_dir: str, port: int) -> subprocess.Popen[bytes]:
    code = ("import sys; from querylib.kafka import run_kafka; "
            "sys.exit(run_kafka(sys.argv[1], '127.0.0.1', int(sys.argv[2])))")
    proc = subprocess.Popen([sys.executable, "-c", code, data_dir, str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + _READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"listener exited: {proc.stderr.read().decode()[-400:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("listener did not start")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _consume(port: int, records: int, extra: dict[str, Any]) -> tuple[int, int, float]:
    """(records, value bytes, seconds from assign to the last record)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "bench",
                         "enable.auto.commit": False, **extra})
    try:
        start = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        count = values = 0
        while count < records:
            # never ask for more than remain: consume() waits for the count or the timeout
            messages = consumer.consume(min(10_000, records - count), 10.0)
            if not messages:
                break
            for message in messages:
                if message.error() is None:
                    values += len(message.value())
                    count += 1
        return count, values, time.perf_counter() - start
    finally:
        consumer.close()


def run() -> Iterator[dict[str, Any]]:
    megabytes = int(os.environ.get("TQ_BENCH_KAFKA_MB", "1024"))
    data_dir = tempfile.mkdtemp(prefix="tq-bench-kafka-")
    try:
        records, log_bytes = _write_topic(data_dir, megabytes)
        size_mb = log_bytes / 1e6
        raw_bytes, raw_s = _raw_read(data_dir)
        yield {"case": "raw_segment_read", "mb": round(size_mb),
               "mb_s": round(raw_bytes / raw_s / 1e6)}
        port = _free_port()
        proc = _start_listener(data_dir, port)
        try:
            for name, extra in (("confluent_defaults", {}), ("confluent_tuned", TUNED)):
                cpu_before = _cpu_seconds(proc.pid)
                count, values, seconds = _consume(port, records, extra)
                row = {"case": name, "mb": round(size_mb), "records": count,
                       "mb_s": round(log_bytes * count / records / seconds / 1e6),
                       "value_mb_s": round(values / seconds / 1e6),
                       "records_s": round(count / seconds),
                       "server_cpu_s": round(_cpu_seconds(proc.pid) - cpu_before, 2),
                       "config": {k: str(v) for k, v in extra.items()}}
                if extra is TUNED:
                    row.update(goal_mb_s=GOAL_MB_S, ok=row["mb_s"] >= GOAL_MB_S)
                yield row
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
