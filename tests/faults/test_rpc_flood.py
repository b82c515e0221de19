"""Oversized unsigned messages against `tq up`'s ZeroMQ ports (loopback only, bounded in count
and time): 20 messages of 90 MiB each to the coordinator, its catalog broker and the executor's
broker, four connections at a time per port, spoken in raw ZMTP as an attacker would. ZeroMQ
itself refuses them by their announced size, so `tq up` stays under 300 MB of RSS (sampled
while sending) and serves as before."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.integration._up import Up

MESSAGE = 90 * 1024 * 1024
PER_PORT = 20
CONNECTIONS = 4
RSS_LIMIT = 300 * 1024 * 1024

# ZMTP 3.0 greeting: signature, version 3.0, mechanism NULL, as-server 0, filler.
GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32


def _ready_command() -> bytes:
    name, value = b"Socket-Type", b"DEALER"
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    return bytes([0x04, len(body)]) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed during the handshake")
        data += chunk
    return data


def zmtp_connect(port: int) -> socket.socket:
    """A TCP connection to a ZeroMQ socket, through the NULL handshake, ready for frames."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(GREETING)
    _recv_exact(sock, 64)
    sock.sendall(_ready_command())
    flags, = _recv_exact(sock, 1)  # the server's READY command
    size = _recv_exact(sock, 8 if flags & 0x02 else 1)
    _recv_exact(sock, int.from_bytes(size, "big"))
    return sock


def frame_header(size: int, more: bool = False) -> bytes:
    return bytes([0x02 | (0x01 if more else 0)]) + struct.pack(">Q", size)


def send_unsigned(port: int, count: int, chunk: memoryview) -> int:
    """Send `count` single-frame messages of MESSAGE bytes, each on a fresh ZMTP connection
    once the last is refused; returns how many the server read whole (it closed none)."""
    whole = 0
    for _ in range(count):
        with zmtp_connect(port) as sock:
            sock.sendall(frame_header(MESSAGE))
            try:
                sent = 0
                while sent < MESSAGE:
                    sent += sock.send(chunk[:MESSAGE - sent])
                whole += 1
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused mid-way: what we expect of a server that bounds its frames
    return whole


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    up = Up(tmp_path, "--kafka-port", "-1", "--connector-port", "-1",
            "--coordinator-kafka-port", "-1")
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


def test_a_frame_over_a_server_limit_is_refused_by_its_announced_size(up: Up) -> None:
    from coordinator._server import RPC_LIMITS
    from querylib.broker import BrokerLimits
    from querylib.broker._server import server_limits

    coordinator, catalog_broker, broker = ports(up)
    broker_limit = server_limits(BrokerLimits()).receive_bytes
    for port, limit in ((coordinator, RPC_LIMITS.receive_bytes),
                        (catalog_broker, broker_limit), (broker, broker_limit)):
        with zmtp_connect(port) as sock:
            sock.sendall(frame_header(limit + 1))  # the size alone: no byte of the body
            assert closed_by_server(sock), port


def _peak_rss_while(up: Up, send: Callable[[int], int], targets: list[int]) -> tuple[int, list]:
    """Run `send(port)` on a thread per target port while sampling tq up's RSS every 10 ms;
    (peak RSS, what the sends returned)."""
    process = psutil.Process(up.proc.pid)
    peak = [process.memory_info().rss]
    done_sending = threading.Event()

    def sample() -> None:
        while not done_sending.wait(0.01):
            peak.append(process.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    results: list[int] = []
    senders = [threading.Thread(target=lambda p=port: results.append(send(p)))
               for port in targets]
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
    chunk = memoryview(bytes(MESSAGE))
    peak, results = _peak_rss_while(
        up, lambda port: send_unsigned(port, PER_PORT // CONNECTIONS, chunk),
        [port for port in ports(up) for _ in range(CONNECTIONS)])
    assert peak < RSS_LIMIT, f"tq up peaked at {peak / 2**20:.0f} MiB"
    assert sum(results) == 0, "every oversized message was refused before it was read"
    done = up.tq("status", "--json")  # and it serves as before
    assert done.returncode == 0, done.stderr


@pytest.mark.xfail(strict=True, reason=(
    "ZMQ_MAXMSGSIZE bounds each frame, and zmq delivers a message only once its last frame "
    "is in, counting messages, not frames, against the HWM: an unsigned message of many "
    "frames under the limit is buffered whole. Closing it needs peers authenticated at the "
    "ZMTP handshake (a ZAP handler), see DESIGN §2 \"Limits\"."))
def test_an_unsigned_message_of_many_frames_is_not_buffered_whole(up: Up) -> None:
    from querylib.broker import BrokerLimits
    from querylib.broker._server import server_limits

    part = server_limits(BrokerLimits()).receive_bytes - 1024
    chunk = memoryview(bytes(part))

    def send(port: int) -> int:
        with zmtp_connect(port) as sock:
            try:
                for i in range(20):  # 20 frames of ~8 MiB: one message of 160 MiB
                    sock.sendall(frame_header(part, more=i < 19))
                    sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return 0
            return 1

    broker = ports(up)[2]
    peak, _ = _peak_rss_while(up, send, [broker] * 3)
    assert peak < RSS_LIMIT, f"tq up peaked at {peak / 2**20:.0f} MiB"
