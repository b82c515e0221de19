"""spark.readStream.format("tq"): micro-batches over log offsets, checkpoints, AvailableNow."""

from __future__ import annotations

from pathlib import Path

import pytest

from querylib.records import encode_batch, frontier_batch
from tests.conftest import wait_for
from tests.spark._topics import append, create_topic, log_rows

pytestmark = pytest.mark.spark


def values(first: int, count: int) -> list[bytes]:
    return [encode_batch([(i, None, b"v%05d" % (first + i), ())
                          for i in range(count)]), frontier_batch(first + count, timestamp=1)]


def stream(spark, data: Path, **options: str):
    reader = spark.readStream.format("tq").option("path", str(data))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().selectExpr("topic", "partition", "offset", "value")


def to_parquet(df, out: Path, checkpoint: Path, **trigger):
    return (df.writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())


def output(spark, out: Path) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.parquet(str(out)).collect())


def expected(data: Path, topic: str) -> list[tuple]:
    return sorted((r[2], r[3], r[4], r[1]) for r in log_rows(data, topic))


def test_restarts_read_each_row_exactly_once(spark, tmp_path: Path) -> None:
    data, out, checkpoint = tmp_path / "data", tmp_path / "out", tmp_path / "cp"
    create_topic(data, "s", 2)
    append(data, "s", 0, values(0, 40) + values(40, 40))
    append(data, "s", 1, values(0, 25))
    source = stream(spark, data, subscribe="s", startingOffsets="earliest",
                    maxOffsetsPerTrigger="30")

    # A query stopped after a few micro-batches, in the middle of the data...
    query = to_parquet(source, out, checkpoint, processingTime="0 seconds")
    try:
        wait_for(lambda: sum(1 for p in query.recentProgress if p["numInputRows"]) >= 2,
                 timeout=240, what="two micro-batches")
    finally:
        query.stop()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert all(n <= 30 for n in batches)

    # ...then AvailableNow from its checkpoint reads the rest, in micro-batches of <= 30...
    query = to_parquet(source, out, checkpoint, availableNow=True)
    query.awaitTermination(240)
    batches += [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert all(n <= 30 for n in batches) and sum(batches) == 105
    assert output(spark, out) == expected(data, "s")

    # ...and once more after new records: only those are read.
    append(data, "s", 1, values(25, 7))
    query = to_parquet(source, out, checkpoint, availableNow=True)
    query.awaitTermination(240)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 7
    assert output(spark, out) == expected(data, "s")


def test_latest_start_and_topics_that_appear_later(spark, tmp_path: Path) -> None:
    data, out, checkpoint = tmp_path / "data", tmp_path / "out", tmp_path / "cp"
    create_topic(data, "p.old", 1)
    append(data, "p.old", 0, values(0, 10))
    source = stream(spark, data, subscribePattern=r"p\..*")  # startingOffsets latest

    query = to_parquet(source, out, checkpoint, availableNow=True)
    query.awaitTermination(240)
    assert output(spark, out) == []  # what was there when the stream started is skipped

    append(data, "p.old", 0, values(10, 5))
    create_topic(data, "p.new", 2)
    append(data, "p.new", 1, values(0, 4))
    query = to_parquet(source, out, checkpoint, availableNow=True)
    query.awaitTermination(240)
    new_rows = expected(data, "p.new")
    old_rows = [r for r in expected(data, "p.old") if r[2] >= 11]  # after the first frontier
    assert output(spark, out) == sorted(old_rows + new_rows)
