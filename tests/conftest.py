"""Shared test helpers: wait on a condition with a deadline, free loopback ports, child processes
that are always stopped."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import settings

from querylib.driver import Driver

settings.register_profile("tq", deadline=None, max_examples=100)
settings.load_profile("tq")

# Tests never depend on the caller's environment: a user who exported TQ_HOME (as the demo's
# closing hint suggests) or TQ_COORDINATOR, TQ_CREDENTIALS... must not point the tests' clients
# and children at their own cluster. Only the tests' own knobs stay (TQ_FAULT_SEED,
# TQ_CHECK_INVARIANTS, and TQ_RPC_CURVE=1: the suite with every RPC link CURVE).
_TEST_KNOBS = frozenset({"TQ_FAULT_SEED", "TQ_CHECK_INVARIANTS", "TQ_RPC_CURVE"})
for _name in [name for name in os.environ if name.startswith("TQ_") and name not in _TEST_KNOBS]:
    del os.environ[_name]

T = TypeVar("T")

# Every shell's driver checks its core's invariants after each step in the tests (DESIGN §1
# "Pure cores and their driver"); a test that breaks one fails.
Driver.check_invariants = True


@pytest.fixture(autouse=True)
def _invariants_hold() -> Iterator[None]:
    Driver.broken.clear()
    yield
    broken = list(Driver.broken)
    Driver.broken.clear()
    assert broken == [], f"invariants broken during the test: {broken}"


async def wait_for_async(condition: Callable[[], T], *, timeout: float = 10.0,
                         interval: float = 0.005, what: str = "condition") -> T:
    """`wait_for` for coroutines: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_for(condition: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.01,
             what: str = "condition") -> T:
    """Poll `condition` until it returns a truthy value or the deadline passes (then fail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def broker_dirs(executor_data: Path) -> list[Path]:
    """An executor's broker data dirs: broker 0's (`<data>/broker`), then each shard's
    (`<data>/broker-<k>/broker`), DESIGN §5 "The broker"."""
    return [executor_data / "broker", *sorted(executor_data.glob("broker-*/broker"))]


def partition_dir(executor_data: Path, name: str) -> Path | None:
    """The directory of partition `name` ("topic-0") under whichever of an executor's brokers
    holds it, None when none does (placement spreads a topic over a host's brokers)."""
    found = [d / name for d in broker_dirs(executor_data) if (d / name).is_dir()]
    assert len(found) <= 1, f"partition {name} is on several brokers: {found}"
    return found[0] if found else None


def free_port() -> int:
    """A port on 127.0.0.1 that is free now, and the one after it too (`tq up` and `tq
    coordinator` put their broker on listen port + 1). Taken below the kernel's ephemeral range
    (32768-60999 here): a port the kernel handed out with bind(0) could otherwise be given to
    another socket (a listener on port 0, an outgoing connection) before the server under test
    binds it. Nor is it a port (or the neighbour of one) this process handed out recently: a
    test asking for two ports before binding either (a Kafka port, then tq up's listen port)
    gets two that cannot collide."""
    for _ in range(200):
        port = _ports.randrange(20000, 32000)
        if port in _handed or port + 1 in _handed or port - 1 in _handed:
            continue
        if _bindable(port) and _bindable(port + 1):
            _handed.add(port)
            _recent.append(port)
            if len(_recent) > _REMEMBERED:
                _handed.discard(_recent.popleft())
            return port
    raise AssertionError("no free port pair found in 20000-32000")


_ports = random.Random()
_REMEMBERED = 1000
_recent: collections.deque[int] = collections.deque()
_handed: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Processes:
    """Starts child processes in their own process groups and kills every one at teardown."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(args, **kwargs)
        self.children.append(proc)
        return proc

    def python(self, *args: str, **kwargs) -> subprocess.Popen:
        return self.start([sys.executable, *args], **kwargs)

    def stop_all(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.stop_all()
