"""SASL and TLS on `tq up`'s Kafka listeners (DESIGN §12), with the four Kafka clients: users
made by `tq user add` authenticate with PLAIN and SCRAM-SHA-256/512; a wrong password or an
unauthenticated connection gets nothing; topic writes are authorized as the user (29) and
groups belong to the user that first uses them (30); SASL_SSL with confluent-kafka."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from querylib.cluster import Cluster
from tests.conftest import free_port
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(300)

confluent_kafka = pytest.importorskip("confluent_kafka")


class SaslUp(Up):
    """`tq up` whose Kafka listeners (the executor's and the group coordinator's) require
    SASL, and users alice and bob with their Kafka passwords."""

    def __init__(self, home: Path, *extra: str) -> None:
        super().__init__(home, "--kafka-port", str(free_port()), "--connector-port", "-1",
                         "--kafka-sasl", *extra, slots=1)
        self.passwords: dict[str, str] = {}
        for name in ("alice", "bob"):
            done = self.tq("user", "add", name, "-o", str(home / f"{name}.credential"))
            assert done.returncode == 0, done.stderr
            found = re.search(r"username (\S+), password (\S+)", done.stdout)
            assert found is not None, done.stdout
            self.passwords[found[1]] = found[2]

    @property
    def bootstrap(self) -> str:
        return self.info["kafka"]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslUp]:
    with SaslUp(tmp_path_factory.mktemp("tq-up-sasl")) as running:
        yield running


def _ingest_topic(up: SaslUp, topic: str) -> None:
    """Made beforehand: kafka-python and aiokafka may ask the group coordinator's listener for
    metadata, which creates no topics (issue 15)."""
    done = up.tq("topic", "create", topic, "--partitions", "1")
    assert done.returncode == 0, done.stderr


def _confluent(up: SaslUp, mechanism: str, user: str, password: str | None = None,
               **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": up.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": mechanism, "sasl.username": user,
            "sasl.password": password if password is not None else up.passwords[user],
            **extra}


def _produce_confluent(config: dict[str, object], topic: str, value: bytes) -> int | None:
    """Produce one record; the delivery's error code (None: delivered)."""
    producer = confluent_kafka.Producer({"message.timeout.ms": 20000, **config})
    outcome: list[object] = []
    producer.produce(topic, value, partition=0,
                     on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(30)
    assert outcome, "no delivery report"
    return None if outcome[0] is None else outcome[0].code()  # type: ignore[attr-defined]


def _consume_confluent(config: dict[str, object], topic: str, count: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                         "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
            if len(values) >= count:
                break
        return values
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_authenticates_with_each_mechanism(up: SaslUp, mechanism: str) -> None:
    topic = f"confluent-{mechanism.lower()}"
    config = _confluent(up, mechanism, "alice")
    assert _produce_confluent(config, topic, b"hello " + mechanism.encode()) is None
    assert _consume_confluent(config, topic, 1) == [b"hello " + mechanism.encode()]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_is_refused(up: SaslUp, mechanism: str) -> None:
    config = _confluent(up, mechanism, "alice", password="not-the-password",
                        **{"message.timeout.ms": 8000})
    code = _produce_confluent(config, "never-written", b"x")
    assert code is not None  # an authentication failure, never a delivery
    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"],
                         session=False) as cluster:
        topics = {t.short_name for t, _ in cluster.snapshot("topics")["topics"].records}
    assert "never-written" not in topics


def test_an_unauthenticated_client_gets_nothing(up: SaslUp) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": up.bootstrap,
                                         "message.timeout.ms": 5000})
    outcome: list[object] = []
    producer.produce("plain-attempt", b"x", on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(20)
    assert outcome and outcome[0] is not None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_kafka_python_authenticates(up: SaslUp, mechanism: str) -> None:
    kafka = pytest.importorskip("kafka")
    topic = f"kafka-python-{mechanism.lower()}"
    _ingest_topic(up, topic)
    common = {"bootstrap_servers": up.bootstrap, "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": mechanism, "sasl_plain_username": "bob",
              "sasl_plain_password": up.passwords["bob"]}
    producer = kafka.KafkaProducer(**common)
    try:
        producer.send(topic, b"from kafka-python", partition=0).get(timeout=30)
    finally:
        producer.close(timeout=10)
    consumer = kafka.KafkaConsumer(**common, auto_offset_reset="earliest",
                                   consumer_timeout_ms=20000)
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        assert next(iter(consumer)).value == b"from kafka-python"
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_aiokafka_authenticates(up: SaslUp, mechanism: str) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    topic = f"aiokafka-{mechanism.lower()}"
    _ingest_topic(up, topic)
    common = {"bootstrap_servers": up.bootstrap, "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": mechanism, "sasl_plain_username": "alice",
              "sasl_plain_password": up.passwords["alice"]}

    async def main() -> bytes:
        producer = aiokafka.AIOKafkaProducer(**common)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"from aiokafka", partition=0)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(**common, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition(topic, 0)])
            message = await asyncio.wait_for(consumer.getone(), 30)
            return message.value
        finally:
            await consumer.stop()

    assert asyncio.run(main()) == b"from aiokafka"


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_kcat_authenticates(up: SaslUp, mechanism: str) -> None:
    topic = f"kcat-{mechanism.lower()}"
    auth = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
            "-X", "sasl.username=alice", "-X", f"sasl.password={up.passwords['alice']}"]
    produced = subprocess.run(["kcat", "-b", up.bootstrap, *auth, "-P", "-t", topic, "-p", "0"],
                              input=b"from kcat\n", capture_output=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-b", up.bootstrap, *auth, "-C", "-t", topic, "-p", "0",
                               "-o", "beginning", "-c", "1", "-e"],
                              capture_output=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.strip() == b"from kcat"
    wrong = subprocess.run(["kcat", "-b", up.bootstrap, *auth[:-2], "-X",
                            "sasl.password=wrong", "-L", "-m", "5"],
                           capture_output=True, timeout=60)
    assert wrong.returncode != 0


def test_topic_writes_are_authorized_as_the_user(up: SaslUp) -> None:
    """A topic alice owns (made by her own session) takes her Kafka writes, not bob's."""
    with Cluster.connect(up.info["coordinator"],
                         secret_file=str(up.home / "alice.credential")) as alice:
        alice.create_topic("alices-own", 1)
    code = _produce_confluent(_confluent(up, "SCRAM-SHA-256", "bob"), "alices-own", b"bob")
    assert code == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce_confluent(_confluent(up, "SCRAM-SHA-256", "alice"), "alices-own",
                              b"alice") is None


def test_a_group_belongs_to_the_user_that_first_uses_it(up: SaslUp) -> None:
    topic = "grouped"
    alice = _confluent(up, "PLAIN", "alice")
    assert _produce_confluent(alice, topic, b"one") is None
    consumer = confluent_kafka.Consumer({**alice, "group.id": "alices-group",
                                         "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None:
                break
        assert message is not None and message.error() is None
        consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()
    bob = confluent_kafka.Consumer({**_confluent(up, "PLAIN", "bob"),
                                    "group.id": "alices-group",
                                    "auto.offset.reset": "earliest"})
    try:
        bob.subscribe([topic])
        error = None
        for _ in range(30):
            message = bob.poll(1.0)
            if message is not None and message.error() is not None:
                error = message.error()
                break
        assert error is not None and \
            error.code() == confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED, error
    finally:
        bob.close()


def test_sasl_over_tls_with_confluent_kafka(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = (tmp_path / "cert.pem", tmp_path / "key.pem",
                                    tmp_path / "ca.pem")
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with SaslUp(tmp_path / "home", "--kafka-tls-cert", str(cert_file), "--kafka-tls-key",
                str(key_file)) as up:
        config = {**_confluent(up, "SCRAM-SHA-512", "alice"), "security.protocol": "SASL_SSL",
                  "ssl.ca.location": str(ca_file)}
        assert _produce_confluent(config, "over-tls", b"encrypted") is None
        assert _consume_confluent(config, "over-tls", 1) == [b"encrypted"]
        # A client that does not speak TLS gets nowhere.
        plain = _confluent(up, "SCRAM-SHA-512", "alice", **{"message.timeout.ms": 5000})
        assert _produce_confluent(plain, "over-tls", b"clear") is not None


def test_binding_beyond_loopback_without_authentication_needs_insecure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "querylib.cli", "up", "--data", str(tmp_path / "data"),
         "--kafka-host", "0.0.0.0", "--kafka-port", str(free_port()), "--connector-port", "-1"],
        capture_output=True, text=True, timeout=60, env=tq_env(tmp_path / "home"), cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "--insecure" in done.stderr and "--kafka-sasl" in done.stderr
