"""Hostile input against `tq up`'s ZeroMQ ports (loopback only, bounded in count and time),
spoken in raw ZMTP as an attacker would.

A peer must pass the handshake first (PLAIN, with the token of a key the server's keyring
checks: DESIGN §2 "Handshake"): one without (ZeroMQ's NULL mechanism, a made-up token, an
unknown principal) is closed before it may send a frame, so an unsigned message of many
frames is never buffered. A peer that passed it (here: one holding the admin's token) may
still send garbage, and ZeroMQ itself refuses its frames over a server's limit by their
announced size: 20 messages of 90 MiB on each port keep `tq up` under 300 MB of RSS (sampled
while sending), and it serves as before."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from querylib.rpc import BROKER, COORDINATOR, audience_key, handshake_token, load_credential
from tests.integration._up import Up

MESSAGE = 90 * 1024 * 1024
PER_PORT = 20
CONNECTIONS = 4
RSS_LIMIT = 300 * 1024 * 1024
READ_TIMEOUT = 30  # seconds: past the servers' handshake interval


def greeting(mechanism: bytes) -> bytes:
    """ZMTP 3.0 greeting: signature, version 3.0, mechanism, as-server 0, filler."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + \
        b"\0" * 32


def command(name: bytes, data: bytes) -> bytes:
    body = bytes([len(name)]) + name + data
    if len(body) > 255:
        return b"\x06" + struct.pack(">Q", len(body)) + body
    return bytes([0x04, len(body)]) + body


def metadata(**properties: bytes) -> bytes:
    return b"".join(bytes([len(k)]) + k.encode() + struct.pack(">I", len(v)) + v
                    for k, v in properties.items())


def hello(username: bytes, password: bytes) -> bytes:
    return command(b"HELLO", bytes([len(username)]) + username + bytes([len(password)])
                   + password)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed during the handshake")
        data += chunk
    return data


def read_command(sock: socket.socket) -> tuple[bytes, bytes]:
    """The next command the server sends: (name, data)."""
    flags, = _recv_exact(sock, 1)
    assert flags & 0x04, f"a message frame (flags {flags:#x}) during the handshake"
    size = int.from_bytes(_recv_exact(sock, 8 if flags & 0x02 else 1), "big")
    body = _recv_exact(sock, size)
    return body[1:1 + body[0]], body[1 + body[0]:]


def server_commands(sock: socket.socket) -> list[bytes]:
    """Every command the server sends until it closes the connection: WELCOME, READY, or
    b"ERROR 400" and the like."""
    names = []
    try:
        _recv_exact(sock, 64)  # its greeting
        while True:
            flags, = _recv_exact(sock, 1)
            assert flags & 0x04, f"a message frame (flags {flags:#x}) during the handshake"
            size = int.from_bytes(_recv_exact(sock, 8 if flags & 0x02 else 1), "big")
            body = _recv_exact(sock, size)
            if body.endswith(b"\x03400") or body.endswith(b"\x03300"):
                # libzmq 4.3.5 mangles the name of its ERROR command (b"\x04\t^RROR...");
                # its status code at the end is what a client reads.
                names.append(b"ERROR " + body[-3:])
            else:
                names.append(body[1:1 + body[0]])
    except (ConnectionError, OSError):
        return names


def zmtp_stranger(port: int, username: bytes | None, password: bytes = b"") -> socket.socket:
    """A TCP connection to a ZeroMQ socket that has sent its greeting (NULL with a READY
    command when `username` is None, else PLAIN with a HELLO) and waits for nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT)
    if username is None:
        sock.sendall(greeting(b"NULL") + command(b"READY", metadata(**{"Socket-Type":
                                                                        b"DEALER"})))
    else:
        sock.sendall(greeting(b"PLAIN") + hello(username, password))
    return sock


def zmtp_connect(port: int, username: bytes, password: bytes) -> socket.socket:
    """A TCP connection through the PLAIN handshake, ready for frames."""
    sock = zmtp_stranger(port, username, password)
    _recv_exact(sock, 64)
    assert read_command(sock)[0] == b"WELCOME"
    sock.sendall(command(b"INITIATE", metadata(**{"Socket-Type": b"DEALER"})))
    assert read_command(sock)[0] == b"READY"
    return sock


def frame_header(size: int, more: bool = False) -> bytes:
    return bytes([0x02 | (0x01 if more else 0)]) + struct.pack(">Q", size)


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    # One server of each kind (a broker shard is the same BrokerServer as the executor's).
    up = Up(tmp_path, "--kafka-port", "-1", "--connector-port", "-1",
            "--coordinator-kafka-port", "-1", "--brokers", "1")
    try:
        yield up
    finally:
        log = up.stop()
    assert "Traceback" not in log, log


def ports(up: Up) -> list[int]:
    """The coordinator, its catalog broker, the executor's broker."""
    status = json.loads(up.tq("status", "--json").stdout)
    found = [int(up.info["coordinator"].rsplit(":", 1)[1])] + [
        int(b["address"].rsplit(":", 1)[1]) for b in sorted(
            status["brokers"], key=lambda b: b["session_id"] is not None)]
    assert len(found) == 3, status
    return found


def admin_tokens(up: Up) -> list[bytes]:
    """The admin's handshake token for each of `ports(up)`."""
    secret = load_credential(up.info["secret_file"]).key
    return [handshake_token(audience_key(secret, audience))
            for audience in (COORDINATOR, BROKER, BROKER)]


STRANGERS = (
    (None, b""),                              # ZeroMQ's NULL mechanism: no credential at all
    (b"admin", b"0" * 64),                    # a real principal, a made-up token
    (b"user:mallory", b"made up"),            # a principal nobody knows
)


def test_a_peer_without_a_credential_is_closed_at_the_handshake(up: Up) -> None:
    # A refused peer that does not hang up itself is closed at the handshake interval: the
    # strangers wait for that together, not one after another.
    cases = [(port, username, password) for port in ports(up)
             for username, password in STRANGERS]
    socks = [zmtp_stranger(port, username, password) for port, username, password in cases]
    try:
        with ThreadPoolExecutor(len(socks)) as pool:
            answers = list(pool.map(server_commands, socks))
    finally:
        for sock in socks:
            sock.close()
    for (port, username, _), answered in zip(cases, answers, strict=True):
        assert b"WELCOME" not in answered and b"READY" not in answered, (port, username)
        if username == b"admin":  # every server knows the admin's key: refused at once
            assert answered == [b"ERROR 400"], (port, answered)


def test_a_frame_over_a_server_limit_is_refused_by_its_announced_size(up: Up) -> None:
    from coordinator._server import RPC_LIMITS
    from querylib.server.broker import BrokerLimits
    from querylib.server.broker._server import server_limits

    coordinator, catalog_broker, broker = ports(up)
    broker_limit = server_limits(BrokerLimits()).receive_bytes
    for port, token, limit in zip((coordinator, catalog_broker, broker), admin_tokens(up),
                                  (RPC_LIMITS.receive_bytes, broker_limit, broker_limit),
                                  strict=True):
        with zmtp_connect(port, b"admin", token) as sock:
            sock.sendall(frame_header(limit + 1))  # the size alone: no byte of the body
            assert closed_by_server(sock), port


def _peak_rss_while(up: Up, send: Callable[..., object], targets: list[tuple]
                    ) -> tuple[int, list]:
    """Run `send(*target)` on a thread per target while sampling tq up's RSS every 10 ms;
    (peak RSS, what the sends returned)."""
    process = psutil.Process(up.proc.pid)
    peak = [process.memory_info().rss]
    done_sending = threading.Event()

    def sample() -> None:
        while not done_sending.wait(0.01):
            peak.append(process.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    results: list = []
    senders = [threading.Thread(target=lambda t=target: results.append(send(*t)))
               for target in targets]
    try:
        for t in senders:
            t.start()
        for t in senders:
            t.join(600)
    finally:
        done_sending.set()
        sampler.join(10)
    assert len(results) == len(senders), "a sender did not finish"
    return max(peak), results


def test_oversized_unsigned_messages_keep_tq_up_small(up: Up) -> None:
    """An authenticated peer's 90 MiB frames: each connection closed at the frame header."""
    chunk = memoryview(bytes(MESSAGE))

    def send_unsigned(port: int, token: bytes) -> int:
        """PER_PORT // CONNECTIONS single-frame messages of MESSAGE bytes, each on a fresh
        connection once the last is refused; how many the server read whole."""
        whole = 0
        for _ in range(PER_PORT // CONNECTIONS):
            with zmtp_connect(port, b"admin", token) as sock:
                sock.sendall(frame_header(MESSAGE))
                try:
                    sent = 0
                    while sent < MESSAGE:
                        sent += sock.send(chunk[:MESSAGE - sent])
                    whole += 1
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused mid-way: what we expect of a server that bounds its frames
        return whole

    targets = [(port, token) for port, token in zip(ports(up), admin_tokens(up), strict=True)
               for _ in range(CONNECTIONS)]
    peak, results = _peak_rss_while(up, send_unsigned, targets)
    assert peak < RSS_LIMIT, f"tq up peaked at {peak / 2**20:.0f} MiB"
    assert sum(results) == 0, "every oversized message was refused before it was read"
    done = up.tq("status", "--json")  # and it serves as before
    assert done.returncode == 0, done.stderr


def test_an_unsigned_message_of_many_frames_is_not_buffered_whole(up: Up) -> None:
    """ZMQ_MAXMSGSIZE bounds each frame, and zmq hands a message over only once its last
    frame is in: 20 frames of ~8 MiB from each stranger, sent without waiting for the
    server, would be one message of 160 MiB buffered per connection. Strangers never get
    past the handshake, so none is."""
    from querylib.server.broker import BrokerLimits
    from querylib.server.broker._server import server_limits

    part = server_limits(BrokerLimits()).receive_bytes - 1024
    chunk = memoryview(bytes(part))

    def send(port: int, username: bytes | None, password: bytes
             ) -> tuple[tuple[int, bytes | None], list[bytes]]:
        with zmtp_stranger(port, username, password) as sock:
            try:
                for i in range(20):  # one message of 20 frames
                    sock.sendall(frame_header(part, more=i < 19))
                    sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return (port, username), server_commands(sock)

    targets = [(port, *stranger) for port in ports(up) for stranger in STRANGERS]
    peak, answers = _peak_rss_while(up, send, targets)
    assert peak < RSS_LIMIT, f"tq up peaked at {peak / 2**20:.0f} MiB"
    for target, answered in answers:
        assert b"WELCOME" not in answered and b"READY" not in answered, (target, answered)
    done = up.tq("status", "--json")
    assert done.returncode == 0, done.stderr
