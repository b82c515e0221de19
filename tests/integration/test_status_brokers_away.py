"""`tq status` asks every broker for its subscriptions and partitions at once, within one
timeout: brokers that do not answer (a host cut off) are left out without each costing a
timeout of its own (with two brokers per host, a cut host made `tq status` wait 20 s)."""

from __future__ import annotations

import socket
import time

import msgspec

from querylib.broker import Producer
from querylib.cli._catalog import ask_brokers, subscription_lags
from tests.conftest import free_port

from ._broker_helpers import secret_file, start_broker


class _Broker(msgspec.Struct):
    address: str


class _Snap(msgspec.Struct):
    records: list


def test_silent_brokers_are_asked_together_and_left_out(processes, tmp_path) -> None:
    path, secret = secret_file(tmp_path)
    port = free_port()
    start_broker(processes, tmp_path / "data", port, path, secret)
    live = f"tcp://127.0.0.1:{port}"
    producer = Producer(live, "t", secret=secret)
    for value in (b"a", b"b", b"c"):
        producer.send(value, time=0)
    producer.flush()
    producer.close()
    silent = []
    try:
        for _ in range(6):  # a host cut off: TCP connects (the kernel's backlog) and nothing
            sock = socket.socket()  # ever speaks, so a client waits out its timeout
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
            silent.append(sock)
        addresses = [live] + [f"tcp://127.0.0.1:{s.getsockname()[1]}" for s in silent]
        snaps = {"brokers": _Snap([(_Broker(a), None) for a in addresses])}
        timeout = 1.0
        started = time.monotonic()
        reports = ask_brokers(snaps, secret, partitions=True, timeout=timeout)
        took = time.monotonic() - started
        assert set(reports) == {live}
        assert [p.log_end >= 3 for p in reports[live].partitions] == [True]
        assert subscription_lags(reports) == {}  # nobody subscribes
        for sock in silent:  # every silent broker was asked: a connection waits there
            sock.settimeout(5)
            sock.accept()[0].close()
        # Each silent one holds its asker for `timeout`: asked one after another, six would
        # take six timeouts at least; asked together, about one.
        assert took < 6 * timeout
    finally:
        for sock in silent:
            sock.close()
