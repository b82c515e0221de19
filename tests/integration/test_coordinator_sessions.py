"""A real coordinator process with real client processes: sessions come and go, an expired
lease's cleanup reaches the catalog topics within the lease plus a second, blocking subscribe
works across processes, and the commands find the coordinator through cluster.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from catalog import (
    Publication,
    QueryState,
    Resources,
    SessionKind,
    SessionRef,
    UnknownTopicError,
)
from querylib.cluster import Cluster, KillProcesses
from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import (
    ROOT,
    CoordinatorProcess,
    client_process,
    client_processes,
    tq,
    tq_env,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    return tmp_path


@pytest.fixture
def coordinator(processes: Processes, home: Path) -> CoordinatorProcess:
    return CoordinatorProcess(processes, home).start()


def test_clients_come_and_go(processes: Processes, home: Path,
                             coordinator: CoordinatorProcess) -> None:
    with Cluster.connect(session=False) as watcher, watcher.follow("publications") as follower:
        snapshot = follower.snapshot(timeout=20)
        assert snapshot is not None and snapshot.records == []
        publications: dict[Publication, int] = {}

        def publishers() -> set[int]:
            while (event := follower.next_event(timeout=0.05)) is not None:
                for record, diff in event.updates:  # type: ignore[union-attr]
                    publications[record] = publications.get(record, 0) + diff
                    if not publications[record]:
                        del publications[record]
            return {p.publisher.session_id for p in publications
                    if isinstance(p.publisher, SessionRef)}

        lease = 0.6
        (polite, polite_info), (crashy, crashy_info) = client_processes(
            processes, home, ["--lease", str(lease), "--create", "a", "--publish", "a"],
            ["--lease", str(lease), "--create", "b", "--publish", "b"])
        wait_for(lambda: publishers() == {polite_info["session"], crashy_info["session"]},
                 what="both publications in the catalog topic")

        # A clean goodbye retracts at once.
        polite.stdin.close()  # type: ignore[union-attr]
        assert polite.wait(timeout=20) == 0
        wait_for(lambda: publishers() == {crashy_info["session"]}, what="a's publication gone")

        # A crash is noticed when the lease runs out.
        os.killpg(crashy.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: publishers() == set(), timeout=lease + 1.0,
                 what="the killed client's publication to leave within lease + 1 s")
        assert time.monotonic() - killed <= lease + 1.0
        # Topics outlive their owners.
        assert {t.short_name for t, _ in watcher.snapshot("topics")["topics"].records
                if not t.internal} == {"a", "b"}


def test_blocking_subscribe_waits_for_another_process(processes: Processes, home: Path,
                                                      coordinator: CoordinatorProcess) -> None:
    with Cluster.connect(lease=5.0) as cluster:
        result: dict[str, object] = {}

        def wait() -> None:
            try:
                result["info"] = cluster.subscribe("later", wait=20.0)
            except Exception as exc:  # reported below
                result["error"] = exc

        waiter = threading.Thread(target=wait)
        waiter.start()
        # The subscribe is parked at the coordinator until the topic exists.
        creator, _ = client_process(processes, home, "--create", "later")
        waiter.join(timeout=30)
        assert "error" not in result, result
        assert result["info"].topic.short_name == "later"  # type: ignore[attr-defined]
        creator.stdin.close()  # type: ignore[union-attr]
        with pytest.raises(UnknownTopicError):
            cluster.subscribe("never", wait=0.3)


def test_commands_find_the_coordinator_and_render(processes: Processes, home: Path,
                                                  coordinator: CoordinatorProcess) -> None:
    holder, info = client_process(processes, home, "--create", "numbers", "--publish", "numbers")
    status = tq(home, "status")
    assert status.returncode == 0, status.stderr
    assert f"session {info['session']} client: test client" in status.stdout
    assert "publishes numbers (2 partitions)" in status.stdout
    topics = tq(home, "topics", "--json")
    assert topics.returncode == 0, topics.stderr
    (row,) = [json.loads(line) for line in topics.stdout.splitlines()]
    assert row["short_name"] == "numbers" and row["publishers"] == 1
    catalog = tq(home, "catalog", "sessions", "--json")
    assert catalog.returncode == 0, catalog.stderr
    body = json.loads(catalog.stdout)
    assert [s["session_id"] for s in body["snapshot"]] == [info["session"]]
    table = tq(home, "catalog", "topics")
    assert "numbers" in table.stdout and "__catalog.topics" in table.stdout
    holder.stdin.close()  # type: ignore[union-attr]


def test_no_coordinator_is_one_line_and_a_non_zero_exit(processes: Processes,
                                                        home: Path) -> None:
    result = tq(home, "status")
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert "tq coordinator" in line
    # A connection file left behind by a killed coordinator is recognised, not waited on.
    coordinator = CoordinatorProcess(processes, home).start()
    coordinator.kill()
    result = tq(home, "topics")
    assert result.returncode != 0 and "not running" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_lost_query_process_fails_its_query_and_executors_are_told(
        processes: Processes, home: Path, coordinator: CoordinatorProcess) -> None:
    kills: list[KillProcesses] = []
    with Cluster.connect(kind=SessionKind.EXECUTOR, lease=10.0, peer="fake agent") as agent:
        agent.on_notify(KillProcesses, lambda note: kills.append(note.message))
        broker = agent.register_broker("host-a", "tcp://127.0.0.1:1")
        executor = agent.register_executor("host-a", broker.broker_id,
                                           Resources(cores=1, memory=1 << 30, disk=1 << 30,
                                                     slots=4))
        with Cluster.connect(lease=10.0) as client:
            query = client.submit_query("job", "job.py", processes=2)
            assert query.executors == (executor.executor_id,) * 2
            steady = Cluster.connect(kind=SessionKind.QUERY, query_id=query.query_id,
                                     process=1, lease=10.0)
            try:
                # Process 0 runs in a process of its own, which then dies without a word.
                code = ("import sys; from querylib.cluster import Cluster; "
                        "from catalog import SessionKind; "
                        f"c = Cluster.connect(kind=SessionKind.QUERY, query_id={query.query_id},"
                        " process=0, lease=0.5); print('up', flush=True); sys.stdin.read()")
                lost = processes.python("-c", code, env=tq_env(home), cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                assert lost.stdout.readline().strip() == "up"  # type: ignore[union-attr]
                wait_for(lambda: _query(client, query.query_id).state == QueryState.RUNNING,
                         what="the query to run once both processes registered")
                os.killpg(lost.pid, signal.SIGKILL)
                wait_for(lambda: kills, timeout=10, what="the executor to be told to kill")
                (kill,) = kills
                assert kill.query_id == query.query_id and kill.processes == [0, 1]
                assert "process 0 lost its session" in kill.reason
                assert _query(client, query.query_id).state == QueryState.FAILED
            finally:
                steady.close()


def _query(cluster: Cluster, query_id: int) -> Any:
    (query,) = [q for q, _ in cluster.snapshot("queries")["queries"].records
                if q.query_id == query_id]
    return query
