"""`tq up` runs its executor agent (and its broker) in a child process, apart from the
coordinator (issue 17): a SIGKILL of tq up takes the child and its query processes with it;
a child that dies on its own is said, and tq up stops non-zero, removing its cluster.json."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

import querylib
from querylib.cluster import Cluster
from tests.conftest import wait_for
from tests.integration._up import Up

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="PR_SET_PDEATHSIG is Linux only")]


def _record_pid(ctx: querylib.Context, folder: str) -> None:
    Path(folder, str(os.getpid())).touch()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only a SIGKILL ends it
    while True:
        time.sleep(0.2)


def _executor_child(up: Up) -> psutil.Process:
    (child,) = [p for p in psutil.Process(up.proc.pid).children()
                if "executor" in p.cmdline()]
    return child


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_executor_runs_in_a_child_named_in_the_ready_block(tmp_path: Path) -> None:
    up = Up(tmp_path)
    try:
        child = _executor_child(up)
        assert up.tq("topics").returncode == 0
    finally:
        err = up.stop()
    assert f"broker {up.info['catalog_broker']}" not in err
    assert f"(pid {child.pid})" in err, err
    wait_for(lambda: _gone(child), timeout=10, what="the child to stop with tq up")


def test_a_sigkilled_up_takes_its_executor_and_query_processes_with_it(tmp_path: Path) -> None:
    up = Up(tmp_path)
    try:
        child = _executor_child(up)
        pids = tmp_path / "pids"
        pids.mkdir()
        with Cluster.connect(up.info["coordinator"],
                             secret_file=up.info["secret_file"]) as cluster:
            querylib.submit(_record_pid, processes=2, workers=2, args=(str(pids),),
                            by_value=[sys.modules[__name__]], cluster=cluster)
            wait_for(lambda: len(list(pids.iterdir())) == 2, timeout=60,
                     what="both query processes to start")
        queries = [psutil.Process(int(p.name)) for p in pids.iterdir()]
        os.kill(up.proc.pid, signal.SIGKILL)  # tq up alone, not its process group
        assert up.proc.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: _gone(child), timeout=20, what="the executor child to die with tq up")
        wait_for(lambda: all(_gone(q) for q in queries), timeout=20,
                 what="the query processes to die with the executor")
    finally:
        try:
            os.killpg(up.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        up.stop()


def test_an_executor_child_that_dies_is_said_and_up_exits_non_zero(tmp_path: Path) -> None:
    up = Up(tmp_path)
    try:
        child = _executor_child(up)
        child.kill()
        assert up.proc.wait(timeout=60) == 1
    finally:
        err = up.stop()
    assert f"tq up: the executor (pid {child.pid}) was killed by SIGKILL; stopping" in err, err
    assert "Traceback" not in err, err
    assert not (tmp_path / "cluster.json").exists()


def test_ctrl_c_to_the_process_group_stops_the_executor_then_up(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches tq up and its child: the child waits for tq up's SIGTERM
    (its order: the executor's queries first), and nothing is said to have died."""
    up = Up(tmp_path)
    try:
        child = _executor_child(up)
        os.killpg(up.proc.pid, signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0
    finally:
        err = up.stop()
    assert "stopping" not in err and "Traceback" not in err, err
    wait_for(lambda: _gone(child), timeout=10, what="the child to stop with tq up")
    assert not (tmp_path / "cluster.json").exists()


def test_an_executor_that_cannot_start_is_said_and_up_exits_with_its_code(
        tmp_path: Path) -> None:
    import fcntl
    import subprocess

    from tests.conftest import free_port
    from tests.coordinator._cluster import ROOT, tq_env

    data = tmp_path / "data"
    (data / "executor").mkdir(parents=True)
    with open(data / "executor" / "tq.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running executor would
        done = subprocess.run(
            [sys.executable, "-m", "querylib.cli", "up", "--data", str(data), "--listen",
             f"tcp://127.0.0.1:{free_port()}", "--console-port", "-1", "--kafka-port", "-1",
             "--connector-port", "-1"], env=tq_env(tmp_path / "home"), cwd=ROOT,
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"data directory {data / 'executor'}" in done.stderr  # the child's own line
    assert "tq up's executor (pid " in done.stderr
    assert "exited with code 2 before it was ready" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "home" / "cluster.json").exists()
