"""SIGKILL and restart: the catalog comes back equal, sessions that come back within their lease
keep their ids and what they own, those that do not expire, and followers (started early,
across the restart, or late) all see the same collections."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from catalog import COLLECTIONS, Publication, SessionRef
from querylib.cluster import Cluster, CollectionFollower, Snapshot
from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import CoordinatorProcess, client_process, client_processes


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    return tmp_path


def everything(cluster: Cluster) -> dict[str, Snapshot]:
    return cluster.snapshot(*COLLECTIONS, timeout=30)


def contents(snapshots: dict[str, Snapshot]) -> dict[str, dict[Any, int]]:
    return {name: dict(s.records) for name, s in snapshots.items()}


def test_sigkill_and_restart_give_an_equal_catalog(processes: Processes, home: Path) -> None:
    coordinator = CoordinatorProcess(processes, home).start()
    holders = client_processes(processes, home,
                               *[["--create", f"t{i}", "--publish", f"t{i}"] for i in range(3)])
    client_process(processes, home, "--subscribe", "t0", "--subscribe", "t1")
    holders[2][0].stdin.close()  # type: ignore[union-attr]
    holders[2][0].wait(timeout=20)
    with Cluster.connect(session=False) as cluster:
        before = everything(cluster)
    versions = {s.version for s in before.values()}
    assert len(before["sessions"].records) == 3 and len(before["publications"].records) == 2

    coordinator.kill()
    coordinator.start()
    with Cluster.connect(session=False) as cluster:
        after = everything(cluster)
    assert contents(after) == contents(before)
    # Same address, same broker: the restart itself changed nothing.
    assert {s.version for s in after.values()} == versions


def test_sessions_come_back_within_their_lease(processes: Processes, home: Path) -> None:
    coordinator = CoordinatorProcess(processes, home, recovery_lease=1.0).start()
    (survivor, survivor_info), (victim, victim_info) = client_processes(
        processes, home, ["--lease", "1", "--create", "kept", "--publish", "kept"],
        ["--lease", "1", "--create", "orphan", "--publish", "orphan"])
    mine = Cluster.connect(lease=1.0)
    try:
        mine.create_topic("mine")
        mine.publish("mine")
        coordinator.kill()
        os.killpg(victim.pid, signal.SIGKILL)  # it will not come back
        coordinator.start()

        with Cluster.connect(session=False) as watcher, watcher.follow("sessions") as follower:
            first = follower.snapshot(timeout=20)
            assert first is not None
            open_sessions = {s.session_id for s, _ in first.records}
            assert victim_info["session"] in open_sessions  # recovered, on probation

            def victim_expired() -> bool:
                while (event := follower.next_event(timeout=0.05)) is not None:
                    for record, diff in event.updates:  # type: ignore[union-attr]
                        if diff < 0:
                            open_sessions.discard(record.session_id)
                return victim_info["session"] not in open_sessions

            wait_for(victim_expired, timeout=20, what="the dead client's session to expire")
            # Those that kept renewing kept their ids (same lease, so they had to renew).
            assert {survivor_info["session"], mine.session_id} <= open_sessions
            publishers = {p.publisher for p, _ in watcher.snapshot("publications")[
                "publications"].records if isinstance(p, Publication)}
            assert publishers == {SessionRef(survivor_info["session"]),
                                  SessionRef(mine.session_id)}  # type: ignore[arg-type]
        # The resumed session keeps working as itself.
        mine.unpublish("mine")
        assert not mine.lost
    finally:
        mine.close()
    survivor.stdin.close()  # type: ignore[union-attr]
    assert survivor.wait(timeout=20) == 0


def _churn(cluster: Cluster, prefix: str, count: int) -> None:
    """Topics created, published, some deleted: history for followers to replay."""
    for i in range(count):
        name = f"{prefix}{i}"
        cluster.create_topic(name, partitions=1 + i % 3)
        cluster.publish(name)
        if i % 4 == 0:
            cluster.delete_topic(name)


def _drain(follower: CollectionFollower, version: int) -> None:
    def caught_up() -> bool:
        while follower.next_event(timeout=0.05) is not None:
            pass
        return (follower.view.version or 0) >= version

    wait_for(caught_up, timeout=30, what=f"a follower to reach version {version}")


@pytest.mark.parametrize("checkpoint_updates", [100_000, 50])
def test_late_and_early_followers_see_the_same_state(processes: Processes, home: Path,
                                                     checkpoint_updates: int) -> None:
    """Without checkpoints every follower replays the history; with frequent ones late
    followers (and the restart) start from a checkpoint block."""
    coordinator = CoordinatorProcess(processes, home,
                                     checkpoint_updates=checkpoint_updates).start()
    watched = ("topics", "publications", "sessions", "counters")
    with Cluster.connect(session=False) as watcher:
        early = {c: watcher.follow(c) for c in watched}
        try:
            for follower in early.values():
                assert follower.snapshot(timeout=20) is not None
            with Cluster.connect(lease=10.0) as cluster:
                _churn(cluster, "before", 40)
                coordinator.kill()
                coordinator.start()
                _churn(cluster, "after", 40)
                version = cluster.version
                if checkpoint_updates < 1000:
                    assert watcher.info().checkpoint is not None
                late = {c: watcher.follow(c) for c in watched}
                try:
                    for c in watched:
                        _drain(early[c], version)
                        _drain(late[c], version)
                    final = watcher.snapshot(*watched)
                    for c in watched:
                        assert early[c].view.version == late[c].view.version
                        assert early[c].view.contents == late[c].view.contents, c
                        if early[c].view.version == final[c].version:
                            assert dict(final[c].records) == early[c].view.contents
                finally:
                    for follower in late.values():
                        follower.close()
        finally:
            for follower in early.values():
                follower.close()
