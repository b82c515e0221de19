"""The tq source and sink against a running cluster: topics found through the coordinator,
read from and written through its broker; the catalog's own topics read as tables."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import INGEST
from querylib.broker import Producer
from querylib.cluster import Cluster
from querylib.records import TIME_HEADER, encode_batch
from querylib.rpc import load_secret
from tests.conftest import Processes, free_port
from tests.coordinator._cluster import CoordinatorProcess

pytestmark = pytest.mark.spark


class Running:
    def __init__(self, home: Path) -> None:
        info = json.loads((home / "cluster.json").read_text())
        self.address: str = info["coordinator"]
        self.secret_file: str = info["secret_file"]
        self.broker_data = Path(info["data"]) / "broker"
        self.secret = load_secret(self.secret_file)

    def options(self) -> dict[str, str]:
        return {"coordinator": self.address, "secretFile": self.secret_file}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A `tq coordinator` (with its broker) and a topic `events` of 2 partitions, 3 batches
    each (with tq.time headers), published through the broker."""
    home = tmp_path_factory.mktemp("cluster")
    processes = Processes()
    try:
        CoordinatorProcess(processes, home).start()
        running = Running(home)
        with Cluster(running.address, running.secret) as session:
            info = session.create_topic("events", 2)
            # Spark writes from outside any query: into an ingest topic.
            session.create_topic("written", 2, ingest=True)
        broker = info.brokers[info.topic.locations[0]]
        for p in range(2):
            # `events` is the admin's (its creator's principal), who writes it.
            with Producer(broker, "events", p, secret=running.secret) as producer:
                for t in range(3):
                    producer.send_batch(encode_batch([
                        (1000 + i, b"k%d" % i, b"e%d-%d-%d" % (p, t, i),
                         ((TIME_HEADER, t.to_bytes(8, "big")),)) for i in range(10)]))
                    producer.advance(t + 1)  # frontiers: control batches between the data
                producer.close(end=False)
        yield running
    finally:
        processes.stop_all()


def read(spark, running: Running, **options: str):
    reader = spark.read.format("tq")
    for key, value in {**running.options(), **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def test_read_through_the_broker_equals_the_files(spark, cluster: Running) -> None:
    remote = read(spark, cluster, subscribe="events").collect()
    assert sorted((r.partition, r.value, r.tq_time) for r in remote) == sorted(
        (p, b"e%d-%d-%d" % (p, t, i), t) for p in range(2) for t in range(3) for i in range(10))
    # The same rows as a same-host read of the broker's own files.
    local = spark.read.format("tq").option("subscribe", "events").load(str(cluster.broker_data))
    assert sorted(map(tuple, remote)) == sorted(map(tuple, local.collect()))
    ranged = read(spark, cluster, subscribe="events", maxRecordsPerPartition="7",
                  startingOffsets='{"events":{"1":12}}')
    assert ranged.rdd.getNumPartitions() > 2
    assert sorted(map(tuple, ranged.collect())) == sorted(
        tuple(r) for r in remote if r.partition == 0 or r.offset >= 12)


def test_write_then_stream_through_the_cluster(spark, cluster: Running,
                                               tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"w%d" % i, i % 2, i) for i in range(50)],
                               "value binary, partition int, tq_time long")
    writer = df.write.format("tq").option("topic", "written").mode("append")
    for key, value in cluster.options().items():
        writer = writer.option(key, value)
    writer.save()
    stream = (spark.readStream.format("tq").options(**cluster.options())
              .option("subscribe", "written").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "20").load()
              .selectExpr("partition", "value", "tq_time"))
    query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
             .start())
    query.awaitTermination(240)
    assert query.exception() is None
    got = sorted(tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == sorted((i % 2, b"w%d" % i, i) for i in range(50))


def test_catalog_topics_read_as_tables(spark, cluster: Running) -> None:
    import querylib.spark

    topics = querylib.spark.catalog_table(spark, "topics", **cluster.options())
    names = {r.name for r in topics.selectExpr("record.name AS name").collect()}
    assert {"persistent://public/default/events", "persistent://public/default/written",
            "persistent://public/default/__catalog.queries"} <= names
    raw = read(spark, cluster, subscribe="__catalog.queries")
    assert raw.count() == 0  # no query was ever submitted
    brokers = querylib.spark.catalog_table(spark, "brokers", **cluster.options()).collect()
    with Cluster(cluster.address, cluster.secret, session=False) as client:
        catalog_broker = client.info().catalog_broker
    assert [b.record.address for b in brokers] == [catalog_broker]
    assert [b["count"] for b in brokers] == [1]


def test_cluster_errors(spark, cluster: Running, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="UnknownTopicError: topic 'nope' not found in the "
                                        "cluster"):
        read(spark, cluster, subscribe="nope").collect()
    wrong = tmp_path / "wrong-secret"
    wrong.write_bytes(os.urandom(32))
    wrong.chmod(0o600)
    with pytest.raises(Exception, match="SecretRejectedError: .*refused our signature.*is not "
                                        "this cluster's secret"):
        read(spark, cluster, subscribe="events", secretFile=str(wrong), timeout="2").collect()
    with pytest.raises(Exception, match="NoCoordinatorError: no coordinator answers"):
        read(spark, cluster, subscribe="events", timeout="2",
             coordinator=f"tcp://127.0.0.1:{free_port()}").collect()


def test_default_save_creates_a_missing_topic_in_the_cluster(spark, cluster: Running) -> None:
    """save() under Spark's default mode appends; a missing topic is created as an ingest
    topic of option partitions (default 1), as Kafka creates a topic on first produce."""
    df = spark.createDataFrame([(b"m%d" % i, f"k{i}") for i in range(40)], "value binary, "
                               "key string")
    for _ in range(2):
        df.write.format("tq").options(**cluster.options()).option("topic", "made") \
            .option("partitions", "2").save()
    df.write.format("tq").options(**cluster.options()).option("topic", "single").save()
    with Cluster(cluster.address, cluster.secret, session=False) as client:
        made = client.lookup_topic("made").topic
        single = client.lookup_topic("single").topic
    assert (made.partitions, made.owner, single.partitions) == (2, INGEST, 1)
    back = read(spark, cluster, subscribe="made").collect()
    assert sorted(r.value for r in back) == sorted([b"m%d" % i for i in range(40)] * 2)
    assert {r.partition for r in back} == {0, 1}
    assert read(spark, cluster, subscribe="single").count() == 40


def test_a_grown_topic_is_read_whole_by_the_next_plan(spark, cluster: Running) -> None:
    """CreatePartitions / `tq topic add-partitions`: Spark plans each read from the catalog,
    so a read after the topic grew covers the new partitions."""
    with Cluster(cluster.address, cluster.secret) as session:
        info = session.create_topic("growing", 1)

        def send(partition: int, value: bytes) -> None:
            found = session.lookup_topic("growing")
            address = found.brokers[found.topic.locations[partition]]
            with Producer(address, "growing", partition, secret=cluster.secret) as producer:
                producer.send_batch(encode_batch([(1000, None, value, ())]))
                producer.close(end=False)

        send(0, b"before")
        assert [(r.partition, r.value) for r in read(spark, cluster, subscribe="growing")
                .collect()] == [(0, b"before")]
        grown = session.alter_topic("growing", partitions=3)
        assert grown.topic.partitions == 3 and info.topic.topic_id == grown.topic.topic_id
        send(2, b"after")
    rows = read(spark, cluster, subscribe="growing").collect()
    assert sorted((r.partition, r.value) for r in rows) == [(0, b"before"), (2, b"after")]
