"""Every way into a broker of a real `tq up` is admitted by the broker core (issue 13 §1):
Kafka clients, the connector endpoint and RPC producers may write a topic only if its
writers rule admits them (a query's topic: only that query; an ingest topic: anyone; a `__`
topic: only tq itself), and nobody writes after a stream's end unless its owner reopens it.

One `tq up` with both endpoints serves the module; a query it ran owns `owned`."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import QueryRef
from catalog.errors import TqError
from querylib.broker import Data, EndOfStream, PrincipalError, Producer, Subscriber
from querylib.kafka import ApiKey, ErrorCode
from querylib.records import encode_batch
from querylib.rpc import (
    Credential,
    SecretRejectedError,
    load_credential,
    load_secret,
    principal_key,
)
from tests.conftest import free_port, partition_dir, wait_for
from tests.integration._up_endpoints import UpWithEndpoints
from tests.querylib.server.kafka._support import WireClient, make_request

T0 = 1_700_000_000_000

pytestmark = pytest.mark.timeout(240)

OWNER = textwrap.dedent('''
    import querylib

    def main(ctx):
        print("the owner writes its topic", flush=True)
        with ctx.publish("owned", serde="bytes") as pub:
            pub.send(0, [b"from-the-query"])
            pub.advance_to(1)

    querylib.execute(main)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-admission"),
                         "--connector-port", str(free_port()),
                         "--kafka-port", str(free_port())) as running:
        program = running.home / "owner.py"
        program.write_text(OWNER)
        query = running.ended(running.submit(program))
        assert query.state.value == "finished", query
        yield running


def _secret(up: UpWithEndpoints) -> bytes:
    return load_secret(up.info["secret_file"])


def _address(up: UpWithEndpoints, topic: str) -> tuple[str, object]:
    with up.cluster() as cluster:
        info = cluster.lookup_topic(topic)
    return info.brokers[info.topic.locations[0]], info.topic


def _owner_query(up: UpWithEndpoints) -> int:
    _, topic = _address(up, "owned")
    return topic.owner.query_id  # type: ignore[attr-defined]


def _values(up: UpWithEndpoints, topic: str) -> list[bytes | None]:
    return [value for _, value in up.read(topic)]


def _create_ingest(up: UpWithEndpoints, topic: str) -> None:
    created = up.tq("topic", "create", topic, "--partitions", "1")
    assert created.returncode == 0, created.stderr


def _produce(up: UpWithEndpoints, topic: str, *lines: str) -> None:
    done = up.tq("produce", topic, stdin="".join(f"{line}\n" for line in lines))
    assert done.returncode == 0, done.stderr


def _ingest(up: UpWithEndpoints, tmp: Path, topic: str, *lines: str, instance: str):
    source = tmp / f"{instance}.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    return up.tq("ingest", topic, str(source), "--instance", instance, "--timeout", "10")


def test_the_query_owns_its_topic(up: UpWithEndpoints) -> None:
    _, topic = _address(up, "owned")
    assert isinstance(topic.owner, QueryRef)  # type: ignore[attr-defined]
    assert _values(up, "owned")[0] == b"from-the-query"


def test_kafka_python_is_refused_a_query_topic_but_feeds_an_ingest_one(
        up: UpWithEndpoints) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.errors import TopicAuthorizationFailedError

    _create_ingest(up, "kp-ingest")
    producer = kafka.KafkaProducer(bootstrap_servers=up.info["kafka"], retries=0,
                                   enable_idempotence=False, acks="all")
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("owned", b"injected", partition=0).get(timeout=30)
        sent = producer.send("kp-ingest", b"fed", partition=0).get(timeout=30)
        assert sent.offset == 0
    finally:
        producer.close(timeout=10)
    assert b"injected" not in _values(up, "owned")
    assert [r.value for r in up.records("kp-ingest", count=1)] == [b"fed"]


def test_confluent_kafka_is_refused_a_query_topic_but_feeds_an_ingest_one(
        up: UpWithEndpoints) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    _create_ingest(up, "ck-ingest")
    outcomes: list[tuple[str, int | None]] = []

    def report(error, message) -> None:
        outcomes.append((message.topic(), None if error is None else error.code()))

    producer = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"], "acks": "all",
                                         "message.send.max.retries": 0})
    producer.produce("owned", value=b"injected", partition=0, on_delivery=report)
    producer.produce("ck-ingest", value=b"fed", partition=0, on_delivery=report)
    assert producer.flush(30) == 0
    assert sorted(outcomes) == [
        ("ck-ingest", None),
        ("owned", confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    assert b"injected" not in _values(up, "owned")
    assert [r.value for r in up.records("ck-ingest", count=1)] == [b"fed"]


def test_a_connector_stream_into_a_query_topic_is_refused(up: UpWithEndpoints,
                                                           tmp_path: Path) -> None:
    refused = _ingest(up, tmp_path, "owned", "injected", instance="into-owned")
    assert refused.returncode != 0
    assert "owned" in refused.stderr and "write" in refused.stderr, refused.stderr
    _create_ingest(up, "cn-ingest")
    fed = _ingest(up, tmp_path, "cn-ingest", "fed", instance="into-ingest")
    assert fed.returncode == 0, fed.stderr
    assert b"injected" not in _values(up, "owned")
    assert _values(up, "cn-ingest") == [b"fed"]


def test_rpc_producers_other_than_the_owner_are_refused_a_query_topic(
        up: UpWithEndpoints, tmp_path: Path) -> None:
    address, _ = _address(up, "owned")
    owner = _owner_query(up)
    # The holder of the cluster secret ("admin") is not the topic's owner, nor is a user.
    mallory = tmp_path / "mallory.credential"
    assert up.tq("user", "add", "mallory", "-o", str(mallory)).returncode == 0
    for credential in [_secret(up), load_credential(mallory)]:
        with pytest.raises(TqError, match="may not write"):
            Producer(address, "owned", 0, secret=credential, timeout=10)
    # Nobody authenticates as tq itself ("system"), or as a query that does not exist: no
    # key is valid for them, and the executor's broker, told so by the coordinator, refuses
    # them at the handshake.
    secret = _secret(up)
    for principal in ["system", f"query:{owner + 1000}"]:
        with pytest.raises(SecretRejectedError):
            Producer(address, "owned", 0, secret=Credential(
                principal, principal_key(secret, principal)), timeout=10)
    assert b"by-the-owner" not in _values(up, "owned")


def test_system_topics_refuse_every_writer_but_tq(up: UpWithEndpoints) -> None:
    secret = _secret(up)
    catalog_broker = up.info["catalog_broker"]
    executor_broker, _ = _address(up, "owned")
    for address, topic in [(catalog_broker, "__catalog.topics"),
                           (catalog_broker, "__consumer_offsets"),
                           (executor_broker, "__logs")]:
        with pytest.raises(TqError, match="may not write"):
            Producer(address, topic, 0, secret=secret, timeout=10)
    # A Kafka Produce straight to the executor's listener (Metadata never names `__logs`, so
    # a client library would not even try): TOPIC_AUTHORIZATION_FAILED.
    host, port = up.info["kafka"].rsplit(":", 1)
    assert host == "127.0.0.1"
    records = encode_batch([(T0, None, b"forged line", ())])
    with WireClient(int(port)) as client:
        response = client.call(make_request(
            ApiKey.PRODUCE, 7, acks=-1, timeout=5000, transactional_id=None,
            topic_data=[{"name": "__logs", "partition_data": [{"index": 0,
                                                                "records": records}]}]))
    (refused,) = response.responses[0].partition_responses
    assert refused.error_code == ErrorCode.topic_authorization_failed
    # tq's own writers still write there: the query's output reached __logs.
    logs = up.tq("logs", str(_owner_query(up)))
    assert logs.returncode == 0, logs.stderr
    assert "the owner writes its topic" in logs.stdout


def test_writes_after_the_end_of_a_stream_are_refused_on_every_path(
        up: UpWithEndpoints, tmp_path: Path) -> None:
    _create_ingest(up, "ended")
    _produce(up, "ended", "first")  # EOF ends the stream
    address, _ = _address(up, "ended")
    secret = _secret(up)
    with pytest.raises(TqError, match="ended"):
        Producer(address, "ended", 0, secret=secret, timeout=10)

    kafka = pytest.importorskip("kafka")
    from kafka.errors import PolicyViolationError

    producer = kafka.KafkaProducer(bootstrap_servers=up.info["kafka"], retries=0,
                                   enable_idempotence=False)
    try:
        with pytest.raises(PolicyViolationError):
            producer.send("ended", b"late", partition=0).get(timeout=30)
    finally:
        producer.close(timeout=10)

    late = _ingest(up, tmp_path, "ended", "late", instance="after-the-end")
    assert late.returncode != 0 and "ended" in late.stderr, late.stderr
    assert _values(up, "ended") == [b"first"]


def test_an_explicit_reopen_goes_on_and_readers_agree(up: UpWithEndpoints) -> None:
    _create_ingest(up, "reopened")
    _produce(up, "reopened", "first")
    address, _ = _address(up, "reopened")
    secret = _secret(up)
    # A live reader that saw the end stops there.
    with Subscriber(address, "reopened", [0], secret=secret) as live:
        seen = []
        for event in live:
            seen.append(event)
    assert isinstance(seen[-1], EndOfStream)
    # `tq produce` reopens the ingest topic explicitly; so may any writer the rule admits.
    _produce(up, "reopened", "second")
    with Producer(address, "reopened", 0, secret=secret, reopen=True, timeout=10) as producer:
        producer.send(b"third", time=5)
    # A reader replaying the history goes on past the superseded ends to the current one.
    with Subscriber(address, "reopened", [0], secret=secret) as replay:
        events = list(replay)
    values = [r.value for e in events if isinstance(e, Data) for r in e.records]
    assert values == [b"first", b"second", b"third"]
    assert [type(e).__name__ for e in events].count("EndOfStream") == 1
    assert isinstance(events[-1], EndOfStream)
    consumed = up.tq("consume", "reopened", "--follow")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split() == ["first", "second", "third"]
    wait_for(lambda: _values(up, "reopened") == [b"first", b"second", b"third"], timeout=10)


def test_a_kafka_batch_over_the_brokers_maximum_is_message_too_large(
        up: UpWithEndpoints) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.errors import MessageSizeTooLargeError

    _create_ingest(up, "too-large")
    # The client's own size checks are set above the broker's maximum (8 MiB), so it is the
    # broker that answers.
    producer = kafka.KafkaProducer(bootstrap_servers=up.info["kafka"], retries=0,
                                   enable_idempotence=False, max_request_size=32 << 20)
    try:
        with pytest.raises(MessageSizeTooLargeError):
            producer.send("too-large", b"x" * (9 << 20), partition=0).get(timeout=60)
        assert producer.send("too-large", b"small", partition=0).get(timeout=30).offset == 0
    finally:
        producer.close(timeout=10)


def test_rpc_clients_drop_nothing_and_create_only_what_the_catalog_places(
        up: UpWithEndpoints, tmp_path: Path) -> None:
    """A user may not drop a topic's partitions over broker RPC (only `tq topic delete`, or the
    admin on a standalone broker), nor have a broker create partitions the catalog does not
    place there by reading them."""
    address, topic = _address(up, "owned")
    eve = tmp_path / "eve.credential"
    assert up.tq("user", "add", "eve", "-o", str(eve)).returncode == 0
    credential = load_credential(eve)
    before = _values(up, "owned")

    async def attempt() -> None:
        from querylib.broker import BrokerLink
        from querylib.broker.messages import (
            DropPartitionRequest,
            EnsurePartition,
            WriteMarkersRequest,
        )
        from querylib.records import transaction_marker_batch

        link = BrokerLink(address, credential, timeout=10)
        await link.start()
        try:
            with pytest.raises(PrincipalError, match="may not drop partitions"):
                await link.request(DropPartitionRequest(topic="owned", partition=0))
            # Transaction markers are the transaction coordinator's (the admin's) to write,
            # refused before any partition is touched.
            marker = transaction_marker_batch(1, 0, True, timestamp=0)
            with pytest.raises(PrincipalError, match="may not write transaction markers"):
                await link.request(WriteMarkersRequest(session=link.session,
                                                       partitions=[("owned", 0)]),
                                   payload=[marker])
            for partition in (1, 7):  # `owned` has one partition
                with pytest.raises(TqError, match="no partition"):
                    await link.request(EnsurePartition(topic="owned", partition=partition,
                                                       create=True))
        finally:
            await link.close()
        admin = BrokerLink(address, _secret(up), timeout=10)
        await admin.start()
        try:  # even the admin names a bounded number of partitions per marker request
            with pytest.raises(TqError, match="at most 10000 partitions"):
                await admin.request(WriteMarkersRequest(
                    session=admin.session, partitions=[("owned", 0)] * 10_001),
                    payload=[transaction_marker_batch(1, 0, True, timestamp=0)])
        finally:
            await admin.close()

    asyncio.run(attempt())
    assert _values(up, "owned") == before
    executor = up.home / "executor"
    assert partition_dir(executor, "owned-1") is None and partition_dir(executor, "owned-7") is None
