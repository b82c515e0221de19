"""Benchmark suite "coordinator": `python -m querylib.bench coordinator`.

A real coordinator process (its own data directory, fresh ports) is loaded with 200 simulated
executors (each a session, a broker and an executor record) and 10,000 topics of 4 partitions,
created by concurrent clients. Then:

  coordinator_rpc          round trips/s from 4 client processes (heartbeats: the request goes
                           through the core and renews a lease), Ping as the RPC layer's baseline
  coordinator_rss          the coordinator process's resident memory
  coordinator_snapshot     time for a new follower to receive the consolidated snapshot of
                           `topics` (10,000 records), and of every collection at once
  coordinator_recovery     SIGKILL, restart: time to rebuild the catalog and serve again

Not a test: the numbers depend on the machine and on what else runs. Rows are
{"name", "figures", "baseline"?, "goal"}. Client processes are spawned, never forked (a zmq
context must not cross a fork). This module never imports `coordinator`: it runs it as a
process, as users do.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from catalog import Resources, SessionKind
from querylib.cluster import AsyncCluster, Cluster
from querylib.cluster import messages as m
from querylib.rpc import Ping, RpcClient, load_or_create_secret

__all__ = ["run"]

_SERVE = """
import json, sys
from coordinator import CoordinatorConfig, run_coordinator
from querylib.rpc import load_secret
data, listen, broker, secret_file = sys.argv[1:5]
def ready(c):
    print(json.dumps({"start_s": c.recovery_seconds, "version": c.state.catalog.version,
                      "records": c.recovered.records}), flush=True)
sys.exit(run_coordinator(data, listen, load_secret(secret_file), secret_file,
                         broker_listen=broker, config=CoordinatorConfig(max_lease_ms=3_600_000),
                         home=data, on_ready=ready))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _CoordinatorProcess:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.secret_file = root / "secret"
        self.secret = load_or_create_secret(self.secret_file)
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        self.broker = f"tcp://127.0.0.1:{_free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> tuple[float, dict[str, Any]]:
        """Start and wait until it answers: (seconds that took, what the process reported:
        its own start-up time `start_s`, the catalog version, the updates it replayed)."""
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(self.root / "data"), self.address, self.broker,
             str(self.secret_file)], start_new_session=True, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the coordinator exited during start-up")
        with Cluster(self.address, self.secret, session=False, connect_timeout=60) as cluster:
            cluster.info()
        return time.perf_counter() - started, json.loads(line)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def rss(self) -> int:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).memory_info().rss


async def _load(address: str, secret: bytes, executors: int, topics: int,
                partitions: int) -> dict[str, float]:
    """200 executor agents (long leases, so they need no heartbeats here), then the topics."""
    started = time.perf_counter()
    agents = []
    for i in range(executors):
        agent = await AsyncCluster(address, secret, kind=SessionKind.EXECUTOR, lease=3600.0,
                                   peer=f"simulated executor {i}").start()
        broker = await agent.register_broker(f"host-{i}", f"tcp://10.0.{i // 250}.{i % 250}:7411")
        await agent.register_executor(f"host-{i}", broker.broker_id,
                                      Resources(cores=8, memory=32 << 30, disk=1 << 40,
                                                slots=8))
        agents.append(agent)
    registered = time.perf_counter()
    owner = await AsyncCluster(address, secret, lease=3600.0, peer="bench loader").start()
    concurrency = 64

    async def create(worker: int) -> None:
        for i in range(worker, topics, concurrency):
            await owner.create_topic(f"bench-{i:05d}", partitions)

    await asyncio.gather(*(create(w) for w in range(concurrency)))
    created = time.perf_counter()
    for agent in agents:  # their sessions stay open in the coordinator (leases of an hour)
        await agent.client.close()
    await owner.client.close()
    return {"register_executors_s": round(registered - started, 2),
            "create_topics_s": round(created - registered, 2),
            "topic_creates_per_s": round(topics / (created - registered))}


def _rpc_client(address: str, secret: bytes, ping: bool, seconds: float, concurrency: int,
                barrier: Any, results: Any) -> None:
    results.put(asyncio.run(_rpc_main(address, secret, ping, seconds, concurrency, barrier)))


async def _rpc_main(address: str, secret: bytes, ping: bool, seconds: float,
                    concurrency: int, barrier: Any) -> tuple[int, float]:
    async with RpcClient(address, secret, timeout=60.0) as client:
        opened = await client.request(m.OpenSession(lease_ms=60_000, peer="bench rpc"))
        request: Any = Ping() if ping else m.Heartbeat(session_id=opened.session_id)
        await client.request(request)
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 120)
        done = 0
        start = time.perf_counter()
        stop_at = start + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await client.request(request)
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        await client.request(m.CloseSession(session_id=opened.session_id))
        return done, elapsed


def round_trips(address: str, secret: bytes, pid: int, *, ping: bool = False,
                clients: int = 4, seconds: float = 3.0, concurrency: int = 32
                ) -> tuple[int, float]:
    """(round trips/s over all clients, CPU µs the coordinator process spent per round trip).
    The clients share the machine with the coordinator: on few cores they compete with it."""
    mp = multiprocessing.get_context("spawn")
    barrier = mp.Barrier(clients + 1)
    results = mp.Queue()
    children = [mp.Process(target=_rpc_client, daemon=True,
                           args=(address, secret, ping, seconds, concurrency, barrier, results))
                for _ in range(clients)]
    try:
        for child in children:
            child.start()
        barrier.wait(timeout=120)
        server = psutil.Process(pid)
        cpu = server.cpu_times()
        rows = [results.get(timeout=seconds + 120) for _ in children]
        spent = sum(server.cpu_times()[:2]) - sum(cpu[:2])
    finally:
        for child in children:
            if child.pid is None:
                continue  # never started
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    total = sum(count for count, _ in rows)
    return (round(sum(count / elapsed for count, elapsed in rows)),
            round(spent / max(total, 1) * 1e6, 1))


def _snapshot_seconds(address: str, secret: bytes, *collections: str) -> float:
    with Cluster(address, secret, session=False) as cluster:
        started = time.perf_counter()
        cluster.snapshot(*collections, timeout=60)
        return time.perf_counter() - started


def run(executors: int = 200, topics: int = 10_000, partitions: int = 4) -> Iterator[dict]:
    """The rows `python -m querylib.bench coordinator` prints."""
    with tempfile.TemporaryDirectory(prefix="tq-bench-coordinator-") as tmp:
        proc = _CoordinatorProcess(Path(tmp))
        try:
            proc.start()
            setup = asyncio.run(_load(proc.address, proc.secret, executors, topics, partitions))
            scale = {"executors": executors, "topics": topics, "partitions": partitions}
            heartbeats, heartbeat_cpu = round_trips(proc.address, proc.secret, proc.pid)
            pings, ping_cpu = round_trips(proc.address, proc.secret, proc.pid, ping=True)
            yield {"name": "coordinator_rpc",
                   "figures": {"heartbeat_round_trips_per_s": heartbeats, "clients": 4,
                               "in_flight_per_client": 32,
                               "coordinator_cpu_us_per_heartbeat": heartbeat_cpu,
                               "one_core_heartbeats_per_s": round(1e6 / heartbeat_cpu),
                               "cores": os.cpu_count(), **scale},
                   "baseline": {"ping_round_trips_per_s": pings,
                                "coordinator_cpu_us_per_ping": ping_cpu},
                   "goal": {"heartbeat_round_trips_per_s": ">= 20000"}}
            yield {"name": "coordinator_rss",
                   "figures": {"rss_mb": round(proc.rss / 2**20, 1), **scale, **setup},
                   "goal": {"rss_mb": "<= 300"}}
            topics_s = min(_snapshot_seconds(proc.address, proc.secret, "topics")
                           for _ in range(3))
            all_s = _snapshot_seconds(proc.address, proc.secret, "sessions", "brokers",
                                      "executors", "queries", "topics", "publications",
                                      "subscriptions", "counters")
            yield {"name": "coordinator_snapshot",
                   "figures": {"topics_snapshot_ms": round(topics_s * 1000, 1),
                               "all_collections_snapshot_ms": round(all_s * 1000, 1), **scale},
                   "goal": {"topics_snapshot_ms": "<= 200"}}
            proc.kill()
            restart_s, report = proc.start()
            yield {"name": "coordinator_recovery",
                   "figures": {"recovery_s": round(report["start_s"], 3),
                               "restart_until_serving_s": round(restart_s, 2),
                               "replayed_updates": report["records"],
                               "catalog_version": report["version"], **scale},
                   "baseline": {"note": "recovery_s: read the catalog topics, replay, start "
                                "the broker, bootstrap; restart_until_serving_s adds the "
                                "interpreter and imports"},
                   "goal": {"recovery_s": "<= 2"}}
        finally:
            proc.stop()
