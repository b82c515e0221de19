"""The four Kafka clients against a real `tq up`, on the flexible api versions they negotiate
(issue 15, DESIGN §8 "Flexible versions"): each produces into a topic of two partitions,
consumes it in a group, commits and fetches the committed offsets, lists offsets and reads
metadata, and the test checks which versions carried it, from the clients' own request logs
(librdkafka's `debug=protocol`, kafka-python's DEBUG log, aiokafka's requests as sent).
confluent-kafka also asks ListOffsets for the record with the largest timestamp (v7)."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

from tests.conftest import free_port
from tests.integration._up_endpoints import UpWithEndpoints

pytestmark = pytest.mark.timeout(240)

VALUES = [b"v-%d" % i for i in range(6)]
T0 = 1_700_000_000_000
# The first flexible version of each api (Kafka's "flexibleVersions").
FLEXIBLE = {"Produce": 9, "Fetch": 12, "ListOffsets": 6, "Metadata": 9, "OffsetCommit": 8,
            "OffsetFetch": 6, "FindCoordinator": 3, "JoinGroup": 6, "Heartbeat": 4,
            "LeaveGroup": 4, "SyncGroup": 4, "ApiVersions": 3, "InitProducerId": 2,
            "ApiVersion": 3}  # librdkafka's name for ApiVersions


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-flexible"),
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def _create(up: UpWithEndpoints, topic: str) -> None:
    created = up.tq("topic", "create", topic, "--partitions", "2")
    assert created.returncode == 0, created.stderr


class _Versions(logging.Handler):
    """Collects (api, version) of the requests a client logs."""

    def __init__(self, pattern: str) -> None:
        super().__init__(logging.DEBUG)
        self.pattern = re.compile(pattern)
        self.used: dict[str, set[int]] = defaultdict(set)

    def emit(self, record: logging.LogRecord) -> None:
        self.take(record.getMessage())

    def take(self, text: str) -> None:
        for api, version in self.pattern.findall(text):
            self.used[api].add(int(version))


# librdkafka: "Sent MetadataRequest (v13, 52 bytes @ 0, CorrId 2)"
_LIBRDKAFKA = r"Sent (\w+)Request \(v(\d+),"
# kafka-python: "<KafkaConnection ...> Request 2: MetadataRequest(version=13, ..."
_KAFKA_PYTHON = r"Request \d+: (\w+)Request\(version=(\d+)"
# aiokafka: "Request to 127.0.0.1:9092 2: MetadataRequest_v5(..."
_AIOKAFKA = r"Request to \S+ \d+: (\w+)Request_v(\d+)"


def _flexible(used: dict[str, set[int]], apis: list[str]) -> None:
    """Each of `apis` was sent, at a flexible version only."""
    for api in apis:
        assert used.get(api), f"no {api} request was seen: {dict(used)}"
        assert min(used[api]) >= FLEXIBLE[api], (api, sorted(used[api]))


def test_confluent_kafka_on_flexible_versions(up: UpWithEndpoints) -> None:
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, OffsetSpec

    topic, group = "flex-confluent", "flex-confluent-group"
    _create(up, topic)
    seen = _Versions(_LIBRDKAFKA)
    logger = logging.getLogger("test.flexible.confluent")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(seen)
    common = {"bootstrap.servers": up.info["kafka"], "debug": "protocol", "logger": logger}
    try:
        producer = ck.Producer({**common, "enable.idempotence": True})
        for i, value in enumerate(VALUES):
            producer.produce(topic, value=value, key=b"k", partition=i % 2,
                             timestamp=T0 + (7 if i == 2 else i))
        assert producer.flush(30) == 0

        consumer = ck.Consumer({**common, "group.id": group, "auto.offset.reset": "earliest",
                                "enable.auto.commit": False})
        consumer.subscribe([topic])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(VALUES) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message)
        assert sorted(m.value() for m in got) == VALUES
        consumer.commit(asynchronous=False)
        partitions = [ck.TopicPartition(topic, p) for p in (0, 1)]
        committed = consumer.committed(partitions, timeout=30)
        assert [(tp.partition, tp.offset) for tp in committed] == [(0, 3), (1, 3)]
        assert consumer.get_watermark_offsets(partitions[1], timeout=30) == (0, 3)
        by_time = consumer.offsets_for_times([ck.TopicPartition(topic, 1, T0 + 2)], timeout=30)
        assert by_time[0].offset == 1  # T0+1 at 0, T0+3 at 1, T0+5 at 2 in partition 1
        metadata = consumer.list_topics(topic, timeout=30)
        assert sorted(metadata.topics[topic].partitions) == [0, 1]
        everything = consumer.list_topics(timeout=30)  # Metadata v13 for all topics
        assert sorted(everything.topics[topic].partitions) == [0, 1]
        consumer.close()

        admin = AdminClient(common)
        future = admin.list_offsets({ck.TopicPartition(topic, 0): OffsetSpec.max_timestamp()})
        (result,) = [f.result(30) for f in future.values()]
        # partition 0 holds T0, T0+7 (the third value), T0+4: the largest is at offset 1
        assert (result.offset, result.timestamp) == (1, T0 + 7)
    finally:
        logger.removeHandler(seen)
    _flexible(seen.used, ["Produce", "Fetch", "ListOffsets", "Metadata", "OffsetCommit",
                          "OffsetFetch", "ApiVersion", "InitProducerId"])
    assert max(seen.used["Fetch"]) >= 13  # topics named by id
    assert max(seen.used["ListOffsets"]) >= 7


def test_kafka_python_on_flexible_versions(up: UpWithEndpoints) -> None:
    kafka = pytest.importorskip("kafka")
    topic, group = "flex-kafka-python", "flex-kafka-python-group"
    _create(up, topic)
    seen = _Versions(_KAFKA_PYTHON)
    logger = logging.getLogger("kafka")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(seen)
    try:
        producer = kafka.KafkaProducer(bootstrap_servers=up.info["kafka"], acks="all")
        for i, value in enumerate(VALUES):
            producer.send(topic, value, key=b"k", partition=i % 2,
                          timestamp_ms=T0 + i).get(timeout=30)
        producer.close(timeout=10)

        consumer = kafka.KafkaConsumer(topic, bootstrap_servers=up.info["kafka"],
                                       group_id=group, auto_offset_reset="earliest",
                                       enable_auto_commit=False, consumer_timeout_ms=30_000)
        got = []
        for message in consumer:
            got.append(message.value)
            if len(got) == len(VALUES):
                break
        assert sorted(got) == VALUES
        consumer.commit()
        partitions = [kafka.TopicPartition(topic, p) for p in (0, 1)]
        assert [consumer.committed(tp) for tp in partitions] == [3, 3]
        assert consumer.end_offsets(partitions) == dict.fromkeys(partitions, 3)
        assert consumer.beginning_offsets(partitions) == dict.fromkeys(partitions, 0)
        found = consumer.offsets_for_times({partitions[1]: T0 + 2})[partitions[1]]
        assert (found.offset, found.timestamp) == (1, T0 + 3)
        assert consumer.partitions_for_topic(topic) == {0, 1}
        assert topic in consumer.topics()  # every topic
        consumer.close()
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    _flexible(seen.used, ["Produce", "Fetch", "ListOffsets", "Metadata", "OffsetCommit",
                          "OffsetFetch", "FindCoordinator", "JoinGroup", "SyncGroup",
                          "LeaveGroup", "ApiVersions", "InitProducerId"])


def test_aiokafka_still_works_on_the_versions_it_has(up: UpWithEndpoints) -> None:
    """aiokafka 0.14 has no flexible versions (its maximums are below them): it must go on
    working against the larger ranges advertised."""
    aiokafka = pytest.importorskip("aiokafka")
    topic, group = "flex-aiokafka", "flex-aiokafka-group"
    _create(up, topic)
    seen = _Versions(_AIOKAFKA)
    logger = logging.getLogger("aiokafka")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(seen)

    async def main() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=up.info["kafka"])
        await producer.start()
        try:
            for i, value in enumerate(VALUES):
                await producer.send_and_wait(topic, value, key=b"k", partition=i % 2,
                                             timestamp_ms=T0 + i)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=up.info["kafka"],
                                             group_id=group, auto_offset_reset="earliest",
                                             enable_auto_commit=False)
        await consumer.start()
        try:
            got = []
            while len(got) < len(VALUES):
                got.append((await asyncio.wait_for(consumer.getone(), 60)).value)
            assert sorted(got) == VALUES
            await consumer.commit()
            partitions = [aiokafka.TopicPartition(topic, p) for p in (0, 1)]
            assert [await consumer.committed(tp) for tp in partitions] == [3, 3]
            assert await consumer.end_offsets(partitions) == dict.fromkeys(partitions, 3)
            found = (await consumer.offsets_for_times({partitions[1]: T0 + 2}))[partitions[1]]
            assert found.offset == 1
            assert consumer.partitions_for_topic(topic) == {0, 1}
        finally:
            await consumer.stop()

    try:
        asyncio.run(main())
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    # (aiokafka calls ListOffsets "OffsetRequest")
    for api in ("Produce", "Fetch", "Offset", "Metadata", "OffsetCommit", "OffsetFetch",
                "JoinGroup", "SyncGroup"):
        assert seen.used.get(api), (api, dict(seen.used))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_produces_consumes_in_a_group_and_lists(up: UpWithEndpoints) -> None:
    """kcat 1.7 (librdkafka 2.0.2) knows no flexible version but ApiVersions v3: it must go on
    working against the larger ranges advertised."""
    topic, group = "flex-kcat", "flex-kcat-group"
    _create(up, topic)
    seen = _Versions(_LIBRDKAFKA)
    bootstrap = up.info["kafka"]

    def kcat(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run(["kcat", "-b", bootstrap, "-d", "protocol", *args], input=stdin,
                              capture_output=True, text=True, timeout=90)
        seen.take(done.stderr)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    kcat("-P", "-t", topic, "-p", "0", stdin="".join(f"{v.decode()}\n" for v in VALUES[:3]))
    kcat("-P", "-t", topic, "-p", "1", stdin="".join(f"{v.decode()}\n" for v in VALUES[3:]))
    # A balanced consumer in a group reads both partitions to their ends and commits on close
    # (auto commit); the group's next consumer starts at those commits and reads nothing.
    read = kcat("-G", group, "-X", "auto.offset.reset=earliest", "-e", topic)
    assert sorted(read.split()) == [v.decode() for v in VALUES]
    again = kcat("-G", group, "-X", "auto.offset.reset=earliest", "-e", topic)
    assert again.split() == []
    offsets = kcat("-Q", "-t", f"{topic}:1:-1")
    assert f"{topic} [1] offset 3" in offsets
    listed = kcat("-L", "-t", topic)
    assert "2 partitions" in listed
    for api in ("Produce", "Fetch", "Metadata", "OffsetCommit", "OffsetFetch", "JoinGroup",
                "ListOffsets"):
        assert seen.used.get(api), (api, dict(seen.used))


def test_a_topic_created_again_gets_a_new_topic_id(up: UpWithEndpoints) -> None:
    """Topic ids are per incarnation (DESIGN §8 "Topic ids"): every listener gives the same
    one, a topic deleted and created again under its name gets a new one, and a Fetch by the
    old id finds nothing."""
    from catalog import Broker
    from tests.querylib.server.kafka._support import WireClient, make_request

    with up.cluster() as cluster:
        (coordinator,) = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                          if isinstance(b, Broker) and b.session_id is None]

    def topic_id(address: str) -> object:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        with WireClient(int(port)) as client:
            response = client.call(make_request(
                3, 12, topics=[{"name": "flex-again", "topic_id": None}],
                allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        (topic,) = response.topics
        assert topic.error_code == 0, topic
        return topic.topic_id

    _create(up, "flex-again")
    first = topic_id(up.info["kafka"])
    assert first is not None and topic_id(coordinator.kafka_address) == first
    deleted = up.tq("topic", "delete", "flex-again", "--force")
    assert deleted.returncode == 0, deleted.stderr
    _create(up, "flex-again")
    second = topic_id(up.info["kafka"])
    assert second not in (None, first)
    host, port = up.info["kafka"].rsplit(":", 1)
    with WireClient(int(port)) as client:
        fetched = client.call(make_request(
            1, 13, replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
            session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
            topics=[{"topic_id": old_or_new, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                 "current_leader_epoch": -1, "log_start_offset": -1,
                 "last_fetched_epoch": -1}]} for old_or_new in (first, second)]))
    old, new = fetched.responses
    assert [p.error_code for p in old.partitions] == [100]  # UNKNOWN_TOPIC_ID
    assert [p.error_code for p in new.partitions] == [0]
