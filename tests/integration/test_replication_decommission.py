"""A host gone for good, decommissioned (DESIGN §5 "Decommissioning a broker"), with real
processes: a coordinator and four `tq executor` hosts on loopback; an RF 3 topic under a
publisher (querylib producers following their leaders); the host leading partition 0
SIGKILLed for good mid-stream; `tq broker decommission` its broker. Every partition is back
to three replicas, all in sync, none on the dead broker; every acknowledged record is on
every replica (the logs are byte-identical) and a subscriber reads each one once. Bad
requests get one clear line and change nothing. The host coming back after all gets a new
broker id and deletes its copies of the partitions it held."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, partition_dir, wait_for
from tests.coordinator._cluster import ROOT, tq, tq_env
from tests.integration._three_hosts import ThreeHosts, broker_ids

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 3

# A publisher of one producer per partition, each following its leader through the catalog
# (`watch_leader`, `locate`): a round of one record per partition, flushed, then logged as
# acknowledged; at STOP it ends every stream. Bounded (240 s).
PUBLISHER = textwrap.dedent("""
    import functools, os, sys, time
    from querylib.api._runtime import incarnation_of
    from querylib.broker import Producer
    from querylib.cluster import Cluster

    topic, partitions, out, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    cluster = Cluster.connect(None, session=False, connect_timeout=30, timeout=10)
    info = cluster.lookup_topic(topic)

    def locate(p):
        return cluster.lookup_topic(topic).leader_address(p)

    producers = [Producer(info.leader_address(p), topic, p, secret=cluster.secret,
                          reopen=True, incarnation=incarnation_of(info),
                          locate=functools.partial(locate, p), timeout=10,
                          reconnect_timeout=60, linger=0,
                          watch_leader=functools.partial(cluster.watch_leader, topic, p))
                 for p in range(partitions)]
    log = open(out, "a", buffering=1)
    deadline, i = time.monotonic() + 240, 0
    while not os.path.exists(stop) and time.monotonic() < deadline:
        values = [f"{p}-{i:06d}" for p in range(partitions)]
        for producer, value in zip(producers, values):
            producer.send(value.encode())
        for producer in producers:
            producer.flush()
        log.write("".join(f"{v}\\n" for v in values))
        i += 1
    for producer in producers:
        producer.close()
""")


def _acked(out: Path) -> list[str]:
    """What the publisher had acknowledged, in order (a last line not written whole yet is
    left out)."""
    try:
        text = out.read_text()
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


def _log_bytes(executor_data: Path, name: str) -> bytes | None:
    directory = partition_dir(executor_data, name)
    if directory is None:
        return None
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def _partitions(hosts: ThreeHosts, topic: str) -> list[dict[str, Any]] | None:
    done = tq(hosts.home, "topic", "describe", topic, "--json", "--timeout", "2")
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)["partitions"]  # type: ignore[no-any-return]


def _decommission(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return tq(home, "broker", "decommission", *args, "--timeout", "10", timeout=60)


def test_a_dead_hosts_replicas_move_to_live_hosts_and_nothing_acknowledged_is_lost(
        processes: Processes, tmp_path: Path) -> None:
    hosts = ThreeHosts(processes, tmp_path, hosts=4, options=lambda i: ("--brokers", "1"))
    created = tq(tmp_path, "topic", "create", "kept", "--partitions", str(PARTITIONS),
                 "--replication-factor", "3")
    assert created.returncode == 0, created.stderr
    wait_for(lambda: (parts := _partitions(hosts, "kept"))
             and all(p["isr"] == p["replicas"] for p in parts),
             timeout=60, interval=0.2, what="every replica in sync")
    before = _partitions(hosts, "kept")
    assert before is not None
    dead = before[0]["broker"]  # partition 0's leader: its host dies for good

    out, stop = tmp_path / "published", tmp_path / "stop"
    publisher = processes.python(
        "-c", PUBLISHER, "kept", str(PARTITIONS), str(out), str(stop), env=tq_env(tmp_path),
        cwd=ROOT, stderr=(tmp_path / "publisher.err").open("w"))
    wait_for(lambda: len(_acked(out)) >= 300, timeout=60, what="the publisher under way")

    hosts.kill(dead)
    wait_for(lambda: (parts := _partitions(hosts, "kept"))
             and all(dead not in p["isr"] for p in parts),
             timeout=60, interval=0.2, what="the dead broker to leave every ISR")

    # Bad requests: one line each, nothing changes.
    refused = _decommission(tmp_path, "999")
    assert refused.returncode != 0 and "no broker 999" in refused.stderr, refused.stderr
    status = json.loads(tq(tmp_path, "status", "--json").stdout)
    (own,) = [b["broker_id"] for b in status["brokers"] if b["session_id"] is None]
    refused = _decommission(tmp_path, str(own), "--force")
    assert refused.returncode != 0 and "coordinator's own broker" in refused.stderr
    live = next(b for p in before for b in p["replicas"] if b != dead)
    refused = _decommission(tmp_path, str(live))
    assert refused.returncode != 0 and "--force" in refused.stderr, refused.stderr
    added = tq(tmp_path, "user", "add", "alice", "-o", str(tmp_path / "alice.cred"))
    assert added.returncode == 0, added.stderr
    refused = _decommission(tmp_path, str(dead), "--credentials", str(tmp_path / "alice.cred"))
    assert refused.returncode != 0 and "admin" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert _partitions(hosts, "kept") is not None

    # The publisher goes on (it followed partition 0's new leader); the dead broker is
    # decommissioned under it.
    done = _decommission(tmp_path, str(dead), "--json")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["retired"] and reply["stuck"] == []
    held = [p["partition"] for p in before if dead in p["replicas"]]
    assert sorted(m["partition"] for m in reply["moved"]) == held
    so_far = len(_acked(out))
    wait_for(lambda: len(_acked(out)) >= so_far + 300, timeout=60,
             what="the publisher acknowledged after the moves")

    # Back to three replicas each, all in sync, none on the dead broker (tq topic describe).
    after: list[dict[str, Any]] = wait_for(
        lambda: (parts := _partitions(hosts, "kept"))
        and all(len(p["replicas"]) == 3 and p["isr"] == p["replicas"] for p in parts) and parts,
        timeout=90, interval=0.2, what="the new replicas to join the ISR")
    assert all(dead not in p["replicas"] for p in after)
    assert {m["to"] for m in reply["moved"]} <= {b for p in after for b in p["replicas"]}
    stop.touch()  # the publisher ends every stream
    assert publisher.wait(timeout=60) == 0, (tmp_path / "publisher.err").read_text()
    acked = _acked(out)

    # Every replica holds the same bytes: every acknowledged record is on each of them.
    data = {b: hosts.data(i) for i in range(4) for b in broker_ids(hosts.data(i))}
    def identical(name: str, replicas: list[int]) -> bool:
        return len({_log_bytes(data[b], name) for b in replicas}) == 1

    for part in after:
        name = f"kept-{part['partition']}"
        wait_for(lambda n=name, r=part["replicas"]: identical(n, r),  # type: ignore[misc]
                 timeout=30, what=f"every replica of {name} to hold its leader's bytes")
        assert _log_bytes(data[part["replicas"][0]], name)

    # A subscriber reads every record once.
    read = tq(tmp_path, "consume", "kept", "--json", "--follow", timeout=120)
    assert read.returncode == 0, read.stderr
    values = [e["value"] for e in map(json.loads, read.stdout.splitlines()) if "value" in e]
    counts = Counter(values)
    assert set(counts.values()) == {1}, "a record read twice"
    assert set(acked) <= set(counts), "an acknowledged record lost"

    # Twice is refused; the retired id never comes back.
    again = _decommission(tmp_path, str(dead))
    assert again.returncode != 0 and "decommissioned already" in again.stderr, again.stderr

    # Draining a live broker with --force when no host is free to take its replicas (three
    # live hosts, three replicas each): nothing moves, each partition says why, exit code 1.
    live = after[0]["replicas"][0]
    stuck = _decommission(tmp_path, str(live), "--force")
    assert stuck.returncode == 1, stuck.stderr
    assert stuck.stdout.count("no live executor host") == PARTITIONS, stuck.stdout
    now = _partitions(hosts, "kept")
    assert now is not None and [p["replicas"] for p in now] == [p["replicas"] for p in after]

    # The dead host comes back after all: its remembered id is retired, so it registers
    # under a new one, and nothing is placed on the old id again.
    (i,) = [i for i in range(4) if dead in broker_ids(hosts.data(i))]
    processes.python("-m", "querylib.cli", "executor", "--data", str(hosts.data(i)),
                     "--slots", "1", "--lease", "1", "--grace", "1", "--brokers", "1",
                     env=tq_env(tmp_path), cwd=ROOT, stderr=subprocess.DEVNULL)
    wait_for(lambda: len(set(hosts.hosts().values())) == 4 and dead not in hosts.hosts(),
             timeout=60, interval=0.2, what="the host back under a new broker id")
    assert dead not in broker_ids(hosts.data(i))
    # Its copies of the partitions it held are nobody's replicas now, and the replicas named
    # are all in sync: it deletes them rather than keep them for ever.
    wait_for(lambda: all(partition_dir(hosts.data(i), f"kept-{p}") is None for p in held),
             timeout=60, interval=0.2, what="the returned host to drop its old copies")
    created = tq(tmp_path, "topic", "create", "later", "--partitions", "8")
    assert created.returncode == 0, created.stderr
    later = _partitions(hosts, "later")
    assert later is not None and all(dead not in p["replicas"] for p in later)
