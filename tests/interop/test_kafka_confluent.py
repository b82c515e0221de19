"""confluent-kafka (librdkafka) against the Kafka endpoint: an assign() consumer reading what
querylib.log wrote, a subscribe() group of two that rebalances when one leaves, committed
offsets surviving a restart of the endpoint, and an acks=all producer with each compression
codec whose records querylib.log reads back unchanged."""

from __future__ import annotations

import time

import pytest

from querylib.records import Compression
from tests.conftest import wait_for
from tests.interop._kafka import (
    KafkaServer,
    as_tuples,
    read_batches,
    read_topic,
    sample_entries,
    write_topic,
)

confluent_kafka = pytest.importorskip("confluent_kafka")
Consumer, Producer, TopicPartition = (confluent_kafka.Consumer, confluent_kafka.Producer,
                                      confluent_kafka.TopicPartition)


def consumer(server: KafkaServer, **extra: object):
    return Consumer({"bootstrap.servers": server.bootstrap, "group.id": "tests",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 100,
                     "max.poll.interval.ms": 20000, "topic.metadata.refresh.interval.ms": 1000,
                     **extra})


def received(message) -> tuple:
    assert message.error() is None, message.error()
    return (message.timestamp()[1], message.key(), message.value(),
            list(message.headers() or []))


def consume_n(c, n: int, timeout: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        message = c.poll(0.2)
        if message is not None:
            got.append(message)
    assert len(got) == n, f"consumed {len(got)} of {n}"
    return got


def test_assign_consumer_reads_what_querylib_log_wrote(kafka_server: KafkaServer) -> None:
    entries = sample_entries(12)
    write_topic(kafka_server.data_dir, "numbers", 0, entries)
    kafka_server.start()
    c = consumer(kafka_server)
    try:
        c.assign([TopicPartition("numbers", 0, 0)])
        messages = consume_n(c, len(entries))
    finally:
        c.close()
    assert [received(m) for m in messages] == [(ts, k, v, list(h)) for ts, k, v, h in entries]
    assert [m.offset() for m in messages][:4] == [0, 1, 2, 4]  # 3: tq's frontier control batch


def test_acks_all_producer_with_each_compression_codec(kafka_server: KafkaServer) -> None:
    kafka_server.start()
    codecs = ["gzip", "snappy", "lz4", "zstd"]
    produced = {}
    for codec in codecs:
        # compression is a producer setting: one producer per codec
        p = Producer({"bootstrap.servers": kafka_server.bootstrap, "acks": "all",
                      "enable.idempotence": True, "compression.type": codec, "linger.ms": 20})
        entries = produced[codec] = sample_entries(20, prefix=codec)
        reports: list = []
        for ts, key, value, headers in entries:
            p.produce(f"produced-{codec}", value=value, key=key, headers=list(headers),
                      timestamp=ts, on_delivery=lambda err, msg, out=reports: out.append(
                          (err, msg)))
        assert p.flush(30) == 0
        assert [err for err, _ in reports] == [None] * len(entries)
        assert sorted(msg.offset() for _, msg in reports) == list(range(len(entries)))
        del p  # librdkafka's producer is destroyed with its Python object
    kafka_server.stop()
    for codec, entries in produced.items():
        records = read_topic(kafka_server.data_dir, f"produced-{codec}")
        assert as_tuples(records) == [(ts, k, v, list(h)) for ts, k, v, h in entries], codec
        batches = read_batches(kafka_server.data_dir, f"produced-{codec}")
        assert {b.compression for b in batches} == {Compression[codec.upper()]}
        assert all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches)  # idempotent


def test_group_of_two_rebalances_when_one_leaves(kafka_server: KafkaServer) -> None:
    for partition in (0, 1):
        write_topic(kafka_server.data_dir, "jobs", partition,
                    sample_entries(5, prefix=f"p{partition}-"), frontier=False)
    kafka_server.start()
    assigned: dict[str, set[int]] = {"c1": set(), "c2": set()}

    def tracker(name: str):
        def on_assign(_consumer, partitions):
            assigned[name] = {p.partition for p in partitions}

        def on_revoke(_consumer, partitions):
            assigned[name] = set()

        return {"on_assign": on_assign, "on_revoke": on_revoke}

    c1, c2 = consumer(kafka_server, **{"group.id": "workers"}), None
    seen: list = []
    try:
        c1.subscribe(["jobs"], **tracker("c1"))
        wait_for(lambda: _poll_into(seen, c1) or assigned["c1"] == {0, 1}, timeout=20,
                 what="c1 to get both partitions")
        c2 = consumer(kafka_server, **{"group.id": "workers"})
        c2.subscribe(["jobs"], **tracker("c2"))
        wait_for(lambda: _poll_into(seen, c1, c2) or (
            len(assigned["c1"]) == 1 and len(assigned["c2"]) == 1), timeout=20,
            what="the group to split the partitions")
        assert assigned["c1"] | assigned["c2"] == {0, 1}
        wait_for(lambda: _poll_into(seen, c1, c2) or len({(m.partition(), m.offset())
                                                          for m in seen}) == 10,
                 timeout=20, what="all ten records")
        c1.close()
        c1 = None
        wait_for(lambda: _poll_into(seen, c2) or assigned["c2"] == {0, 1}, timeout=20,
                 what="c2 to take over both partitions")
    finally:
        for c in (c1, c2):
            if c is not None:
                c.close()


def _poll_into(seen: list, *consumers) -> bool:
    for c in consumers:
        message = c.poll(0.05)
        if message is not None and message.error() is None:
            seen.append(message)
    return False


def test_committed_offsets_survive_a_restart(kafka_server: KafkaServer) -> None:
    entries = sample_entries(10)
    write_topic(kafka_server.data_dir, "orders", 0, entries, frontier=False)
    kafka_server.start()
    first = consumer(kafka_server, **{"group.id": "resume"})
    try:
        first.subscribe(["orders"])
        messages = consume_n(first, 4)
        first.commit(message=messages[-1], asynchronous=False)
        committed = first.committed([TopicPartition("orders", 0)], timeout=10)
        assert committed[0].offset == 4
    finally:
        first.close()
    kafka_server.stop()
    kafka_server.start()
    second = consumer(kafka_server, **{"group.id": "resume"})
    try:
        second.subscribe(["orders"])
        resumed = consume_n(second, 6)
    finally:
        second.close()
    assert [m.offset() for m in resumed] == list(range(4, 10))
    assert [received(m) for m in resumed] == [(ts, k, v, list(h)) for ts, k, v, h in entries[4:]]
