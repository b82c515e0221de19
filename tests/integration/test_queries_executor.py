"""Queries on a real `tq up` (coordinator + executor agent in one process): `tq submit` packs,
uploads and runs programs on the executor, the processes register (the barrier), their exits
reach the catalog; `tq kill` terminates them; a process that cannot start fails the query and
its submitter hears why; a SIGKILLed process fails its query; output reaches `tq logs`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from catalog import InvalidCommandError, Query
from querylib.cluster import Cluster
from tests.conftest import free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env

pytestmark = pytest.mark.timeout(180)

SLOTS = 3

SUBSCRIBER = textwrap.dedent('''
    import sys
    import querylib

    def main(ctx):
        total = 0
        with ctx.subscribe(sys.argv[1], timeout=120) as sub:
            for event in sub:
                if isinstance(event, querylib.Data):
                    total += sum(event.records)
        print(f"total {total}", flush=True)

    querylib.execute(main)
''')

SLEEPER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        Path(sys.argv[1], f"{os.getpid()}").write_text("")
        while True:
            print("still here", flush=True)
            time.sleep(0.5)

    querylib.execute(main)
''')


class Up:
    """A `tq up` child process and the tq commands run against it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = tq_env(home)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "querylib.cli", "up", "--listen",
             f"tcp://127.0.0.1:{free_port()}", "--slots", str(SLOTS), "--grace", "2"],
            env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        wait_for(lambda: (home / "cluster.json").exists() or self.proc.poll() is not None,
                 timeout=60, what="tq up to write cluster.json")
        assert self.proc.poll() is None, self.proc.stderr.read()  # type: ignore[union-attr]
        self.info = json.loads((home / "cluster.json").read_text())

    def tq(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "querylib.cli", *args], env=self.env,
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)

    def submit(self, program: Path, *args: str) -> int:
        done = self.tq("submit", str(program), *args)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[0])

    def query(self, query_id: int) -> Query:
        (query,) = [q for q in _all_queries(self) if q.query_id == query_id]
        return query

    def ended(self, query_id: int) -> Query:
        return wait_for(lambda: (q := self.query(query_id)).ended and q, timeout=120,
                        interval=0.1, what=f"query {query_id} to end")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc.stderr.close()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    running = Up(tmp_path_factory.mktemp("tq-up"))
    try:
        yield running
    finally:
        running.stop()


def _program(up: Up, name: str, text: str) -> Path:
    path = up.home / name
    path.write_text(text)
    return path


def _pids(directory: Path, count: int) -> list[int]:
    found = wait_for(lambda: len(list(directory.iterdir())) >= count and
                     sorted(int(p.name) for p in directory.iterdir()),
                     timeout=60, what=f"{count} processes to start")
    return found  # type: ignore[return-value]


def test_numbers_and_a_subscriber_run_to_the_end(up: Up) -> None:
    # A program called numbers.py would shadow the stdlib `numbers` module it imports.
    numbers = up.home / "numbers_job.py"
    shutil.copy(ROOT / "querylib" / "examples" / "numbers.py", numbers)
    subscriber = _program(up, "sum_job.py", SUBSCRIBER)
    reader = up.submit(subscriber, "--", "nums")
    writer = up.submit(numbers, "--processes", "2", "--workers", "2", "--wait", "--",
                       "--topic", "nums")
    done = up.ended(writer)
    assert (done.state.value, done.exit_codes, done.processes) == ("finished", (0, 0), 2)
    read = up.ended(reader)
    assert (read.state.value, read.exit_codes) == ("finished", (0,))
    logs = up.tq("logs", str(reader))
    assert logs.returncode == 0, logs.stderr
    assert f"[0] total {sum(range(400))}" in logs.stdout.splitlines()


def test_kill_terminates_the_processes(up: Up) -> None:
    pids_dir = up.home / "kill-pids"
    pids_dir.mkdir()
    sleeper = _program(up, "sleeper.py", SLEEPER)
    query_id = up.submit(sleeper, "--processes", "2", "--", str(pids_dir))
    pids = _pids(pids_dir, 2)
    assert up.query(query_id).state.value == "running"
    killed = up.tq("kill", str(query_id))
    assert killed.returncode == 0, killed.stderr
    assert up.ended(query_id).state.value == "killed"
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() !=
                             psutil.STATUS_ZOMBIE for p in pids),
             timeout=30, what="the killed processes to be gone")
    logs = up.tq("logs", str(query_id))
    assert "still here" in logs.stdout


def test_a_failed_spawn_reaches_the_submitter(up: Up) -> None:
    sleeper = _program(up, "sleeper2.py", SLEEPER)
    pins = [arg for _ in range(SLOTS + 1) for arg in ("--executor", "1")]
    pids_dir = up.home / "spawn-pids"
    pids_dir.mkdir()
    done = up.tq("submit", str(sleeper), "--processes", str(SLOTS + 1), *pins, "--",
                 str(pids_dir))
    assert done.returncode != 0
    assert "NoFreeSlotsError" in done.stderr and "could not start" in done.stderr, done.stderr
    (query,) = [q for q in _all_queries(up) if q.program.startswith("sha256:")
                and q.name == "sleeper2"]
    ended = up.ended(query.query_id)
    assert ended.state.value == "failed" and "NoFreeSlotsError" in ended.reason
    # What did start was killed: every slot comes back.
    wait_for(lambda: all(not psutil.pid_exists(int(p.name)) or
                         psutil.Process(int(p.name)).status() == psutil.STATUS_ZOMBIE
                         for p in pids_dir.iterdir()),
             timeout=30, what="the started processes to be killed")


def test_a_sigkilled_process_fails_its_query(up: Up) -> None:
    pids_dir = up.home / "sigkill-pids"
    pids_dir.mkdir()
    sleeper = _program(up, "sleeper3.py", SLEEPER)
    query_id = up.submit(sleeper, "--processes", "2", "--", str(pids_dir))
    pids = _pids(pids_dir, 2)
    os.kill(pids[0], signal.SIGKILL)
    ended = up.ended(query_id)
    assert ended.state.value == "failed"
    assert -signal.SIGKILL in ended.exit_codes


def _all_queries(up: Up) -> list[Any]:
    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"],
                         session=False) as cluster:
        return [q for q, _ in cluster.snapshot("queries")["queries"].records
                if isinstance(q, Query)]


def test_uploads_are_checked_against_their_digest(up: Up) -> None:
    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as cluster:
        with pytest.raises(InvalidCommandError, match="hashes to"):
            cluster.upload_artifact("0" * 64, b"not the pack you named")
        with pytest.raises(InvalidCommandError, match="not a sha256 digest"):
            cluster.upload_artifact("../../etc/passwd", b"x")
        pack = b"any bytes at all"
        digest = hashlib.sha256(pack).hexdigest()
        assert cluster.upload_artifact(digest, pack) == f"sha256:{digest}"


def test_topic_create(up: Up) -> None:
    done = up.tq("topic", "create", "feed", "--partitions", "3")
    assert done.returncode == 0, done.stderr
    listed = up.tq("topics", "--json")
    (topic,) = [t for t in map(json.loads, listed.stdout.splitlines()) if "feed" in str(t)]
    assert topic["partitions"] == 3
