"""Kafka's admin apis against a real `tq up` (its executor broker's listener, the catalog behind
it), from confluent-kafka's AdminClient and kafka-python's KafkaAdminClient, each checked by its
effect: CreatePartitions grows the catalog's topic (a producer then writes the new partition and
a consumer reads it), IncrementalAlterConfigs stores the topic's configs in the catalog and the
broker applies them (retention removes segments from disk), DeleteRecords moves the log start
(consumers start there), DeleteTopics removes the topic from the catalog."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import Broker, UnknownTopicError
from querylib.kafka import ApiKey, ErrorCode
from tests.conftest import free_port, wait_for
from tests.conftest import partition_dir as find_partition_dir
from tests.integration._up_endpoints import UpWithEndpoints
from tests.querylib.server.kafka._support import WireClient, make_request

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-kafka-admin"),
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def bootstrap(up: UpWithEndpoints) -> str:
    return up.info["kafka"]


def produce(up: UpWithEndpoints, topic: str, count: int, partition: int = 0,
            size: int = 10) -> None:
    """`count` records, each its own batch, each delivered: a producer's first Metadata may
    reach the group coordinator's listener, which creates no topics (issue 15's first point,
    another part's), so a failed delivery is sent again."""
    producer = Producer({"bootstrap.servers": bootstrap(up), "linger.ms": 0,
                         "topic.metadata.refresh.interval.ms": 500})
    deadline = time.monotonic() + 60
    for i in range(count):
        while True:
            errors: list[object] = []
            producer.produce(topic, value=b"%d-" % i + b"x" * size, partition=partition,
                             on_delivery=lambda err, _msg, seen=errors: seen.append(err))
            assert producer.flush(30) == 0
            if errors == [None]:
                break
            assert time.monotonic() < deadline, f"not delivered: {errors}"


def read_first(up: UpWithEndpoints, topic: str, partition: int) -> tuple[int, bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap(up), "group.id": "reader"})
    try:
        consumer.assign([TopicPartition(topic, partition, confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                return message.offset(), message.value()
        raise AssertionError(f"nothing read from {topic}-{partition}")
    finally:
        consumer.close()


def catalog_topic(up: UpWithEndpoints, name: str):
    with up.cluster() as cluster:
        return cluster.lookup_topic(name).topic


def partition_dir(up: UpWithEndpoints, topic: str, partition: int) -> Path | None:
    """The partition's directory under whichever of the host's brokers holds it."""
    return find_partition_dir(up.home / "executor", f"{topic}-{partition}")


def test_confluent_create_partitions_grows_the_topic_everywhere(up: UpWithEndpoints) -> None:
    produce(up, "growing", 1)
    admin = AdminClient({"bootstrap.servers": bootstrap(up)})
    admin.create_partitions([NewPartitions("growing", 3)],
                            operation_timeout=30)["growing"].result(30)
    topic = catalog_topic(up, "growing")
    assert (topic.partitions, len(topic.locations)) == (3, 3)
    wait_for(lambda: len(admin.list_topics("growing", timeout=10)
                         .topics["growing"].partitions) == 3,
             timeout=30, what="Metadata to list 3 partitions")
    produce(up, "growing", 1, partition=2)
    assert read_first(up, "growing", 2) == (0, b"0-" + b"x" * 10)
    shrink = admin.create_partitions([NewPartitions("growing", 2)],
                                     operation_timeout=30)["growing"]
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        shrink.result(30)
    assert failed.value.args[0].code() == confluent_kafka.KafkaError.INVALID_PARTITIONS
    assert catalog_topic(up, "growing").partitions == 3


def test_kafka_python_create_partitions(up: UpWithEndpoints) -> None:
    produce(up, "grown-by-python", 1)
    client = kafka.KafkaAdminClient(bootstrap_servers=bootstrap(up), request_timeout_ms=30000)
    try:
        client.create_partitions({"grown-by-python": kafka.admin.NewPartitions(2)})
    finally:
        client.close()
    assert catalog_topic(up, "grown-by-python").partitions == 2
    produce(up, "grown-by-python", 1, partition=1)
    assert read_first(up, "grown-by-python", 1)[0] == 0


def test_confluent_incremental_alter_configs_is_kept_and_applied(up: UpWithEndpoints) -> None:
    produce(up, "retained", 1)
    admin = AdminClient({"bootstrap.servers": bootstrap(up)})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "retained", incremental_configs=[
        ConfigEntry("segment.bytes", "1000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.bytes", "2000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    assert dict(catalog_topic(up, "retained").configs) == {
        "retention.bytes": "2000", "segment.bytes": "1000"}
    described = ConfigResource(ConfigResource.Type.TOPIC, "retained")

    def describe() -> dict:
        return admin.describe_configs([described])[described].result(30)

    # A listener's catalog view follows the catalog: it may answer from before the change.
    wait_for(lambda: describe()["segment.bytes"].value == "1000", timeout=30,
             what="DescribeConfigs to show the new segment.bytes")
    configs = describe()
    assert configs["segment.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    # The broker rolls segments of 1000 bytes and keeps about 2000 bytes: old ones go.
    produce(up, "retained", 30, size=300)
    directory = partition_dir(up, "retained", 0)
    assert directory is not None
    wait_for(lambda: "00000000000000000000.log" not in {p.name for p in directory.iterdir()},
             timeout=30, what="retention to remove the first segment")
    assert read_first(up, "retained", 0)[0] > 0
    unknown = ConfigResource(ConfigResource.Type.TOPIC, "retained", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        admin.incremental_alter_configs([unknown])[unknown].result(30)
    assert failed.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG


def test_kafka_python_alter_configs_sets_and_deletes(up: UpWithEndpoints) -> None:
    produce(up, "configured-by-python", 1)
    client = kafka.KafkaAdminClient(bootstrap_servers=bootstrap(up), request_timeout_ms=30000)
    try:
        resource = kafka.admin.ConfigResource("TOPIC", "configured-by-python",
                                              {"retention.ms": "86400000"})
        assert client.alter_configs([resource]) == {"topic": {"configured-by-python": "OK"}}
        assert dict(catalog_topic(up, "configured-by-python").configs) == {
            "retention.ms": "86400000"}
        removed = kafka.admin.ConfigResource("TOPIC", "configured-by-python",
                                             {"retention.ms": ("DELETE", None)})
        client.alter_configs([removed])
        assert catalog_topic(up, "configured-by-python").configs == ()
    finally:
        client.close()


def test_delete_records_and_delete_topics_through_tq_up(up: UpWithEndpoints) -> None:
    produce(up, "short-lived", 5)
    client = kafka.KafkaAdminClient(bootstrap_servers=bootstrap(up), request_timeout_ms=30000)
    try:
        partition = kafka.TopicPartition("short-lived", 0)
        assert client.delete_records({partition: 3})[partition]["low_watermark"] == 3
        assert read_first(up, "short-lived", 0) == (3, b"3-" + b"x" * 10)
        directory = partition_dir(up, "short-lived", 0)
        assert directory and (directory / "log-start-offset-checkpoint").exists()
    finally:
        client.close()
    admin = AdminClient({"bootstrap.servers": bootstrap(up)})
    admin.delete_topics(["short-lived"], operation_timeout=30)["short-lived"].result(30)
    with pytest.raises(UnknownTopicError):
        catalog_topic(up, "short-lived")
    wait_for(lambda: partition_dir(up, "short-lived", 0) is None, timeout=30,
             what="the broker to drop the deleted topic's files")


def test_the_group_coordinators_listener_alters_and_deletes_topics_too(
        up: UpWithEndpoints) -> None:
    """Clients send CreatePartitions and DeleteTopics to the controller and
    IncrementalAlterConfigs to any broker: the coordinator's listener serves them as well."""
    produce(up, "via-coordinator", 1)
    with up.cluster() as cluster:
        (broker,) = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                     if isinstance(b, Broker) and b.session_id is None]
    port = int(broker.kafka_address.rpartition(":")[2])
    with WireClient(port) as wire:
        grown = wire.call(make_request(ApiKey.CREATE_PARTITIONS, 1, topics=[
            {"name": "via-coordinator", "count": 2, "assignments": None}],
            timeout=30000, validate_only=False))
        assert [r.error_code for r in grown.results] == [ErrorCode.none]
        assert catalog_topic(up, "via-coordinator").partitions == 2
        altered = wire.call(make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, resources=[
            {"resource_type": 2, "resource_name": "via-coordinator", "configs": [
                {"name": "retention.ms", "config_operation": 0, "value": "5000"}]}],
            validate_only=False))
        assert [r.error_code for r in altered.responses] == [ErrorCode.none]
        assert dict(catalog_topic(up, "via-coordinator").configs) == {"retention.ms": "5000"}
        system = wire.call(make_request(ApiKey.DELETE_TOPICS, 3,
                                        topic_names=["__catalog.topics"], timeout=30000))
        assert [r.error_code for r in system.responses] == [
            ErrorCode.topic_authorization_failed]
        deleted = wire.call(make_request(ApiKey.DELETE_TOPICS, 3,
                                         topic_names=["via-coordinator"], timeout=30000))
        assert [r.error_code for r in deleted.responses] == [ErrorCode.none]
    with pytest.raises(UnknownTopicError):
        catalog_topic(up, "via-coordinator")


def test_a_client_that_does_not_write_a_topic_may_not_change_it(up: UpWithEndpoints) -> None:
    """Kafka's ALTER and DELETE on a topic are its writers' and the admin's (DESIGN §12): an
    anonymous client (no SASL) may change ingest topics, not one a principal owns."""
    with up.connect() as ctx, ctx.publish("owned", serde="bytes") as out:
        out.send(1, [b"mine"])
    admin = AdminClient({"bootstrap.servers": bootstrap(up)})
    refused = confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    futures = [admin.delete_topics(["owned"], operation_timeout=30)["owned"],
               admin.create_partitions([NewPartitions("owned", 2)],
                                       operation_timeout=30)["owned"],
               *admin.delete_records([TopicPartition("owned", 0, 1)],
                                     operation_timeout=30).values()]
    resource = ConfigResource(ConfigResource.Type.TOPIC, "owned", incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    futures.append(admin.incremental_alter_configs([resource])[resource])
    for future in futures:
        with pytest.raises(confluent_kafka.KafkaException) as failed:
            future.result(30)
        assert failed.value.args[0].code() == refused
    topic = catalog_topic(up, "owned")
    assert (topic.partitions, topic.configs) == (1, ())
    assert read_first(up, "owned", 0) == (0, b"mine")
