"""The catalog's collections as Spark tables.

Each collection is the topic `__catalog.<collection>` (DESIGN §3): one record per update, the
record in MessagePack as the value, its version in `tq.time` and its multiplicity change in
`tq.diff`; checkpoint blocks (records with a `tq.snapshot` header) repeat state that the
updates already give. `catalog_table` reads a collection through the tq source, consolidates
it on the driver (the catalog is small) and returns one row per record present now:

    version long     the catalog version of the record's last update
    count   long     its multiplicity (1 for every record the catalog holds once)
    record  struct   the record's fields, as the catalog defines them (`type` names it)

With history=True it returns every update instead (version, diff, record), in order.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pyspark.sql import DataFrame, SparkSession

from catalog import COLLECTIONS
from querylib.records import DIFF_HEADER, TIME_HEADER
from querylib.spark._errors import BadOptionError

__all__ = ["catalog_table"]

SNAPSHOT_HEADER = "tq.snapshot"


def _int64(value: bytes | None) -> int | None:
    if value is None or len(value) != 8:
        return None
    return int.from_bytes(value, "big", signed=True)


def catalog_table(spark: SparkSession, collection: str, *, history: bool = False,
                  **options: str) -> DataFrame:
    """The catalog collection `collection` (topics, queries, brokers, ...) as a DataFrame.
    `options` are the tq source's (coordinator, secretFile, or path for a data dir)."""
    if collection not in COLLECTIONS:
        raise BadOptionError(f"no catalog collection {collection!r}; the collections are "
                             f"{', '.join(sorted(COLLECTIONS))}")
    reader = (spark.read.format("tq").option("subscribe", f"__catalog.{collection}")
              .option("includeHeaders", "true"))
    for key, value in options.items():
        reader = reader.option(key, value)
    updates: list[tuple[int, int, bytes]] = []
    for row in reader.load().select("value", "headers", "offset").orderBy("offset").collect():
        headers = dict((h.key, h.value) for h in row.headers or ())
        diff = _int64(headers.get(DIFF_HEADER))
        version = _int64(headers.get(TIME_HEADER))
        if SNAPSHOT_HEADER in headers or row.value is None or diff is None or version is None:
            continue  # a checkpoint block, or not an update
        updates.append((version, diff, bytes(row.value)))
    lines: list[dict[str, Any]]
    if history:
        lines = [{"version": v, "diff": d, "record": msgspec.msgpack.decode(r)}
                 for v, d, r in updates]
        empty_schema = "version long, diff long, record struct<type: string>"
    else:
        totals: dict[bytes, list[int]] = {}
        for version, diff, record in updates:
            total = totals.setdefault(record, [0, version])
            total[0] += diff
            total[1] = max(total[1], version)
        lines = [{"version": v, "count": n, "record": msgspec.msgpack.decode(r)}
                 for r, (n, v) in totals.items() if n > 0]
        empty_schema = "version long, count long, record struct<type: string>"
    if not lines:
        return spark.createDataFrame([], empty_schema)
    rdd = spark.sparkContext.parallelize([msgspec.json.encode(x).decode() for x in lines], 1)
    return spark.read.json(rdd)
