"""The accept loop of tq's TCP listeners: the process's connection budget and each listener's
share of it, refusals summed up in the log, and accept() failing for want of descriptors
(EMFILE) without a traceback per connection and without stopping the other listeners."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess

import pytest

from querylib._tcp import Connection, ConnectionBudget, RefusalLog, TcpListener, fd_reserve
from tests.conftest import wait_for
from tests.coordinator._cluster import ROOT


def test_the_reserve_is_a_quarter_of_the_limit_within_bounds() -> None:
    assert fd_reserve(1024) == 512
    assert fd_reserve(20_000) == 5_000
    assert fd_reserve(600) == 300  # never more than half
    assert fd_reserve(1 << 20) == 1 << 18


def test_each_listener_keeps_a_share_of_the_budget() -> None:
    budget = ConnectionBudget(100)
    a, b = object(), object()
    budget.register(a)
    budget.register(b)
    share = budget.share()
    assert share == 12  # 100 // (4 * 2)
    taken = 0
    while budget.try_take(a):
        taken += 1
    assert taken == 100 - share, "a cannot take what b keeps"
    assert all(budget.try_take(b) for _ in range(share))
    assert not budget.try_take(b)
    budget.give_back(a)
    assert budget.try_take(b), "a slot given back is free for anyone"
    budget.unregister(a)
    assert budget.in_use == share + 1


def test_refusals_are_logged_at_once_then_summed_up(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    log = logging.getLogger("querylib.test")

    async def run() -> None:
        refusals = RefusalLog("listener X", log, interval=0.2)
        for _ in range(500):
            refusals.add("at the limit")
        refusals.add("other")
        await asyncio.sleep(0.4)  # the interval passes: one summary of the rest
        refusals.close()

    asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "listener X: refused 1 connection(s) in the last 0.2s: 1 at the limit",
        "listener X: refused 500 connection(s) in the last 0.2s: 499 at the limit, 1 other"]


async def _echo(conn: Connection) -> None:
    reader, writer = await conn.streams()
    writer.write(await reader.read(100))
    await writer.drain()
    await reader.read(100)


def _round_trip(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"ping")
        try:
            return s.recv(100) == b"ping"
        except ConnectionError:
            return False


def test_a_flood_on_one_listener_leaves_the_other_its_share() -> None:
    async def run() -> None:
        budget = ConnectionBudget(40)
        flooded = TcpListener("flooded", _echo, "127.0.0.1", 0, budget=budget)
        other = TcpListener("other", _echo, "127.0.0.1", 0, budget=budget)
        flood_port = (await flooded.start())[1]
        other_port = (await other.start())[1]
        loop = asyncio.get_running_loop()
        flood = [await asyncio.open_connection("127.0.0.1", flood_port) for _ in range(60)]
        for _r, w in flood:
            w.write(b"x")
        await asyncio.wait_for(_until(lambda: flooded.counters["refused"] >= 60 - 35), 10)
        assert flooded.open_connections == 40 - 5  # the other keeps 40 // 8 = 5
        assert await loop.run_in_executor(None, _round_trip, other_port)
        for _r, w in flood:
            w.close()
        await flooded.close()
        await other.close()

    asyncio.run(run())


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_out_of_descriptors_accept_pauses_logs_once_and_recovers(processes) -> None:
    child = processes.python("-m", "tests.querylib._fd_starved", cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)

    def answer() -> dict:
        line = child.stdout.readline()
        if not line:
            raise AssertionError(f"the child ended: {child.stderr.read()}")
        return json.loads(line)

    def ask(command: str) -> dict:
        child.stdin.write(command + "\n")
        child.stdin.flush()
        return answer()

    ready = answer()
    port_a, port_b = ready["ports"]
    assert ready["hogged"] > 0
    # 150 connections complete in the kernel's backlog; the listener cannot accept them.
    flood = [socket.create_connection(("127.0.0.1", port_a), timeout=5) for _ in range(150)]
    try:
        wait_for(lambda: ask("status")["a"].get("accept_failed", 0) >= 3, timeout=20,
                 what="accept() to fail (and be retried) for want of descriptors")
        ask("release")
        wait_for(lambda: ask("status")["a"].get("accepted", 0) == 150, timeout=20,
                 what="the backlog to be accepted once descriptors are back")
        assert _round_trip(port_a) and _round_trip(port_b)
        failures = ask("status")["a"]["accept_failed"]
    finally:
        for s in flood:
            s.close()
    child.stdin.write("stop\n")
    child.stdin.close()
    child.wait(timeout=20)
    log = child.stderr.read()
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if "accept() out of descriptors" in line]
    # The first failure is said at once, the rest summed up: not one line per failure.
    assert 1 <= len(lines) <= 2 + int(failures * 0.25 / 10), (failures, lines)
    assert "Too many open files" in lines[0]
