"""Spark reading tq topics against Spark reading JSON and Parquet: `python -m querylib.bench spark`.

Workload: TQ_BENCH_SPARK_RECORDS records (default 2,000,000) with a null key, a 100-byte value
and a tq.time header, in a topic of 2 partitions written through querylib.log in batches of
1000 records; the same records (value, partition, offset, timestamp, tq_time) as JSON lines and
as Parquet, written by Spark into 2 files each. One local session with 2 cores; each query runs
once per source to warm up (JVM, Python workers, page cache), then TQ_BENCH_SPARK_REPEAT
times (default 3) per source, the sources taking turns, and the best is reported.

Rows: `tq`, `json` (schema given), `json-infer` (spark.read.json as it is usually called:
the schema is inferred by an extra scan) and `parquet`, each for `count` and for
`groupBy(partition).count()`, as rows/s; tq rows add `vs_json`, the ratio to the JSON figure
with the schema given. Goal: vs_json >= 1.0. A last row, `decode`, gives the CPU seconds per
million records of tq's reader alone, in this process: steadier than wall times on a shared
machine.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from querylib.log import LogConfig, PartitionLog
from querylib.records import TIME_HEADER, encode_batch

TOPIC = "bench"
PARTITIONS = 2
RECORDS_PER_BATCH = 1000
VALUE_SIZE = 100
GOAL = 1.0
JSON_SCHEMA = "value string, partition int, offset long, timestamp long, tq_time long"


def _write_topic(data: str, records: int) -> None:
    per_partition = records // PARTITIONS
    value = b"x" * VALUE_SIZE
    for p in range(PARTITIONS):
        log = PartitionLog.open(os.path.join(data, f"{TOPIC}-{p}"), LogConfig())
        try:
            for first in range(0, per_partition, RECORDS_PER_BATCH):
                n = min(RECORDS_PER_BATCH, per_partition - first)
                log.append(encode_batch([
                    (1_700_000_000_000 + first + i, None, value,
                     ((TIME_HEADER, ((first + i) // 1000).to_bytes(8, "big")),))
                    for i in range(n)]))
        finally:
            log.close()


def _write_files(spark: Any, root: str, records: int) -> None:
    per_partition = records // PARTITIONS
    df = spark.range(records).selectExpr(
        f"repeat('x', {VALUE_SIZE}) AS value",
        f"CAST(id DIV {per_partition} AS INT) AS partition",
        f"id % {per_partition} AS offset",
        f"1700000000000 + id % {per_partition} AS timestamp",
        f"(id % {per_partition}) DIV 1000 AS tq_time",
    ).repartition(PARTITIONS)
    df.write.mode("overwrite").json(os.path.join(root, "json"))
    df.write.mode("overwrite").parquet(os.path.join(root, "parquet"))


def _apply(action: Callable[[Any], object], frame: Callable[[], Any]) -> object:
    return action(frame())


def _best(actions: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """The best time of each action. Runs alternate (a, b, c, a, b, c, ...) so that load from
    elsewhere on the machine falls on all of them alike."""
    for action in actions.values():
        action()  # warm up
    times: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(repeat):
        for name, action in actions.items():
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def _decode_cpu_s(data: str, records: int) -> float:
    """CPU seconds of the reader alone (segment files to Arrow batches, in this process) per
    million records: what a Spark task's Python worker spends, without Spark."""
    from querylib.spark._access import read_range
    from querylib.spark._options import Location
    from querylib.spark._plan import OffsetRange

    per_partition = records // PARTITIONS
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for p in range(PARTITIONS):
            for _batch in read_range(Location(data_dir=data),
                                     OffsetRange(TOPIC, p, 0, per_partition), None):
                pass
        best = min(best, time.process_time() - start)
    return best * 1_000_000 / (per_partition * PARTITIONS)


def run() -> Iterator[dict]:
    import querylib.spark

    records = int(os.environ.get("TQ_BENCH_SPARK_RECORDS", "2000000"))
    repeat = int(os.environ.get("TQ_BENCH_SPARK_REPEAT", "3"))
    root = tempfile.mkdtemp(prefix="tq-bench-spark-")
    spark = querylib.spark.session("tq-bench", master=f"local[{PARTITIONS}]")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        data = os.path.join(root, "data")
        os.makedirs(data)
        start = time.perf_counter()
        _write_topic(data, records)
        write_s = time.perf_counter() - start
        _write_files(spark, root, records)
        frames: dict[str, Callable[[], Any]] = {
            "tq": lambda: spark.read.format("tq").option("subscribe", TOPIC).load(data),
            "json": lambda: spark.read.schema(JSON_SCHEMA).json(os.path.join(root, "json")),
            "json-infer": lambda: spark.read.json(os.path.join(root, "json")),
            "parquet": lambda: spark.read.parquet(os.path.join(root, "parquet")),
        }
        queries: dict[str, Callable[[Any], object]] = {
            "count": lambda df: df.count(),
            "groupBy-partition": lambda df: df.groupBy("partition").count().collect(),
        }
        assert frames["tq"]().count() == records - records % PARTITIONS
        results: dict[tuple[str, str], float] = {}
        for query, action in queries.items():
            best = _best({source: functools.partial(_apply, action, frame)
                          for source, frame in frames.items()}, repeat)
            for source, seconds in best.items():
                results[(source, query)] = records / seconds
        for (source, query), rows_s in results.items():
            row: dict[str, Any] = {"source": source, "query": query, "records": records,
                                   "rows_s": round(rows_s)}
            if source == "tq":
                ratio = rows_s / results[("json", query)]
                row.update(vs_json=round(ratio, 2),
                           vs_json_infer=round(rows_s / results[("json-infer", query)], 2),
                           vs_parquet=round(rows_s / results[("parquet", query)], 2),
                           goal=GOAL, met=ratio >= GOAL, topic_write_s=round(write_s, 1))
            yield row
        yield {"source": "tq", "query": "decode", "records": records,
               "cpu_s_per_million": round(_decode_cpu_s(data, records), 3)}
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
