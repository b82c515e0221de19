"""Kafka clients and Spark on the same bytes (issue 7's proof): records a confluent-kafka
Producer writes through tq's Kafka listener read back with spark.read.format("tq") with the same
keys, values, headers and timestamps, and records Spark writes with the tq sink read back by a
confluent-kafka Consumer the same way. Real listener process, real client, real local Spark."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.interop._kafka import KafkaServer
from tests.spark._topics import create_topic

pytestmark = pytest.mark.spark

confluent_kafka = pytest.importorskip("confluent_kafka")

UTC = dt.UTC
T0 = 1_700_000_000_000


def _records(n: int) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]], int]]:
    """Keys (some null), values, headers (some none) and create times, all different."""
    return [(None if i % 5 == 0 else b"key-%d" % i, b"value %d " % i + b"x" * (i % 17),
             [] if i % 4 == 0 else [("origin", b"kafka"), ("i", str(i).encode())], T0 + i * 7)
            for i in range(n)]


def test_kafka_producer_records_read_by_spark(spark, processes: Processes,
                                              tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_topic(data, "from_kafka", 2)
    server = KafkaServer(processes, data).start()
    sent = _records(300)
    producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap, "acks": "all",
                                         "enable.idempotence": True,
                                         "compression.type": "lz4", "linger.ms": 5})
    for i, (key, value, headers, ts) in enumerate(sent):
        producer.produce("from_kafka", value=value, key=key, headers=headers or None,
                         timestamp=ts, partition=i % 2)
    assert producer.flush(30) == 0
    del producer  # before the listener stops, so librdkafka does not keep reconnecting
    server.stop()

    rows = (spark.read.format("tq").option("subscribe", "from_kafka")
            .option("includeHeaders", "true").load(str(data)).collect())
    got = sorted(((r.key, r.value, [(h.key, h.value) for h in r.headers or []],
                  int(r.timestamp.timestamp() * 1000), r.partition) for r in rows), key=repr)
    want = sorted(((key, value, headers, ts, i % 2)
                   for i, (key, value, headers, ts) in enumerate(sent)), key=repr)
    assert got == want
    assert {r.timestampType for r in rows} == {0}  # CreateTime, as the producer set it


def test_spark_written_records_read_by_kafka_consumer(spark, processes: Processes,
                                                      tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_topic(data, "from_spark", 3)
    sent = _records(240)
    df = spark.createDataFrame(
        [(key, value, headers, i % 3, dt.datetime.fromtimestamp(ts / 1000, UTC))
         for i, (key, value, headers, ts) in enumerate(sent)],
        "key binary, value binary, headers array<struct<key:string,value:binary>>, "
        "partition int, timestamp timestamp")
    df.write.format("tq").option("topic", "from_spark").mode("append").save(str(data))

    server = KafkaServer(processes, data).start()
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap,
                                         "group.id": "spark-check",
                                         "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition("from_spark", p,
                                                        confluent_kafka.OFFSET_BEGINNING)
                         for p in range(3)])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.key(), message.value(),
                        [(k, v) for k, v in message.headers() or []],
                        message.timestamp()[1], message.partition()))
    finally:
        consumer.close()
        server.stop()
    want = sorted(((key, value, headers, ts, i % 3)
                   for i, (key, value, headers, ts) in enumerate(sent)), key=repr)
    assert sorted(got, key=repr) == want
