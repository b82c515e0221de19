"""Kafka endpoint throughput: `python -m querylib.bench kafka`.

Workload: one partition of TQ_BENCH_KAFKA_MB megabytes (default 1024) written through
querylib.log, records with a null key and a 1 KiB value in batches of 1000 (about 1 MB
each). Rows:

- raw: reading the segment files with os.read into one buffer (page cache warm: the same run
  just wrote them), the ceiling for serving them;
- confluent-kafka: a Consumer with assign() reading the whole partition from a `tq kafka`
  listener (a separate process, so client and server do not share a GIL) with `consume()` in
  batches of 10,000, once with librdkafka's defaults and once tuned (fetch.queue.backoff.ms
  5 instead of 1000, so the fetcher does not sleep a second whenever the Python side lets its
  queue fill; max.partition.fetch.bytes 8 MiB). MB/s counts log bytes delivered (batch
  framing included); value_mb_s counts record values only.

Goal: >= 200 MB/s for the tuned consumer. Needs confluent-kafka (the `test` extra).

- kafka_sasl_cost: SASL's cost (DESIGN §12): two standalone brokers (`tq broker`, same
  secret, the same workload each), one listener plaintext and one requiring SASL
  (SCRAM-SHA-512; the user's password derived as `tq user add` derives it). Per round, on
  each: confluent-kafka produces TQ_BENCH_SASL_RECORDS (default 1,000,000) 100-byte records
  (acks=all; timed from the first produce, so connecting and authenticating count) and
  consumes them back on a fresh connection (timed from the first records received: the
  steady rate), the two listeners alternated. min/median/max of records/s; goal: SASL >=
  0.95x plaintext (medians).

- kafka_transactional_produce: a transactional producer against plain idempotent produce
  (the same `tq kafka` listener, same run): per round, confluent-kafka produces
  TQ_BENCH_TXN_RECORDS (default 500,000) 100-byte records, idempotent (acks=all) and
  transactional in two shapes: committed every 100 ms (transactional_100ms: Kafka Streams'
  exactly-once commit interval, the transaction length KIP-98 states the overhead for) and
  every TQ_BENCH_TXN_PER_COMMIT records (default 10,000: ~10-15 ms transactions, where the
  client's commit cycle dominates), alternated. min/median/max of records/s; goal:
  transactional_100ms >= 0.8x idempotent (medians); the 10,000-record ratio is reported.
  transaction_ms splits a transaction's cycle: "enqueue" (handing its records to the client)
  and "commit" (commit_transaction: the client sends the records it still holds, waits for
  their acks, then EndTxn). Idempotent produce pays neither wait: its requests stay
  pipelined, while a transaction's cycle leaves the partition idle from its last ack to its
  next transaction's first batch (EndTxn, begin, AddPartitionsToTxn, the client's linger).

- kafka_tq_up: the same through `tq up`'s own Kafka listener (the executor broker's: topics
  auto-created in the catalog, groups and transactions coordinated by the coordinator's broker,
  markers crossing brokers) against a bare `tq kafka` listener on a data dir, alternated, same
  run: per round TQ_BENCH_UP_RECORDS (default 300,000) 100-byte records produced and consumed
  on each, then produced in transactions (both shapes) through `tq up`. min/median/max of
  records/s; goal: `tq up` >= 0.9x the bare listener (medians), transactional_100ms >= 0.8x
  idempotent (tq_up_transaction_ms: as transaction_ms above).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch

TOPIC = "bench"
RECORDS_PER_BATCH = 1000
VALUE_SIZE = 1024
GOAL_MB_S = 200
_READY_TIMEOUT = 30.0

TUNED = {"fetch.queue.backoff.ms": 5, "max.partition.fetch.bytes": 8 * 1024 * 1024}


def _write_topic(data_dir: str, megabytes: int) -> tuple[int, int]:
    """(records, log bytes) of the partition written."""
    value = bytes(range(256)) * (VALUE_SIZE // 256)
    t0 = 1_700_000_000_000
    batch = encode_batch([(t0 + i, None, value, ()) for i in range(RECORDS_PER_BATCH)])
    batches = max(1, megabytes * 1_000_000 // len(batch))
    log = PartitionLog.open(os.path.join(data_dir, f"{TOPIC}-0"), LogConfig())
    try:
        for _ in range(batches):
            log.append(batch)
        size = log.size_in_bytes
    finally:
        log.close()
    return batches * RECORDS_PER_BATCH, size


def _raw_read(data_dir: str) -> tuple[int, float]:
    """(bytes, seconds) reading every segment file of the partition once."""
    directory = os.path.join(data_dir, f"{TOPIC}-0")
    buffer = bytearray(1024 * 1024)
    total = 0
    start = time.perf_counter()
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(directory, name), "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total, time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(proc: subprocess.Popen[bytes]) -> str:
    """What `proc` runs, for an error message: the arguments after the interpreter."""
    args = proc.args
    return str(args[1:4] if isinstance(args, list | tuple) else args)


def _accepting(proc: subprocess.Popen[bytes], port: int) -> subprocess.Popen[bytes]:
    """`proc` once something accepts connections on `port` (RuntimeError if it exits)."""
    deadline = time.monotonic() + _READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            assert proc.stderr is not None
            raise RuntimeError(f"{_command(proc)} exited: {proc.stderr.read().decode()[-400:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{_command(proc)} did not start listening")


def _start_listener(data_dir: str, port: int) -> subprocess.Popen[bytes]:
    code = ("import sys; from querylib.server import run_kafka; "
            "sys.exit(run_kafka(sys.argv[1], '127.0.0.1', int(sys.argv[2])))")
    return _accepting(subprocess.Popen([sys.executable, "-c", code, data_dir, str(port)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), port)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _consume(port: int, records: int, extra: dict[str, Any]) -> tuple[int, int, float]:
    """(records, value bytes, seconds from assign to the last record)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "bench",
                         "enable.auto.commit": False, **extra})
    try:
        start = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        count = values = 0
        while count < records:
            # never ask for more than remain: consume() waits for the count or the timeout
            messages = consumer.consume(min(10_000, records - count), 10.0)
            if not messages:
                break
            for message in messages:
                if message.error() is None:
                    values += len(message.value() or b"")
                    count += 1
        return count, values, time.perf_counter() - start
    finally:
        consumer.close()


def _start_broker(data_dir: str, secret_file: str, port: int, *extra: str
                  ) -> subprocess.Popen[bytes]:
    return _accepting(subprocess.Popen(
        [sys.executable, "-m", "querylib.cli", "broker", "--data", data_dir, "--listen",
         "tcp://127.0.0.1:0", "--secret-file", secret_file, "--kafka-port", str(port), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), port)


def _send(producer: Any, topic: str, records: int) -> None:
    """Queue `records` 100-byte records for partition 0, waiting while the queue is full."""
    value = b"v" * 100
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)


def _produce_consume(config: dict[str, Any], topic: str, records: int) -> tuple[float, float]:
    """(produce records/s, consume records/s) of `records` 100-byte records."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({**config, "acks": "all", "linger.ms": 5,
                         "batch.num.messages": 10_000, "queue.buffering.max.messages": 200_000})
    start = time.perf_counter()
    _send(producer, topic, records)
    assert producer.flush(120) == 0, "records left unsent"
    produced = records / (time.perf_counter() - start)
    consumer = Consumer({**config, "group.id": "bench", "enable.auto.commit": False, **TUNED})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        count, start = 0, 0.0
        while count < records:
            messages = consumer.consume(min(10_000, records - count), 10.0)
            if not messages:
                break
            start = start or time.perf_counter()  # from the first records: steady state
            count += sum(1 for m in messages if m.error() is None)
        consumed = count / max(time.perf_counter() - start, 1e-9)
    finally:
        consumer.close()
    return produced, consumed


def sasl_cost(rounds: int = 3) -> dict[str, Any]:
    """Produce and consume through a plaintext and a SASL listener, alternated."""
    from querylib.bench._baseline import spread
    from querylib.rpc import Credential, kafka_password, load_or_create_secret, principal_key

    records = int(os.environ.get("TQ_BENCH_SASL_RECORDS", "1000000"))
    root = tempfile.mkdtemp(prefix="tq-bench-sasl-")
    procs = []
    try:
        secret_file = os.path.join(root, "secret")
        secret = load_or_create_secret(secret_file)
        password = kafka_password(Credential("user:bench", principal_key(secret, "user:bench")))
        ports = {"plaintext": _free_port(), "sasl": _free_port()}
        procs.append(_start_broker(os.path.join(root, "plain"), secret_file, ports["plaintext"]))
        procs.append(_start_broker(os.path.join(root, "sasl"), secret_file, ports["sasl"],
                                   "--kafka-sasl", "SCRAM-SHA-512"))
        configs = {
            "plaintext": {"bootstrap.servers": f"127.0.0.1:{ports['plaintext']}"},
            "sasl": {"bootstrap.servers": f"127.0.0.1:{ports['sasl']}",
                     "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
                     "sasl.username": "bench", "sasl.password": password}}
        rates: dict[str, dict[str, list[float]]] = {
            k: {"produce": [], "consume": []} for k in configs}
        for round_ in range(rounds):
            for name, config in configs.items():
                produced, consumed = _produce_consume(config, f"r{round_}", records)
                rates[name]["produce"].append(produced)
                rates[name]["consume"].append(consumed)
        figures: dict[str, Any] = {"rounds": rounds, "records": records,
                                   "load_avg_1m": round(os.getloadavg()[0], 2)}
        ratio = {}
        for way in ("produce", "consume"):
            plain, sasl = spread(rates["plaintext"][way]), spread(rates["sasl"][way])
            figures[f"{way}_records_per_s"] = sasl
            figures[f"{way}_plaintext_records_per_s"] = plain
            ratio[way] = round(sasl["median"] / max(plain["median"], 1), 3)
        return {"case": "kafka_sasl_cost", "figures": figures,
                "baseline": "the same broker code with a plaintext listener, same run",
                "ratio": ratio, "goal": ">= 0.95x plaintext (medians)"}
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(root, ignore_errors=True)


TXN_RECORDS_PER_COMMIT = 10_000
# Kafka Streams' exactly-once commit interval (commit.interval.ms under exactly_once_v2), the
# transaction length KIP-98 states the transactional overhead for ("transactions lasting
# 100ms"): the goal's shape. Records go 10,000 at a time until that long has passed.
TXN_COMMIT_INTERVAL_MS = 100.0


def _records_per_commit() -> int:
    return int(os.environ.get("TQ_BENCH_TXN_PER_COMMIT", str(TXN_RECORDS_PER_COMMIT)))


def _produce_rate(config: dict[str, Any], topic: str, records: int, *,
                  transactional: bool, cycle: dict[str, list[float]] | None = None,
                  interval_ms: float | None = None) -> float:
    """Records/s of `records` 100-byte records, idempotent or in transactions, timed after
    a first record has gone through. A transaction holds `_records_per_commit()` records, or
    with `interval_ms` lasts that long (records handed over 10,000 at a time, committed once
    the interval has passed, as Kafka Streams commits). With `cycle`, each transaction's
    milliseconds are added to its lists: "enqueue" (handing its records to the client) and
    "commit" (commit_transaction: the client sends what it has not yet, waits for the acks,
    then EndTxn), where the time a transaction costs beyond idempotent produce goes."""
    from confluent_kafka import Producer

    settings = {**config, "linger.ms": 5, "batch.num.messages": 10_000,
                "queue.buffering.max.messages": 200_000}
    if transactional:
        settings["transactional.id"] = f"bench-{topic}"
    else:
        settings["enable.idempotence"] = True
    producer = Producer(settings)
    # One record first, untimed: the topic's creation, metadata and the producer id (or the
    # transactional id's) would otherwise weigh on short runs as if they were throughput.
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    _send(producer, topic, 1)
    if transactional:
        producer.commit_transaction(60)
    assert producer.flush(60) == 0, "the first record was not sent"
    per_commit = _records_per_commit() if interval_ms is None else 10_000
    start = time.perf_counter()
    sent = 0
    while sent < records:
        if transactional:
            producer.begin_transaction()
        began = time.perf_counter()
        while True:
            count = min(per_commit, records - sent)
            _send(producer, topic, count)
            sent += count
            if (interval_ms is None or sent >= records
                    or (time.perf_counter() - began) * 1000 >= interval_ms):
                break
        if transactional:
            queued = time.perf_counter()
            producer.commit_transaction(60)
            if cycle is not None:
                cycle.setdefault("enqueue", []).append((queued - began) * 1000)
                cycle.setdefault("commit", []).append((time.perf_counter() - queued) * 1000)
    assert producer.flush(120) == 0, "records left unsent"
    return records / (time.perf_counter() - start)


def _ms_spread(cycle: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """min / median / max milliseconds of each part of a transaction's cycle."""
    return {part: {"min": round(min(v), 2), "median": round(statistics.median(v), 2),
                   "max": round(max(v), 2)} for part, v in cycle.items() if v}


def transactional_cost(rounds: int = 3) -> dict[str, Any]:
    """Transactional against idempotent produce through one `tq kafka` listener."""
    from querylib.bench._baseline import spread

    records = int(os.environ.get("TQ_BENCH_TXN_RECORDS", "500000"))
    root = tempfile.mkdtemp(prefix="tq-bench-txn-")
    port = _free_port()
    proc = _start_listener(root, port)
    try:
        config = {"bootstrap.servers": f"127.0.0.1:{port}"}
        rates: dict[str, list[float]] = {"idempotent": [], "transactional": [],
                                         "transactional_100ms": []}
        cycles: dict[str, dict[str, list[float]]] = {"transactional": {},
                                                     "transactional_100ms": {}}
        for round_ in range(rounds):
            for name in rates:
                rates[name].append(_produce_rate(
                    config, f"{name}-{round_}", records, transactional=name != "idempotent",
                    cycle=cycles.get(name), interval_ms=(
                        TXN_COMMIT_INTERVAL_MS if name == "transactional_100ms" else None)))
        plain, txn = spread(rates["idempotent"]), spread(rates["transactional"])
        txn_100ms = spread(rates["transactional_100ms"])
        return {"case": "kafka_transactional_produce",
                "figures": {"rounds": rounds, "records": records,
                            "records_per_commit": _records_per_commit(),
                            "transaction_ms": _ms_spread(cycles["transactional"]),
                            "transactional_records_per_s": txn,
                            "commit_interval_ms": TXN_COMMIT_INTERVAL_MS,
                            "transaction_100ms_ms": _ms_spread(cycles["transactional_100ms"]),
                            "transactional_100ms_records_per_s": txn_100ms,
                            "idempotent_records_per_s": plain,
                            "load_avg_1m": round(os.getloadavg()[0], 2)},
                "baseline": "idempotent produce to the same listener, same run",
                "ratio": {"transactional_100ms": round(txn_100ms["median"]
                                                       / max(plain["median"], 1), 3),
                          "transactional": round(txn["median"] / max(plain["median"], 1), 3)},
                "goal": ">= 0.8x idempotent (medians) for transactions committed every 100 ms "
                        "(Kafka Streams' exactly-once interval, KIP-98's stated shape)"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def run() -> Iterator[dict[str, Any]]:
    megabytes = int(os.environ.get("TQ_BENCH_KAFKA_MB", "1024"))
    data_dir = tempfile.mkdtemp(prefix="tq-bench-kafka-")
    try:
        records, log_bytes = _write_topic(data_dir, megabytes)
        size_mb = log_bytes / 1e6
        raw_bytes, raw_s = _raw_read(data_dir)
        yield {"case": "raw_segment_read", "mb": round(size_mb),
               "mb_s": round(raw_bytes / raw_s / 1e6)}
        port = _free_port()
        proc = _start_listener(data_dir, port)
        try:
            for name, extra in (("confluent_defaults", {}), ("confluent_tuned", TUNED)):
                cpu_before = _cpu_seconds(proc.pid)
                count, values, seconds = _consume(port, records, extra)
                row: dict[str, Any] = {"case": name, "mb": round(size_mb), "records": count,
                       "mb_s": round(log_bytes * count / records / seconds / 1e6),
                       "value_mb_s": round(values / seconds / 1e6),
                       "records_s": round(count / seconds),
                       "server_cpu_s": round(_cpu_seconds(proc.pid) - cpu_before, 2),
                       "config": {k: str(v) for k, v in extra.items()}}
                if extra is TUNED:
                    row.update(goal_mb_s=GOAL_MB_S, ok=row["mb_s"] >= GOAL_MB_S)
                yield row
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    yield sasl_cost()
    yield transactional_cost()
    yield up_cost()


def _start_up(home: str, kafka_port: int) -> subprocess.Popen[bytes]:
    """`tq up` in its own TQ_HOME, every endpoint on a free port (the connector off). The
    coordinator on port 0: tq up picks free ports for it and its catalog broker together (a
    port chosen here could have a taken neighbour, which the catalog broker binds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQ_")} | {"TQ_HOME": home}
    proc = subprocess.Popen(
        [sys.executable, "-m", "querylib.cli", "up", "--listen",
         "tcp://127.0.0.1:0", "--kafka-port", str(kafka_port),
         "--connector-port", "-1", "--coordinator-kafka-port", str(_free_port())],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 90
    while not os.path.exists(os.path.join(home, "cluster.json")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            assert proc.stderr is not None
            raise RuntimeError(f"tq up did not start: {proc.stderr.read().decode()[-400:]}")
        time.sleep(0.1)
    return _accepting(proc, kafka_port)


def up_cost(rounds: int = 3) -> dict[str, Any]:
    """Produce and consume through `tq up`'s listener and a bare one, alternated; then
    transactional and idempotent produce through `tq up`."""
    from querylib.bench._baseline import spread

    records = int(os.environ.get("TQ_BENCH_UP_RECORDS", "300000"))
    root = tempfile.mkdtemp(prefix="tq-bench-up-")
    procs: list[subprocess.Popen[bytes]] = []
    up = None
    try:
        ports = {"bare": _free_port(), "tq_up": _free_port()}
        procs.append(_start_listener(os.path.join(root, "bare"), ports["bare"]))
        up = _start_up(os.path.join(root, "home"), ports["tq_up"])
        procs.append(up)
        configs = {name: {"bootstrap.servers": f"127.0.0.1:{port}"}
                   for name, port in ports.items()}
        rates: dict[str, list[float]] = {f"{n}_{w}": [] for n in configs
                                         for w in ("produce", "consume")}
        kinds = ("idempotent", "transactional", "transactional_100ms")
        rates |= {f"tq_up_{kind}": [] for kind in kinds}
        cycles: dict[str, dict[str, list[float]]] = {"transactional": {},
                                                     "transactional_100ms": {}}
        for round_ in range(rounds):
            for name, config in configs.items():
                produced, consumed = _produce_consume(config, f"up-{round_}", records)
                rates[f"{name}_produce"].append(produced)
                rates[f"{name}_consume"].append(consumed)
            for kind in kinds:
                rates[f"tq_up_{kind}"].append(_produce_rate(
                    configs["tq_up"], f"up-{kind}-{round_}", records,
                    transactional=kind != "idempotent", cycle=cycles.get(kind),
                    interval_ms=TXN_COMMIT_INTERVAL_MS if kind == "transactional_100ms"
                    else None))
        figures: dict[str, Any] = {k: spread(v) for k, v in rates.items()}
        figures |= {"rounds": rounds, "records": records,
                    "records_per_commit": _records_per_commit(),
                    "tq_up_transaction_ms": _ms_spread(cycles["transactional"]),
                    "commit_interval_ms": TXN_COMMIT_INTERVAL_MS,
                    "tq_up_transaction_100ms_ms": _ms_spread(cycles["transactional_100ms"]),
                    "load_avg_1m": round(os.getloadavg()[0], 2)}

        def ratio(a: str, b: str) -> float:
            return round(figures[a]["median"] / max(figures[b]["median"], 1), 3)

        return {"case": "kafka_tq_up", "figures": figures,
                "baseline": "a bare `tq kafka` listener on a data dir, same run, alternated",
                "ratio": {"produce": ratio("tq_up_produce", "bare_produce"),
                          "consume": ratio("tq_up_consume", "bare_consume"),
                          "transactional_100ms": ratio("tq_up_transactional_100ms",
                                                       "tq_up_idempotent"),
                          "transactional": ratio("tq_up_transactional", "tq_up_idempotent")},
                "goal": "tq up >= 0.9x the bare listener; transactional_100ms >= 0.8x "
                        "idempotent (transactions committed every 100 ms, as Kafka Streams)"}
    finally:
        for proc in procs:
            if proc.poll() is None and proc is up:
                os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: tq up stops its cluster
            elif proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)

