"""Bounded resources at the Kafka listener, over real sockets: connection caps in total and per
client address, the idle timeout (connections.max.idle.ms), the cap on request bytes read
ahead of the request being handled, and refusals logged once per interval."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from querylib.kafka import ApiKey, ErrorCode, ListenerLimits
from tests.conftest import wait_for

from ._support import ListenerThread, WireClient, make_request, running_listener

A = ApiKey


def api_versions(client: WireClient) -> object:
    return client.call(make_request(A.API_VERSIONS, 3, client_software_name="t",
                                    client_software_version="1"))


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def closed_by_listener(sock: socket.socket, timeout: float = 10.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def served(sock: socket.socket, port: int) -> bool:
    """Whether the listener answers a request on this connection."""
    client = WireClient.__new__(WireClient)
    client.sock, client.client_id, client._correlation = sock, "t", 0
    sock.settimeout(10)
    try:
        return api_versions(client).error_code is ErrorCode.none  # type: ignore[attr-defined]
    except ConnectionError:
        return False


@pytest.fixture
def listen(tmp_path: Path) -> Iterator:
    """`listen(**limits)` starts a listener with these ListenerLimits; all stop at the end."""
    with ExitStack() as stack:
        def start(**limits: object) -> ListenerThread:
            data = str(tmp_path / f"data{len(stack._exit_callbacks)}")
            return stack.enter_context(running_listener(
                data, limits=ListenerLimits(**limits)))  # type: ignore[arg-type]

        yield start


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("querylib") and "refused" in r.getMessage()]


def test_total_connection_cap_refuses_the_excess_and_logs_once(
        listen, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    thread = listen(max_connections=5)
    kept = [connect(thread.port) for _ in range(5)]
    assert all(served(s, thread.port) for s in kept)
    refused = [connect(thread.port) for _ in range(30)]
    try:
        assert all(closed_by_listener(s) for s in refused)
        assert all(served(s, thread.port) for s in kept), "the first five stay served"
        kept[0].close()
        wait_for(lambda: thread.listener.stats.open_connections == 4,  # type: ignore[union-attr]
                 what="the listener to see a connection go")
        again = connect(thread.port)
        assert served(again, thread.port), "a freed slot is taken again"
        again.close()
        stats = thread.listener.stats  # type: ignore[union-attr]
        assert stats.refused_connections == 30
        # One line at the first refusal, the rest summed up later (at most every 10 s).
        lines = refusal_lines(caplog)
        assert 1 <= len(lines) <= 2, lines
        assert "limit of 5 connections" in lines[0]
    finally:
        for s in kept + refused:
            s.close()


def test_per_address_cap_counts_each_client_address_apart(listen) -> None:
    thread = listen(max_connections_per_address=3)
    first = [connect(thread.port, "127.0.0.2") for _ in range(5)]
    second = [connect(thread.port, "127.0.0.3") for _ in range(3)]
    try:
        assert [served(s, thread.port) for s in first[:3]] == [True] * 3
        assert all(closed_by_listener(s) for s in first[3:])
        assert all(served(s, thread.port) for s in second), "another address has its own count"
        assert thread.listener.stats.refused_connections == 2  # type: ignore[union-attr]
    finally:
        for s in first + second:
            s.close()


def test_idle_connections_are_closed_after_the_idle_timeout(listen) -> None:
    thread = listen(idle_timeout_ms=1000)
    idle = []
    try:
        for _ in range(1000):
            idle.append(connect(thread.port))
        wait_for(lambda: thread.listener.stats.open_connections == 1000,  # type: ignore
                 what="1000 connections accepted")
        with WireClient(thread.port) as active:
            # A client that keeps asking is never idle, however long it stays.
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                assert api_versions(active).error_code is ErrorCode.none  # type: ignore
                time.sleep(0.2)

            def only_the_active_one_open() -> bool:
                # It keeps asking while it waits: however slow the closing, it is not idle.
                assert api_versions(active).error_code is ErrorCode.none  # type: ignore
                return thread.listener.stats.open_connections == 1  # type: ignore

            wait_for(only_the_active_one_open, timeout=30, interval=0.2,
                     what="the idle connections to be closed")
            assert api_versions(active).error_code is ErrorCode.none  # type: ignore
        assert all(closed_by_listener(s, timeout=0.5) for s in idle)
        assert thread.listener.stats.idle_closed == 1000  # type: ignore[union-attr]
    finally:
        for s in idle:
            s.close()


def test_a_connection_waiting_on_a_long_fetch_is_not_idle(listen) -> None:
    thread = listen(idle_timeout_ms=300)
    thread.call(thread.backend.create_topic("t", 1))
    from .test_listener import fetch

    with WireClient(thread.port) as client:
        started = time.monotonic()
        response = client.call(fetch(11, [("t", 0, 0)], max_wait=1500, min_bytes=1))
        assert time.monotonic() - started >= 1.4  # it waited its max_wait out, uncut
        assert response.error_code is ErrorCode.none  # type: ignore[attr-defined]
        assert thread.listener.stats.idle_closed == 0  # type: ignore[union-attr]


def test_requests_read_ahead_of_a_waiting_one_are_capped(listen) -> None:
    """A client pipelines 48 MiB of requests behind a Fetch that waits: the listener reads at
    most the cap ahead (then stops reading the socket, so TCP holds the client back), and
    answers every request in order once the Fetch returns."""
    cap = 256 * 1024
    thread = listen(max_inflight_request_bytes=cap, max_request_bytes=64 * 1024)
    thread.call(thread.backend.create_topic("t", 1))
    from .test_listener import fetch

    stats = thread.listener.stats  # type: ignore[union-attr]
    with WireClient(thread.port, client_id="x" * 30_000) as client:
        fetch_id = client.send(fetch(11, [("t", 0, 0)], max_wait=4000, min_bytes=1))
        request = make_request(A.API_VERSIONS, 0)
        frames = [client.frame(request) for _ in range(1600)]  # ~30 KB each, 48 MiB in all
        data = b"".join(f for f, _ in frames)
        client.sock.setblocking(False)
        sent = 0
        while not stats.muted:  # until the listener stops reading this connection
            try:
                sent += client.sock.send(data[sent:sent + 65536])
            except BlockingIOError:
                wait_for(lambda: stats.muted, timeout=10, what="the listener to stop reading")
        assert stats.max_inflight_bytes <= cap + 256 * 1024 + 32 * 1024, stats.max_inflight_bytes
        responses: list[int] = []

        def read_all() -> None:
            got, _ = client.receive(A.FETCH, 11)
            responses.append(got)
            for _ in frames:
                got, _ = client.receive(A.API_VERSIONS, 0)
                responses.append(got)

        client.sock.settimeout(60)
        reader = threading.Thread(target=read_all)
        reader.start()
        client.sock.sendall(data[sent:])
        reader.join(60)
        assert responses == [fetch_id] + [c for _, c in frames], "every response, in order"
        assert stats.max_inflight_bytes <= cap + 256 * 1024 + 32 * 1024
