"""`tq executor` started before its coordinator: it runs its broker, says on stderr that it is
waiting for the coordinator, and registers once `tq coordinator` comes up at that address. A
coordinator holding another secret refuses it: the executor exits at once with a clear line
and exit code 2 instead of waiting forever."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from querylib.rpc import load_or_create_secret
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq_env

pytestmark = pytest.mark.timeout(90)


def _executors(home: Path) -> list[int]:
    done = subprocess.run([sys.executable, "-m", "querylib.cli", "status", "--json"],
                          env=tq_env(home), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:  # the coordinator is not up yet
        return []
    return [e["executor_id"] for e in json.loads(done.stdout)["executors"]]


def _executor(processes: Processes, home: Path, port: int, log: Path,
              *extra: str) -> subprocess.Popen[bytes]:
    with log.open("w") as stderr:
        return processes.python("-m", "querylib.cli", "executor", "--coordinator",
                                f"tcp://127.0.0.1:{port}", "--data", str(home / "executor"),
                                "--slots", "1", *extra, env=tq_env(home), cwd=ROOT,
                                stderr=stderr)


def test_executor_waits_for_a_coordinator_that_is_not_up_yet(processes: Processes,
                                                             tmp_path: Path) -> None:
    load_or_create_secret(tmp_path / "secret")  # the secret both will use
    coordinator = CoordinatorProcess(processes, tmp_path)
    log = tmp_path / "executor.log"
    agent = _executor(processes, tmp_path, coordinator.port, log)
    wait_for(lambda: "waiting for the coordinator at" in log.read_text()
             or agent.poll() is not None, timeout=30, what="the executor to say it waits")
    assert agent.poll() is None, log.read_text()
    assert f"tcp://127.0.0.1:{coordinator.port}" in log.read_text()

    coordinator.start()
    (executor_id,) = wait_for(lambda: _executors(tmp_path), timeout=30, interval=0.2,
                              what="the executor to register")
    assert agent.poll() is None
    assert log.read_text().count("waiting for the coordinator") >= 1
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0, log.read_text()
    assert coordinator.stop() == 0


def test_executor_refused_by_the_coordinator_exits_with_a_clear_error(
        processes: Processes, tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(processes, tmp_path).start()
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    load_or_create_secret(other / "secret")
    log = tmp_path / "executor.log"
    agent = _executor(processes, tmp_path, coordinator.port, log,
                      "--secret-file", str(other / "secret"))
    assert agent.wait(timeout=60) == 2
    err = log.read_text()
    assert "refused our signature" in err and "Traceback" not in err, err
    assert "waiting for the coordinator" not in err
    assert _executors(tmp_path) == []
    assert coordinator.stop() == 0


def test_executor_stops_on_sigterm_while_waiting(processes: Processes, tmp_path: Path) -> None:
    load_or_create_secret(tmp_path / "secret")
    log = tmp_path / "executor.log"
    agent = _executor(processes, tmp_path, free_port(), log)
    wait_for(lambda: "waiting for the coordinator" in log.read_text()
             or agent.poll() is not None, timeout=30, what="the executor to say it waits")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0, log.read_text()
