"""`tq executor --broker-id N` (DESIGN §6 "Executor broker ids"): the operator's override of
the id a host's broker registers under. A host of the same credential claims an id that is
down and keeps it in its data dir; another credential's id is refused, as is an id the
cluster never assigned, each in one line before the executor runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)


def _brokers(up: Up) -> dict[str, int]:
    """host name -> broker id, of the executors registered now."""
    done = up.tq("status", "--json")
    return {} if done.returncode else {e["host"]: e["broker_id"]
                                       for e in json.loads(done.stdout)["executors"]}


def _argv(up: Up, credential: Path, data: Path, host: str, *extra: str) -> list[str]:
    return ["-m", "querylib.cli", "executor", "--coordinator", up.info["coordinator"],
            "--credentials", str(credential), "--data", str(data), "--host", host,
            "--brokers", "1", "--slots", "1", *extra]


def test_an_executor_claims_a_broker_id_of_its_own_credential_only(
        processes: Processes, tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        credentials = {name: up.executor_credential(name, tmp_path / f"{name}.credential")
                       for name in ("host-b", "host-c")}
        env = tq_env(tmp_path / "elsewhere")
        agent = processes.python(*_argv(up, credentials["host-b"], tmp_path / "b", "host-b"),
                                 env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        claimed = wait_for(lambda: _brokers(up).get("host-b"), timeout=60, interval=0.2,
                           what="host-b to register")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
        wait_for(lambda: "host-b" not in _brokers(up), timeout=30, what="host-b to leave")

        def refused(credential: Path, data: Path, host: str, broker_id: int) -> str:
            done = subprocess.run(
                [sys.executable, *_argv(up, credential, data, host, "--broker-id",
                                        str(broker_id))],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode != 0, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            return done.stderr

        assert "belongs to executor:host-b" in refused(credentials["host-c"], tmp_path / "c",
                                                       "host-c", claimed)
        assert "never assigned" in refused(credentials["host-b"], tmp_path / "x", "host-x",
                                           claimed + 1000)
        # host-b's credential on a new machine (another name, an empty data dir) takes it.
        agent = processes.python(*_argv(up, credentials["host-b"], tmp_path / "b2", "host-b2",
                                        "--broker-id", str(claimed)),
                                 env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: _brokers(up).get("host-b2"), timeout=60, interval=0.2,
                        what="host-b2 to register") == claimed
        assert (tmp_path / "b2" / "broker.id").read_text() == f"{claimed}\n"
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0


def test_a_killed_executor_restarted_on_its_data_gets_its_broker_ids_back_at_once(
        processes: Processes, tmp_path: Path) -> None:
    """The restarted executor and its shard hold their data dirs' locks, so the run that wrote
    them has ended: each closes that run's session (named in `broker.session`) rather than
    wait for it to expire, and registers its remembered broker id again. Their lease here is
    longer than the test waits: before, the ids stayed taken until it ran out."""
    with Up(tmp_path / "home") as up:
        credential = up.executor_credential("host-b", tmp_path / "host-b.credential")
        env = tq_env(tmp_path / "elsewhere")
        argv = _argv(up, credential, tmp_path / "b", "host-b", "--lease", "600")
        argv[argv.index("--brokers") + 1] = "2"

        def host_b() -> list[tuple[int, int, tuple[int, ...]]]:
            """(executor id, broker id, shard broker ids) of host-b's executors now."""
            done = up.tq("status", "--json")
            return [] if done.returncode else [
                (e["executor_id"], e["broker_id"], tuple(e["shards"]))
                for e in json.loads(done.stdout)["executors"] if e["host"] == "host-b"]

        agent = processes.python(*argv, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        [(old, broker, shards)] = wait_for(lambda: (found := host_b()) and found[0][2] and found,
                                           timeout=60, interval=0.2, what="host-b to register")
        agent.kill()  # its shard dies with it (its parent-death signal)
        agent.wait(timeout=30)
        processes.python(*argv, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        [(new, broker_again, shards_again)] = wait_for(
            lambda: (found := host_b()) and len(found) == 1 and found[0][0] != old
            and found[0][2] and found,
            timeout=60, interval=0.2, what="the restarted host-b registered, alone")
        assert (broker_again, shards_again) == (broker, shards) and new != old
