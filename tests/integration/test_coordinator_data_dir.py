"""A real `tq coordinator` on a data dir whose `namespace` file is damaged (DESIGN §9
"Starting"): it refuses to start in one line naming the file, with a non-zero exit and no
traceback, and leaves the file as it was. An empty file started a cluster under
public/default, whatever the cluster had been; a directory or undecodable bytes showed a
traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import CoordinatorProcess, tq

pytestmark = pytest.mark.timeout(120)

DAMAGED = {
    "empty": b"",
    "blank": b" \n",
    "undecodable": b"\xff\xfeacme/lab\n",
    "not-tenant-slash-namespace": b"acme\n",
    "huge": b"acme/" + b"x" * 100_000 + b"\n",
}


def _refused(processes: Processes, home: Path) -> str:
    """Start a coordinator on `home`; its one line of stderr once it exited, refusing."""
    coordinator = CoordinatorProcess(processes, home).start(wait=False)
    proc = coordinator.proc
    assert proc is not None

    def serving() -> bool:
        try:
            return json.loads((home / "cluster.json").read_text())["pid"] == proc.pid
        except (OSError, ValueError, KeyError):
            return False

    wait_for(lambda: proc.poll() is not None or serving(), timeout=60,
             what="the coordinator to exit or serve")
    assert proc.poll() is not None, "the coordinator started on a damaged namespace file"
    _, err = proc.communicate(timeout=10)
    stderr = err.decode(errors="replace")
    assert proc.returncode != 0
    assert "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    return stderr


@pytest.mark.parametrize("content", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_namespace_file_is_refused_in_one_line(processes: Processes, tmp_path: Path,
                                                         content: bytes) -> None:
    path = tmp_path / "coordinator" / "namespace"
    path.parent.mkdir()
    path.write_bytes(content)
    stderr = _refused(processes, tmp_path)
    assert str(path) in stderr
    assert len(stderr) < 600, "the file's content is not repeated whole"
    assert path.read_bytes() == content


def test_a_namespace_directory_is_refused_in_one_line(processes: Processes,
                                                      tmp_path: Path) -> None:
    path = tmp_path / "coordinator" / "namespace"
    path.mkdir(parents=True)
    assert str(path) in _refused(processes, tmp_path)
    assert path.is_dir()


def test_a_good_namespace_file_is_kept(processes: Processes, tmp_path: Path) -> None:
    path = tmp_path / "coordinator" / "namespace"
    path.parent.mkdir()
    path.write_text("acme/lab\n")
    coordinator = CoordinatorProcess(processes, tmp_path).start()
    listed = tq(tmp_path, "status", "--json")
    assert listed.returncode == 0, listed.stderr
    assert coordinator.stop() == 0
    assert path.read_text() == "acme/lab\n"
