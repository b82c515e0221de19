"""SIGKILL of the broker during produce, then restart: every acknowledged batch is read exactly
once, by a subscriber that lived through the crash and by a fresh one; a subscriber that
reconnects on its own resumes with no gap and no duplicate."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

from querylib.broker import Data, EndOfStream, Producer, Subscriber
from tests.conftest import free_port, wait_for

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


def test_a_batch_in_flight_to_a_killed_broker_goes_to_its_successor_once_it_is_up(
        processes, tmp_path):
    """The dropped connection fails the batch the killed broker held at once (DESIGN §2 "Lost
    connections"): the producer sends it again to the restarted broker, where it is stored
    once. Its request deadline and lease are longer than the test waits, so before, only
    they could tell it the batch was lost."""
    path, secret = secret_file(tmp_path)
    port = free_port()
    data = tmp_path / "data"
    broker = start_broker(processes, data, port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    producer = Producer(address, "t", secret=secret, create=True, timeout=600.0, lease=600.0,
                        reconnect_timeout=120.0)
    flushed = threading.Event()
    try:
        producer.send(b"before", time=0)
        producer.flush()
        os.killpg(broker.pid, signal.SIGSTOP)
        producer.send(b"in flight", time=1)
        flusher = threading.Thread(target=lambda: (producer.flush(), flushed.set()),
                                   daemon=True)
        flusher.start()
        wait_for(lambda: producer.link.client.in_flight == 1, timeout=30,
                 what="the batch sent to the stopped broker")
        os.killpg(broker.pid, signal.SIGKILL)
        broker.wait(timeout=10)
        start_broker(processes, data, port, path, secret)
        wait_for(flushed.is_set, timeout=60, what="the batch acknowledged by the new broker")
        assert producer.core.resent >= 1
    finally:
        producer.close(end=False)
    with Subscriber(address, "t", 0, secret=secret) as sub:
        values = []
        while len(values) < 2 and (event := sub.next_event(timeout=30)) is not None:
            if isinstance(event, Data):
                values += [r.value for r in event.records]
        assert sub.next_event(timeout=0.5) is None  # and nothing more
    assert values == [b"before", b"in flight"]


def test_a_subscriber_waiting_on_a_killed_broker_resumes_from_its_successor(
        processes, tmp_path):
    """A subscriber waiting for records has no call in flight to fail: the dropped connection
    itself has its link reopen the session (DESIGN §2 "Lost connections"), and it subscribes
    again at the restarted broker. Its lease here (renewed a third of it apart) is longer
    than the test waits: before, only a renewal could tell it the broker had forgotten it."""
    path, secret = secret_file(tmp_path)
    port = free_port()
    data = tmp_path / "data"
    broker = start_broker(processes, data, port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    producer = Producer(address, "t", secret=secret, create=True)
    sub = Subscriber(address, "t", 0, secret=secret, lease=600.0)
    try:
        producer.send(b"before", time=0)
        producer.flush()
        event = sub.next_event(timeout=30)
        assert isinstance(event, Data) and [r.value for r in event.records] == [b"before"]
        os.killpg(broker.pid, signal.SIGKILL)
        broker.wait(timeout=10)
        start_broker(processes, data, port, path, secret)
        producer.send(b"after", time=1)
        producer.flush()
        values: list[bytes | None] = []

        def read() -> bool:
            event = sub.next_event(timeout=0.2)
            if isinstance(event, Data):
                values.extend(r.value for r in event.records)
            return bool(values)

        wait_for(read, timeout=60, what="the record sent after the restart")
        assert values == [b"after"]
    finally:
        sub.close()
        producer.close(end=False)
