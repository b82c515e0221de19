"""The console's own bounds, on a real socket: connections, form sizes (no cluster needed:
its feed keeps trying to reach one while the pages are served)."""

from __future__ import annotations

import asyncio
import http.client
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from querylib.server.console import Console
from tests.conftest import free_port, wait_for


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


def _event_streams(console: Console, count: int) -> list[tuple[Any, Any]]:
    """`count` event streams, open (each holds its connection), with their responses."""
    streams = []
    for _ in range(count):
        connection = _connect(console)
        connection.request("GET", "/api/events")
        reply = connection.getresponse()
        assert reply.status == 200
        streams.append((connection, reply))
    return streams


def test_connections_past_the_limit_are_refused_and_the_rest_served(console: Console) -> None:
    streams = _event_streams(console, 3)
    extra = _connect(console)
    extra.request("GET", "/api/state")
    assert extra.getresponse().status == 503
    extra.close()
    for connection, _ in streams:
        connection.close()


def test_one_address_holds_a_bounded_share_of_the_connections() -> None:
    """One client (here 127.0.0.1) holding event streams open took every place, and nobody
    else was served; past its share it is refused, while another address is served."""
    running = Console("tcp://127.0.0.1:9", os.urandom(32), port=free_port(), fallback=False,
                      max_connections=5, max_connections_per_address=2).start()
    try:
        streams = _event_streams(running, 2)
        extra = _connect(running)
        extra.request("GET", "/api/state")
        reply = extra.getresponse()
        assert reply.status == 503
        assert b"too many connections from 127.0.0.1" in reply.read()
        extra.close()
        other = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30,
                                           source_address=("127.0.0.2", 0))
        other.request("GET", "/api/state")
        assert other.getresponse().status == 200
        other.close()
        streams[0][0].close()  # a place of its own again once one of its own closed
        wait_for(lambda: _status(running, "/api/state") == 200, timeout=30,
                 what="the address's freed place to be served")
        for connection, _ in streams[1:]:
            connection.close()
    finally:
        running.stop()


def _status(console: Console, path: str) -> int:
    connection = _connect(console)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
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


def test_a_log_stream_the_browser_left_closes_what_it_reads() -> None:
    """A page following a query's output goes away while the stream waits for the next
    lines: the lines it read from (subscribers of every broker's __logs) are closed. Before,
    closing them raised "aclose(): asynchronous generator is already running" (a traceback
    in tq up's log per page left) and they were never closed."""
    closed = threading.Event()

    async def lines(query_id: int) -> AsyncIterator[list[dict[str, Any]]]:
        try:
            yield [{"process": 0, "stream": "stdout", "text": "hi", "timestamp_ms": 0}]
            await asyncio.Event().wait()  # no more lines
            yield []
        finally:
            closed.set()

    running = Console("tcp://127.0.0.1:9", os.urandom(32), port=free_port(), fallback=False)
    running._lines = lines  # type: ignore[method-assign]
    running.start()
    try:
        connection = _connect(running)
        connection.request("GET", "/api/queries/7/logs")
        reply = connection.getresponse()
        assert reply.status == 200
        read = b""
        while b"event: lines" not in read:
            chunk = reply.read1(4096)
            assert chunk, read
            read += chunk
        connection.close()
        wait_for(closed.is_set, timeout=30, what="the stream's lines to be closed")
    finally:
        running.stop()


def test_a_login_form_of_more_fields_than_it_has_is_refused_with_a_reason(
        console: Console) -> None:
    """A form of nine fields (the limit the parser is given is eight): refused as bad input,
    not answered with a 500 and a traceback in tq up's log."""
    connection = _connect(console)
    connection.request("POST", "/login", body="&".join(f"f{i}=x" for i in range(9)).encode(),
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    reply = connection.getresponse()
    assert reply.status == 400
    assert b"principal and a password" in reply.read()
    connection.close()


def test_a_loopback_console_serves_reads_only_to_pages_of_a_loopback_name(
        console: Console) -> None:
    """Reading needs no login on loopback, for requests that name a loopback host: a page of
    another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) names its own
    host, and must not read the cluster through the browser."""
    def call(path: str, host: str) -> int:
        connection = _connect(console)
        connection.request("GET", path, headers={"Host": host})
        status = connection.getresponse().status
        connection.close()
        return status

    port = console.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}",
                 f"127.0.0.2:{port}"):
        assert call("/api/state", host) == 200, host
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}",
                 f"localhost.attacker.example:{port}", ""):
        assert call("/api/state", host) == 401, host
        assert call("/api/events", host) == 401, host
        assert call("/", host) == 303, host


def test_connections_that_never_finish_a_request_do_not_hold_the_places_for_long(
        capfd: pytest.CaptureFixture[str]) -> None:
    """Connections that send nothing, half a request head, or a login form a few bytes at a
    time hold every place the limit allows: they are closed once the time for a request has
    passed, and the console serves the others again (before, it answered 503 for good, to
    anyone, logged in or not), and a login whose form never came logs no traceback."""
    import socket

    running = Console("tcp://127.0.0.1:9", os.urandom(32), port=free_port(), fallback=False,
                      max_connections=3, request_timeout=1.0).start()
    assert running._server is not None
    served = running._server.server_state  # what uvicorn counts against the limit
    hogs = []
    try:
        hogs.append(socket.create_connection(("127.0.0.1", running.port)))
        hogs[0].sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                        b"Content-Type: application/x-www-form-urlencoded\r\n\r\nprincipal=")
        wait_for(lambda: len(served.tasks) == 1, what="the login to wait for its form")
        hogs.append(socket.create_connection(("127.0.0.1", running.port)))
        hogs[1].sendall(b"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        hogs.append(socket.create_connection(("127.0.0.1", running.port)))
        wait_for(lambda: len(served.connections) == 3, what="the console to hold them all")

        def state() -> int:
            connection = _connect(running)
            connection.request("GET", "/api/state")
            status = connection.getresponse().status
            connection.close()
            return status

        assert state() == 503
        wait_for(lambda: state() == 200, timeout=30, interval=0.2,
                 what="the console to serve again")
        for hog in hogs:  # closed by the console
            hog.settimeout(30)
            assert hog.recv(4096) == b""
    finally:
        for hog in hogs:
            hog.close()
        running.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_a_login_or_logout_posted_by_another_sites_page_is_refused(console: Console) -> None:
    """A page of another site can post a form to the console: it must not log the browser in
    (as whoever the page chose) nor out. Browsers name the posting page's origin; a client
    that names none (curl, a script) is not a page and logs in as before."""
    from querylib.rpc import Credential, kafka_password

    form = f"principal=admin&password={kafka_password(Credential('admin', console.secret))}"
    port = console.port

    def post(path: str, origin: str | None) -> tuple[int, str | None]:
        connection = _connect(console)
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   "Host": f"127.0.0.1:{port}"}
        if origin is not None:
            headers["Origin"] = origin
        connection.request("POST", path, body=form.encode(), headers=headers)
        reply = connection.getresponse()
        outcome = reply.status, reply.getheader("set-cookie")
        connection.close()
        return outcome

    for origin in ("http://attacker.example", f"http://localhost:{port}", "null"):
        status, cookie = post("/login", origin)
        assert status == 403 and cookie is None, origin
        assert post("/logout", origin)[0] == 403, origin
    for origin in (f"http://127.0.0.1:{port}", None):
        status, cookie = post("/login", origin)
        assert status == 303 and cookie is not None and "tq_console=" in cookie, origin
        assert post("/logout", origin)[0] == 303, origin
