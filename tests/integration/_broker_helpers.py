"""Shared pieces of the broker integration tests: a broker process, client processes, and
following their JSON-line output."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from querylib.broker import list_partitions
from querylib.log import LogConfig
from querylib.rpc import RpcError, load_or_create_secret
from querylib.server.broker import BrokerServer, TopicAccess
from tests.conftest import Processes, wait_for


def secret_file(tmp_path: Path) -> tuple[str, bytes]:
    path = tmp_path / "secret"
    return str(path), load_or_create_secret(path)


class Lines:
    """A child's stdout, parsed line by line on a thread (each line one JSON object)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.items: list[dict] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.strip()
            if line:
                with self._lock:
                    self.items.append(json.loads(line))

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.items)

    def having(self, key: str) -> list[dict]:
        return [item for item in self.snapshot() if key in item]

    def wait(self, key: str, *, timeout: float = 30.0, count: int = 1) -> list[dict]:
        return wait_for(lambda: len(self.having(key)) >= count and self.having(key),
                        timeout=timeout, what=f"{count} {key!r} line(s) from pid {self.proc.pid}")

    def finish(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout=timeout)
        self._thread.join(timeout=10)
        return code


def start_broker(processes: Processes, data: Path, port: int, secret_path: str,
                 secret: bytes, *, flush: str = "never",
                 kafka_port: int | None = None) -> subprocess.Popen:
    """`tq broker` as a child process (with a Kafka listener on `kafka_port`); returns once
    it answers requests."""
    kafka = () if kafka_port is None else ("--kafka-port", str(kafka_port))
    proc = processes.python("-m", "querylib.cli", "broker", "--data", str(data),
                            "--listen", f"tcp://127.0.0.1:{port}", "--secret-file",
                            secret_path, "--flush", flush, *kafka)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited with {proc.returncode}")
        try:
            list_partitions(f"tcp://127.0.0.1:{port}", secret, timeout=0.5)
        except RpcError:
            return False
        return True

    wait_for(answers, timeout=30.0, what="the broker to answer")
    return proc


def client(processes: Processes, mode: str, address: str, secret_path: str,
           *args: str) -> Lines:
    proc = processes.python("-m", "tests.integration._broker_clients", mode, "--broker",
                            address, "--secret-file", secret_path, *args,
                            stdout=subprocess.PIPE, text=True)
    return Lines(proc)


def data_values(lines: list[dict]) -> list[str]:
    return [v for item in lines if "data" in item for v in item["data"]]


def python() -> str:
    return sys.executable


@contextmanager
def broker_on_thread(data_dir: str, secret: bytes, config: LogConfig, **options: Any
                     ) -> Iterator[tuple[str, BrokerServer]]:
    """A BrokerServer (given `options`) on a loop of its own thread in this process: its
    address and itself; closed, and the loop stopped, on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = BrokerServer(data_dir, secret, log_config=config, **options)
    try:
        endpoint = asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
        yield endpoint, server
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def next_records(sub: Any, count: int) -> list[Any]:
    """The next `count` Records a blocking Subscriber hands out, waiting up to 30 s for each
    event."""
    from querylib.broker import Data

    got: list[Any] = []
    while len(got) < count:
        event = sub.next_event(timeout=30)
        assert event is not None, f"only {len(got)} records arrived: {got[-3:]}"
        if isinstance(event, Data):
            got += event.records
    return got


def read_records(sub: Any, count: int) -> list[tuple[int, bytes]]:
    """(offset, value) of the next `count` records a blocking Subscriber hands out."""
    return [(r.offset, bytes(r.value or b"")) for r in next_records(sub, count)]


class AliceOwnsMine:
    """A broker's topic directory for tests: topic "mine" is user:alice's; every other topic
    is open to anyone."""

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        return TopicAccess(topic, "user:alice" if topic == "mine" else "*")

    def watch(self, learn: object, forget: object) -> None:
        pass
