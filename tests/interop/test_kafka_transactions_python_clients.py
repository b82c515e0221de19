"""Kafka transactions with kafka-python and aiokafka against the Kafka endpoint (a broker with
only its listener, in a child process): a committed and an aborted transaction each; a
read_committed consumer of the same client reads the committed records only."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.interop._kafka import KafkaServer

kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")


def test_kafka_python_transactions(kafka_server: KafkaServer) -> None:
    kafka_server.start()
    producer = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap,
                                   transactional_id="kp-txn")
    try:
        producer.init_transactions()
        for n, commit in ((0, True), (1, False), (2, True)):
            producer.begin_transaction()
            for i in range(3):
                producer.send("kp", value=f"{n}-{i}".encode())
            producer.flush()
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    consumer = kafka.KafkaConsumer(bootstrap_servers=kafka_server.bootstrap,
                                   isolation_level="read_committed",
                                   auto_offset_reset="earliest", enable_auto_commit=False,
                                   consumer_timeout_ms=3000)
    try:
        consumer.assign([kafka.TopicPartition("kp", 0)])
        got = [m.value for m in consumer]
    finally:
        consumer.close()
    assert got == [f"{n}-{i}".encode() for n in (0, 2) for i in range(3)]


def test_aiokafka_transactions(kafka_server: KafkaServer) -> None:
    kafka_server.start()

    async def main() -> list[bytes]:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap,
                                             transactional_id="aio-txn")
        await producer.start()
        try:
            for n, commit in ((0, True), (1, False), (2, True)):
                await producer.begin_transaction()
                for i in range(3):
                    await producer.send_and_wait("aio", f"{n}-{i}".encode())
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=kafka_server.bootstrap,
                                             isolation_level="read_committed",
                                             auto_offset_reset="earliest",
                                             enable_auto_commit=False)
        await consumer.start()
        got: list[bytes] = []
        try:
            partition = aiokafka.TopicPartition("aio", 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            deadline = time.monotonic() + 20
            while len(got) < 6 and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                got += [m.value for messages in batches.values() for m in messages]
            # Nothing more: the aborted records stay unread.
            batches = await consumer.getmany(timeout_ms=1000)
            got += [m.value for messages in batches.values() for m in messages]
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(main())
    assert got == [f"{n}-{i}".encode() for n in (0, 2) for i in range(3)]
