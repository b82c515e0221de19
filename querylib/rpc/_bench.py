"""Benchmark of the RPC layer: Ping round trips/s from N client processes against one server.

    python -c "from querylib.rpc._bench import echo_round_trips; print(echo_round_trips())"

`run()` yields rows in the shape `python -m querylib.bench` prints (suite module protocol).
Not a test: numbers depend on the machine and on whatever else runs on it. The server runs
on an event loop thread in this process; clients are spawned processes (never forked: a zmq
context must not cross a fork), each keeping `concurrency` requests in flight.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from ._client import RpcClient
from ._messages import Ping
from ._server import RpcServer

__all__ = ["echo_round_trips", "run"]


def echo_round_trips(clients: int = 4, seconds: float = 3.0, concurrency: int = 32,
                     payload_bytes: int = 0) -> dict[str, Any]:
    """Round trips/s of Ping (echoing `payload_bytes` in one payload frame each way)."""
    secret = os.urandom(32)
    server, loop, thread = _start_server(secret)
    mp = multiprocessing.get_context("spawn")
    barrier = mp.Barrier(clients + 1)
    results = mp.Queue()
    children = [mp.Process(target=_client_process, daemon=True,
                           args=(server.endpoint, secret, concurrency, seconds, payload_bytes,
                                 barrier, results))
                for _ in range(clients)]
    try:
        for child in children:
            child.start()
        barrier.wait(timeout=120)  # every client connected and warmed up
        cpu_start = time.process_time()
        loop_cpu_start = _loop_thread_time(loop)
        rows = [results.get(timeout=seconds + 120) for _ in children]
        loop_cpu = _loop_thread_time(loop) - loop_cpu_start
        server_cpu = time.process_time() - cpu_start
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
    rate = sum(count / elapsed for count, elapsed in rows)
    total = sum(count for count, _ in rows)
    return {
        "name": "rpc_echo",
        "clients": clients,
        "concurrency": concurrency,
        "payload_bytes": payload_bytes,
        "seconds": seconds,
        "round_trips_per_s": round(rate),
        "payload_mb_per_s": round(rate * payload_bytes / 1e6, 1),
        # CPU of this process (server loop + zmq I/O thread), and of the loop thread alone, per
        # round trip: comparable across loads where the rate is not (1e6 / the loop's figure
        # is what one free core would serve).
        "server_cpu_us_per_round_trip": round(server_cpu / max(total, 1) * 1e6, 1),
        "server_loop_cpu_us_per_round_trip": round(loop_cpu / max(total, 1) * 1e6, 1),
        "server_drops": server.counters,
    }


def run() -> Iterator[dict[str, Any]]:
    """The rows `python -m querylib.bench rpc` prints."""
    yield echo_round_trips(clients=4, seconds=3.0, concurrency=32)
    # One caller, one request at a time: the latency bound rather than the CPU one.
    yield {**echo_round_trips(clients=1, seconds=3.0, concurrency=1),
           "name": "rpc_echo_sequential"}
    yield echo_round_trips(clients=1, seconds=3.0, concurrency=8, payload_bytes=100_000)


def _loop_thread_time(loop: asyncio.AbstractEventLoop) -> float:
    async def read() -> float:
        return time.thread_time()
    return asyncio.run_coroutine_threadsafe(read(), loop).result(30)


def _start_server(secret: bytes) -> tuple[RpcServer, asyncio.AbstractEventLoop,
                                          threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="rpc-bench-server", daemon=True)
    thread.start()
    server = RpcServer(secret)
    asyncio.run_coroutine_threadsafe(server.start("tcp://127.0.0.1:0"), loop).result(30)
    return server, loop, thread


def _client_process(endpoint: str, secret: bytes, concurrency: int, seconds: float,
                    payload_bytes: int, barrier: Any, results: Any) -> None:
    results.put(asyncio.run(_client_main(endpoint, secret, concurrency, seconds,
                                         payload_bytes, barrier)))


async def _client_main(endpoint: str, secret: bytes, concurrency: int, seconds: float,
                       payload_bytes: int, barrier: Any) -> tuple[int, float]:
    payload = [os.urandom(payload_bytes)] if payload_bytes else []
    async with RpcClient(endpoint, secret, timeout=60.0) as client:
        await client.exchange(Ping(), payload=payload)
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 120)
        done = 0
        start = time.perf_counter()
        stop_at = start + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await client.exchange(Ping(), payload=payload)
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, time.perf_counter() - start
