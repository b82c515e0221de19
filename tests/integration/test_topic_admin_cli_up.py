"""`tq topic alter`, `tq topic add-partitions` and `tq topic delete-records` against a real
`tq up` (issue 15, "Admin"): each checked by its effect (the catalog's record, what `tq
consume` then reads, the broker's files), as a user runs them through $TQ_HOME/cluster.json."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.conftest import partition_dir, wait_for
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up-topic-admin")) as running:
        yield running


def _ok(done) -> str:
    assert done.returncode == 0, done.stderr
    return done.stderr


def _describe(up: Up, name: str) -> dict:
    done = up.tq("topic", "describe", name, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _records(up: Up, name: str) -> list[dict]:
    """What `tq consume --json` prints of the records (not of the stream's end)."""
    read = up.tq("consume", name, "--json")
    assert read.returncode == 0, read.stderr
    return [r for r in map(json.loads, read.stdout.splitlines()) if "value" in r]


def test_alter_sets_and_resets_retention_in_the_catalog(up: Up) -> None:
    _ok(up.tq("topic", "create", "kept"))
    said = _ok(up.tq("topic", "alter", "kept", "--retention-ms", "86400000",
                     "--retention-bytes", "1048576"))
    assert "retention.bytes=1048576, retention.ms=86400000" in said
    assert _describe(up, "kept")["configs"] == {"retention.bytes": "1048576",
                                                "retention.ms": "86400000"}
    _ok(up.tq("topic", "alter", "kept", "--reset", "retention.ms"))
    assert _describe(up, "kept")["configs"] == {"retention.bytes": "1048576"}
    refused = up.tq("topic", "alter", "kept", "--segment-bytes", "3")
    assert refused.returncode != 0 and "segment.bytes 3 is outside" in refused.stderr
    nothing = up.tq("topic", "alter", "kept")
    assert nothing.returncode != 0 and "nothing to alter" in nothing.stderr


def test_add_partitions_grows_the_topic_and_producers_write_the_new_ones(up: Up) -> None:
    _ok(up.tq("topic", "create", "wider", "--partitions", "2"))
    said = _ok(up.tq("topic", "add-partitions", "wider", "2"))
    assert "4 partitions (was 2)" in said
    described = _describe(up, "wider")
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2, 3]
    _ok(up.tq("produce", "wider", "--partition", "3", stdin="in-the-new-one\n"))
    assert [(r["partition"], r["value"]) for r in _records(up, "wider")] == [
        (3, "in-the-new-one")]
    refused = up.tq("topic", "add-partitions", "wider", "0")
    assert refused.returncode != 0


def test_delete_records_moves_the_log_start(up: Up) -> None:
    _ok(up.tq("topic", "create", "trimmed"))
    for i in range(6):  # one batch each (and tq's progress batches between them)
        _ok(up.tq("produce", "trimmed", stdin=f"r{i}\n"))
    before = _records(up, "trimmed")
    assert [r["value"] for r in before] == [f"r{i}" for i in range(6)]
    cut = before[4]["offset"]
    end = _describe(up, "trimmed")["partitions"][0]["end"]
    said = _ok(up.tq("topic", "delete-records", "trimmed", "--partition", "0",
                     "--before", str(cut)))
    assert f"starts at {cut} (ends at {end})" in said
    (partition,) = _describe(up, "trimmed")["partitions"]
    assert (partition["start"], partition["end"]) == (cut, end)
    assert [r["value"] for r in _records(up, "trimmed")] == ["r4", "r5"]
    directory = partition_dir(up.home / "executor", "trimmed-0")
    assert directory is not None
    wait_for(lambda: (directory / "log-start-offset-checkpoint").exists(), timeout=10,
             what="the log start offset on disk")
    _ok(up.tq("topic", "delete-records", "trimmed", "--partition", "0", "--before", "end"))
    assert _describe(up, "trimmed")["partitions"][0]["start"] == end
    past = up.tq("topic", "delete-records", "trimmed", "--partition", "0", "--before",
                 str(end + 5))
    assert past.returncode != 0 and f"ends at {end}" in past.stderr
    missing = up.tq("topic", "delete-records", "trimmed", "--partition", "5", "--before", "1")
    assert missing.returncode != 0 and "no partition 5" in missing.stderr
