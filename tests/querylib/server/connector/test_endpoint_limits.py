"""Bounded resources at the connector endpoint, over real sockets: its connection limits in
total and per client address, refusals logged once per interval, the idle timeout (a
connection with nothing unacknowledged and nothing sent for that long is closed; the client
library reconnects and goes on), and what a connector that never reads makes it hold."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

from querylib.connector import Accepted, BulkSourceConnection, Dialect
from querylib.server.connector._connection import PeerConnection
from tests.conftest import wait_for

from .test_endpoint import COOKIE, Harness, Raw


def connect(harness: Harness, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", harness.config.port))
    return sock


def closed_by_endpoint(sock: socket.socket, timeout: float = 10.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("querylib") and "refused" in r.getMessage()
            and "connection" in r.getMessage()]


def test_per_address_limit_and_refusals_logged_once(tmp_path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    harness = Harness(str(tmp_path / "data"), max_connections_per_address=2)
    kept: list[socket.socket] = []
    try:
        kept = [connect(harness, "127.0.0.2") for _ in range(2)]
        wait_for(lambda: harness.stats()["live_connections"] == 2, what="two connections")
        refused = [connect(harness, "127.0.0.2") for _ in range(20)]
        kept += refused
        assert all(closed_by_endpoint(s) for s in refused)
        assert not any(closed_by_endpoint(s, timeout=0.2) for s in kept[:2])
        other = Raw(harness, instance="other")  # from 127.0.0.1: its own count
        other.handshake()
        other.close()
        assert harness.stats()["refused_connections"] == 20
        lines = refusal_lines(caplog)
        assert 1 <= len(lines) <= 2, lines  # the first at once, the rest summed up later
        assert "limit of 2 connections from 127.0.0.2" in lines[0]
    finally:
        for s in kept:
            s.close()
        harness.close()


def test_total_limit_refusals_are_counted_and_logged_once(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    harness = Harness(str(tmp_path / "data"), max_connections=3)
    socks: list[socket.socket] = []
    try:
        socks = [connect(harness) for _ in range(3)]
        wait_for(lambda: harness.stats()["live_connections"] == 3, what="three connections")
        socks += [connect(harness) for _ in range(10)]
        assert all(closed_by_endpoint(s) for s in socks[3:])
        assert harness.stats()["refused_connections"] == 10
        assert 1 <= len(refusal_lines(caplog)) <= 2
    finally:
        for s in socks:
            s.close()
        harness.close()


@pytest.mark.parametrize("dialect", ["draft", "released"])
def test_idle_connections_are_closed_and_the_client_goes_on(tmp_path, dialect: str) -> None:
    harness = Harness(str(tmp_path / "data"), idle_timeout=0.5, handshake_timeout=30.0)
    try:
        with harness.connector(dialect) as conn:
            sid = conn.open_stream("events")
            conn.send(sid, b"one", message_id=1)
            conn.flush()
            wait_for(lambda: harness.stats()["idle_closed"] >= 1
                     and harness.stats()["live_connections"] == 0, what="the idle close")
            conn.send(sid, b"two", message_id=2)  # the client reconnects and resends
            conn.flush()
        assert harness.ids("events") == [1, 2]
        assert harness.stats()["connections"] >= 2
    finally:
        harness.close()


def test_a_silent_socket_is_closed_by_the_idle_timeout_too(tmp_path) -> None:
    harness = Harness(str(tmp_path / "data"), idle_timeout=0.3, handshake_timeout=60.0)
    try:
        socks = [connect(harness) for _ in range(50)]
        assert all(closed_by_endpoint(s) for s in socks)
        assert harness.stats()["idle_closed"] == 50
        for s in socks:
            s.close()
    finally:
        harness.close()


class Deaf:
    """A draft connector that never reads: it re-introduces one stream (each NOTIFY is answered
    with an ACK) a window at a time, whenever the endpoint has handed every credit back, from a
    thread of its own. Its socket takes little (and the endpoint's kernel keeps little of what
    it writes to it: a slow network), so what it leaves unread soon waits at the endpoint."""

    def __init__(self, harness: Harness, window: int, instance: str = "deaf") -> None:
        self.harness = harness
        self.window = window
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", harness.config.port))
        conn = BulkSourceConnection(Dialect.DRAFT, program="test", instance=instance,
                                    cookie=COOKIE)
        self.sock.sendall(conn.hello())
        events: list = []
        while not any(isinstance(e, Accepted) for e in events):
            events += conn.receive_data(self.sock.recv(65536))
        self.sock.sendall(conn.notify(1, "deaf"))
        self.again = conn.notify(1, "deaf")  # the same re-introduction, over and over

        async def slow_network() -> PeerConnection:
            (peer,) = harness.endpoint._peers
            peer.writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            return peer

        self.peer = harness.call(slow_network())
        self._stop = threading.Event()
        self._sender = threading.Thread(target=self._send, daemon=True)
        self._sender.start()

    async def _state(self) -> tuple[int, int, int]:
        return (self.peer.writer.transport.get_write_buffer_size(), self.peer.conn.credits,
                self.harness.endpoint.counters.get("write_waits", 0))

    def state(self) -> tuple[int, int, int]:
        """(bytes the endpoint holds unsent, credits it handed back, its write_waits)."""
        return self.harness.call(self._state())

    def _send(self) -> None:
        try:
            while not self._stop.is_set():
                if self.state()[1] == self.window:  # every credit handed back
                    self.sock.sendall(self.again * self.window)
        except OSError:
            pass  # closed by the test

    def stop_sending(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a sendall blocked in the thread
        except OSError:
            pass
        self.sock.close()
        self._sender.join(10)


def test_a_connector_that_never_reads_is_held_back_not_buffered(tmp_path) -> None:
    # Every NOTIFY is answered with an ACK. A connector that never reads them, but sends again
    # as soon as the endpoint has handed its credits back, must be held back by TCP once what
    # it left unread piles up, not have the endpoint keep every ACK in memory.
    harness = Harness(str(tmp_path / "data"), initial_credits=4096)
    deaf: Deaf | None = None
    try:
        deaf = Deaf(harness, 4096)
        limit = 1024 * 1024

        def held_back_or_piled_up() -> tuple[int, int, int] | None:
            now = deaf.state()
            return now if now[0] > limit or now[2] else None

        unsent, _, waits = wait_for(held_back_or_piled_up, timeout=60,
                                    what="the endpoint to stop reading, or to pile up ACKs")
        assert unsent <= limit and waits >= 1
        # Everyone else is served meanwhile.
        with harness.connector(instance="other") as other:
            sid = other.open_stream("others")
            other.send(sid, b"x", message_id=1)
        assert harness.ids("others") == [1]
    finally:
        if deaf is not None:
            deaf.close()
        harness.close()


def test_an_ended_connection_that_is_never_read_lets_go_of_its_socket(tmp_path) -> None:
    # The endpoint ends a connection (here: fenced by a new connection of its instance) whose
    # connector reads nothing: what it still had to send cannot go out, and the socket (a
    # descriptor the listener's limits no longer count) must not stay open for as long as
    # the connector stays silent.
    harness = Harness(str(tmp_path / "data"), initial_credits=4096)
    deaf: Deaf | None = None
    try:
        deaf = Deaf(harness, 4096)
        wait_for(lambda: deaf.state()[0] > 0, timeout=60, what="answers waiting unsent")
        deaf.stop_sending()
        server_side = deaf.peer.writer.get_extra_info("socket")
        successor = Raw(harness, instance="deaf")
        successor.handshake()  # fences the deaf connection
        wait_for(lambda: harness.stats()["live_connections"] == 1, what="the fenced one ended")
        wait_for(lambda: server_side.fileno() == -1, timeout=15,
                 what="the endpoint to close the fenced connection's socket")
        successor.close()
    finally:
        if deaf is not None:
            deaf.close()
        harness.close()
