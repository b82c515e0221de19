"""The broker with real processes on loopback: `tq broker`, producer and subscriber processes.

No timing thresholds: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from querylib.broker import Data, EndOfStream, Progress, Subscriber, Values
from tests.conftest import free_port

from ._broker_helpers import Lines, client, data_values, secret_file, start_broker


def expected(tag: str, batches: int, records: int) -> list[str]:
    return [f"{tag}:{b}:{i}" for b in range(batches) for i in range(records)]


def test_one_producer_to_one_subscriber_through_the_cli(processes, tmp_path):
    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    lines = "".join(f"line {i}\n" for i in range(2000))
    produce = processes.python("-m", "querylib.cli", "produce", "demo", "--broker",
                               address, "--secret-file", path, "--time", "5",
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = produce.communicate(lines, timeout=60)
    assert produce.returncode == 0, err
    consume = processes.python("-m", "querylib.cli", "consume", "demo", "--broker",
                               address, "--secret-file", path, "--from", "earliest",
                               "--follow", "--json", stdout=subprocess.PIPE, text=True)
    out = Lines(consume)
    assert out.finish(timeout=60) == 0
    records = out.having("value")
    assert [r["value"] for r in records] == [f"line {i}" for i in range(2000)]
    assert [r["offset"] for r in records] == list(range(2000))
    assert {r["time"] for r in records} == {5}
    assert out.snapshot()[-1] == {"end_of_stream": True}


def test_subscriber_process_follows_a_producer_process(processes, tmp_path):
    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    sub = client(processes, "consume", address, path, "--follow")
    sub.wait("ready")
    prod = client(processes, "produce", address, path, "--batches", "50", "--records", "100",
                  "--advance", "--pipeline")
    assert prod.finish() == 0
    assert sub.finish() == 0
    items = sub.snapshot()
    assert data_values(items) == expected("p", 50, 100)
    progress = [i["progress"] for i in items if "progress" in i]
    assert progress == list(range(1, 51))
    assert items[-2] == {"eos": True}


def test_frontier_is_the_minimum_over_several_producers(processes, tmp_path):
    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    start, go = tmp_path / "start", tmp_path / "go"
    # Producer a goes to time 10 at once; b stops at 3 until told to go on. Both join the
    # partition before either sends.
    fast = client(processes, "produce", address, path, "--tag", "a", "--batches", "10",
                  "--advance", "--start-file", str(start), "--go-file", str(go))
    slow = client(processes, "produce", address, path, "--tag", "b", "--batches", "3",
                  "--advance", "--start-file", str(start), "--go-file", str(go),
                  "--then-advance", "7")
    fast.wait("ready")
    slow.wait("ready")
    start.touch()
    fast.wait("waiting")
    slow.wait("waiting")
    # Both producers' advances are acknowledged, so every control record the broker wrote
    # for them is in the log: a reader of the log so far sees the minimum, ending at 3.
    with Subscriber(address, "t", 0, secret=secret, follow=False) as sub:
        before = [e.frontier for e in sub if isinstance(e, Progress)]
    assert before == sorted(set(before)) and before[-1] == 3
    go.touch()
    assert fast.finish() == 0 and slow.finish() == 0
    with Subscriber(address, "t", 0, secret=secret) as sub:
        events = list(sub)
    after = [e.frontier for e in events if isinstance(e, Progress)]
    # b moves to 7; whoever ends first leaves the other's frontier (7 or 10) as the minimum.
    assert after in ([*before, 7], [*before, 7, 10])
    assert isinstance(events[-1], EndOfStream)
    # Data never arrives for a time the frontier already passed.
    frontier = 0
    for event in events:
        if isinstance(event, Progress):
            frontier = event.frontier
        elif isinstance(event, Data):
            assert event.time >= frontier
    values = [r.value.decode() for e in events if isinstance(e, Data) for r in e.records]
    assert sorted(values) == sorted(expected("a", 10, 10) + expected("b", 3, 10))


def test_many_subscribers_at_different_speeds_one_paused(processes, tmp_path):
    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    fast = [client(processes, "consume", address, path, "--follow") for _ in range(3)]
    slow = client(processes, "consume", address, path, "--follow", "--credit", "4096",
                  "--delay", "0.001")
    paused = client(processes, "consume", address, path, "--follow", "--credit", "8192")
    for sub in [*fast, slow, paused]:
        sub.wait("ready")
    os.kill(paused.proc.pid, signal.SIGSTOP)
    try:
        # The producer finishes, every batch acknowledged, while one subscriber is stopped.
        prod = client(processes, "produce", address, path, "--batches", "200", "--records",
                      "50", "--pipeline", "--advance")
        assert prod.finish() == 0
        assert len(prod.having("acked")) == 200
        for sub in fast:
            assert sub.finish() == 0
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)
    assert slow.finish() == 0
    assert paused.finish() == 0
    want = expected("p", 200, 50)
    for sub in [*fast, slow, paused]:
        assert data_values(sub.snapshot()) == want
        assert sub.snapshot()[-2] == {"eos": True}


def test_a_late_subscriber_catches_up_then_tails_without_gap_or_duplicate(processes, tmp_path):
    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    go = tmp_path / "go"
    first = client(processes, "produce", address, path, "--tag", "x", "--batches", "300",
                   "--records", "20", "--pipeline", "--go-file", str(go))
    first.wait("waiting")
    # Joins late, with little credit so the catch-up from disk is still running when the
    # second producer starts appending.
    late = client(processes, "consume", address, path, "--follow", "--credit", "16384")
    late.wait("data")
    second = client(processes, "produce", address, path, "--tag", "y", "--batches", "100",
                    "--records", "20", "--pipeline")
    assert second.finish() == 0
    go.touch()  # only now does x end its stream (the last producer to end ends the partition)
    assert first.finish() == 0
    assert late.finish() == 0
    values = data_values(late.snapshot())
    assert len(values) == len(set(values)) == 400 * 20
    assert values[:6000] == expected("x", 300, 20)
    assert [v for v in values if v.startswith("y")] == expected("y", 100, 20)


def test_send_values_batches_many_records_like_send(processes, tmp_path):
    """Records handed over many at a time arrive in order with their time, timestamp and
    headers, across batch boundaries (batch_records 7, and a byte limit), mixed with send."""
    from querylib.broker import Producer

    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    sent = []
    with Producer(address, "many", secret=secret, batch_records=7, batch_bytes=300) as producer:
        for t in range(5):
            values = [b"t%d-%d" % (t, i) + bytes(i % 40) for i in range(23 + t)] + [None]
            producer.send_values(values, headers=(("h", b"%d" % t),), timestamp=1000 + t,
                                 time=t)
            producer.send(b"single-%d" % t, time=t)
            sent += [(v, t, 1000 + t) for v in values]
            sent.append((b"single-%d" % t, t, None))
            producer.advance(t + 1)
    got = []
    with Subscriber(address, "many", 0, secret=secret) as sub:
        while True:
            event = sub.next_event(30)
            assert event is not None, "timed out"
            if isinstance(event, EndOfStream):
                break
            if isinstance(event, Data):
                got += [(r.value, _time_of(r), r.timestamp, r.headers) for r in event.records]
    assert [(v, t) for v, t, _, _ in got] == [(v, t) for v, t, _ in sent]
    for (_, t, stamp, headers), (_, _, want_stamp) in zip(got, sent, strict=True):
        if want_stamp is not None:
            assert stamp == want_stamp
            assert ("h", b"%d" % t) in headers
    # The same records read values-only (Values events, cut out a run at a time)
    values_got = []
    with Subscriber(address, "many", 0, secret=secret, values=True) as sub:
        while not isinstance(event := sub.next_event(30), EndOfStream):
            assert event is not None, "timed out"
            if isinstance(event, Values):
                values_got += [(v, event.time) for v in event.values]
    assert values_got == [(v, t) for v, t, _ in sent]


def _time_of(record) -> int:
    from querylib.records import TIME_HEADER, decode_int64

    return next(decode_int64(v) for k, v in record.headers if k == TIME_HEADER)


def test_send_values_refuses_wrong_types_whole_and_copies_what_it_takes(processes, tmp_path):
    """A value that is not bytes-like (or None, when refused) fails the call and sends none of
    its values, even when they would span batches; values are copied as they are handed over,
    so changing them afterwards changes nothing sent."""
    from querylib.broker import Producer

    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    with Producer(address, "typed", secret=secret, batch_records=3) as producer:
        producer.send_values([b"a0"], time=0)
        with pytest.raises(TypeError):
            producer.send_values([b"x0", b"x1", b"x2", b"x3", "text", b"x5"], time=0)
        with pytest.raises(TypeError):
            producer.send_values(["text"], time=0)
        with pytest.raises(TypeError):
            producer.send_values([b"n0", None], time=0, allow_none=False)
        mutable = [bytearray(b"m%d" % i) for i in range(5)]
        producer.send_values(mutable, time=0)
        for value in mutable:
            value[:] = b"changed"
        producer.send_values([b"z", None], time=1)
    with Subscriber(address, "typed", 0, secret=secret, follow=False) as sub:
        got = [r.value for e in sub if isinstance(e, Data) for r in e.records]
    assert got == [b"a0", b"m0", b"m1", b"m2", b"m3", b"m4", b"z", None]
