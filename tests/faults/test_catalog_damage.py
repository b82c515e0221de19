"""A damaged catalog topic stops the coordinator with a clear message and a repair path,
instead of dropping the topics it held (issue 13 part 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, client_process, tq_env

TOPICS = 20


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    return tmp_path


def _data_batches(segment: Path) -> list[tuple[int, int, int]]:
    """(position, size, base offset) of the data (not control) batches of a segment."""
    data = segment.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
        if not data[pos + 22] & 0x20:
            out.append((pos, size, int.from_bytes(data[pos:pos + 8], "big")))
        pos += size
    return out


def test_a_flip_in_the_catalog_topics_stops_the_coordinator(processes: Processes,
                                                            home: Path) -> None:
    coordinator = CoordinatorProcess(processes, home).start()
    client, _ = client_process(processes, home,
                               *[a for i in range(TOPICS) for a in ("--create", f"t{i}")])
    client.stdin.close()  # type: ignore[union-attr]
    assert client.wait(timeout=30) == 0
    assert coordinator.stop() == 0

    broker = coordinator.data / "broker"
    (segment,) = sorted((broker / "__catalog.topics-0").glob("*.log"))
    batches = _data_batches(segment)
    assert len(batches) >= TOPICS
    position, size, base = batches[len(batches) // 2]
    with open(segment, "r+b") as f:
        f.seek(position + size // 2 - 8)
        old = f.read(16)
        f.seek(position + size // 2 - 8)
        f.write(bytes(b ^ 0x77 for b in old))

    restarted = processes.python(
        "-m", "querylib.cli", "coordinator", "--data", str(coordinator.data),
        "--listen", coordinator.address, "--broker-listen",
        f"tcp://127.0.0.1:{coordinator.broker_port}",
        env=tq_env(home), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def started() -> bool:
        try:
            return json.loads((home / "cluster.json").read_text())["pid"] == restarted.pid
        except (OSError, ValueError, KeyError):
            return False

    wait_for(lambda: restarted.poll() is not None or started(), timeout=60,
             what="the coordinator to stop or start")
    assert restarted.poll() is not None, "the coordinator started on a damaged catalog"
    assert restarted.returncode != 0
    # the log's own warning about the damage, then the one line that stops it
    lines = restarted.stderr.read().strip().splitlines()
    assert "Traceback" not in "\n".join(lines), lines
    # nothing was dropped: the catalog's files still hold every topic's record
    check = subprocess.run([sys.executable, "-m", "querylib.cli", "log", "check", "--data",
                            str(broker)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 1 and f"offsets {base}.." in check.stdout

