"""spark.read.format("tq"): batch reads return exactly what the logs hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from querylib.log import LogConfig
from querylib.records import (
    TIME_HEADER,
    Compression,
    TimestampType,
    encode_batch,
    end_of_stream_batch,
    frontier_batch,
)
from querylib.spark import SCHEMA, SCHEMA_NO_HEADERS
from tests.spark._topics import append, create_topic, log_rows, spark_rows

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def tq_time(t: int) -> tuple:
    return ((TIME_HEADER, t.to_bytes(8, "big", signed=True)),)


def mixed_batches(partition: int, rounds: int) -> list[bytes]:
    """Keys and values null or not, tq.time and other headers, compression, LogAppendTime,
    frontiers and an end of stream."""
    out = []
    for r in range(rounds):
        entries = [(1_700_000_000_000 + r * 10 + i,
                    None if i % 3 == 0 else b"k%d" % i,
                    None if i == 7 else b"p%d-r%d-i%d" % (partition, r, i),
                    tq_time(r) if i % 4 else (("a", b"1"), ("b", None), (TIME_HEADER, b"x")))
                   for i in range(12)]
        out.append(encode_batch(entries, compression=(Compression.NONE, Compression.ZSTD,
                                                      Compression.GZIP)[r % 3],
                                timestamp_type=TimestampType.LOG_APPEND_TIME if r == 2
                                else TimestampType.CREATE_TIME))
        out.append(frontier_batch(r + 1, timestamp=1))
    out.append(end_of_stream_batch(timestamp=2))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Topics of the read tests: `mixed` (3 partitions, many segments), `t/ns/other`."""
    root = tmp_path_factory.mktemp("read")
    create_topic(root, "mixed", 3)
    small = LogConfig(segment_bytes=2048)
    for p in range(3):
        append(root, "mixed", p, mixed_batches(p, 6 + p), small)
    create_topic(root, "t/ns/other", 1)
    append(root, "t/ns/other", 0, [encode_batch([(5, b"k", b"v%d" % i, ()) for i in range(50)])])
    return str(root)


def read(spark, data: str, **options: str):
    reader = spark.read.format("tq").option("includeHeaders", "true")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(data)


def test_batch_read_equals_the_log(spark, data: str) -> None:
    df = read(spark, data, subscribe="mixed")
    assert df.schema == SCHEMA
    assert spark_rows(df) == log_rows(data, "mixed")
    plain = spark.read.format("tq").option("subscribe", "mixed").load(data)
    assert plain.schema == SCHEMA_NO_HEADERS  # as Kafka's source, headers when asked for
    assert plain.count() == len(log_rows(data, "mixed"))


def test_several_topics_patterns_and_assignments(spark, data: str) -> None:
    both = log_rows(data, "mixed") + log_rows(data, "t/ns/other")
    expected = sorted(both, key=lambda r: (r[2], r[3], r[4]))
    assert spark_rows(read(spark, data, subscribe="mixed,t/ns/other")) == expected
    assert spark_rows(read(spark, data, subscribePattern="t/ns/.*")) == log_rows(
        data, "t/ns/other")
    assigned = read(spark, data, assign='{"mixed":[1]}')
    assert spark_rows(assigned) == [r for r in log_rows(data, "mixed") if r[3] == 1]


def test_offset_ranges(spark, data: str) -> None:
    df = read(spark, data, subscribe="mixed", startingOffsets='{"mixed":{"0":20,"2":-1}}',
              endingOffsets='{"mixed":{"0":40,"1":30}}')
    expected = [r for r in log_rows(data, "mixed")
                if (r[3] == 0 and 20 <= r[4] < 40) or (r[3] == 1 and r[4] < 30)]
    assert spark_rows(df) == expected


def test_large_partitions_are_split_into_tasks(spark, data: str) -> None:
    df = read(spark, data, subscribe="mixed", maxRecordsPerPartition="25")
    assert df.rdd.getNumPartitions() > 3
    assert spark_rows(df) == log_rows(data, "mixed")
    df = read(spark, data, subscribe="t/ns/other", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert df.count() == 50


def test_sql_over_the_rows(spark, data: str) -> None:
    df = read(spark, data, subscribe="mixed")
    counts = {r.partition: r["count"] for r in df.groupBy("partition").count().collect()}
    rows = log_rows(data, "mixed")
    assert counts == {p: sum(1 for r in rows if r[3] == p) for p in range(3)}
    times = df.where("tq_time IS NOT NULL").selectExpr("max(tq_time)").first()[0]
    assert times == 7  # the last of the 8 rounds of partition 2


def test_an_empty_topic_reads_as_no_rows(spark, tmp_path: Path) -> None:
    create_topic(tmp_path, "empty", 2)
    assert read(spark, str(tmp_path), subscribe="empty").count() == 0


def test_spark_finds_the_source_by_itself(tmp_path: Path) -> None:
    """A plain SparkSession, nothing registered: Spark's lookup of `pyspark_*` modules on
    its workers' path finds pyspark_tq (here on PYTHONPATH, as an editable install needs)."""
    create_topic(tmp_path, "found", 1)
    append(tmp_path, "found", 0, [encode_batch([(1, None, b"v", ())] * 3)])
    script = (
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
        ".getOrCreate()\n"
        f"print('ROWS', s.read.format('tq').option('subscribe', 'found').load({str(tmp_path)!r})"
        ".count())\n"
        "s.stop()\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYSPARK_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "ROWS 3" in done.stdout, done.stderr[-3000:]


def test_int64_extreme_timestamps_read_as_the_codec_decodes_them(spark,
                                                                    tmp_path: Path) -> None:
    """A partition directory holding batches whose timestamps (and deltas) are at the ends of
    int64, as querylib.records encodes and decodes them: every row comes back, its
    `timestamp` the record's saturated at the ends of Spark's range (int64 microseconds)."""
    low, high = -(2**63), 2**63 - 1
    spans = [[high, low], [low, high, 0], [0, high], [high - 1, high], [1_700_000_000_000]]
    create_topic(tmp_path, "extremes", 1)
    append(tmp_path, "extremes", 0, [
        encode_batch([(t, None, b"v%d-%d" % (n, i), tq_time(i)) for i, t in enumerate(times)],
                     compression=Compression.ZSTD if n == 2 else Compression.NONE)
        for n, times in enumerate(spans)])
    expected = [(r[4], max(low, min(high, r[5] * 1000)), r[1], r[8])
                for r in log_rows(str(tmp_path), "extremes")]
    df = read(spark, str(tmp_path), subscribe="extremes")
    got = [(r.offset, r.us, r.value, r.tq_time) for r in df.selectExpr(
        "offset", "unix_micros(timestamp) AS us", "value", "tq_time").orderBy("offset").collect()]
    assert len(expected) == 10 and got == expected
