"""Peers measured in the same run as tq: Redis Streams (append-only file) and NATS JetStream
(file storage), each a real server started on a free loopback port in a temporary folder,
when it is installed (`apt-get install redis-server nats-server`) with its Python client
(the `bench` extra: redis, nats-py); otherwise the row says why it was skipped.

Each peer moves 100-byte records from a producer process to a consumer process:
- batched: Redis pipelines 1,000 XADDs per round trip, JetStream keeps up to 1,000
  asynchronous publishes in flight (tq's counterpart: 1,000-record batches);
- one at a time: each record published and acknowledged alone (a Redis XADD per round trip;
  a JetStream publish awaiting its ack), tq's counterpart being 1-record batches.
The consumer's records/s from its first record to its last is the figure. The peers' Python
clients (redis-py, nats-py) bound these figures more than their servers do: read them as what
a Python program gets from each, which is what tq's figures are too.

Must not: leave a server or a folder behind, or talk to anything but loopback.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["nats_jetstream", "redis_streams", "run"]

RECORD_BYTES = 100
BATCH = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the peer server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"the peer server did not listen on {port} within {timeout:g}s")


def _die_with_parent(bench: int) -> None:
    """In the child before exec: the kernel kills it when the bench dies, however it dies
    (a `timeout`, a Ctrl-C, SIGKILL), so no server outlives its run."""
    from querylib._parent import die_with_parent

    if not die_with_parent(bench):
        os._exit(1)  # the bench is gone already


class _Server:
    def __init__(self, args: list[str], port: int, folder: str) -> None:
        self.folder = folder
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=functools.partial(_die_with_parent, os.getpid()))
        try:
            _wait_port(port, self.proc)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _run_pair(producer: Any, consumer: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    reader = mp.Process(target=consumer, args=(*args, queue), daemon=True)
    reader.start()
    assert queue.get(timeout=60) == "ready"
    writer = mp.Process(target=producer, args=args, daemon=True)
    writer.start()
    result = queue.get(timeout=600)
    for child in (writer, reader):
        child.join(30)
        if child.is_alive():
            child.terminate()
    return result


# -- Redis Streams ----------------------------------------------------------------------------


def _redis_produce(port: int, records: int, batched: bool) -> None:
    import redis

    client = redis.Redis(port=port)
    value = bytes(RECORD_BYTES)
    if batched:
        for _ in range(records // BATCH):
            pipe = client.pipeline(transaction=False)
            for _ in range(BATCH):
                pipe.xadd("bench", {"v": value})
            pipe.execute()
    else:
        for _ in range(records):
            client.xadd("bench", {"v": value})


def _redis_consume(port: int, records: int, batched: bool, queue: Any) -> None:
    import redis

    client = redis.Redis(port=port)
    client.ping()
    queue.put("ready")
    last, seen, first = "0", 0, None
    while seen < records:
        found: Any = client.xread({"bench": last}, count=10_000, block=30_000)
        if not found:
            break
        first = first or time.perf_counter()
        entries = found[0][1]
        seen += len(entries)
        last = entries[-1][0]
    queue.put({"records": seen, "seconds": time.perf_counter() - (first or 0.0)})


def redis_streams(records: int = 500_000, single: int = 20_000) -> dict[str, Any]:
    if shutil.which("redis-server") is None:
        return {"name": "peer_redis_streams", "skipped": "redis-server is not installed"}
    try:
        import redis  # noqa: F401
    except ImportError:
        return {"name": "peer_redis_streams", "skipped": "the redis client is not installed "
                                                         "(the bench extra)"}
    figures = {}
    for batched, count in ((True, records), (False, single)):
        port, folder = _free_port(), tempfile.mkdtemp(prefix="tq-bench-redis-")
        server = _Server(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                          "--dir", folder, "--appendonly", "yes", "--appendfsync", "everysec",
                          "--save", ""], port, folder)
        try:
            result = _run_pair(_redis_produce, _redis_consume, (port, count, batched))
        finally:
            server.close()
        figures["batched_1000" if batched else "one_at_a_time"] = {
            "records_per_s": round(result["records"] / max(result["seconds"], 1e-9)),
            "records": result["records"]}
    return {"name": "peer_redis_streams", "figures": figures,
            "note": "XADD to one stream, append-only file (fsync every second, as tq's "
                    "default flush never syncs per write), XREAD by a second process"}


# -- NATS JetStream ---------------------------------------------------------------------------


def _nats_produce(port: int, records: int, batched: bool) -> None:
    asyncio.run(_nats_publish(port, records, batched))


async def _nats_publish(port: int, records: int, batched: bool) -> None:
    import nats

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    js = connection.jetstream()
    value = bytes(RECORD_BYTES)
    if batched:
        for i in range(records):
            await js.publish_async("bench", value, wait_stall=30.0)
            if i % BATCH == BATCH - 1:
                await js.publish_async_completed()
    else:
        for _ in range(records):
            await js.publish("bench", value)
    await connection.drain()


def _nats_consume(port: int, records: int, batched: bool, queue: Any) -> None:
    asyncio.run(_nats_read(port, records, queue))


async def _nats_read(port: int, records: int, queue: Any) -> None:
    import nats

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    js = connection.jetstream()
    await js.add_stream(name="bench", subjects=["bench"])  # file storage by default
    # An ordered push consumer: flow-controlled delivery, no acknowledgements (as tq's
    # subscribers, whose position is theirs).
    state = {"seen": 0, "first": 0.0}
    done = asyncio.Event()

    async def count(_message: Any) -> None:
        if not state["seen"]:
            state["first"] = time.perf_counter()
        state["seen"] += 1
        if state["seen"] >= records:
            done.set()

    await js.subscribe("bench", cb=count, ordered_consumer=True)
    queue.put("ready")
    try:
        await asyncio.wait_for(done.wait(), 600)
    except TimeoutError:
        pass
    queue.put({"records": state["seen"], "seconds": time.perf_counter() - state["first"]})
    await connection.drain()


def nats_jetstream(records: int = 500_000, single: int = 20_000) -> dict[str, Any]:
    if shutil.which("nats-server") is None:
        return {"name": "peer_nats_jetstream", "skipped": "nats-server is not installed"}
    try:
        import nats  # noqa: F401
    except ImportError:
        return {"name": "peer_nats_jetstream", "skipped": "the nats-py client is not "
                                                          "installed (the bench extra)"}
    figures = {}
    for batched, count in ((True, records), (False, single)):
        port, folder = _free_port(), tempfile.mkdtemp(prefix="tq-bench-nats-")
        server = _Server(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js",
                          "-sd", folder], port, folder)
        try:
            result = _run_pair(_nats_produce, _nats_consume, (port, count, batched))
        finally:
            server.close()
        figures["async_publish" if batched else "one_at_a_time"] = {
            "records_per_s": round(result["records"] / max(result["seconds"], 1e-9)),
            "records": result["records"]}
    return {"name": "peer_nats_jetstream", "figures": figures,
            "note": "JetStream file storage; async publishes (up to 1,000 in flight) or each "
                    "awaiting its ack; an ordered push consumer in a second process"}


def run() -> Iterator[dict[str, Any]]:
    yield redis_streams()
    yield nats_jetstream()
