"""The default tenant and namespace are settings of the cluster (issue 15; seed 003's
kafkaTenant / kafkaNamespace): a `tq up --tenant acme --namespace lab` resolves a bare topic
name to acme/lab/NAME for `tq produce`, a Kafka client and `ctx.publish` alike, `tq topics`
shows those topics by their short names (and the full ones in --json), names in other
namespaces keep their full form, and a restart keeps the setting (another one is refused)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import DEFAULT_NAMESPACE, DEFAULT_TENANT, set_default_namespace
from querylib import Data
from tests.conftest import free_port
from tests.integration._up import Up
from tests.integration._up_endpoints import UpWithEndpoints

pytestmark = pytest.mark.timeout(240)

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tq-up-namespace")


@pytest.fixture(scope="module")
def up(home: Path) -> Iterator[UpWithEndpoints]:
    try:
        with UpWithEndpoints(home, "--connector-port", "-1", "--kafka-port", str(free_port()),
                             "--tenant", "acme", "--namespace", "lab") as running:
            yield running
    finally:
        # This test process followed that cluster's default when it connected: the rest of
        # the session's tests expect tq's own.
        set_default_namespace(DEFAULT_TENANT, DEFAULT_NAMESPACE)


def _full_names(up: UpWithEndpoints) -> set[str]:
    listed = up.tq("topics", "--json")
    assert listed.returncode == 0, listed.stderr
    return {json.loads(line)["name"] for line in listed.stdout.splitlines()}


def test_bare_names_land_in_the_clusters_default_namespace(up: UpWithEndpoints) -> None:
    produced = up.tq("produce", "ns-cli", "--create", stdin="one\ntwo\n")
    assert produced.returncode == 0, produced.stderr
    producer = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"], "acks": "all"})
    producer.produce("ns-kafka", value=b"from kafka")
    assert producer.flush(30) == 0
    with up.connect() as ctx:
        with ctx.publish("ns-query") as out:
            assert out.name == "ns-query"  # short: the cluster's default namespace
            out.send(0, ["from a query"])
            out.advance_to(1)
        # Another namespace is named in full, and stays apart.
        with ctx.publish("public/default/ns-query") as out:
            assert out.name == "public/default/ns-query"
            out.send(0, ["elsewhere"])
            out.advance_to(1)
        with ctx.subscribe("persistent://acme/lab/ns-query") as sub:
            assert [e.records for e in sub if isinstance(e, Data)] == [["from a query"]]
        with ctx.subscribe("ns-kafka") as sub:
            event = next(e for e in sub if isinstance(e, Data))
            assert event.records == [b"from kafka"]
    names = _full_names(up)
    assert {"persistent://acme/lab/ns-cli", "persistent://acme/lab/ns-kafka",
            "persistent://acme/lab/ns-query", "persistent://public/default/ns-query"} <= names
    assert not {"persistent://public/default/ns-cli",
                "persistent://public/default/ns-kafka"} & names
    table = up.tq("topics")
    assert table.returncode == 0, table.stderr
    shown = {line.split()[0] for line in table.stdout.splitlines()[1:]}
    assert {"ns-cli", "ns-kafka", "ns-query", "public/default/ns-query"} <= shown
    consumed = up.tq("consume", "ns-cli", "--count", "2")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split() == ["one", "two"]


def test_kafka_clients_see_short_names(up: UpWithEndpoints) -> None:
    admin = pytest.importorskip("confluent_kafka.admin").AdminClient(
        {"bootstrap.servers": up.info["kafka"]})
    topics = admin.list_topics(timeout=30).topics
    assert "ns-query" in topics and "ns-kafka" in topics and "ns-cli" in topics
    assert "acme/lab/ns-query" not in topics


def test_a_restart_keeps_the_default_and_refuses_another(up: UpWithEndpoints,
                                                         home: Path) -> None:
    stored = (Path(up.info["data"]) / "namespace").read_text().strip()
    assert stored == "acme/lab"
    # A second coordinator on the same data is refused before anything else (the running one
    # holds it); the stored setting is what a later start would check against, which the
    # unit of coordinator/_namespace.py shows without a second cluster.
    from catalog import UserError
    from coordinator._namespace import settle_namespace

    try:
        with pytest.raises(UserError, match="default namespace is acme/lab"):
            settle_namespace(up.info["data"], "public/default")
        assert settle_namespace(up.info["data"], None) == "acme/lab"
    finally:
        set_default_namespace(DEFAULT_TENANT, DEFAULT_NAMESPACE)


def test_a_new_cluster_defaults_to_public_default(tmp_path: Path) -> None:
    with Up(tmp_path) as running, running.connect() as ctx:
        with ctx.publish("plain") as out:
            out.close()
        assert (Path(running.info["data"]) / "namespace").read_text().strip() == \
            "public/default"
