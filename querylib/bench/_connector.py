"""Records ingested through the connector endpoint: `python -m querylib.bench connector`.

Rows (each {"name", "figures", "baseline", "ratio", "goal"}):
- connector_ingest_draft / connector_ingest_released: N 100-byte records (default 500,000;
  TQ_BENCH_CONNECTOR_RECORDS) sent one `Connector.send` at a time, with explicit message ids,
  from this process through a broker process's connector endpoint (flush policy "never", the
  default window of 1024 credits), timed until the last one is acknowledged (durable).
  Baseline, in the same run against the same broker: tq's own producer path,
  `querylib.broker.Producer.send` per record into another topic, timed until flushed.
  Goal: >= 0.7x the producer's records/s.

The broker runs in a spawned process; the clients run here one after the other, so each
measurement has the machine's two cores to itself (with whatever else runs on it).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

RECORD_BYTES = 100


def _broker_process(data_dir: str, secret: bytes, queue: Any) -> None:
    from querylib.server._connector_main import run_connector_broker
    from querylib.server.connector._endpoint import EndpointConfig

    def ready(address: str, bound: tuple[str, int]) -> None:
        queue.put((address, f"{bound[0]}:{bound[1]}"))

    run_connector_broker(data_dir, "tcp://127.0.0.1:0", secret,
                         EndpointConfig(port=0, cookie=b"bench"), on_ready=ready)


def _producer(address: str, secret: bytes, records: int) -> float:
    from querylib.broker import Producer

    value = bytes(RECORD_BYTES)
    with Producer(address, "bench-producer", secret=secret, linger=0.0005) as producer:
        start = time.perf_counter()
        for _ in range(records):
            producer.send(value)
        producer.flush()
        return time.perf_counter() - start


def _connector(address: str, dialect: str, records: int) -> float:
    from querylib.connector import Connector

    value = bytes(RECORD_BYTES)
    with Connector(address, program="bench", instance=dialect, cookie=b"bench",
                   dialect=dialect) as conn:
        sid = conn.open_stream(f"bench-{dialect}")
        start = time.perf_counter()
        for i in range(records):
            conn.send(sid, value, message_id=i)
        conn.flush()
        return time.perf_counter() - start


def run() -> Iterator[dict[str, Any]]:
    records = int(os.environ.get("TQ_BENCH_CONNECTOR_RECORDS", "500000"))
    mp = multiprocessing.get_context("spawn")
    secret = os.urandom(32)
    queue = mp.Queue()
    data_dir = tempfile.mkdtemp(prefix="tq-bench-connector-")
    broker = mp.Process(target=_broker_process, args=(data_dir, secret, queue), daemon=True)
    broker.start()
    try:
        address, connector_address = queue.get(timeout=120)
        producer_s = _producer(address, secret, records)
        producer_rps = records / producer_s
        for dialect in ("draft", "released"):
            seconds = _connector(connector_address, dialect, records)
            rps = records / seconds
            yield {
                "name": f"connector_ingest_{dialect}",
                "figures": {"records_per_s": round(rps), "records": records,
                            "record_bytes": RECORD_BYTES, "seconds": round(seconds, 2),
                            "credits": 1024, "flush": "never",
                            "load_avg_1m": round(os.getloadavg()[0], 2)},
                "baseline": {"producer_records_per_s": round(producer_rps),
                             "note": "querylib.broker.Producer.send per record, same broker"},
                "ratio": round(rps / producer_rps, 3),
                "goal": ">= 0.7x the producer path",
            }
    finally:
        broker.terminate()
        broker.join(30)
        shutil.rmtree(data_dir, ignore_errors=True)
