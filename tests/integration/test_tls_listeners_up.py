"""A TLS listener of a real `tq up` (Kafka, connector) facing clients that do not speak TLS:
each such connection is refused and counted, said in one summary line rather than a
traceback each, and tq up keeps serving and stops at once when asked. Before, each one wrote
a traceback as a "bug", and a client retrying filled tq up's stderr pipe until its executor
blocked writing to it and no longer stopped on SIGTERM."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.integration._up_endpoints import UpWithEndpoints
from tests.integration.test_connector_tls_up import _certificates

pytestmark = pytest.mark.timeout(180)

ATTEMPTS = 200  # plain-text connections, each a failed TLS handshake


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def _read_until_closed(sock: socket.socket) -> None:
    """Read until the server closes the connection (a reset counts); the socket's timeout
    fails the test if it never does."""
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, ssl.SSLError):
        pass


@pytest.mark.parametrize("listener", ["kafka", "connector"])
def test_clients_without_tls_are_refused_quietly_and_tq_up_stops_at_once(
        tmp_path: Path, listener: str) -> None:
    cert, key, ca = _certificates(tmp_path)
    if listener == "kafka":
        extra = ["--kafka-port", str(free_port()), "--connector-port", "-1", "--kafka-sasl",
                 "--kafka-tls-cert", str(cert), "--kafka-tls-key", str(key)]
    else:
        extra = ["--kafka-port", "-1", "--connector-port", str(free_port()),
                 "--connector-tls-cert", str(cert), "--connector-tls-key", str(key)]
    up = UpWithEndpoints(tmp_path / "home", *extra)
    try:
        address = _host_port(up.info[listener])
        # A Kafka ApiVersions request, or any bytes: not a TLS ClientHello.
        hello = bytes.fromhex("0000001500120003000000010007636c69656e742d31000000")
        for _ in range(ATTEMPTS):
            with socket.create_connection(address, timeout=30) as sock:
                sock.sendall(hello)
                _read_until_closed(sock)
        # A client that speaks TLS is served, and its leaving is no news either.
        context = ssl.create_default_context(cafile=str(ca))
        for _ in range(3):
            with socket.create_connection(address, timeout=30) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.version() is not None  # the handshake completed
    finally:
        log = up.stop()
    assert not up.killed, f"tq up did not stop on SIGTERM within 30 s:\n{log[-3000:]}"
    assert "Traceback" not in log and "bug" not in log, log[-3000:]
    assert "eof_received" not in log, log[-3000:]
    refusals = [line for line in log.splitlines() if "TLS handshake" in line]
    assert 1 <= len(refusals) <= 3, log[-3000:]  # a summary per 10 s, not a line each
