"""kcat against the Kafka endpoint: metadata (-L), consuming a topic written through
querylib.log from the beginning to the end (-C -e), producing (-P) records that querylib.log
then reads back."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from tests.interop._kafka import (
    KafkaServer,
    as_tuples,
    read_topic,
    run,
    sample_entries,
    write_topic,
)

pytestmark = pytest.mark.skipif(
    shutil.which("kcat") is None,
    reason="kcat is not installed (Debian package `kcat`: apt-get install -y kcat)")


def test_metadata_lists_brokers_and_topics(kafka_server: KafkaServer) -> None:
    write_topic(kafka_server.data_dir, "numbers", 0, sample_entries(3))
    write_topic(kafka_server.data_dir, "numbers", 1, sample_entries(2))
    kafka_server.start()
    result = run(["kcat", "-b", kafka_server.bootstrap, "-L", "-J"])
    assert result.returncode == 0, result.stderr
    metadata = json.loads(result.stdout)
    assert [(b["id"], b["name"]) for b in metadata["brokers"]] == [(0, kafka_server.bootstrap)]
    topics = {t["topic"]: t["partitions"] for t in metadata["topics"]}
    assert set(topics) == {"numbers", "__consumer_offsets"}
    assert [(p["partition"], p["leader"]) for p in topics["numbers"]] == [(0, 0), (1, 0)]


def test_consume_from_the_beginning_to_the_end(kafka_server: KafkaServer) -> None:
    entries = sample_entries(10)
    write_topic(kafka_server.data_dir, "numbers", 0, entries)
    kafka_server.start()
    result = run(["kcat", "-b", kafka_server.bootstrap, "-C", "-t", "numbers", "-p", "0",
                  "-o", "beginning", "-e", "-J"])
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line) for line in result.stdout.splitlines()]
    # The frontier control batch (offset 3) is skipped by the client: offsets jump over it.
    assert [m["offset"] for m in messages] == [0, 1, 2, *range(4, 11)]
    got = [(m["ts"], m["key"], m["payload"], m.get("headers", [])) for m in messages]
    expected = [(ts, None if key is None else key.decode(),
                 None if value is None else value.decode(),
                 [x for name, v in headers for x in (name, None if v is None else v.decode())])
                for ts, key, value, headers in entries]
    assert got == expected


def test_produce_lands_in_the_log(kafka_server: KafkaServer) -> None:
    kafka_server.start()
    before = int(time.time() * 1000)
    lines = b"k1:one\nk2:two\nk3:three\n"
    result = run(["kcat", "-b", kafka_server.bootstrap, "-P", "-t", "made-by-kcat", "-K:",
                  "-H", "origin=kcat", "-z", "lz4", "-X", "acks=all"], input=lines)
    assert result.returncode == 0, result.stderr
    after = int(time.time() * 1000)
    kafka_server.stop()
    records = read_topic(kafka_server.data_dir, "made-by-kcat")
    assert [(r.key, r.value, r.headers) for r in records] == [
        (b"k1", b"one", (("origin", b"kcat"),)), (b"k2", b"two", (("origin", b"kcat"),)),
        (b"k3", b"three", (("origin", b"kcat"),))]
    assert all(before <= r.timestamp <= after for r in records)
    assert as_tuples(records)  # decodable through querylib.records
