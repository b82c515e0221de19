"""One view from every listener of a real `tq up` (issue 15): the executor broker's Kafka
listener and the coordinator broker's (the group coordinator) answer Metadata for every topic
with its real leader and name one controller (the coordinator's broker); topics are created
through either, by auto-creation and by CreateTopics (forwarded to the coordinator).

- kafka-python produces into 20 fresh topics through whichever listener it picks, 20 of 20,
  twice over (its metadata requests go to the least loaded node, often the coordinator's);
- `kcat -L -t T` through one listener knows a topic created through the other;
- CreateTopics sent straight to each listener: created, TOPIC_ALREADY_EXISTS, validate_only
  (checks, creates nothing), INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS,
  INVALID_REPLICATION_FACTOR; confluent's AdminClient and kafka-python's KafkaAdminClient
  bootstrapped from each listener create topics."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from catalog import Broker
from querylib.kafka import ApiKey
from querylib.kafka._client import KafkaClient
from tests.conftest import free_port, wait_for
from tests.integration._up_endpoints import UpWithEndpoints
from tests.interop._kafka import run

pytestmark = pytest.mark.timeout(300)

kcat = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    # One executor broker (the listeners of broker shards: tests/integration/
    # test_executor_shards.py).
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-kafka-view"), "--brokers", "1",
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def _coordinator_broker(up: UpWithEndpoints) -> tuple[int, str]:
    with up.cluster() as cluster:
        (found,) = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                    if isinstance(b, Broker) and b.session_id is None]
    return found.broker_id, found.kafka_address


def _executor_broker(up: UpWithEndpoints) -> int:
    with up.cluster() as cluster:
        (found,) = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                    if isinstance(b, Broker) and b.session_id is not None]
    return found.broker_id


def _listeners(up: UpWithEndpoints) -> list[str]:
    return [up.info["kafka"], _coordinator_broker(up)[1]]


def _metadata(bootstrap: str, topic: str | None = None) -> dict:
    args = ["kcat", "-b", bootstrap, "-L", "-J"] + ([] if topic is None else ["-t", topic])
    listed = run(args, timeout=30)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


@kcat
def test_every_listener_names_the_coordinators_broker_as_the_one_controller(up) -> None:
    coordinator_id, _ = _coordinator_broker(up)
    controllers = {_metadata(bootstrap)["controllerid"] for bootstrap in _listeners(up)}
    assert controllers == {coordinator_id}


@kcat
def test_a_topic_created_through_one_listener_is_known_through_the_other(up) -> None:
    executor_id = _executor_broker(up)
    brokers = {b: b for b in _listeners(up)}
    for made, name in ((up.info["kafka"], "view-made-on-executor"),
                       (_coordinator_broker(up)[1], "view-made-on-coordinator")):
        with KafkaClient(made) as client:
            created = client.call(ApiKey.CREATE_TOPICS, 4, topics=[_new(name, 2)],
                                  timeout=30_000, validate_only=False)
        assert [(t.name, t.error_code) for t in created.topics] == [(name, 0)], created
        for bootstrap in brokers:
            metadata = _metadata(bootstrap, name)
            (topic,) = metadata["topics"]
            assert topic.get("error") is None, (bootstrap, topic)
            # Led by the executor's broker (the coordinator's holds no data topic), which
            # Metadata lists with its own Kafka address.
            assert {p["leader"] for p in topic["partitions"]} == {executor_id}
            named = {b["id"]: b["name"].split("/")[0] for b in metadata["brokers"]}
            assert named[executor_id] == up.info["kafka"]


@pytest.mark.parametrize("where", ["executor", "coordinator"])
def test_kafka_python_produces_into_20_fresh_topics(up, where: str) -> None:
    """Bootstrapped from either listener, twice over; kafka-python then asks whichever node
    it finds least loaded (the issue saw 4 failures in 6 with a 10 s metadata wait)."""
    kafka = pytest.importorskip("kafka")
    bootstrap = up.info["kafka"] if where == "executor" else _coordinator_broker(up)[1]
    for round_ in range(2):
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                       max_block_ms=10_000)
        names = [f"view-fresh-{where}-{round_}-{i}" for i in range(20)]
        try:
            sent = {}
            for name in names:
                try:
                    sent[name] = producer.send(name, b"first of " + name.encode()).get(30)
                except kafka.errors.KafkaError as exc:  # counted, so the report says how many
                    sent[name] = exc
            failed = {n: repr(r) for n, r in sent.items() if isinstance(r, Exception)}
            assert not failed, f"{len(failed)} of 20 topics failed: {failed}"
        finally:
            producer.close(5)
        for name in names:
            assert [r.value for r in up.records(name, count=1)] == [b"first of " +
                                                                   name.encode()]


@pytest.mark.parametrize("where", ["executor", "coordinator"])
def test_create_topics_answers_as_kafka_through_each_listener(up, where: str) -> None:
    address = up.info["kafka"] if where == "executor" else _coordinator_broker(up)[1]
    name = f"view-ct-{where}"
    with KafkaClient(address) as client:
        def create(*topics: dict, validate_only: bool = False) -> list[tuple[str, int]]:
            answer = client.call(ApiKey.CREATE_TOPICS, 4, topics=list(topics),
                                 timeout=30_000, validate_only=validate_only)
            return [(t.name, t.error_code) for t in answer.topics]

        assert create(_new(name + "-checked", 3), validate_only=True) == [
            (name + "-checked", 0)]
        assert create(_new("bad name!", 1), _new(name + "-zero", 0),
                      _new(name + "-rf", 1, replication=3), validate_only=True) == [
            ("bad name!", 17), (name + "-zero", 37), (name + "-rf", 38)]
        assert create(_new(name, 3)) == [(name, 0)]
        assert create(_new(name, 3)) == [(name, 36)]
        assert create(_new(name, 3), validate_only=True) == [(name, 36)]
        assert create(_new("bad name!", 1), _new(name + "-zero", 0)) == [
            ("bad name!", 17), (name + "-zero", 37)]
    with up.cluster() as cluster:
        assert cluster.lookup_topic(name).topic.partitions == 3
        for never in (name + "-checked", name + "-zero"):
            with pytest.raises(Exception, match="no topic"):
                cluster.lookup_topic(never)


@pytest.mark.parametrize("where", ["executor", "coordinator"])
def test_admin_clients_create_topics_bootstrapped_from_each_listener(up, where: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic
    kafka_admin = pytest.importorskip("kafka.admin")
    address = up.info["kafka"] if where == "executor" else _coordinator_broker(up)[1]

    admin = AdminClient({"bootstrap.servers": address})
    futures = admin.create_topics([NewTopic(f"view-admin-c-{where}", 2, 1)],
                                  operation_timeout=20)
    futures[f"view-admin-c-{where}"].result(30)
    again = admin.create_topics([NewTopic(f"view-admin-c-{where}", 2, 1)])
    with pytest.raises(confluent_kafka.KafkaException) as exc_info:
        again[f"view-admin-c-{where}"].result(30)
    assert exc_info.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS

    client = kafka_admin.KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=20_000)
    try:
        client.create_topics([kafka_admin.NewTopic(f"view-admin-k-{where}", 2, 1)])
        from kafka.errors import TopicAlreadyExistsError
        with pytest.raises(TopicAlreadyExistsError):
            client.create_topics([kafka_admin.NewTopic(f"view-admin-k-{where}", 2, 1)])
    finally:
        client.close()
    with up.cluster() as cluster:
        for name in (f"view-admin-c-{where}", f"view-admin-k-{where}"):
            assert cluster.lookup_topic(name).topic.partitions == 2

    def listed() -> bool:
        metadata = _metadata(address)
        return {f"view-admin-c-{where}", f"view-admin-k-{where}"} <= {
            t["topic"] for t in metadata["topics"]}

    if shutil.which("kcat"):
        wait_for(listed, timeout=30, what="both topics in a full Metadata listing")


@pytest.mark.parametrize("where", ["executor", "coordinator"])
def test_metadata_creates_a_topic_unless_the_client_declines(up, where: str) -> None:
    """Kafka's auto-creation through either listener; allow.auto.create.topics=false (Metadata
    v4+) is honoured."""
    address = up.info["kafka"] if where == "executor" else _coordinator_broker(up)[1]
    name = f"view-auto-{where}"
    with KafkaClient(address) as client:
        declined = client.call(ApiKey.METADATA, 8, topics=[{"name": name}],
                               allow_auto_topic_creation=False,
                               include_cluster_authorized_operations=False,
                               include_topic_authorized_operations=False)
        assert [(t.name, t.error_code) for t in declined.topics] == [(name, 3)]
        created = client.call(ApiKey.METADATA, 8, topics=[{"name": name}],
                              allow_auto_topic_creation=True,
                              include_cluster_authorized_operations=False,
                              include_topic_authorized_operations=False)
    (topic,) = created.topics
    assert (topic.name, topic.error_code) == (name, 0)
    assert [p.leader_id for p in topic.partitions] == [_executor_broker(up)]
    with up.cluster() as cluster:
        assert cluster.lookup_topic(name).topic.locations == (_executor_broker(up),)


def _new(name: str, partitions: int, replication: int = 1) -> dict:
    return {"name": name, "num_partitions": partitions, "replication_factor": replication,
            "assignments": [], "configs": []}
