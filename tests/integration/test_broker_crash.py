"""SIGKILL of the broker during produce, then restart: every acknowledged batch is read exactly
once, by a subscriber that lived through the crash and by a fresh one; a subscriber that
reconnects on its own resumes with no gap and no duplicate."""

from __future__ import annotations

import os
import signal
from collections import Counter

from querylib.broker import Data, EndOfStream, Subscriber
from tests.conftest import free_port

from ._broker_helpers import client, data_values, secret_file, start_broker


def test_sigkill_during_produce_loses_nothing_acknowledged(processes, tmp_path):
    path, secret = secret_file(tmp_path)
    port = free_port()
    data = tmp_path / "data"
    broker = start_broker(processes, data, port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    survivor = client(processes, "consume", address, path, "--follow", "--lease", "1")
    survivor.wait("ready")
    # It gives up after 1 s without its broker (a reconnect would find none: no restart yet).
    producer = client(processes, "produce", address, path, "--batches", "100000",
                      "--records", "20", "--pipeline", "--timeout", "1.5",
                      "--reconnect-timeout", "1")
    producer.wait("acked", count=300)
    os.killpg(broker.pid, signal.SIGKILL)
    broker.wait(timeout=10)
    assert producer.finish() == 3  # its batches in flight failed
    acked = [f"p:{item['acked']}:" for item in producer.having("acked")]

    start_broker(processes, data, port, path, secret)
    # A new producer ends the stream, so the followers stop at end-of-stream.
    closer = client(processes, "produce", address, path, "--tag", "z", "--batches", "1",
                    "--records", "20")
    assert closer.finish() == 0

    with Subscriber(address, "t", 0, secret=secret) as fresh:
        values = [r.value.decode() for e in fresh if isinstance(e, Data) for r in e.records]
    assert survivor.finish() == 0
    for seen in (values, data_values(survivor.snapshot())):
        counts = Counter(seen)
        assert max(counts.values()) == 1, "a record was read twice"
        batches = Counter(v.rsplit(":", 1)[0] + ":" for v in seen)
        for batch in acked:
            assert batches[batch] == 20, f"acknowledged batch {batch} not read exactly once"
        assert batches["z:0:"] == 20
    assert values == data_values(survivor.snapshot())


def test_subscriber_resumes_from_its_positions_without_gap_or_duplicate(processes, tmp_path):
    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    producer = client(processes, "produce", address, path, "--batches", "40", "--records",
                      "25", "--pipeline", "--advance")
    assert producer.finish() == 0
    seen: list[str] = []
    with Subscriber(address, "t", 0, secret=secret, credit=4096) as first:
        for event in first:
            if isinstance(event, Data):
                seen += [r.value.decode() for r in event.records]
                if len(seen) >= 333:
                    break
        positions = first.positions
    with Subscriber(address, "t", 0, secret=secret, start=positions[0]) as second:
        events = list(second)
    seen += [r.value.decode() for e in events if isinstance(e, Data) for r in e.records]
    assert seen == [f"p:{b}:{i}" for b in range(40) for i in range(25)]
    assert isinstance(events[-1], EndOfStream)
