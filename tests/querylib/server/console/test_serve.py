"""The console's own bounds, on a real socket: connections, form sizes (no cluster needed:
its feed keeps trying to reach one while the pages are served)."""

from __future__ import annotations

import http.client
import os
from collections.abc import Iterator

import pytest

from querylib.server.console import Console
from tests.conftest import free_port


@pytest.fixture
def console() -> Iterator[Console]:
    running = Console("tcp://127.0.0.1:9", os.urandom(32), port=free_port(), fallback=False,
                      max_connections=3).start()
    try:
        yield running
    finally:
        running.stop()


def _connect(console: Console) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", console.port, timeout=30)


def test_connections_past_the_limit_are_refused_and_the_rest_served(console: Console) -> None:
    streams = []
    for _ in range(3):  # event streams hold their connections open
        connection = _connect(console)
        connection.request("GET", "/api/events")
        reply = connection.getresponse()
        assert reply.status == 200
        streams.append((connection, reply))
    extra = _connect(console)
    extra.request("GET", "/api/state")
    assert extra.getresponse().status == 503
    extra.close()
    for connection, _ in streams:
        connection.close()


def test_a_login_form_past_4_kib_is_refused_unread(console: Console) -> None:
    connection = _connect(console)
    connection.request("POST", "/login", body=b"principal=admin&password=" + b"x" * 100_000,
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert connection.getresponse().status == 413
    connection.close()
    connection = _connect(console)  # a wrong small one: back to the login page
    connection.request("POST", "/login", body=b"principal=admin&password=wrong",
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    reply = connection.getresponse()
    assert (reply.status, reply.getheader("location")) == (303, "/login?failed=1")
    connection.close()


def test_a_taken_default_port_moves_and_a_named_one_is_refused() -> None:
    import socket

    from querylib.server.console import ConsoleUnavailableError

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        taken = holder.getsockname()[1]
        moved = Console("tcp://127.0.0.1:9", os.urandom(32), port=taken, fallback=True).start()
        try:
            assert moved.moved and moved.port != taken
        finally:
            moved.stop()
        with pytest.raises(ConsoleUnavailableError, match="--console-port"):
            Console("tcp://127.0.0.1:9", os.urandom(32), port=taken, fallback=False).start()
