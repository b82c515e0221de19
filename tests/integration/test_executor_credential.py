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


def test_executors_replicate_each_as_itself(processes: Processes, tmp_path: Path) -> None:
    """Two executors holding executor credentials and tq up's own hold the replicas of a topic
    of three: each follower fetches from the leader as its own broker and the ISR is full; the
    credential of one, fetching as the other's broker, is refused (a follower's fetch moves
    the high watermark: naming another replica would acknowledge what that one never had)."""
    import asyncio

    from querylib.broker._errors import PrincipalError
    from querylib.broker.messages import ReplicaFetchRequest
    from querylib.rpc import BROKER, RpcClient, load_credential

    with Up(tmp_path / "home") as up:
        (local,) = _executor_ids(up)
        credentials = {name: up.executor_credential(name, tmp_path / f"{name}.credential")
                       for name in ("host-b", "host-c")}
        for name in credentials:
            processes.python(
                "-m", "querylib.cli", "executor", "--coordinator", up.info["coordinator"],
                "--credentials", str(credentials[name]), "--host", name, "--data",
                str(tmp_path / name), "--slots", "1", env=tq_env(tmp_path / "elsewhere"),
                cwd=ROOT, stderr=subprocess.DEVNULL)
        wait_for(lambda: len(_executor_ids(up)) == 3, timeout=60, interval=0.2,
                 what="both executors to register")
        made = up.tq("topic", "create", "kept", "--replication-factor", "3")
        assert made.returncode == 0, made.stderr
        produced = up.tq("produce", "kept", stdin="a\nb\nc\n")
        assert produced.returncode == 0, produced.stderr

        def described() -> dict:
            done = up.tq("topic", "describe", "kept", "--json")
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)["partitions"][0]

        part = wait_for(lambda: (p := described())["isr"] == p["replicas"] and p, timeout=60,
                        interval=0.2, what="every replica in sync")
        status = json.loads(up.tq("status", "--json").stdout)
        broker_of = {e["host"]: e["broker_id"] for e in status["executors"]}
        address = {e["broker_id"]: e["broker"] for e in status["executors"]}

        async def fetch_as(name: str, replica: int) -> None:
            client = RpcClient(address[part["broker"]], load_credential(credentials[name]),
                               audience=BROKER, timeout=30)
            try:
                await client.connect()
                await client.exchange(ReplicaFetchRequest(
                    "kept", 0, fetch_offset=0, leader_epoch=part["leader_epoch"],
                    replica=replica, max_wait_ms=0))
            finally:
                await client.close()

        with pytest.raises(PrincipalError):
            asyncio.run(fetch_as("host-b", broker_of["host-c"]))
