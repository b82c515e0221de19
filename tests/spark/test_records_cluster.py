"""Whole records from querylib to Spark (issue 15): a querylib publisher's keys, headers and
event times are the `key`, `headers` and `timestamp` columns of a `spark.read.format("tq")`
through a running cluster, with the logical time in `tq_time`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import querylib
from querylib import Record
from tests.conftest import Processes
from tests.coordinator._cluster import CoordinatorProcess

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("records-cluster")
    processes = Processes()
    try:
        CoordinatorProcess(processes, home).start()
        yield home
    finally:
        processes.stop_all()


def test_querylib_records_read_by_spark(spark, home: Path) -> None:
    info = json.loads((home / "cluster.json").read_text())
    sent = [Record(b"v%d" % i, key=None if i % 3 == 0 else b"k%d" % i,
                   headers=[] if i % 2 else [("origin", b"tq"), ("i", b"%d" % i)],
                   timestamp=T0 + 11 * i) for i in range(40)]
    with querylib.connect(info["coordinator"], secret_file=info["secret_file"]) as ctx, \
            ctx.publish("records-spark", serde="bytes") as out:
        out.send(3, sent[:20])
        out.send(4, sent[20:])
        out.advance_to(5)
    rows = (spark.read.format("tq").option("subscribe", "records-spark")
            .option("includeHeaders", "true").option("coordinator", info["coordinator"])
            .option("secretFile", info["secret_file"]).load().collect())
    got = sorted((r.offset, r.key, r.value,
                   [(h.key, h.value) for h in r.headers or [] if h.key != "tq.time"],
                   int(r.timestamp.timestamp() * 1000), r.timestampType, r.tq_time)
                  for r in rows)
    assert got == [(i, r.key, r.value, list(r.headers),
                    r.timestamp, 0, 3 if i < 20 else 4)
                   for i, r in enumerate(sent)]
