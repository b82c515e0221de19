"""Kafka's admin apis from confluent-kafka's AdminClient and kafka-python's KafkaAdminClient
against a real listener process (`tq kafka`'s): each call checked by its effect (what a
consumer then reads, what Metadata lists, the files in the data directory, a restart), not
only by the response: DeleteTopics, DeleteRecords, DescribeConfigs, DescribeCluster,
DeleteGroups and OffsetDelete."""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_for
from tests.interop._kafka import KafkaServer

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, ConfigResource  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def produce(server: KafkaServer, topic: str, count: int) -> None:
    """`count` records, each its own batch (flushed one by one)."""
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i)
        assert producer.flush(20) == 0


def first_offset_read(server: KafkaServer, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                return message.offset()
        raise AssertionError("nothing read")
    finally:
        consumer.close()


def watermarks(server: KafkaServer, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "marks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()


def admin(server: KafkaServer) -> AdminClient:
    return AdminClient({"bootstrap.servers": server.bootstrap})


def python_admin(server: KafkaServer):
    return kafka.KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=20000)


# ---- DeleteTopics ---------------------------------------------------------------------------


def test_confluent_delete_topics_removes_the_topic_and_its_files(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "doomed", 3)
    assert (server.data_dir / "doomed-0").is_dir()
    client = admin(server)  # (kept: its futures fail once the client is collected)
    futures = client.delete_topics(["doomed"], operation_timeout=20)
    futures["doomed"].result(20)
    assert "doomed" not in client.list_topics(timeout=10).topics
    assert not (server.data_dir / "doomed-0").exists()
    missing = client.delete_topics(["doomed"], operation_timeout=20)["doomed"]
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        missing.result(20)
    assert failed.value.args[0].code() == confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART


def test_kafka_python_delete_topics_removes_the_topic(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "gone", 2)
    client = python_admin(server)
    try:
        client.delete_topics(["gone"], timeout_ms=20000)
        assert "gone" not in client.list_topics()
    finally:
        client.close()
    assert not (server.data_dir / "gone-0").exists()
    produce(server, "gone", 1)  # made again, empty: it starts at offset 0
    assert watermarks(server, "gone") == (0, 1)


def test_internal_topics_cannot_be_deleted(kafka_server) -> None:
    server = kafka_server.start()
    client = admin(server)
    future = client.delete_topics(["__consumer_offsets"],
                                  operation_timeout=20)["__consumer_offsets"]
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        future.result(20)
    assert failed.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert (server.data_dir / "__consumer_offsets-0").is_dir()


# ---- DeleteRecords ----------------------------------------------------------------------------


def test_confluent_delete_records_advances_the_log_start_across_a_restart(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "trimmed", 10)
    client = admin(server)
    futures = client.delete_records([TopicPartition("trimmed", 0, 6)], operation_timeout=20)
    (done,) = futures.values()
    assert done.result(20).low_watermark == 6
    assert watermarks(server, "trimmed") == (6, 10)
    assert first_offset_read(server, "trimmed") == 6
    checkpoint = server.data_dir / "trimmed-0" / "log-start-offset-checkpoint"
    assert checkpoint.read_text().split("\n")[2] == "trimmed 0 6"
    server.stop()
    server.start()
    assert watermarks(server, "trimmed") == (6, 10)
    assert first_offset_read(server, "trimmed") == 6
    # A read below the start is out of range: the consumer resets to the start.
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "below",
                         "auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition("trimmed", 0, 2)])
        deadline, error = time.monotonic() + 20, None
        while error is None and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is not None:
                error = message.error()
        assert error is not None
        assert error.code() == confluent_kafka.KafkaError._AUTO_OFFSET_RESET
    finally:
        consumer.close()


def test_kafka_python_delete_records_to_the_end_and_past_it(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "emptied", 4)
    client = python_admin(server)
    try:
        partition = kafka.TopicPartition("emptied", 0)
        result = client.delete_records({partition: -1})  # -1: up to the high watermark
        assert result[partition]["low_watermark"] == 4
        assert watermarks(server, "emptied") == (4, 4)
        with pytest.raises(kafka.errors.OffsetOutOfRangeError):
            client.delete_records({partition: 9})
    finally:
        client.close()


# ---- DescribeConfigs, DescribeCluster ---------------------------------------------------------

EXPECTED = {"retention.ms": "-1", "retention.bytes": "-1", "segment.bytes": "1073741824",
            "max.message.bytes": str(8 * 1024 * 1024), "cleanup.policy": "delete",
            "message.timestamp.type": "CreateTime"}


def test_confluent_describe_configs_of_a_topic_and_the_broker(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "configured", 1)
    client = admin(server)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "configured")
    configs = client.describe_configs([resource])[resource].result(20)
    assert {name: c.value for name, c in configs.items()} == EXPECTED
    assert configs["retention.ms"].source == \
        confluent_kafka.admin.ConfigSource.STATIC_BROKER_CONFIG.value
    broker = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = client.describe_configs([broker])[broker].result(20)
    assert configs["message.max.bytes"].value == EXPECTED["max.message.bytes"]
    assert configs["log.retention.ms"].value == "-1"
    missing = ConfigResource(ConfigResource.Type.TOPIC, "no-such-topic")
    with pytest.raises(confluent_kafka.KafkaException):
        client.describe_configs([missing])[missing].result(20)


def test_kafka_python_describe_configs_and_cluster(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "described", 1)
    client = python_admin(server)
    try:
        described = client.describe_configs(
            [kafka.admin.ConfigResource("TOPIC", "described")], config_filter="all")
        configs = described["topic"]["described"]
        assert {name: c["value"] for name, c in configs.items()} == EXPECTED
        assert configs["retention.ms"]["config_source"] == "STATIC_BROKER_CONFIG"
        cluster = client.describe_cluster()
        assert [(b["broker_id"], b["port"]) for b in cluster["brokers"]] == [(0, server.port)]
        assert cluster["controller_id"] == 0
    finally:
        client.close()


def test_confluent_describe_cluster(kafka_server) -> None:
    server = kafka_server.start()
    client = admin(server)
    described = client.describe_cluster(request_timeout=20).result(20)
    assert [(n.id, n.port) for n in described.nodes] == [(0, server.port)]
    assert described.controller.id == 0
    assert described.cluster_id == client.list_topics(timeout=10).cluster_id


# ---- DeleteGroups, OffsetDelete ----------------------------------------------------------------


def commit(server: KafkaServer, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()


def committed(server: KafkaServer, group: str, topic: str, partition: int = 0) -> int:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group})
    try:
        (found,) = consumer.committed([TopicPartition(topic, partition)], timeout=10)
        return found.offset
    finally:
        consumer.close()


def test_confluent_delete_consumer_groups_forgets_their_offsets(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "grouped", 3)
    commit(server, "finished", "grouped", {0: 2})
    assert committed(server, "finished", "grouped") == 2
    client = admin(server)
    client.delete_consumer_groups(["finished"], request_timeout=20)["finished"].result(20)
    assert committed(server, "finished", "grouped") == confluent_kafka.OFFSET_INVALID
    server.stop()  # the tombstones are in __consumer_offsets: a restart keeps them deleted
    server.start()
    assert committed(server, "finished", "grouped") == confluent_kafka.OFFSET_INVALID
    client = admin(server)
    unknown = client.delete_consumer_groups(["never-used"], request_timeout=20)["never-used"]
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        unknown.result(20)
    assert failed.value.args[0].code() == confluent_kafka.KafkaError.GROUP_ID_NOT_FOUND


def test_a_group_with_members_is_not_deleted(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "busy", 2)
    member = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "active",
                       "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    try:
        member.subscribe(["busy"])
        wait_for(lambda: member.poll(0.2) is not None and bool(member.assignment()),
                 timeout=30, what="the member to join")
        confluent = admin(server)
        future = confluent.delete_consumer_groups(["active"], request_timeout=20)["active"]
        with pytest.raises(confluent_kafka.KafkaException) as failed:
            future.result(20)
        assert failed.value.args[0].code() == confluent_kafka.KafkaError.NON_EMPTY_GROUP
        client = python_admin(server)
        try:
            result = client.delete_group_offsets(
                "active", [kafka.TopicPartition("busy", 0)])
            (error,) = result.values()
            assert error is kafka.errors.GroupSubscribedToTopicError or \
                isinstance(error, kafka.errors.GroupSubscribedToTopicError)
        finally:
            client.close()
    finally:
        member.close()


def test_kafka_python_delete_groups_and_group_offsets(kafka_server) -> None:
    server = kafka_server.start()
    produce(server, "two", 1)
    commit(server, "idle", "two", {0: 1})
    commit(server, "other", "two", {0: 1})
    client = python_admin(server)
    try:
        partition = kafka.TopicPartition("two", 0)
        result = client.delete_group_offsets("idle", [partition])
        assert result[partition] is None or result[partition] is kafka.errors.NoError, result
        assert committed(server, "idle", "two") == confluent_kafka.OFFSET_INVALID
        results = dict(client.delete_groups(["other"]))
        assert results == {"other": "OK"}
        assert committed(server, "other", "two") == confluent_kafka.OFFSET_INVALID
    finally:
        client.close()
