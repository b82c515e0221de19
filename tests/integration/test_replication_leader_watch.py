"""Clients switch to a new leader on the catalog's change, not after their broker lease of
silence (DESIGN §5 "Replication", "Clients follow the catalog"; issue 19's "new leader serving
within lease + 1 s"): a real coordinator and three `tq executor` processes, a topic of
replication factor 3, a blocking producer and subscriber watching the catalog for their
partition's leader (`Cluster.watch_leader`).

The proof is by events, not timing: the leader's executor is SIGSTOPped (alive to the network:
its sockets stay open, it answers nothing) and the clients' broker sessions have a lease, a
request timeout and a reconnect timeout of hours. Without the catalog's word they would wait
for the stopped broker for hours; with it they are answered by the new leader while the old one
is still stopped."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from catalog import Resources
from querylib.api._runtime import incarnation_of
from querylib.broker import Data, Producer, Subscriber
from querylib.cluster import Cluster
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq, tq_env
from tests.integration._three_hosts import ThreeHosts, is_stopped

pytestmark = pytest.mark.timeout(240)

HOURS = 4 * 3600.0  # the clients' broker lease, request timeout and reconnect timeout


def _partition(home: Path) -> dict:
    done = tq(home, "topic", "describe", "kept", "--json", "--timeout", "2")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["partitions"][0]


def test_clients_follow_a_leader_the_catalog_moved_while_the_old_one_is_silent(
        processes: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator = CoordinatorProcess(processes, tmp_path).start()
    agents = [processes.python(
        "-m", "querylib.cli", "executor", "--data", str(tmp_path / f"executor{i}"),
        "--slots", "1", "--brokers", "1", "--lease", "1", "--grace", "1",
        env=tq_env(tmp_path), cwd=ROOT, stderr=subprocess.DEVNULL) for i in range(3)]

    def executors() -> int:
        done = tq(tmp_path, "status", "--json")
        return len(json.loads(done.stdout)["executors"]) if done.returncode == 0 else 0

    wait_for(lambda: executors() == 3, timeout=60, interval=0.2,
             what="three executors to register")
    done = tq(tmp_path, "topic", "create", "kept", "--replication-factor", "3")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: len(_partition(tmp_path)["isr"] or ()) == 3, timeout=30, interval=0.2,
             what="three in-sync replicas")

    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    cluster = Cluster.connect(coordinator.address, session=False, timeout=10)
    stopped: subprocess.Popen[str] | None = None
    try:
        info = cluster.lookup_topic("kept")
        first = info.leader_address(0)
        options = dict(secret=cluster.secret, incarnation=incarnation_of(info),
                       locate=lambda: cluster.lookup_topic("kept").leader_address(0),
                       watch_leader=functools.partial(cluster.watch_leader, "kept", 0),
                       lease=HOURS, timeout=HOURS, reconnect_timeout=HOURS)
        with Producer(first, "kept", 0, reopen=True, linger=0, **options) as producer, \
                Subscriber(first, "kept", [0], follow=True, **options) as subscriber:
            read: list[bytes] = []
            for i in range(10):
                producer.send(b"before %d" % i)
            producer.flush()
            wait_for(lambda: _read(subscriber, read) and len(read) == 10, timeout=60,
                     what="the subscriber to read the first ten records")

            # The leader's executor stops answering anything; the clients keep waiting on it.
            before = _partition(tmp_path)
            (stopped,) = [a for i, a in enumerate(agents)
                          if (tmp_path / f"executor{i}" / "broker.id").read_text().strip()
                          == str(before["broker"])]
            os.killpg(stopped.pid, signal.SIGSTOP)
            flushed = threading.Event()

            def publish() -> None:
                for i in range(10):
                    producer.send(b"after %d" % i)
                producer.flush()
                flushed.set()

            publisher = threading.Thread(target=publish, daemon=True)
            publisher.start()
            # Answered by the new leader (the catalog's), with the old one still stopped.
            wait_for(flushed.is_set, timeout=120, interval=0.1,
                     what="the producer to be answered by the new leader")
            wait_for(lambda: _read(subscriber, read) and len(read) == 20, timeout=120,
                     what="the subscriber to read the new leader's records")
            assert is_stopped(stopped.pid)
            moved = _partition(tmp_path)
            assert moved["broker"] != before["broker"]
            assert moved["leader_epoch"] == before["leader_epoch"] + 1
            assert producer.link.address == subscriber.link.address != first
            assert producer.link.address == cluster.lookup_topic("kept").leader_address(0)
            assert read == [b"before %d" % i for i in range(10)] + \
                [b"after %d" % i for i in range(10)]
            producer.close(end=False)
    finally:
        if stopped is not None:
            os.killpg(stopped.pid, signal.SIGKILL)
        cluster.close()


def _read(subscriber: Subscriber, into: list[bytes]) -> bool:
    """What the subscriber has now (waiting a little for it), appended to `into`."""
    event = subscriber.next_event(timeout=0.2)
    if isinstance(event, Data):
        into.extend(r.value for r in event.records)
    return True


def test_tq_produce_and_consume_follow_a_leader_the_catalog_moved(
        processes: Processes, tmp_path: Path) -> None:
    """`tq produce` and `tq consume --follow` on a topic of two partitions and three replicas,
    with broker leases and timeouts of hours: partition 0's leader is SIGSTOPped between the
    first and second half of the lines; both commands go on at the new leader while the old
    one is still stopped, and every line is read once, in order per partition."""
    hosts = ThreeHosts(processes, tmp_path)
    done = tq(tmp_path, "topic", "create", "kept", "--partitions", "2",
              "--replication-factor", "3")
    assert done.returncode == 0, done.stderr
    before = hosts.in_sync("kept")
    wait_for(lambda: (p := hosts.partition("kept", 1)) and p["isr"] == p["replicas"],
             timeout=60, interval=0.2, what="partition 1's replicas in sync")
    patient = ("--broker-lease", str(HOURS), "--timeout", str(HOURS))
    errors = {name: (tmp_path / f"{name}.err").open("w") for name in ("consume", "produce")}

    def said(name: str) -> str:
        return f"tq {name} failed: {(tmp_path / f'{name}.err').read_text()[-2000:]}"

    consumer = processes.python("-m", "querylib.cli", "consume", "kept", "--follow", "--json",
                                *patient, env=tq_env(tmp_path), cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=errors["consume"])
    producer = processes.python("-m", "querylib.cli", "produce", "kept", *patient,
                                env=tq_env(tmp_path), cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stderr=errors["produce"])
    for file in errors.values():
        file.close()  # the children hold their own descriptors
    assert consumer.stdout is not None and producer.stdin is not None
    printed: list[dict] = []
    reading = threading.Thread(target=lambda: printed.extend(
        json.loads(line) for line in consumer.stdout), daemon=True)  # type: ignore[union-attr]
    reading.start()

    def records() -> list[dict]:
        return [r for r in list(printed) if "value" in r]

    for i in range(20):  # round-robin: the even lines to partition 0, the odd ones to 1
        producer.stdin.write(f"a{i}\n")
    producer.stdin.flush()
    wait_for(lambda: len(records()) == 20, timeout=60,
             what="tq consume to print the first twenty lines")

    stopped = hosts.agent_of(before["broker"])
    os.killpg(stopped.pid, signal.SIGSTOP)
    for i in range(20):
        producer.stdin.write(f"b{i}\n")
    producer.stdin.close()  # tq produce flushes, ends each partition's stream and exits
    assert producer.wait(timeout=120) == 0, said("produce")
    assert consumer.wait(timeout=120) == 0, said("consume")  # every end of stream was read
    reading.join(timeout=10)
    assert is_stopped(stopped.pid)  # answered by the new leader while the old one is stopped
    assert hosts.partition("kept")["broker"] != before["broker"]  # type: ignore[index]
    lines = [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]
    for partition in (0, 1):
        assert [r["value"] for r in records() if r["partition"] == partition] == \
            lines[partition::2]


def test_a_leader_moved_between_a_look_up_and_its_watch_is_told(
        processes: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start race, over a real catalog: a client looks its leader up, the controller moves
    the leadership (the leader's broker session ends), then the client's watch begins, its
    follower's first snapshot already naming the new leader. The watch, naming the leader the
    client started at, is told; one begun from the new leader is not."""
    coordinator = CoordinatorProcess(processes, tmp_path).start()
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    hosts = [Cluster.connect(coordinator.address, session=True, timeout=10) for _ in range(2)]
    admin = Cluster.connect(coordinator.address, session=True, timeout=10)
    watching = Cluster.connect(coordinator.address, session=False, timeout=10)
    try:
        registrants = {}
        for i, host in enumerate(hosts):  # two hosts, each a broker (none listening: the
            # catalog is all this needs) and an executor
            broker = host.register_broker(f"host{i}", f"tcp://127.0.0.1:{free_port()}")
            host.register_executor(f"host{i}", broker.broker_id,
                                   Resources(cores=1, memory=1 << 30, disk=1 << 30, slots=1))
            registrants[broker.broker_id] = host
        info = admin.create_topic("kept", 1, ingest=True, replication_factor=2)
        since = info.leader(0)  # the client's look-up
        registrants[since[1]].close()  # its broker leaves: the controller moves the leadership
        moved = wait_for(lambda: (i := watching.lookup_topic("kept")).leader(0) != since and i,
                         timeout=30, interval=0.05, what="the leadership to move")
        told: list[str] = []
        # Compared in this order, at the follower's first snapshot or as they begin.
        watching.watch_leader("kept", 0, lambda: told.append("from the new"),
                              since=moved.leader(0))
        watching.watch_leader("kept", 0, lambda: told.append("from the old"), since=since)
        wait_for(lambda: told, timeout=30, what="the watch begun at the old leader to be told")
        assert told == ["from the old"]
        assert moved.leader(0)[2] == since[2] + 1  # the next leader epoch
    finally:
        for cluster in (watching, admin, *hosts):
            cluster.close()
