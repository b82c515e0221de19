"""Spark on a cluster whose default namespace is not public/default (issue 15): a bare topic
name read and written with `format("tq")` is the cluster's acme/lab topic, in the driver and in
the Python workers alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import DEFAULT_NAMESPACE, DEFAULT_TENANT, set_default_namespace
from tests.integration._up import Up

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    try:
        with Up(tmp_path_factory.mktemp("spark-namespace"), "--connector-port", "-1",
                "--kafka-port", "-1", "--tenant", "acme", "--namespace", "lab") as running:
            yield running
    finally:
        set_default_namespace(DEFAULT_TENANT, DEFAULT_NAMESPACE)


def test_spark_reads_and_writes_bare_names_in_the_default_namespace(spark, up: Up,
                                                                    tmp_path: Path) -> None:
    with up.connect() as ctx, ctx.publish("ns-spark", serde="bytes") as out:
        out.send(0, [b"a", b"b", b"c"])
        out.advance_to(1)
    options = {"coordinator": up.info["coordinator"], "secretFile": up.info["secret_file"]}
    df = spark.read.format("tq").option("subscribe", "ns-spark").options(**options).load()
    assert sorted(r.value for r in df.collect()) == [b"a", b"b", b"c"]
    df.select("value").write.format("tq").option("topic", "ns-spark-copy") \
        .options(**options).save()
    with up.cluster() as cluster:
        names = {t.name for t, _ in cluster.snapshot("topics")["topics"].records}
    assert {"persistent://acme/lab/ns-spark", "persistent://acme/lab/ns-spark-copy"} <= names
    copy = spark.read.format("tq").option("subscribe", "persistent://acme/lab/ns-spark-copy") \
        .options(**options).load()
    assert sorted(r.value for r in copy.collect()) == [b"a", b"b", b"c"]
