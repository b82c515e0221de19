"""df.write / df.writeStream with format "tq": round trips, partitioning, at-least-once."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from querylib.records import TIME_HEADER, encode_batch
from querylib.spark._local import LocalDir
from querylib.spark._writer import kafka_partition, murmur2
from tests.spark._flaky import FlakySource
from tests.spark._topics import append, create_topic, log_rows

pytestmark = pytest.mark.spark

UTC = dt.UTC


@given(st.binary(max_size=64), st.integers(1, 50))
def test_keys_are_partitioned_as_kafka_does(key: bytes, partitions: int) -> None:
    assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key)
    assert kafka_partition(key, partitions) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % \
        partitions


def test_java_murmur2_vector() -> None:
    assert murmur2(b"21") == -973932308  # Kafka's UtilsTest


def write(df, data: Path, topic: str) -> None:
    df.write.format("tq").option("topic", topic).mode("append").save(str(data))


def test_batch_write_round_trip(spark, tmp_path: Path) -> None:
    create_topic(tmp_path, "out", 3)
    rows = [
        (b"k1", b"v1", [("h", b"x"), (TIME_HEADER, b"junk")], 2, 7,
         dt.datetime(2024, 5, 1, tzinfo=UTC)),
        (None, b"v2", None, 0, None, None),
        (b"k3", None, [], 1, -5, dt.datetime(2024, 5, 2, 0, 0, 1, 500_000, tzinfo=UTC)),
    ]
    df = spark.createDataFrame(rows, "key binary, value binary, "
                               "headers array<struct<key:string,value:binary>>, "
                               "partition int, tq_time long, timestamp timestamp")
    write(df, tmp_path, "out")
    got = {r[3]: r for r in log_rows(tmp_path, "out")}
    assert sorted(got) == [0, 1, 2]
    k1 = got[2]
    assert (k1[0], k1[1], k1[7], k1[8]) == (
        b"k1", b"v1", [(TIME_HEADER, (7).to_bytes(8, "big")), ("h", b"x")], 7)
    assert k1[5] == int(dt.datetime(2024, 5, 1, tzinfo=UTC).timestamp() * 1000)
    assert (got[0][0], got[0][1], got[0][7], got[0][8]) == (None, b"v2", None, None)
    assert got[1][1] is None and got[1][8] == -5 and got[1][5] % 1000 == 500
    # and the tq source reads back what was written
    back = spark.read.format("tq").option("subscribe", "out").load(str(tmp_path))
    assert sorted(r.tq_time for r in back.collect() if r.tq_time is not None) == [-5, 7]


def test_strings_keys_partitions_and_copying_a_topic(spark, tmp_path: Path) -> None:
    create_topic(tmp_path, "keyed", 4)
    df = spark.createDataFrame([(f"key{i}", f"value {i}") for i in range(200)], "key string, "
                               "value string")
    write(df, tmp_path, "keyed")
    rows = log_rows(tmp_path, "keyed")
    assert sorted(r[1] for r in rows) == sorted(b"value %d" % i for i in range(200))
    assert all(r[3] == kafka_partition(r[0], 4) for r in rows)

    # A DataFrame read from tq goes back in as it is (extra columns ignored).
    create_topic(tmp_path, "copy", 4)
    write(spark.read.format("tq").option("subscribe", "keyed").load(str(tmp_path)),
          tmp_path, "copy")
    copied = log_rows(tmp_path, "copy")
    assert sorted((r[0], r[1], r[3], r[5]) for r in copied) == sorted(
        (r[0], r[1], r[3], r[5]) for r in rows)


def test_stream_write(spark, tmp_path: Path) -> None:
    create_topic(tmp_path, "src", 2)
    create_topic(tmp_path, "dst", 1)
    for p in range(2):
        append(tmp_path, "src", p, [encode_batch(
            [(i, b"k", b"p%d-%d" % (p, i), ((TIME_HEADER, (i).to_bytes(8, "big")),))
             for i in range(30)])])
    source = (spark.readStream.format("tq").option("subscribe", "src")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "25")
              .load(str(tmp_path)).selectExpr("key", "value", "tq_time", "0 AS partition"))
    query = (source.writeStream.format("tq").option("topic", "dst").option("path", str(tmp_path))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
             .start())
    query.awaitTermination(240)
    assert query.exception() is None
    written = log_rows(tmp_path, "dst")
    assert sorted(r[1] for r in written) == sorted(b"p%d-%d" % (p, i)
                                                   for p in range(2) for i in range(30))
    assert all(r[8] == int(r[1].split(b"-")[1]) for r in written)


def test_a_retried_task_writes_at_least_once(spark, tmp_path: Path) -> None:
    """A task that fails after the writer appended part of its rows is run again by Spark
    (local[2,2]): no row is lost, and what the failed attempt appended stays."""
    create_topic(tmp_path, "retry", 1)
    count = 5000
    marker = tmp_path / "failed-once"
    spark.dataSource.register(FlakySource)
    df = (spark.read.format("tq_test_flaky").option("rows", str(count))
          .option("data", str(tmp_path)).option("topic", "retry")
          .option("marker", str(marker)).load())
    # The writer gets its input in Arrow batches of this many rows (default 10,000).
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        write(df, tmp_path, "retry")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert marker.exists()
    written = [r[1] for r in log_rows(tmp_path, "retry")]
    assert set(written) == {b"%06d" % i + b"." * 1000 for i in range(count)}  # nothing lost
    assert len(written) > count  # and what the failed attempt appended is there too


def test_default_save_mode_appends_and_creates_a_missing_topic(spark, tmp_path: Path) -> None:
    """As Spark's Kafka sink: save() under the default mode (errorifexists) appends, and a
    topic that does not exist yet is created (option partitions, default 1)."""
    df = spark.createDataFrame([(b"v%d" % i,) for i in range(10)], "value binary")
    df.write.format("tq").option("topic", "fresh").save(str(tmp_path))
    df.write.format("tq").option("topic", "fresh").save(str(tmp_path))
    rows = log_rows(tmp_path, "fresh")
    assert sorted(r[1] for r in rows) == sorted([b"v%d" % i for i in range(10)] * 2)
    assert LocalDir(str(tmp_path)).partitions("fresh") == 1
    df.write.format("tq").option("topic", "wide").option("partitions", "3").save(str(tmp_path))
    assert LocalDir(str(tmp_path)).partitions("wide") == 3
    assert len(log_rows(tmp_path, "wide")) == 10
    # An existing topic keeps its partitions; the option only shapes a topic being created.
    df.write.format("tq").option("topic", "wide").option("partitions", "5").save(str(tmp_path))
    assert LocalDir(str(tmp_path)).partitions("wide") == 3
    with pytest.raises(Exception, match="tq topics are append-only"):
        df.write.format("tq").option("topic", "wide").mode("overwrite").save(str(tmp_path))
    with pytest.raises(Exception, match="option partitions: .0. is not a positive integer"):
        df.write.format("tq").option("topic", "bad").option("partitions", "0").save(
            str(tmp_path))
