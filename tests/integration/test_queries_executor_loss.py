"""`tq executor` as its own process beside `tq coordinator`: it registers, runs what is
submitted, and when the coordinator is gone for longer than its lease it kills its processes
and stops (non-zero), rather than let them run unaccounted for."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq_env

pytestmark = pytest.mark.timeout(120)

SLEEPER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        Path(sys.argv[1], f"{os.getpid()}").write_text("")
        while True:
            time.sleep(0.5)

    querylib.execute(main)
''')


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_executor_kills_its_processes_when_it_loses_the_coordinator(
        processes: Processes, tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(processes, tmp_path).start()
    env = tq_env(tmp_path)
    agent = processes.python("-m", "querylib.cli", "executor", "--data",
                             str(tmp_path / "executor"), "--slots", "2", "--lease", "1",
                             "--grace", "1", env=env, cwd=ROOT, stderr=subprocess.PIPE,
                             text=True)
    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()

    def submit() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "querylib.cli", "submit", str(program),
                               "--processes", "2", "--", str(pids_dir)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)

    # The agent registers in the background: until then there is no executor to place on.
    done = wait_for(lambda: (r := submit()).returncode == 0 and r, timeout=30, interval=0.2,
                    what="a submit once the executor registered")
    assert done.stdout.strip().isdigit()
    pids = wait_for(lambda: len(list(pids_dir.iterdir())) == 2 and
                    [int(p.name) for p in pids_dir.iterdir()], timeout=30,
                    what="both processes to start")
    coordinator.kill()
    wait_for(lambda: all(_gone(p) for p in pids), timeout=30,  # type: ignore[union-attr]
             what="the executor to kill its processes")
    assert agent.wait(timeout=30) == 1
    assert "lost the coordinator" in agent.stderr.read()  # type: ignore[union-attr]
