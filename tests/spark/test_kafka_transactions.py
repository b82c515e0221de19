"""Spark's tq source and Kafka transactions on a real `tq up`: records of committed
transactions are read, an aborted transaction's are not, and nothing past an open
transaction (the last stable offset) is read, through the cluster (the broker serves the
reads) and from the broker's files on the same host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.integration._up_endpoints import UpWithEndpoints

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-spark-txn"),
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def spark_values(spark, up: UpWithEndpoints, topic: str) -> list[bytes]:
    rows = (spark.read.format("tq").option("subscribe", topic)
            .option("coordinator", up.info["coordinator"])
            .option("secretFile", up.info["secret_file"]).load().collect())
    return sorted(bytes(r.value) for r in rows)


def local_values(spark, up: UpWithEndpoints, topic: str) -> list[bytes]:
    broker = Path(up.info["data"]).parent / "executor"
    data = next(p.parent for p in broker.rglob(f"{topic}-0") if p.is_dir())
    rows = spark.read.format("tq").option("subscribe", topic).load(str(data)).collect()
    return sorted(bytes(r.value) for r in rows)


def test_spark_reads_committed_records_only(spark, up: UpWithEndpoints) -> None:
    created = up.tq("topic", "create", "txn", "--partitions", "1")
    assert created.returncode == 0, created.stderr
    p = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"],
                                  "transactional.id": "spark-txn", "linger.ms": 5})
    p.init_transactions(30)
    for n, commit in ((0, True), (1, False), (2, True)):
        p.begin_transaction()
        for i in range(5):
            p.produce("txn", value=f"{n}-{i}".encode())
        assert p.flush(30) == 0
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    p.begin_transaction()
    p.produce("txn", value=b"open")
    assert p.flush(30) == 0
    committed = sorted(f"{n}-{i}".encode() for n in (0, 2) for i in range(5))
    assert spark_values(spark, up, "txn") == committed
    assert local_values(spark, up, "txn") == committed
    p.commit_transaction(30)
    assert spark_values(spark, up, "txn") == sorted([*committed, b"open"])


def test_spark_reads_every_output_of_a_killed_loop_once(spark, up: UpWithEndpoints,
                                                        tmp_path: Path) -> None:
    """Issue 15's proof for Spark: the consume-transform-produce loop SIGKILLed mid-
    transaction and restarted; a Spark read through the cluster and one from the files see
    every input record's output exactly once, and no aborted record."""
    from tests.interop.test_kafka_transactions_tq_up import INPUTS, run_killed_loop

    run_killed_loop(up, tmp_path)
    want = sorted(b"out-" + v for v in INPUTS)
    assert sorted(spark_values(spark, up, "output")) == want
    assert sorted(local_values(spark, up, "output")) == want
