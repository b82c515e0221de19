"""Deleting a topic on a real `tq up` (DESIGN §3 "Deleting topics"): the coordinator has the
hosting executor drop the partitions, so their directories are gone when `tq topic delete`
returns, though the client itself talks to no broker; the name created again starts empty."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import partition_dir
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    with Up(tmp_path) as running:
        yield running


def _values(up: Up, topic: str) -> list[str]:
    read = up.tq("consume", topic, "--json", "--follow")
    assert read.returncode == 0, read.stderr
    return [e["value"] for e in map(json.loads, read.stdout.splitlines()) if "value" in e]


def test_deleted_topic_files_go_and_the_name_starts_empty(up: Up) -> None:
    executor = up.home / "executor"
    old = "".join(f"old {i}\n" for i in range(6))
    done = up.tq("produce", "gone", "--create", "--partitions", "2", stdin=old)
    assert done.returncode == 0, done.stderr
    assert sorted(_values(up, "gone")) == sorted(old.splitlines())
    assert partition_dir(executor, "gone-0") and partition_dir(executor, "gone-1")

    deleted = up.tq("topic", "delete", "gone", "--force")  # ingest owns it, and lives
    assert deleted.returncode == 0, deleted.stderr
    # Gone from whichever of the host's brokers held them (an ingest topic spreads over them).
    assert partition_dir(executor, "gone-0") is None and partition_dir(executor, "gone-1") is None
    with up.cluster() as cluster:
        assert cluster.snapshot("drops")["drops"].records == []  # reported and forgotten

    new = "".join(f"new {i}\n" for i in range(4))
    done = up.tq("produce", "gone", "--create", "--partitions", "2", stdin=new)
    assert done.returncode == 0, done.stderr
    assert sorted(_values(up, "gone")) == sorted(new.splitlines())


def test_deleting_an_unknown_topic_is_a_clear_error(up: Up) -> None:
    done = up.tq("topic", "delete", "never-was")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "never-was" in done.stderr
