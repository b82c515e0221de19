"""Connection floods against `tq up`'s Kafka listener (loopback only, bounded in count and
time): 25,000 connections, more than its open-files limit allows, held open. `tq up` keeps
answering `tq status` and runs a query, its executor keeps its coordinator session, it holds
no more connections than its descriptor budget, its log says what it refused in a few lines
(no traceback per connection), and Kafka clients are served again once the flood is gone. And
1,000 idle Kafka connections closed by a short idle timeout (`--kafka-idle-ms`)."""

from __future__ import annotations

import json
import math
import resource
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from querylib._tcp import fd_reserve
from tests.conftest import Processes, free_port
from tests.coordinator._cluster import ROOT
from tests.integration._up import Up

FLOOD = 25_000
PUBLISHER = textwrap.dedent("""
    import sys
    import querylib

    def main(ctx):
        with ctx.publish(sys.argv[1]) as out:
            for t in range(10):
                out.send(t, [b"x" * 100] * 100)

    querylib.execute(main)
""")
SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]  # each its own ephemeral port range


def _fd_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files limit in /proc")


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _status(up: Up) -> dict:
    done = up.tq("status", "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _executors(status: dict) -> list[tuple[int, int]]:
    return sorted((e["executor_id"], e["session_id"]) for e in status["executors"])


def test_a_connection_flood_costs_the_executor_nothing(tmp_path: Path,
                                                       processes: Processes) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    per_process = min(hard - 200, 8_000)
    floods = math.ceil(FLOOD / max(per_process, 1))
    if per_process < 1000 or floods > len(SOURCES):
        pytest.skip(f"the open-files hard limit ({hard}) is too low to hold {FLOOD} "
                    f"connections from {len(SOURCES)} processes")
    kafka_port = free_port()
    up = Up(tmp_path, "--kafka-port", str(kafka_port), "--connector-port", "-1",
            "--coordinator-kafka-port", "-1")
    try:
        before = _status(up)
        assert _executors(before), before
        limit = _fd_limit(up.proc.pid)
        budget = limit - fd_reserve(limit)
        children = [processes.python(
            "-m", "tests.faults._flood", "127.0.0.1", str(kafka_port),
            str(FLOOD // floods + (1 if i < FLOOD % floods else 0)), SOURCES[i],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for i in range(floods)]
        # While the flood connects: tq status answers, each time.
        during = [_status(up) for _ in range(3)]
        reports = [json.loads(child.stdout.readline()) for child in children]
        assert sum(r["opened"] for r in reports) + sum(
            sum(r["failed"].values()) for r in reports) == FLOOD, reports
        # What it accepted stays within its budget: the reserve is left for its own sockets.
        fds = _open_fds(up.proc.pid)
        assert fds < budget + fd_reserve(limit) // 2, (fds, limit)
        during.append(_status(up))
        # A query started now needs new ZeroMQ connections into tq up (its session, its
        # broker): the descriptors kept in reserve serve them.
        program = tmp_path / "publish.py"
        program.write_text(PUBLISHER)
        query = up.ended(up.submit(program, "during-flood"))
        assert query.state.value == "finished", query
        during.append(_status(up))
        for child in children:
            child.stdin.close()
            child.wait(timeout=60)
        after = _status(up)
        # The same executor on the same session all along: it never lost the coordinator.
        assert all(_executors(s) == _executors(before) for s in during + [after])
        _kafka_client_is_served(kafka_port)
    finally:
        log = up.stop()
    assert "rejoin" not in log, log[-3000:]
    assert "Traceback" not in log and "Too many open files" not in log, log[-3000:]
    refusals = [line for line in log.splitlines() if "refused" in line]
    assert refusals, "the flood went beyond the budget: refusals are said"
    assert "process's limit" in refusals[0]
    # Once at the first refusal, then at most one summary per 10 s: a handful of lines.
    assert len(log.splitlines()) < 30, log


def test_idle_kafka_connections_are_closed_by_the_idle_timeout(tmp_path: Path) -> None:
    kafka_port = free_port()
    up = Up(tmp_path, "--kafka-port", str(kafka_port), "--kafka-idle-ms", "1000",
            "--connector-port", "-1", "--coordinator-kafka-port", "-1")
    idle: list[socket.socket] = []
    try:
        idle = [socket.create_connection(("127.0.0.1", kafka_port), timeout=30)
                for _ in range(1000)]
        for sock in idle:  # each is closed by tq up: EOF, well within the 30 s deadline
            assert sock.recv(1) == b""
        _kafka_client_is_served(kafka_port)  # a client that talks is served as before
    finally:
        for sock in idle:
            sock.close()
        log = up.stop()
    assert "Traceback" not in log, log


def _kafka_client_is_served(port: int) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    metadata = admin.list_topics(timeout=20)
    assert metadata.brokers, "Metadata answered after the flood"
