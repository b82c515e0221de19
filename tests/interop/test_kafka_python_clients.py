"""kafka-python and aiokafka against the Kafka endpoint: consuming what querylib.log wrote (in a
consumer group, committing), and producing records that querylib.log reads back unchanged,
with kafka-python's default idempotent producer."""

from __future__ import annotations

import asyncio

import pytest

from tests.interop._kafka import (
    KafkaServer,
    as_tuples,
    read_batches,
    read_topic,
    sample_entries,
    write_topic,
)

kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")


def expected(entries) -> list:
    return [(ts, k, v, list(h)) for ts, k, v, h in entries]


def test_kafka_python_group_consumer(kafka_server: KafkaServer) -> None:
    entries = sample_entries(9)
    write_topic(kafka_server.data_dir, "numbers", 0, entries)
    kafka_server.start()
    consumer = kafka.KafkaConsumer(
        "numbers", bootstrap_servers=kafka_server.bootstrap, group_id="kp",
        auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=20_000,
        session_timeout_ms=6000, heartbeat_interval_ms=200)
    try:
        got = []
        for message in consumer:
            got.append((message.timestamp, message.key, message.value, list(message.headers)))
            if len(got) == len(entries):
                break
        consumer.commit()
        partition = kafka.TopicPartition("numbers", 0)
        assert consumer.committed(partition) == 10  # 9 records and a control batch
    finally:
        consumer.close()
    assert got == expected(entries)


def test_kafka_python_default_producer_is_idempotent(kafka_server: KafkaServer) -> None:
    kafka_server.start()
    # kafka-python refuses null header values
    entries = [(ts, k, v, [(n, b"" if x is None else x) for n, x in h])
               for ts, k, v, h in sample_entries(15, prefix="kp")]
    producer = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap, linger_ms=10)
    try:
        assert producer.config["enable_idempotence"]
        futures = [producer.send("produced", value=v, key=k, headers=list(h), timestamp_ms=ts)
                   for ts, k, v, h in entries]
        producer.flush(30)
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(timeout=10)
    assert offsets == list(range(len(entries)))
    kafka_server.stop()
    assert as_tuples(read_topic(kafka_server.data_dir, "produced")) == expected(entries)
    batches = read_batches(kafka_server.data_dir, "produced")
    assert all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches)
    sequences = [b.base_sequence for b in batches]
    assert sequences == sorted(sequences) and sequences[0] == 0


def test_aiokafka_produce_and_consume(kafka_server: KafkaServer) -> None:
    entries = sample_entries(8, prefix="aio")
    kafka_server.start()

    async def main() -> list:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap,
                                             enable_idempotence=True, compression_type="gzip")
        await producer.start()
        try:
            for ts, k, v, h in entries:
                await producer.send_and_wait("aio", value=v, key=k, headers=list(h),
                                             timestamp_ms=ts)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(
            "aio", bootstrap_servers=kafka_server.bootstrap, group_id="aio",
            auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got = []
        try:
            async with asyncio.timeout(20):
                async for message in consumer:
                    got.append((message.timestamp, message.key, message.value,
                                list(message.headers)))
                    if len(got) == len(entries):
                        break
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(main()) == expected(entries)
    kafka_server.stop()
    assert as_tuples(read_topic(kafka_server.data_dir, "aio")) == expected(entries)


def test_a_batch_over_the_brokers_maximum_is_message_too_large(
        kafka_server: KafkaServer) -> None:
    """`tq kafka` is a tq broker: its core refuses a batch over its maximum (8 MiB) with
    MESSAGE_TOO_LARGE, and the topic goes on taking batches that fit."""
    from kafka.errors import MessageSizeTooLargeError

    kafka_server.start()
    # The client's own limit is set above the broker's, so that the broker answers.
    producer = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap, retries=0,
                                   enable_idempotence=False, max_request_size=32 << 20)
    try:
        with pytest.raises(MessageSizeTooLargeError):
            producer.send("big", b"x" * (9 << 20), partition=0).get(timeout=60)
        assert producer.send("big", b"small", partition=0).get(timeout=30).offset == 0
    finally:
        producer.close(timeout=10)
