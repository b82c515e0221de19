"""An executor that holds an executor credential, not the cluster secret (DESIGN §12): it
registers, runs a query whose processes publish into its own broker and subscribe across
brokers (its broker learns the query's key from the coordinator), and its credential neither
submits nor kills queries."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from catalog import NotAuthorizedError, NotOwnerError, QueryState
from querylib.cluster import Cluster
from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)

# Each process publishes its half of 1..100 into its partition, on its executor's broker (one
# holds an executor credential); process 1 then reads both partitions and prints the total.
PROGRAM = textwrap.dedent('''
    import querylib

    def main(ctx):
        with ctx.publish("far-numbers", serde="json") as out:
            first = 1 + 50 * ctx.process
            for t in range(5):
                out.send(t, list(range(first + 10 * t, first + 10 * t + 10)))
        if ctx.process == 1:
            total = 0
            with ctx.subscribe("far-numbers", serde="json", timeout=60) as sub:
                for event in sub:
                    if isinstance(event, querylib.Data):
                        total += sum(event.records)
            print(f"TOTAL {total}", flush=True)

    querylib.execute(main)
''')


def _executor_ids(up: Up) -> list[int]:
    done = up.tq("status", "--json")
    return [] if done.returncode else [e["executor_id"]
                                       for e in json.loads(done.stdout)["executors"]]


def test_an_executor_credential_runs_queries_and_nothing_more(processes: Processes,
                                                              tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        (local,) = _executor_ids(up)
        credential = tmp_path / "host-b.credential"
        made = up.tq("user", "add", "host-b", "--role", "executor", "-o", str(credential))
        assert made.returncode == 0, made.stderr
        assert "executor:host-b" in made.stdout
        log = tmp_path / "host-b.log"
        with log.open("w") as stderr:
            agent = processes.python(
                "-m", "querylib.cli", "executor", "--coordinator", up.info["coordinator"],
                "--credentials", str(credential), "--data", str(tmp_path / "host-b"),
                "--slots", "1", env=tq_env(tmp_path / "elsewhere"), cwd=ROOT, stderr=stderr)
        remote = wait_for(lambda: [e for e in _executor_ids(up) if e != local], timeout=60,
                          interval=0.2, what="the second executor to register")[0]
        program = tmp_path / "far.py"
        program.write_text(PROGRAM)
        query = up.submit(program, "--processes", "2", "--executor", str(remote),
                          "--executor", str(local))
        ended = up.ended(query)
        assert ended.state is QueryState.FINISHED, (ended, log.read_text())
        assert "TOTAL 5050" in up.tq("logs", str(query)).stdout
        # The query's process on host-b held a query credential, not host-b's.
        assert not list((tmp_path / "host-b" / "credentials").glob("*.json"))
        with Cluster.connect(up.info["coordinator"], secret_file=str(credential),
                             kind="executor") as host_b:
            with pytest.raises(NotAuthorizedError, match="does not submit"):
                host_b.submit_query("sneaky", "sha256:" + "0" * 64)
            with pytest.raises(NotOwnerError):
                host_b.kill_query(query)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, log.read_text()


def test_a_wrong_executor_credential_stops_at_once(tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        credential = tmp_path / "host-c.credential"
        assert up.tq("user", "add", "host-c", "--role", "executor", "-o",
                     str(credential)).returncode == 0
        assert up.tq("user", "remove", "host-c").returncode == 0
        done = subprocess.run(
            [sys.executable, "-m", "querylib.cli", "executor", "--coordinator",
             up.info["coordinator"], "--credentials", str(credential), "--data",
             str(tmp_path / "host-c")],
            env=tq_env(tmp_path / "elsewhere"), cwd=ROOT, capture_output=True, text=True,
            timeout=120)
        assert done.returncode == 2, done.stderr
