"""Publish/subscribe through a broker, end to end: `python -m querylib.bench pubsub`.

Rows (each {"name", "figures", "baseline", "ratio", "goal"}):
- pubsub_throughput: 100-byte records in batches of 1000 from a producer process through a
  broker process (appended to its log, flush policy "never" as Kafka's default: acknowledged
  once written to the OS) to a subscriber process. The producer sends pre-encoded batches and
  the subscriber counts records from batch headers, so this measures the transport and the
  broker. Baselines, both printed: raw ZeroMQ PUSH/PULL of the same batch bytes between two
  processes, its receiver counting frames only ("raw", noparse), and the same with a receiver
  decoding every record ("per_record"). Goal: >= 1,000,000 records/s and >= 0.3x raw.
- pubsub_throughput_codec: the same, but through the record API on both ends (Producer.send
  per record, the subscriber decodes every record into Data events): the per-record path.
  Goal (issue 17): >= 0.5x the per-record ZeroMQ peer. The codec's own ceiling is
  `python -m querylib.bench records`.
- pubsub_throughput_values: the same through the run-at-a-time paths a query uses
  (Producer.send_values of 1000 values per logical time; Subscriber(values=True)). No goal.
- pubsub_latency: records created at a steady 10,000/s (a batch of 10 every millisecond),
  latency from creation to the subscriber decoding it, with the asyncio clients (the main
  figures) and with the blocking ones. Goal: p50 <= 1 ms, p99 <= 5 ms.
- pubsub_rss: the broker's peak RSS while 100 subscribers read a large partition (default
  1 GiB; TQ_BENCH_PUBSUB_GB), each from a different offset, for a fixed time. Goal: <= 200 MB.
- pubsub_authorization_cost: the pre-built-batch and the send_values paths of this tq against
  the same paths of main before issue 13 (principals, per-principal keys, admission in the
  broker core, bounded listeners, idempotent producers), alternated round by round in this
  run (`_baseline.py`), min/median/max of each, and the broker process's CPU time per
  batch of 1000 records (all threads), which other work on the machine moves less than wall
  time, and the producer's and subscriber's together (sampled from outside every 20 ms, their
  start included). Goal: this tq >= 0.95x the baseline (records/s, medians).

Processes are spawned (never forked: a zmq context must not cross a fork) and all on this
machine: they share its cores with each other and with whatever else runs. Numbers are what
they are on that machine; nothing here asserts them.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterator
from typing import Any

RECORD_BYTES = 100
BATCH_RECORDS = 1000
_TS = struct.Struct(">q")


def _batch(created_ns: int | None = None, n: int = BATCH_RECORDS) -> bytes:
    from querylib.broker import encode_records

    value = bytes(RECORD_BYTES)
    now_ms = int(time.time() * 1000)
    if created_ns is not None:
        value = _TS.pack(created_ns) + value[8:]
    return encode_records([(None, value, (), now_ms, None)] * n)


def _count_records(data: Any) -> int:
    """Data records in delivered bytes, from the batch headers alone."""
    from querylib.records import read_header

    pos, n = 0, 0
    while pos < len(data):
        header = read_header(data, pos)
        if not data[pos + 22] & 0x20:  # not a control batch
            n += header.records_count
        pos += header.size
    return n


# -- processes ------------------------------------------------------------------------------


def _broker_process(data_dir: str, secret: bytes, queue: Any) -> None:
    from querylib.server import run_broker

    run_broker(data_dir, "tcp://127.0.0.1:0", secret, on_ready=queue.put)


def _producer_process(address: str, secret: bytes, topic: str, batches: int, mode: str,
                      queue: Any) -> None:
    from querylib.broker import Producer

    with Producer(address, topic, secret=secret, linger=0.0005) as producer:
        queue.put("ready")
        if mode == "prebuilt":
            batch = _batch()
            for _ in range(batches):
                producer.send_batch(batch)
        elif mode == "records":
            value = bytes(RECORD_BYTES)
            for _ in range(batches * BATCH_RECORDS):
                producer.send(value)
        elif mode == "values":  # what a query's publisher does: a run of values per time
            values = [bytes(RECORD_BYTES)] * BATCH_RECORDS
            for t in range(batches):
                producer.send_values(values, time=t)
        else:  # "paced": 10 records every millisecond, each stamped with its creation time
            start = time.perf_counter()
            for tick in range(batches):
                due = start + tick / 1000
                while (now := time.perf_counter()) < due:
                    time.sleep(min(due - now, 0.0005))
                producer.send_batch(_batch(time.time_ns(), 10))
        producer.flush()


def _subscriber_process(address: str, secret: bytes, topic: str, records: int, mode: str,
                        queue: Any) -> None:
    from querylib.broker import Data, Subscriber, Values

    with Subscriber(address, topic, 0, secret=secret, create=True,
                    credit=4 * 1024 * 1024, values=mode == "values") as sub:
        queue.put("ready")
        seen, first, nbytes, latencies = 0, None, 0, []
        if mode == "headers":
            while seen < records:
                chunk = sub.next_chunk(60)
                if chunk is None:
                    break
                first = first or time.perf_counter()
                seen += _count_records(chunk.data)
                nbytes += len(chunk.data)
                sub.consumed(chunk)
        else:
            while seen < records:
                event = sub.next_event(60)
                if event is None:
                    break
                if isinstance(event, Values):
                    first = first or time.perf_counter()
                    seen += len(event.values)
                elif isinstance(event, Data):
                    first = first or time.perf_counter()
                    seen += len(event.records)
                    if mode == "latency":
                        now = time.time_ns()
                        latencies += [now - _TS.unpack_from(r.value or b"")[0]
                                      for r in event.records]
        elapsed = time.perf_counter() - (first or time.perf_counter())
        queue.put({"records": seen, "seconds": elapsed, "bytes": nbytes,
                   "latencies": latencies})


def _async_latency_producer(address: str, secret: bytes, topic: str, batches: int,
                            queue: Any) -> None:
    asyncio.run(_async_latency_produce(address, secret, topic, batches, queue))


async def _async_latency_produce(address: str, secret: bytes, topic: str, batches: int,
                                 queue: Any) -> None:
    from querylib.broker import AsyncProducer

    async with AsyncProducer(address, topic, secret=secret) as producer:
        queue.put("ready")
        start = time.perf_counter()
        for tick in range(batches):
            delay = start + tick / 1000 - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await producer.send_batch(_batch(time.time_ns(), 10))
        await producer.flush()


def _async_latency_subscriber(address: str, secret: bytes, topic: str, records: int,
                              queue: Any) -> None:
    asyncio.run(_async_latency_subscribe(address, secret, topic, records, queue))


async def _async_latency_subscribe(address: str, secret: bytes, topic: str, records: int,
                                   queue: Any) -> None:
    from querylib.broker import AsyncSubscriber, Data

    async with AsyncSubscriber(address, topic, 0, secret=secret, create=True) as sub:
        queue.put("ready")
        latencies: list[int] = []
        while len(latencies) < records:
            event = await sub.next_event(60)
            if event is None:
                break
            if isinstance(event, Data):
                now = time.time_ns()
                latencies += [now - _TS.unpack_from(r.value or b"")[0] for r in event.records]
        queue.put({"records": len(latencies), "seconds": 0.0, "bytes": 0,
                   "latencies": latencies})


def _raw_push(port: int, batches: int) -> None:
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.connect(f"tcp://127.0.0.1:{port}")
    batch = _batch()
    for _ in range(batches):
        sock.send(batch, copy=False)
    sock.close(linger=-1)
    context.term()  # waits until every queued batch is out: exiting sooner could drop some


def _raw_pull(port: int, batches: int, queue: Any, parse: bool = False) -> None:
    """Receive `batches` frames: counting them only, or (`parse`) decoding every record, as a
    peer that handles records would."""
    import zmq

    from querylib.records import decode_batch

    sock: Any = zmq.Context.instance().socket(zmq.PULL)
    sock.bind(f"tcp://127.0.0.1:{port}")
    queue.put("ready")
    first, nbytes, records = None, 0, 0
    for _ in range(batches):
        frame = sock.recv(copy=False)
        first = first or time.perf_counter()
        nbytes += len(frame.buffer)
        records += len(decode_batch(frame.buffer).records) if parse else BATCH_RECORDS
    queue.put({"records": records, "bytes": nbytes,
               "seconds": time.perf_counter() - (first or time.perf_counter())})


class _Cluster:
    """A broker process on a temporary data directory, and the clients we start."""

    def __init__(self, data_dir: str | None = None) -> None:
        self.mp = multiprocessing.get_context("spawn")
        self.secret = os.urandom(32)  # passed to children: each spawn re-imports this module
        self.queue = self.mp.Queue()
        self.own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="tq-bench-")
        self.children: list[Any] = []
        self.broker = self.start(_broker_process, self.data_dir, self.secret, self.queue)
        self.address = self.get(self.queue, 120)

    def start(self, target: Any, *args: Any) -> Any:
        child = self.mp.Process(target=target, args=args, daemon=True)
        child.start()
        self.children.append(child)
        return child

    def get(self, queue: Any, timeout: float = 600.0) -> Any:
        """The next item from `queue`; fails early if one of our processes died."""
        return _get(queue, self.children, timeout)

    def close(self) -> None:
        for child in reversed(self.children):
            if child.is_alive():
                child.terminate()
            child.join(30)
        if self.own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _get(queue: Any, children: list[Any], timeout: float) -> Any:
    import queue as queue_module

    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=0.5)
        except queue_module.Empty:
            failed = [c for c in children if c.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"benchmark process {failed[0].name} exited with "
                                   f"{failed[0].exitcode}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result within {timeout}s") from None


def _through(cluster: _Cluster, topic: str, batches: int, produce: str,
             consume: str) -> dict[str, Any]:
    results = cluster.mp.Queue()
    records = batches * (10 if produce == "paced" else BATCH_RECORDS)
    cluster.start(_subscriber_process, cluster.address, cluster.secret, topic, records,
                  consume, results)
    assert cluster.get(results, 120) == "ready"
    cluster.start(_producer_process, cluster.address, cluster.secret, topic, batches,
                  produce, results)
    assert cluster.get(results, 120) == "ready"
    return cluster.get(results)


def raw_zmq(batches: int = 20_000, pull_with: Any = None) -> dict[str, Any]:
    """Records/s of PUSH/PULL moving the same batch bytes between two processes (the
    receiver: `_raw_pull`, counting frames, unless `pull_with` names another)."""
    from querylib.rpc._shell import log as _  # noqa: F401  (same import cost as the others)

    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    port = _free_port()
    pull = mp.Process(target=pull_with or _raw_pull, args=(port, batches, queue), daemon=True)
    pull.start()
    assert _get(queue, [pull], 120) == "ready"
    push = mp.Process(target=_raw_push, args=(port, batches), daemon=True)
    push.start()
    result = _get(queue, [pull, push], 600)
    for child in (push, pull):
        child.join(30)
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rate(result: dict[str, Any]) -> tuple[float, float]:
    seconds = max(result["seconds"], 1e-9)
    return result["records"] / seconds, result["bytes"] / seconds / 1e6


def _parsing_pull(port: int, batches: int, queue: Any) -> None:
    _raw_pull(port, batches, queue, parse=True)


def throughput(batches: int = 5000) -> Iterator[dict[str, Any]]:
    raw = raw_zmq(batches=max(batches * 4, 20_000))
    raw_rps, raw_mbps = _rate(raw)
    # The per-record peer: the same PUSH/PULL, its receiver decoding every record, as a
    # peer handling records would (the per-record path's yardstick; issue 17: >= 0.5x).
    per_record_rps, _ = _rate(raw_zmq(batches=max(batches, 2000), pull_with=_parsing_pull))
    baselines = {"raw_zmq_records_per_s": round(raw_rps),
                 "zmq_per_record_records_per_s": round(per_record_rps),
                 "note": "raw: PUSH/PULL of the batches, the receiver counting frames only; "
                         "per_record: the receiver decoding every record"}
    cluster = _Cluster()
    try:
        result = _through(cluster, "bench", batches, "prebuilt", "headers")
        rps, mbps = _rate(result)
        yield {
            "name": "pubsub_throughput",
            "figures": {"records_per_s": round(rps), "mb_per_s": round(mbps, 1),
                        "records": result["records"], "record_bytes": RECORD_BYTES,
                        "batch_records": BATCH_RECORDS, "flush": "never"},
            "baseline": {**baselines, "raw_zmq_mb_per_s": round(raw_mbps, 1)},
            "ratio": round(rps / raw_rps, 3),
            "goal": ">= 1,000,000 records/s and >= 0.3x raw ZeroMQ PUSH/PULL",
        }
        result = _through(cluster, "bench-codec", batches // 2, "records", "events")
        rps, _ = _rate(result)
        yield {
            "name": "pubsub_throughput_codec",
            "figures": {"records_per_s": round(rps), "records": result["records"],
                        "note": "Producer.send per record; every record decoded"},
            "baseline": baselines,
            "ratio": round(rps / raw_rps, 3),
            "ratio_to_zmq_per_record": round(rps / per_record_rps, 3),
            "goal": "issue 17: >= 0.5x the per-record ZeroMQ peer",
        }
        result = _through(cluster, "bench-values", batches, "values", "values")
        rps, _ = _rate(result)
        yield {
            "name": "pubsub_throughput_values",
            "figures": {"records_per_s": round(rps), "records": result["records"],
                        "note": "Producer.send_values of 1000 values per time; Subscriber "
                                "values=True (what a query's publisher and subscriber use)"},
            "baseline": baselines,
            "ratio": round(rps / raw_rps, 3),
            "ratio_to_zmq_per_record": round(rps / per_record_rps, 3),
            "goal": None,
        }
    finally:
        cluster.close()


def _percentiles(latencies_ns: list[int]) -> dict[str, float]:
    warm = sorted(latencies_ns[1000:] if len(latencies_ns) > 2000 else latencies_ns)

    def pct(q: float) -> float:
        return round(warm[min(len(warm) - 1, int(q * len(warm)))] / 1e6, 3) if warm else -1.0

    return {"p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99), "max_ms": pct(1.0)}


def latency(seconds: float = 5.0) -> dict[str, Any]:
    """Creation-to-delivery latency at 10,000 records/s, with the asyncio clients (one event
    loop per process) and with the blocking ones (a loop thread each, so one more handoff
    between threads on each side)."""
    batches = int(seconds * 1000)
    cluster = _Cluster()
    try:
        results = cluster.mp.Queue()
        cluster.start(_async_latency_subscriber, cluster.address, cluster.secret, "lat-async",
                      batches * 10, results)
        assert cluster.get(results, 120) == "ready"
        cluster.start(_async_latency_producer, cluster.address, cluster.secret, "lat-async",
                      batches, results)
        assert cluster.get(results, 120) == "ready"
        async_result = cluster.get(results)
        blocking_result = _through(cluster, "lat-blocking", batches, "paced", "latency")
    finally:
        cluster.close()
    return {
        "name": "pubsub_latency",
        "figures": {"records_per_s": 10_000, "records": async_result["records"],
                    **_percentiles(async_result["latencies"]),
                    "blocking_clients": _percentiles(blocking_result["latencies"]),
                    "batching": "10 records per batch, one batch per ms", "flush": "never",
                    "clients": "AsyncProducer -> broker -> AsyncSubscriber (blocking: "
                               "Producer -> broker -> Subscriber)"},
        "baseline": None,
        "ratio": None,
        "goal": "p50 <= 1 ms, p99 <= 5 ms",
    }


# -- broker memory under many subscribers ---------------------------------------------------


def _fill_partition(data_dir: str, nbytes: int) -> int:
    """Write a partition of about `nbytes` directly with PartitionLog (faster than producing
    it); returns its end offset."""
    from querylib.log import LogConfig, PartitionLog

    batch = _batch()
    with PartitionLog.open(os.path.join(data_dir, "big-0"), LogConfig()) as log:
        group = [batch] * 64
        while log.size_in_bytes < nbytes:
            log.append_batches(group)
        return log.log_end_offset


def _many_subscribers_process(address: str, secret: bytes, first: int, count: int, end: int,
                              total: int, seconds: float, queue: Any) -> None:
    asyncio.run(_many_subscribers(address, secret, first, count, end, total, seconds, queue))


async def _many_subscribers(address: str, secret: bytes, first: int, count: int, end: int,
                            total: int, seconds: float, queue: Any) -> None:
    from querylib.broker import BrokerLink, SubscriberCore

    received = [0]
    links: list[BrokerLink] = []
    for i in range(first, first + count):
        link = BrokerLink(address, secret, timeout=60.0)
        await link.start()
        holder: list[SubscriberCore] = []

        def sink(chunk: Any, holder: list[SubscriberCore] = holder) -> None:
            # Discard the bytes at once: this measures the broker, not the subscribers.
            received[0] += len(chunk.data)
            holder[0].consumed(chunk.partition, len(chunk.data))

        core = SubscriberCore(link, "big", [0], end * i // total, credit=1024 * 1024,
                              sink=sink)
        holder.append(core)
        await core.open()
        links.append(link)
    queue.put("ready")
    await asyncio.sleep(seconds)
    queue.put(received[0])
    for link in links:
        await link.close()


def broker_rss(gigabytes: float | None = None, subscribers: int = 100,
               seconds: float = 10.0) -> dict[str, Any]:
    import psutil

    if gigabytes is None:
        gigabytes = float(os.environ.get("TQ_BENCH_PUBSUB_GB", "1.0"))
    data_dir = tempfile.mkdtemp(prefix="tq-bench-rss-")
    try:
        end = _fill_partition(data_dir, int(gigabytes * 2**30))
        size = sum(e.stat().st_size for e in os.scandir(os.path.join(data_dir, "big-0")))
        cluster = _Cluster(data_dir)
        try:
            broker = psutil.Process(cluster.broker.pid)
            idle_rss = broker.memory_info().rss
            results = cluster.mp.Queue()
            per_process = 25
            for first in range(0, subscribers, per_process):
                cluster.start(_many_subscribers_process, cluster.address, cluster.secret, first,
                              min(per_process, subscribers - first), end, subscribers,
                              seconds, results)
            groups = (subscribers + per_process - 1) // per_process
            for _ in range(groups):
                assert cluster.get(results, 300) == "ready"
            peak, deadline = 0, time.monotonic() + seconds
            while time.monotonic() < deadline:
                peak = max(peak, broker.memory_info().rss)
                time.sleep(0.1)
            delivered = sum(cluster.get(results, 120) for _ in range(groups))
        finally:
            cluster.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "name": "pubsub_rss",
        "figures": {"partition_bytes": size, "subscribers": subscribers,
                    "credit_per_subscriber": 1024 * 1024, "seconds": seconds,
                    "peak_rss_mb": round(peak / 1e6, 1), "idle_rss_mb": round(idle_rss / 1e6, 1),
                    "delivered_mb": round(delivered / 1e6, 1)},
        "baseline": None,
        "ratio": None,
        "goal": "broker RSS <= 200 MB",
    }


# The broker's CPU time (all its threads, user + system) over the transfer beside the rate:
# less moved by other work on the machine than wall time (not immune: caches, frequency).
# The producer's and subscriber's CPU is sampled every 20 ms from outside (this code also runs
# in the baseline tree, whose client processes do not report their own): each one's last
# sample before it exits, start-up included.
_ONE_RUN = """
import json
import threading
import psutil
from querylib.bench._pubsub import _Cluster, _through
cluster = _Cluster()
try:
    broker = psutil.Process(cluster.broker.pid)
    clients, done = {{}}, threading.Event()

    def sample():
        while not done.wait(0.02):
            for child in psutil.Process().children():
                if child.pid == broker.pid:
                    continue
                try:
                    times = child.cpu_times()
                    clients[child.pid] = times.user + times.system
                except psutil.Error:
                    pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = broker.cpu_times()
    result = _through(cluster, "bench", {batches}, "{produce}", "{consume}")
    end = broker.cpu_times()
    done.set()
    sampler.join()
    result["broker_cpu_s"] = end.user - start.user + end.system - start.system
    result["clients_cpu_s"] = sum(clients.values())
    print(json.dumps(result))
finally:
    cluster.close()
"""


def authorization_cost(rounds: int = 3, batches: int = 3000) -> dict[str, Any]:
    """This tq against main before issue 13, each path run in a fresh broker per round, the
    two trees alternated so the machine's load falls on both alike."""
    from querylib.bench._baseline import PRE_ISSUE_13, ROOT, baseline_tree, run_in, spread

    before = baseline_tree(PRE_ISSUE_13)
    if before is None:
        return {"name": "pubsub_authorization_cost",
                "figures": {"skipped": f"no git history to unpack {PRE_ISSUE_13} from"},
                "baseline": {}, "ratio": None, "goal": ">= 0.95x"}
    paths = {"prebuilt": ("prebuilt", "headers"), "values": ("values", "values")}
    rates: dict[str, dict[str, list[float]]] = {p: {"now": [], "before": []} for p in paths}
    cpu: dict[str, dict[str, list[float]]] = {p: {"now": [], "before": []} for p in paths}
    clients: dict[str, dict[str, list[float]]] = {p: {"now": [], "before": []} for p in paths}
    for round_ in range(rounds):
        for path, (produce, consume) in paths.items():
            code = _ONE_RUN.format(batches=batches, produce=produce, consume=consume)
            order = (("now", ROOT), ("before", before))
            for label, tree in order if round_ % 2 == 0 else order[::-1]:
                (result,) = run_in(tree, code)
                rates[path][label].append(_rate(result)[0])
                cpu[path][label].append(result["broker_cpu_s"] / batches * 1e6)
                clients[path][label].append(result["clients_cpu_s"] / batches * 1e6)
    figures: dict[str, Any] = {"rounds": rounds, "records": batches * BATCH_RECORDS}
    ratios = {}
    for path, measured in rates.items():
        now, then = spread(measured["now"]), spread(measured["before"])
        figures[f"{path}_records_per_s"] = now
        figures[f"{path}_baseline_records_per_s"] = then
        figures[f"{path}_broker_cpu_us_per_batch"] = spread(cpu[path]["now"])
        figures[f"{path}_baseline_broker_cpu_us_per_batch"] = spread(cpu[path]["before"])
        figures[f"{path}_clients_cpu_us_per_batch"] = spread(clients[path]["now"])
        figures[f"{path}_baseline_clients_cpu_us_per_batch"] = spread(clients[path]["before"])
        ratios[path] = round(now["median"] / max(then["median"], 1), 3)
    return {"name": "pubsub_authorization_cost", "figures": figures,
            "baseline": {"ref": PRE_ISSUE_13, "what": "main before issue 13, same machine, "
                         "same run, alternated"},
            "ratio": ratios, "goal": ">= 0.95x the baseline on each path (medians)"}


def run() -> Iterator[dict[str, Any]]:
    """The rows `python -m querylib.bench pubsub` prints. Each notes the machine's 1-minute
    load average when it finished: on a shared 2-core machine, other work moves these numbers
    (latency most of all), and the row should say so."""
    for row in (*throughput(), latency(), broker_rss(), authorization_cost()):
        row["figures"]["load_avg_1m"] = round(os.getloadavg()[0], 2)
        yield row
