"""How one broker scales with batch size, partitions, subscribers and a bulk neighbour:
`python -m querylib.bench scaling` (issue 17's shapes, measured before it changes anything).

Rows (each {"name", "figures", ...}; every figure from this run, nothing asserted):
- scaling_batch_size: one producer process sending pre-built batches of 1, 10, 100 and 1,000
  100-byte records to a subscriber process counting records from batch headers; records/s
  and batches/s per size, and the broker's CPU per batch. Peers in the same run: ZeroMQ
  PUSH/PULL moving 1,000-record batches, once with a receiver that only counts frames
  (`zmq_noparse`) and once with one that decodes every record (`zmq_per_record`).
- scaling_partitions: two producer processes spreading 1,000-record batches over 1, 4 and 16
  partitions of one broker; the aggregate acknowledged records/s, and the broker process's
  CPU in cores over the run (what `tq up`'s single event loop caps at about one).
- scaling_partitions_shards: the same shape against a real `tq up`, once with `--brokers 1`
  and once with `--brokers 2` (the executor's broker work on two processes, DESIGN §5): the
  topic's partitions spread over the executor's brokers, each producer writes each of its
  partitions on the broker the catalog locates it on; the aggregate records/s, the CPU of
  every broker process (the executor's and its shards') in cores, and the brokers' and the
  producers' CPU per 1,000 records (the producers' is what keeps 2 cores from 2 brokers).
- scaling_subscribers: one producer and 1, 8 and 64 subscribers of one partition (async
  subscribers, in 4 processes at most); the producer's acknowledged records/s and the
  records delivered in total per second; the CPU seconds of the broker (while the producer
  sent, and until every subscriber read everything), the producer and the subscribers, and
  per delivered record the broker's and the subscribers' (on 2 cores the subscribers'
  processes take the CPU the broker and the producer would use).
- scaling_probe_beside_bulk: a probe writing 1,000 records/s (one per millisecond, stamped
  with its creation time) on its own topic, its latency to a subscriber alone and then beside
  a bulk producer and subscriber at full speed on another topic of the same broker; p50 and
  p99 of each, and, alone, the CPU per record of the probe's producer, broker and subscriber
  processes (all their threads). Its peer in the same windows: the same batches at the same
  pace over ZeroMQ PUSH/PULL between two processes, the receiver decoding each (what
  scheduling on the shared cores alone costs a paced stream, with no broker on its path).
- scaling_control_beside_bulk: a real `tq up`; a control probe making one coordinator round
  trip (a session heartbeat) every 2 ms, alone and then beside a bulk stream through the same
  `tq up` at full speed (a publisher query sending 1,000-record batches of 100-byte records
  to a subscriber query); p50/p99 of each, the bulk stream's records/s, and the CPU of
  `tq up`'s own process (the coordinator's: its executor, broker and queries run in children)
  in cores over each window.
- scaling_trickling_topics: 1,000 topics each written 10 records a second, every record its
  own batch (what a producer with a short linger sends at that rate), by 2 producer processes
  (500 topics each, one session per process), with a subscriber per topic (200 a process:
  a link takes 2-3 of zmq's 1,023 sockets a process), for 10 seconds; the broker process's
  CPU in cores over that window and per record, and the records offered and written per
  second (the producers' own Python may fall short of the offered rate on 2 shared cores:
  then the CPU per record is the figure to compare).

Processes are spawned, all on this machine; they share its cores.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

from querylib.bench._pubsub import (
    BATCH_RECORDS,
    _batch,
    _Cluster,
    _count_records,
    _free_port,
    _parsing_pull,
    _percentiles,
    raw_zmq,
)

__all__ = ["batch_sizes", "control_beside_bulk", "partitions", "partitions_shards",
           "probe_beside_bulk", "run", "subscribers", "trickling_topics", "zmq_per_record"]


# -- processes ------------------------------------------------------------------------------


def _producer(address: str, secret: bytes, topic: str, partitions: list[int], batches: int,
              size: int, queue: Any) -> None:
    """Pre-built batches of `size` records, round robin over `partitions`; then flush."""
    from querylib.broker import Producer

    producers = [Producer(address, topic, p, secret=secret, linger=0.0005, create=True)
                 for p in partitions]
    try:
        batch = _batch(n=size)
        queue.put("ready")
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(batches):
            producers[i % len(producers)].send_batch(batch)
        for producer in producers:
            producer.flush()
        queue.put({"records": batches * size, "seconds": time.perf_counter() - start,
                   "cpu_seconds": time.process_time() - cpu})
    finally:
        for producer in producers:
            producer.close()


def _located_producer(coordinator: str, secret_file: str, topic: str, partitions: list[int],
                      batches: int, size: int, queue: Any) -> None:
    """`_producer`, each partition written on the broker the catalog locates it on."""
    from querylib.broker import Producer
    from querylib.cluster import Cluster
    from querylib.rpc import load_secret

    secret = load_secret(secret_file)
    with Cluster.connect(coordinator, secret_file=secret_file, session=False) as cluster:
        info = cluster.lookup_topic(topic)
    producers = [Producer(info.brokers[info.topic.locations[p]], topic, p, secret=secret,
                          linger=0.0005, create=False) for p in partitions]
    try:
        batch = _batch(n=size)
        queue.put("ready")
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(batches):
            producers[i % len(producers)].send_batch(batch)
        for producer in producers:
            producer.flush()
        queue.put({"records": batches * size, "seconds": time.perf_counter() - start,
                   "cpu_seconds": time.process_time() - cpu})
    finally:
        for producer in producers:
            producer.close()


def _counting_subscriber(address: str, secret: bytes, topic: str, partition: int,
                         records: int, queue: Any) -> None:
    from querylib.broker import Subscriber

    with Subscriber(address, topic, partition, secret=secret, create=True,
                    credit=4 * 1024 * 1024) as sub:
        queue.put("ready")
        seen, first = 0, None
        while seen < records:
            chunk = sub.next_chunk(120)
            if chunk is None:
                break
            first = first or time.perf_counter()
            seen += _count_records(chunk.data)
            sub.consumed(chunk)
        queue.put({"records": seen, "seconds": time.perf_counter() - (first or 0.0)})


def _many_subscribers(address: str, secret: bytes, topic: str, count: int, records: int,
                      queue: Any) -> None:
    asyncio.run(_subscribe_all(address, secret, [topic] * count, records, queue,
                               credit=1024 * 1024, silence=120.0))


async def _subscribe_all(address: str, secret: bytes, topics: list[str], records: int,
                         queue: Any, *, credit: int, silence: float) -> None:
    """A subscriber of partition 0 of each of `topics` (a topic may repeat), each reading
    `records` records or until `silence` seconds without an event; puts "ready", then the
    records read in all and the seconds it took."""
    from querylib.broker import AsyncSubscriber, Data

    subs = [AsyncSubscriber(address, topic, 0, secret=secret, create=True, credit=credit)
            for topic in topics]
    for sub in subs:
        await sub.start()
    queue.put("ready")

    async def read(sub: Any) -> int:
        seen = 0
        while seen < records:
            event = await sub.next_event(silence)
            if event is None:
                break
            if isinstance(event, Data):
                seen += len(event.records)
        return seen

    start, cpu = time.perf_counter(), time.process_time()
    seen = await asyncio.gather(*(read(sub) for sub in subs))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    for sub in subs:
        await sub.close()
    queue.put({"records": sum(seen), "seconds": seconds, "cpu_seconds": cpu})


def _paced(seconds: float, send: Any) -> None:
    """Call `send(batch)` once a millisecond for `seconds`, each batch one record stamped with
    its creation time (the probes' pace, tq's and its ZeroMQ peer's alike)."""
    start = time.perf_counter()
    for tick in range(int(seconds * 1000)):
        due = start + tick / 1000
        while (now := time.perf_counter()) < due:
            time.sleep(min(due - now, 0.0005))
        send(_batch(time.time_ns(), 1))


def _paced_probe(address: str, secret: bytes, topic: str, seconds: float, queue: Any) -> None:
    """One record a millisecond, each stamped with its creation time."""
    from querylib.broker import Producer

    with Producer(address, topic, 0, secret=secret, linger=0.0, create=True) as producer:
        queue.put("ready")
        cpu = time.process_time()  # every thread of the process: its loop's, zmq's
        _paced(seconds, producer.send_batch)
        producer.flush()
        queue.put({"producer_cpu_seconds": time.process_time() - cpu})


def _zmq_paced_probe(port: int, seconds: float) -> None:
    """The probe's ZeroMQ peer: the same batches at the same pace, PUSHed to `port`."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.connect(f"tcp://127.0.0.1:{port}")
    _paced(seconds, sock.send)
    sock.close(linger=-1)
    context.term()  # waits until every batch is out


def _zmq_probe_pull(port: int, records: int, queue: Any) -> None:
    """PULL `records` of the ZeroMQ probe's batches, decode each as the probe's subscriber
    does, and put their latencies (or what arrived in 120 s)."""
    import struct

    import zmq

    from querylib.records import decode_batch

    stamp = struct.Struct(">q")
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    sock.bind(f"tcp://127.0.0.1:{port}")
    queue.put("ready")
    latencies: list[int] = []
    while len(latencies) < records and sock.poll(120_000):
        records_in = decode_batch(sock.recv()).records
        now = time.time_ns()
        latencies += [now - stamp.unpack_from(r.value or b"")[0] for r in records_in]
    sock.close(0)
    context.term()
    queue.put({"latencies": latencies})


def _probe_subscriber(address: str, secret: bytes, topic: str, records: int,
                      queue: Any) -> None:
    import struct

    from querylib.broker import Data, Subscriber

    stamp = struct.Struct(">q")
    with Subscriber(address, topic, 0, secret=secret, create=True) as sub:
        queue.put("ready")
        latencies: list[int] = []
        first_cpu: float | None = None  # the process's CPU time at the first record
        while len(latencies) < records:
            event = sub.next_event(120)
            if event is None:
                break
            if isinstance(event, Data):
                now = time.time_ns()
                if first_cpu is None:
                    first_cpu = time.process_time()
                latencies += [now - stamp.unpack_from(r.value or b"")[0] for r in event.records]
        cpu = 0.0 if first_cpu is None else time.process_time() - first_cpu
        queue.put({"latencies": latencies, "subscriber_cpu_seconds": cpu})


def _bulk(address: str, secret: bytes, topic: str, stop_after: float, queue: Any) -> None:
    from querylib.broker import Producer

    with Producer(address, topic, 0, secret=secret, linger=0.0005, create=True) as producer:
        batch = _batch()
        queue.put("ready")
        start = time.perf_counter()
        end = start + stop_after
        sent = 0
        while time.perf_counter() < end:
            producer.send_batch(batch)
            sent += 1
        producer.flush()  # counted: the rate is of records acknowledged
        queue.put({"records": sent * BATCH_RECORDS, "seconds": time.perf_counter() - start})


def _bulk_reader(address: str, secret: bytes, topic: str, stop_after: float,
                 queue: Any) -> None:
    from querylib.broker import Subscriber

    with Subscriber(address, topic, 0, secret=secret, create=True,
                    credit=4 * 1024 * 1024) as sub:
        queue.put("ready")
        end = time.perf_counter() + stop_after
        while time.perf_counter() < end:
            chunk = sub.next_chunk(1.0)
            if chunk is not None:
                sub.consumed(chunk)


def _control_probe(address: str, secret_file: str, seconds: float, queue: Any) -> None:
    """One coordinator round trip (a heartbeat of its own session) every 2 ms: latencies."""
    asyncio.run(_control_main(address, secret_file, seconds, queue))


async def _control_main(address: str, secret_file: str, seconds: float, queue: Any) -> None:
    from querylib.cluster import messages as m
    from querylib.rpc import RpcClient, load_secret

    async with RpcClient(address, load_secret(secret_file), timeout=60.0) as client:
        opened = await client.request(m.OpenSession(lease_ms=60_000, peer="bench control"))
        heartbeat = m.Heartbeat(session_id=opened.session_id)
        await client.request(heartbeat)
        queue.put("ready")
        latencies: list[int] = []
        start = time.perf_counter()
        for tick in range(int(seconds * 500)):
            due = start + tick / 500
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            sent = time.perf_counter_ns()
            await client.request(heartbeat)
            latencies.append(time.perf_counter_ns() - sent)
        await client.request(m.CloseSession(session_id=opened.session_id))
    queue.put({"latencies": latencies})


def _bulk_publish(ctx: Any, topic: str, folder: str) -> None:
    """A query: 1,000-record batches at full speed until `stop` appears."""
    from pathlib import Path

    stop, batch = Path(folder, "stop"), [bytes(100)] * BATCH_RECORDS
    with ctx.publish(topic, serde="bytes") as out:
        t = 0
        while not stop.exists():
            for _ in range(20):
                out.send(t, batch)
                t += 1
            if t == 200:
                Path(folder, "publishing").touch()


def _bulk_count(ctx: Any, topic: str, folder: str) -> None:
    """A query: count records from the first until `stop` appears; write the rate."""
    import json
    from pathlib import Path

    import querylib

    stop, seen, first = Path(folder, "stop"), 0, None
    with ctx.subscribe(topic, serde="bytes", timeout=120) as sub:
        for event in sub:
            if isinstance(event, querylib.Data):
                first = first or time.perf_counter()
                seen += len(event.records)
                if stop.exists():
                    break
    Path(folder, "count.json").write_text(json.dumps(
        {"records": seen, "seconds": time.perf_counter() - (first or time.perf_counter())}))


def _trickle(address: str, secret: bytes, topics: list[str], seconds: float, rate: float,
             queue: Any) -> None:
    asyncio.run(_trickle_main(address, secret, topics, seconds, rate, queue))


async def _trickle_main(address: str, secret: bytes, topics: list[str], seconds: float,
                        rate: float, queue: Any) -> None:
    """`rate` 1-record batches a second into each of `topics`, one session for all of them."""
    from querylib.broker._producer import ProducerCore
    from querylib.broker._session import BrokerLink

    link = BrokerLink(address, secret, timeout=60)
    await link.start()
    cores = [ProducerCore(link, topic, 0, create=True) for topic in topics]
    for core in cores:
        await core.open()
    batch = _batch(n=1)
    queue.put("ready")
    start = time.perf_counter()
    ticks = int(seconds * rate)
    for tick in range(ticks):
        delay = start + tick / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        for core in cores:
            await core.send_batch(batch)
    for core in cores:
        await core.flush()
    elapsed = time.perf_counter() - start
    await link.close()
    queue.put({"records": ticks * len(cores), "seconds": elapsed})


def _trickle_readers(address: str, secret: bytes, topics: list[str], records: int,
                     queue: Any) -> None:
    """A subscriber per topic, each reading `records` records (or until 60 s of silence)."""
    asyncio.run(_subscribe_all(address, secret, topics, records, queue, credit=256 * 1024,
                               silence=60.0))


# -- rows -----------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _spread(cluster: _Cluster, topic: str, partitions: int, producers: int, batches: int,
            size: int) -> dict[str, Any]:
    """`producers` processes over `partitions`; the aggregate rate and the broker's cores."""
    owned = [[p for p in range(partitions) if p % producers == i] or [i % partitions]
             for i in range(producers)]
    queues = [cluster.mp.Queue() for _ in owned]
    for mine, queue in zip(owned, queues, strict=True):
        cluster.start(_producer, cluster.address, cluster.secret, topic, mine,
                      batches // producers, size, queue)
    for queue in queues:  # each has made its producers; their batches start at once
        assert cluster.get(queue, 120) == "ready"
    cpu, wall = _cpu_seconds(cluster.broker.pid), time.perf_counter()
    done = [cluster.get(queue) for queue in queues]
    cores = (_cpu_seconds(cluster.broker.pid) - cpu) / max(time.perf_counter() - wall, 1e-9)
    records = sum(d["records"] for d in done)
    seconds = max(d["seconds"] for d in done)
    return {"records_per_s": round(records / max(seconds, 1e-9)),
            "broker_cores": round(cores, 2), "records": records}


def zmq_per_record(batches: int = 20_000) -> dict[str, Any]:
    """PUSH/PULL of 1,000-record batches whose receiver decodes every record."""
    return raw_zmq(batches, pull_with=_parsing_pull)


def batch_sizes(records: int = 1_000_000, max_batches: int = 20_000) -> dict[str, Any]:
    # Both peers as long as the pubsub rows' (at least 2,000 batches): a 500-batch run of the
    # per-record peer read 1.7x the pubsub row's in the same window (startup and noise).
    noparse = raw_zmq(batches=max(records // BATCH_RECORDS, 2000))
    parsed = zmq_per_record(batches=max(records // BATCH_RECORDS, 2000))
    figures: dict[str, Any] = {}
    cluster = _Cluster()
    try:
        for size in (1, 10, 100, 1000):
            batches = min(max_batches, records // size)
            reader, writer = cluster.mp.Queue(), cluster.mp.Queue()
            topic = f"size-{size}"
            cluster.start(_counting_subscriber, cluster.address, cluster.secret, topic, 0,
                          batches * size, reader)
            assert cluster.get(reader, 120) == "ready"
            cluster.start(_producer, cluster.address, cluster.secret, topic, [0], batches,
                          size, writer)
            assert cluster.get(writer, 120) == "ready"
            cpu = _cpu_seconds(cluster.broker.pid)
            cluster.get(writer)  # flushed: every batch acknowledged
            read = cluster.get(reader)
            rate = read["records"] / max(read["seconds"], 1e-9)
            figures[f"batch_{size}"] = {
                "records_per_s": round(rate), "batches_per_s": round(rate / size),
                "broker_us_per_batch": round(
                    (_cpu_seconds(cluster.broker.pid) - cpu) / batches * 1e6, 1)}
    finally:
        cluster.close()
    noparse_rate = noparse["records"] / max(noparse["seconds"], 1e-9)
    parsed_rate = parsed["records"] / max(parsed["seconds"], 1e-9)
    return {"name": "scaling_batch_size", "figures": figures,
            "baseline": {"zmq_noparse_records_per_s": round(noparse_rate),
                         "zmq_per_record_records_per_s": round(parsed_rate),
                         "note": "PUSH/PULL of 1,000-record batches: counting frames only, "
                                 "and decoding every record"},
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def partitions(batches: int = 4000) -> dict[str, Any]:
    figures = {}
    cluster = _Cluster()
    try:
        for count in (1, 4, 16):
            figures[f"partitions_{count}"] = _spread(cluster, f"parts-{count}", count, 2,
                                                     batches, BATCH_RECORDS)
    finally:
        cluster.close()
    one = figures["partitions_1"]["records_per_s"]
    return {"name": "scaling_partitions", "figures": figures,
            "ratio_16_to_1": round(figures["partitions_16"]["records_per_s"] / max(one, 1), 3),
            "goal": "issue 17: >= 1.3x from 1 to 16 partitions, brokers using > 1.5 cores",
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def _broker_pids(up: Any) -> list[int]:
    """tq up's executor (broker 0) and its broker shards."""
    import psutil

    (agent,) = [p for p in psutil.Process(up.proc.pid).children()
                if "executor" in p.cmdline()]
    return [agent.pid, *(p.pid for p in agent.children() if "--shard" in p.cmdline())]


def _spread_up(up: Any, mp: Any, topic: str, partitions: int, producers: int, batches: int,
               size: int) -> dict[str, Any]:
    """`_spread` against `tq up`: the topic placed by the catalog, every broker's cores."""
    from querylib.bench._pubsub import _get
    from querylib.cluster import Cluster

    with Cluster.connect(up.coordinator, secret_file=up.secret_file) as cluster:
        info = cluster.create_topic(topic, partitions)
    owned = [[p for p in range(partitions) if p % producers == i] or [i % partitions]
             for i in range(producers)]
    queues = [mp.Queue() for _ in owned]
    children = [mp.Process(target=_located_producer, daemon=True,
                           args=(up.coordinator, up.secret_file, topic, mine,
                                 batches // producers, size, queue))
                for mine, queue in zip(owned, queues, strict=True)]
    for child in children:
        child.start()
    try:
        for queue in queues:
            assert _get(queue, children, 120) == "ready"
        pids = _broker_pids(up)
        cpu, wall = sum(map(_cpu_seconds, pids)), time.perf_counter()
        done = [_get(queue, children, 600) for queue in queues]
        broker_cpu = sum(map(_cpu_seconds, pids)) - cpu
        cores = broker_cpu / max(time.perf_counter() - wall, 1e-9)
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
    records = sum(d["records"] for d in done)
    seconds = max(d["seconds"] for d in done)
    producer_cpu = sum(d["cpu_seconds"] for d in done)
    return {"records_per_s": round(records / max(seconds, 1e-9)),
            "broker_cores": round(cores, 2), "records": records,
            "brokers_used": len(set(info.topic.locations)),
            # CPU per 1,000-record batch: what each side costs whatever else the machine runs
            "broker_cpu_us_per_1k_records": round(broker_cpu / max(records, 1) * 1e9, 1),
            "producer_cpu_us_per_1k_records": round(producer_cpu / max(records, 1) * 1e9, 1)}


def partitions_shards(batches: int = 4000) -> dict[str, Any]:
    import multiprocessing

    from querylib.bench._queries import _Up

    mp = multiprocessing.get_context("spawn")
    figures: dict[str, Any] = {}
    for brokers in (1, 2):
        up = _Up(slots=2, brokers=brokers)
        try:
            for count in (1, 4, 16):
                figures[f"brokers_{brokers}_partitions_{count}"] = _spread_up(
                    up, mp, f"shards-{brokers}-{count}", count, 2, batches, BATCH_RECORDS)
        finally:
            up.close()
    one = figures["brokers_1_partitions_1"]["records_per_s"]
    return {"name": "scaling_partitions_shards", "figures": figures,
            "ratio_16_on_2_brokers_to_1_partition": round(
                figures["brokers_2_partitions_16"]["records_per_s"] / max(one, 1), 3),
            "goal": "issue 17: >= 1.3x from 1 to 16 partitions, brokers using > 1.5 cores",
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def subscribers(batches: int = 2000) -> dict[str, Any]:
    figures = {}
    cluster = _Cluster()
    try:
        for count in (1, 8, 64):
            topic = f"fanout-{count}"
            readers, writer = cluster.mp.Queue(), cluster.mp.Queue()
            groups = min(4, count)
            for i in range(groups):
                share = count // groups + (1 if i < count % groups else 0)
                cluster.start(_many_subscribers, cluster.address, cluster.secret, topic,
                              share, batches * BATCH_RECORDS, readers)
            for _ in range(groups):
                assert cluster.get(readers, 120) == "ready"
            cluster.start(_producer, cluster.address, cluster.secret, topic, [0], batches,
                          BATCH_RECORDS, writer)
            assert cluster.get(writer, 120) == "ready"
            broker_cpu = _cpu_seconds(cluster.broker.pid)
            produced = cluster.get(writer)
            broker_cpu_producing = _cpu_seconds(cluster.broker.pid) - broker_cpu
            delivered = [cluster.get(readers) for _ in range(groups)]
            broker_cpu = _cpu_seconds(cluster.broker.pid) - broker_cpu
            records = sum(d["records"] for d in delivered)
            figures[f"subscribers_{count}"] = {
                "producer_records_per_s": round(produced["records"] / produced["seconds"]),
                "delivered_records_per_s": round(
                    records / max(max(d["seconds"] for d in delivered), 1e-9)),
                # Where the CPU went (seconds; the subscribers' and producer's from when they
                # started reading or sending): the broker's is the part tq's server controls.
                "cpu_s": {"broker_while_producing": round(broker_cpu_producing, 2),
                          "broker": round(broker_cpu, 2),
                          "producer": round(produced["cpu_seconds"], 2),
                          "subscribers": round(sum(d["cpu_seconds"] for d in delivered), 2)},
                "broker_cpu_us_per_delivered_record": round(
                    broker_cpu / max(records, 1) * 1e6, 4),
                "subscriber_cpu_us_per_record": round(
                    sum(d["cpu_seconds"] for d in delivered) / max(records, 1) * 1e6, 4)}
    finally:
        cluster.close()
    one = figures["subscribers_1"]["producer_records_per_s"]
    return {"name": "scaling_subscribers", "figures": figures,
            "ratio_64_to_1": round(
                figures["subscribers_64"]["producer_records_per_s"] / max(one, 1), 3),
            "goal": "issue 17: the producer at 64 subscribers >= 0.7x its rate at 1",
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def trickling_topics(topics: int = 1000, rate: float = 10.0, seconds: float = 10.0,
                     processes: int = 2) -> dict[str, Any]:
    names = [f"trickle-{i}" for i in range(topics)]
    shares = [names[i::processes] for i in range(processes)]
    groups = -(-topics // 200)
    cluster = _Cluster()
    try:
        readers, writers = cluster.mp.Queue(), cluster.mp.Queue()
        per_topic = int(seconds * rate)
        for i in range(groups):
            cluster.start(_trickle_readers, cluster.address, cluster.secret,
                          names[i::groups], per_topic, readers)
        for _ in range(groups):
            assert cluster.get(readers, 300) == "ready"
        for share in shares:
            cluster.start(_trickle, cluster.address, cluster.secret, share, seconds, rate,
                          writers)
        for _ in shares:
            assert cluster.get(writers, 300) == "ready"
        cpu, wall = _cpu_seconds(cluster.broker.pid), time.perf_counter()
        written = [cluster.get(writers) for _ in shares]
        used = _cpu_seconds(cluster.broker.pid) - cpu
        cores = used / max(time.perf_counter() - wall, 1e-9)
        read = [cluster.get(readers) for _ in range(groups)]
    finally:
        cluster.close()
    offered = topics * rate
    took = max(w["seconds"] for w in written)
    return {"name": "scaling_trickling_topics",
            "figures": {"broker_cores": round(cores, 3),
                        "broker_us_per_record": round(
                            used / max(sum(w["records"] for w in written), 1) * 1e6, 1),
                        "offered_records_per_s": round(offered),
                        "written_records_per_s": round(
                            sum(w["records"] for w in written) / max(took, 1e-9)),
                        "delivered_records": sum(r["records"] for r in read),
                        "expected_records": topics * int(seconds * rate)},
            "note": f"{topics} topics x {rate:g} records/s, each record its own batch, "
                    f"{processes} producer and {groups} subscriber processes, {seconds:g} s",
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def probe_beside_bulk(seconds: float = 5.0) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    peer: dict[str, Any] = {}
    cluster = _Cluster()
    try:
        for beside in (False, True):
            results, zmq_results = cluster.mp.Queue(), cluster.mp.Queue()
            probe = f"probe-{beside}"
            records = int(seconds * 1000)
            cluster.start(_probe_subscriber, cluster.address, cluster.secret, probe, records,
                          results)
            assert cluster.get(results, 120) == "ready"
            port = _free_port()
            cluster.start(_zmq_probe_pull, port, records, zmq_results)
            assert cluster.get(zmq_results, 120) == "ready"
            if beside:
                side = cluster.mp.Queue()
                cluster.start(_bulk_reader, cluster.address, cluster.secret, "bulk",
                              seconds + 5, side)
                assert cluster.get(side, 120) == "ready"
                cluster.start(_bulk, cluster.address, cluster.secret, "bulk", seconds + 4,
                              side)
                assert cluster.get(side, 120) == "ready"
            # The ZeroMQ peer in the same window: what the machine's scheduling alone costs
            # a paced stream beside that load, with no broker on its path.
            cluster.start(_zmq_paced_probe, port, seconds)
            cluster.start(_paced_probe, cluster.address, cluster.secret, probe, seconds,
                          results)
            assert cluster.get(results, 120) == "ready"
            broker_cpu = _cpu_seconds(cluster.broker.pid)
            got = cluster.get(results) | cluster.get(results)  # the producer's, the reader's
            broker_cpu = _cpu_seconds(cluster.broker.pid) - broker_cpu
            window = "beside_bulk" if beside else "alone"
            figures[window] = _percentiles(got["latencies"])
            peer[window] = _percentiles(cluster.get(zmq_results)["latencies"])
            if not beside:
                # What each of the probe's processes spends per record (all its threads),
                # with nothing else on the broker: on cores a bulk stream keeps busy its
                # latency follows this, not the broker's queueing (DESIGN §5 "Fair service").
                records_seen = max(len(got["latencies"]), 1)
                figures["alone_cpu_us_per_record"] = {
                    "producer": round(got["producer_cpu_seconds"] / records_seen * 1e6, 1),
                    "broker": round(broker_cpu / records_seen * 1e6, 1),
                    "subscriber": round(got["subscriber_cpu_seconds"] / records_seen * 1e6, 1)}
            if beside:  # what the bulk stream got meanwhile: fairness must not starve it
                bulk = cluster.get(side)
                figures["bulk_records_per_s"] = round(bulk["records"] / bulk["seconds"])
    finally:
        cluster.close()
    return {"name": "scaling_probe_beside_bulk", "figures": figures,
            "baseline": {"zmq_push_pull": peer,
                         "note": "the same batches at the same pace over ZeroMQ PUSH/PULL "
                                 "between two processes, its receiver decoding each, in the "
                                 "same windows"},
            "goal": "issue 17: beside a bulk stream p99 <= 5 ms, p50 <= 1 ms",
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def _control_window(up: Any, mp: Any, seconds: float) -> dict[str, Any]:
    """The control probe for `seconds`: its percentiles, and tq up's own process's cores."""
    results = mp.Queue()
    probe = mp.Process(target=_control_probe, daemon=True,
                       args=(up.coordinator, up.secret_file, seconds, results))
    probe.start()
    try:
        assert _get_from(results, probe, 120) == "ready"
        cpu, wall = _cpu_seconds(up.proc.pid), time.perf_counter()
        latencies = _get_from(results, probe, seconds + 120)["latencies"]
        cores = (_cpu_seconds(up.proc.pid) - cpu) / max(time.perf_counter() - wall, 1e-9)
    finally:
        probe.join(30)
        if probe.is_alive():
            probe.kill()
    return {**_percentiles(latencies), "round_trips": len(latencies),
            "up_process_cores": round(cores, 2)}


def _get_from(queue: Any, child: Any, timeout: float) -> Any:
    from querylib.bench._pubsub import _get

    return _get(queue, [child], timeout)


def control_beside_bulk(seconds: float = 5.0) -> dict[str, Any]:
    import json
    import multiprocessing
    import shutil
    import tempfile
    from pathlib import Path

    from querylib import submit
    from querylib.bench._queries import _Up
    from querylib.cluster import Cluster

    mp = multiprocessing.get_context("spawn")
    folder = Path(tempfile.mkdtemp(prefix="tq-bench-control-"))
    up = _Up(slots=4)
    try:
        figures = {"alone": _control_window(up, mp, seconds)}
        topic = f"bulk-{time.time_ns()}"
        with Cluster.connect(up.coordinator, secret_file=up.secret_file) as cluster:
            reader = submit(_bulk_count, args=(topic, str(folder)), cluster=cluster,
                            name="bulk-count")
            writer = submit(_bulk_publish, args=(topic, str(folder)), cluster=cluster,
                            name="bulk-publish")
            deadline = time.monotonic() + 120
            while not (folder / "publishing").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the bulk publisher did not start within 120 s")
                time.sleep(0.05)
            try:
                figures["beside_bulk"] = _control_window(up, mp, seconds)
            finally:
                (folder / "stop").touch()
                ends = [writer.wait(timeout=120), reader.wait(timeout=120)]
        if any(q.state.value != "finished" for q in ends):
            raise RuntimeError(f"a bulk query did not finish: {ends}")
        counted = json.loads((folder / "count.json").read_text())
    finally:
        up.close()
        shutil.rmtree(folder, ignore_errors=True)
    bulk = round(counted["records"] / max(counted["seconds"], 1e-9))
    return {"name": "scaling_control_beside_bulk", "figures": figures,
            "bulk_records_per_s": bulk,
            "ratio_p99_beside_to_alone": round(
                figures["beside_bulk"]["p99_ms"] / max(figures["alone"]["p99_ms"], 1e-9), 2),
            "goal": "issue 17: a flood of data never delays control (tq up runs the "
                    "coordinator apart from the data path)",
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def run() -> Iterator[dict[str, Any]]:
    yield batch_sizes()
    yield partitions()
    yield partitions_shards()
    yield subscribers()
    yield trickling_topics()
    yield probe_beside_bulk()
    yield control_beside_bulk()

