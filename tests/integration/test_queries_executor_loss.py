"""`tq executor` as its own process beside `tq coordinator`: it registers, runs what is
submitted, and when the coordinator is gone for longer than its lease it kills its processes
(rather than let them run unaccounted for), then rejoins by itself once the coordinator is back:
the same agent process registers as a new executor and runs new queries.

Two ways to lose the coordinator: SIGSTOP (it comes back with its state, and expires the
executor's session itself) and SIGKILL + restart on the same port and data (it recovers the
old session, which must expire before the broker id is free again)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq_env

pytestmark = pytest.mark.timeout(120)

LEASE = 1.0

SLEEPER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        Path(sys.argv[1], f"{os.environ['TQ_EXECUTOR_ID']}-{os.getpid()}").write_text("")
        while True:
            time.sleep(0.5)

    querylib.execute(main)
''')


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Tq:
    def __init__(self, home: Path) -> None:
        self.env = tq_env(home)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "querylib.cli", *args], env=self.env,
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    def executors(self) -> list[int]:
        done = self.run("status", "--json")
        if done.returncode != 0:  # the coordinator is away or restarting
            return []
        return [e["executor_id"] for e in json.loads(done.stdout)["executors"]]


def _started(folder: Path, count: int) -> dict[int, int]:
    """pid -> executor id of the processes that wrote their marker into `folder`."""
    names = wait_for(lambda: len(found := list(folder.iterdir())) >= count and found,
                     timeout=30, what=f"{count} query processes to start")
    return {int(pid): int(executor) for executor, pid in
            (p.name.split("-") for p in names)}  # type: ignore[union-attr]


@pytest.mark.parametrize("fault", ["sigstop", "restart"])
def test_executor_kills_its_processes_on_loss_and_rejoins_by_itself(
        processes: Processes, tmp_path: Path, fault: str) -> None:
    coordinator = CoordinatorProcess(processes, tmp_path, recovery_lease=2.0).start()
    tq = Tq(tmp_path)
    log = tmp_path / "executor.log"
    with log.open("w") as stderr:
        agent = processes.python("-m", "querylib.cli", "executor", "--data",
                                 str(tmp_path / "executor"), "--slots", "2", "--lease",
                                 str(LEASE), "--grace", "1", env=tq.env, cwd=ROOT,
                                 stderr=stderr)
    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    (first := tmp_path / "first").mkdir()
    (first_id,) = wait_for(lambda: tq.executors(), timeout=30, interval=0.2,
                           what="the executor to register")
    done = tq.run("submit", str(program), "--processes", "2", "--", str(first))
    assert done.returncode == 0, done.stderr
    pids = _started(first, 2)
    assert set(pids.values()) == {first_id}
    broker_id = (tmp_path / "executor" / "broker.id").read_text().strip()

    assert coordinator.proc is not None
    if fault == "sigstop":
        os.kill(coordinator.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: all(_gone(p) for p in pids), timeout=30,
                     what="the executor to kill its processes")
        finally:
            os.kill(coordinator.proc.pid, signal.SIGCONT)
    else:
        coordinator.kill()
        wait_for(lambda: all(_gone(p) for p in pids), timeout=30,
                 what="the executor to kill its processes")
        coordinator.start()

    # The same agent process comes back as a new executor, and nothing else is registered.
    (second_id,) = wait_for(lambda: (e := tq.executors()) and first_id not in e and e,
                            timeout=60, interval=0.2, what="the executor to rejoin")
    assert agent.poll() is None
    (second := tmp_path / "second").mkdir()
    done = tq.run("submit", str(program), "--processes", "2", "--", str(second))
    assert done.returncode == 0, done.stderr
    assert set(_started(second, 2).values()) == {second_id}
    killed = tq.run("kill", done.stdout.split()[0])
    assert killed.returncode == 0, killed.stderr
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    text = log.read_text()
    assert "lost the coordinator" in text
    # ... with its broker under the id its partitions are located by.
    assert f"rejoined the coordinator as executor {second_id} (broker {broker_id})" in text
    assert (tmp_path / "executor" / "broker.id").read_text().strip() == broker_id
