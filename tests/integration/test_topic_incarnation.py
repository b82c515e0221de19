"""A topic created under a name the catalog lost never serves the old topic's records (issue
13 part 5): a partition directory records the topic incarnation it belongs to, and a broker
asked for a newer incarnation of the name sets the old directory aside."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import partition_dir
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(240)


def test_a_topic_recreated_under_a_lost_name_does_not_serve_old_records(tmp_path: Path):
    with Up(tmp_path) as up:
        done = up.tq("produce", "x", "--create", "--partitions", "1", stdin="old1\nold2\n")
        assert done.returncode == 0, done.stderr
    partition = partition_dir(tmp_path / "executor", "x-0")
    assert partition is not None
    old = json.loads((partition / "topic.json").read_text())
    assert old["topic"] == "x" and old["partition"] == 0 and old["topic_id"] > 0
    # The catalog is lost (a wiped or older coordinator data dir); the topic's data stays.
    shutil.rmtree(tmp_path / "coordinator")
    with Up(tmp_path) as up:
        done = up.tq("produce", "x", "--create", "--partitions", "1", stdin="new1\n")
        assert done.returncode == 0, done.stderr
        read = up.tq("consume", "x", "--json", "--follow")
        assert read.returncode == 0, read.stderr
        values = [e["value"] for e in map(json.loads, read.stdout.splitlines()) if "value" in e]
        assert values == ["new1"]
    new = json.loads((partition / "topic.json").read_text())
    assert new["created_ms"] > old["created_ms"]
    # Created again on the same broker (placement starts over with the catalog) and set aside.
    assert partition_dir(tmp_path / "executor", "x-0") == partition
    (aside,) = [p for p in partition.parent.iterdir()
                if p.name.startswith(".orphaned-") and p.name.endswith("x-0")]
    assert json.loads((aside / "topic.json").read_text()) == old
