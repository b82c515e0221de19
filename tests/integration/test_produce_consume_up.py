"""`tq produce` / `tq consume` routed through the coordinator of a real `tq up` (issue 5 §4),
and `querylib.connect(secret_file=...)` against it.

The commands find the cluster through $TQ_HOME/cluster.json (as a user's shell would), look the
topic up in the catalog and talk to the brokers hosting its partitions."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.coordinator._cluster import ROOT
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


def _produce(up: Up, *args: str, lines: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querylib.cli", "produce", *args],
                          input=lines, env=up.env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_produce_creates_a_topic_and_consume_reads_every_partition(up: Up) -> None:
    lines = "".join(f"k{i % 5}:v{i}\n" for i in range(60))
    done = _produce(up, "orders", "--create", "--partitions", "3", "--key-separator", ":",
                    lines=lines)
    assert done.returncode == 0, done.stderr
    assert "produced 60 records" in done.stderr

    read = up.tq("consume", "orders", "--json", "--follow")
    assert read.returncode == 0, read.stderr
    events = _json_lines(read.stdout)
    records = [e for e in events if "value" in e]
    assert sorted(r["value"] for r in records) == sorted(f"v{i}" for i in range(60))
    # Keys chose partitions: every key lives in exactly one, and the topic's 3 were used.
    where: dict[str, set[int]] = {}
    for r in records:
        where.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(ps) == 1 for ps in where.values())
    assert {r["time"] for r in records} == set(range(60))  # line i has time i
    assert events[-1] == {"end_of_stream": True}

    topics = _json_lines(up.tq("topics", "--json").stdout)
    (orders,) = [t for t in topics if t["short_name"] == "orders"]
    assert orders["partitions"] == 3 and "ingest" in json.dumps(orders["owner"])


def test_consume_one_partition_count_and_plain_text(up: Up) -> None:
    path = up.home / "lines.txt"
    path.write_text("".join(f"line {i}\n" for i in range(10)))
    done = up.tq("produce", "plain", str(path), "--create", "--partitions", "2",
                 "--partition", "1", "--time", "7")
    assert done.returncode == 0, done.stderr

    read = up.tq("consume", "plain", "--partition", "1", "--json")
    records = [e for e in _json_lines(read.stdout) if "value" in e]
    assert [r["value"] for r in records] == [f"line {i}" for i in range(10)]
    assert {(r["partition"], r["time"]) for r in records} == {(1, 7)}

    first = up.tq("consume", "plain", "--count", "3")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "line 0\nline 1\nline 2\n"
    assert up.tq("consume", "plain", "--partition", "0").stdout == ""


def test_keep_open_then_a_second_producer_ends_the_stream(up: Up) -> None:
    done = _produce(up, "tail", "--create", "--keep-open", lines="a\nb\n")
    assert done.returncode == 0, done.stderr
    # Still open: a non-follow read sees the records; progress past the last time.
    events = _json_lines(up.tq("consume", "tail", "--json").stdout)
    assert [e["value"] for e in events if "value" in e] == ["a", "b"]
    assert {"end_of_stream": True} not in events
    done = _produce(up, "tail", "--time", "5", lines="c\n")
    assert done.returncode == 0, done.stderr
    follow = up.tq("consume", "tail", "--follow")
    assert follow.stdout == "a\nb\nc\n"


def test_unknown_topics_and_query_owned_topics_are_user_errors(up: Up) -> None:
    missing = up.tq("consume", "nowhere")
    assert missing.returncode != 0 and "nowhere" in missing.stderr
    assert "Traceback" not in missing.stderr
    missing = _produce(up, "nowhere-either", lines="x\n")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    bad = _produce(up, "orders", "--partition", "9", lines="x\n")
    assert bad.returncode != 0 and "no partition 9" in bad.stderr


def test_connect_with_an_explicit_secret_file(up: Up, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """connect(secret_file=...) used to pass secret_file twice (TypeError)."""
    import querylib

    monkeypatch.setenv("TQ_HOME", str(tmp_path))  # no cluster.json to fall back on
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    with querylib.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as ctx:
        with ctx.publish("connected", serde="json") as out:
            out.send(0, ["hello"])
        with ctx.subscribe("connected", serde="json", timeout=30) as sub:
            values = [r for e in sub if isinstance(e, querylib.Data) for r in e.records]
    assert values == ["hello"]


def test_a_deleted_topic_created_again_starts_empty(up: Up,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Delete drops the partitions from their brokers: the old records and the old end of
    stream at offset 0 are gone for the new topic of the same name."""
    import querylib
    from querylib.cluster import Cluster

    monkeypatch.setenv("TQ_HOME", str(up.home))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    with querylib.connect() as ctx:
        with ctx.publish("reborn", serde="json") as out:
            out.send(0, ["old 1", "old 2"])
        with Cluster.connect() as cluster:
            cluster.delete_topic("reborn", force=True)  # the owner (ctx) is alive
        with ctx.publish("reborn", serde="json") as out:
            out.send(3, ["new"])
        with ctx.subscribe("reborn", serde="json", start="earliest", timeout=30) as sub:
            events = list(sub)
    data = [(e.time, r) for e in events if isinstance(e, querylib.Data) for r in e.records]
    assert data == [(3, "new")]
    # On disk: one partition directory of the topic, and no tombstones left behind.
    dirs = [p.name for p in up.home.rglob("*") if p.is_dir()]
    assert not [d for d in dirs if d.startswith(".deleted-")]
    assert len([d for d in dirs if d.startswith("reborn-")]) == 1
