"""Replicated partitions across hosts in network namespaces (issue 19's proofs; DESIGN §5
"Replication"; needs root and `ip netns`, skipped otherwise): a coordinator on host c, an
executor on each of hosts a, b and d (one broker each), a topic of replication factor 3.

- The leader's executor is SIGKILLed under a steady publisher and a steady subscriber: no
  acknowledged record is lost, none is delivered twice, offsets only grow; the time until the
  new leader acknowledges is printed (the issue's "lease + 1 s" is a figure, not asserted),
  with a timeline from the logs (the coordinator's, the new leader's executor's, the
  publisher's): when the lease expired, the new leader took its role, the publisher heard of
  it from the catalog and moved, and the new leader acknowledged.
- The leader is cut off (its link to the bridge down) while a publisher on its own host keeps
  writing to it: it acknowledges nothing it cannot replicate; the others elect a new leader;
  once healed, every acknowledged record is on every replica and in what a subscriber reads,
  exactly once, nothing written to the cut leader is served, and the replicas are
  byte-identical (a Jepsen-style check of acknowledged writes against reads).
- A follower's host loses its whole data dir (its broker id too) while its executor is
  stopped, or the leader's host dies with its disk: restarted, it gets its broker id back
  from the catalog (the host's identity: host name and credential), its replica is fetched
  again from the leader, it rejoins the ISR, nothing acknowledged is lost and the replicas
  are byte-identical.

The clients are external Python processes (CLIENT below): a publisher acknowledges one record
at a time (send, flush) and logs each outcome with the wall-clock time; a subscriber logs each
record it gets. Both follow the leader through the catalog (the publisher unless pinned to one
broker), with the clients' default broker lease (10 s): they watch the catalog for their
partition's leader (`Cluster.watch_leader`), so they move when the controller moves it, not
once their broker was unheard for a lease. Their library logs go to clients/NAME.err.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from querylib.records import iter_batches
from tests._netns import Cluster, Hosts, netns_hosts
from tests.conftest import Processes, partition_dir, wait_for
from tests.coordinator._cluster import ROOT

pytestmark = pytest.mark.timeout(240)

LEASE = 2.0
TOPIC = "kept"
EXECUTORS = "abd"

CLIENT = textwrap.dedent('''
    """publish|subscribe COORDINATOR TOPIC OUT STOP [PREFIX follow|pinned]: bounded (120 s)."""
    import functools, logging, os, sys, time
    from querylib.api._runtime import incarnation_of
    from querylib.broker import Data, EndOfStream, Producer, Subscriber
    from querylib.cluster import Cluster

    role, coordinator, topic, out, stop = sys.argv[1:6]
    logging.basicConfig(level=logging.INFO, format="%(created).3f %(name)s %(message)s")
    deadline = time.monotonic() + 120
    log = open(out, "a", buffering=1)
    cluster = Cluster.connect(coordinator, session=False, connect_timeout=30, timeout=10)

    def locate():
        return cluster.lookup_topic(topic).leader_address(0)

    watch = functools.partial(cluster.watch_leader, topic, 0)

    def running():
        return time.monotonic() < deadline and not os.path.exists(stop)

    if role == "subscribe":
        info = cluster.lookup_topic(topic)
        with Subscriber(info.leader_address(0), topic, [0], secret=cluster.secret,
                        incarnation=incarnation_of(info), locate=locate, follow=True,
                        reconnect_timeout=60, watch_leader=watch) as sub:
            log.write("ready\\n")
            while running():
                event = sub.next_event(timeout=0.2)
                if isinstance(event, Data):
                    for r in event.records:
                        log.write(f"read {r.offset} {r.value.decode()}\\n")
                elif isinstance(event, EndOfStream):
                    break
        sys.exit(0)

    prefix, follow = sys.argv[6], sys.argv[7] == "follow"
    if not follow:
        # Pinned: to one broker, never anywhere else; a record a second at most waiting for
        # its acknowledgement, then the next is sent anyway, through a producer of its own
        # (at most 50 waiting), so the broker keeps being written to while it cannot answer;
        # no more once one failed (the broker refuses: it leads no more).
        import threading
        address, incarnation = locate(), incarnation_of(cluster.lookup_topic(topic))
        lock, waiting, refused = threading.Lock(), [], threading.Event()

        def write(value):
            outcome = "acked"
            try:
                with Producer(address, topic, 0, secret=cluster.secret, reopen=True,
                              incarnation=incarnation, timeout=10, reconnect_timeout=30,
                              linger=0) as producer:
                    producer.send(value.encode())
                    producer.flush()
            except Exception as exc:
                outcome = f"failed {type(exc).__name__}: {exc}"
                refused.set()
            with lock:
                log.write(f"{outcome.split(' ')[0]} {value} {time.time()} {outcome}\\n")

        i = 0
        while running() and not refused.is_set() and sum(t.is_alive() for t in waiting) < 50:
            value = f"{prefix}{i:06d}"  # fixed width: no value inside another
            with lock:
                log.write(f"send {value} {time.time()}\\n")
            thread = threading.Thread(target=write, args=(value,), daemon=True)
            thread.start()
            thread.join(timeout=1.0)
            waiting.append(thread)
            i += 1
        while running():
            time.sleep(0.1)
        with lock:
            log.flush()
            os._exit(0)  # producers still waiting for an answer are abandoned

    producer, i = None, 0
    while running():
        value = f"{prefix}{i:06d}"  # fixed width: no value inside another
        try:
            if producer is None:
                info = cluster.lookup_topic(topic)
                producer = Producer(info.leader_address(0), topic, 0, secret=cluster.secret,
                                    reopen=True, incarnation=incarnation_of(info),
                                    locate=locate, timeout=10, watch_leader=watch,
                                    reconnect_timeout=30, linger=0)
            log.write(f"send {value} {time.time()}\\n")
            producer.send(value.encode())
            producer.flush()
            log.write(f"acked {value} {time.time()}\\n")
        except Exception as exc:
            log.write(f"failed {value} {time.time()} {type(exc).__name__}: {exc}\\n")
            if producer is not None:
                try:
                    producer.close(end=False)
                except Exception:
                    pass
            producer = None
            time.sleep(0.2)  # then a new producer, found through the catalog
        i += 1
    if producer is not None:
        producer.close(end=False)
''')


@pytest.fixture
def hosts(processes: Processes) -> Iterator[Hosts]:
    with netns_hosts(processes.stop_all, "c" + EXECUTORS, subnet="10.199.9") as made:
        yield made


class Replicated:
    """The cluster of `hosts`, three executors of one broker each, the topic of replication
    factor 3, and the clients' logs under HOME/clients."""

    def __init__(self, hosts: Hosts, processes: Processes, home: Path) -> None:
        self.hosts, self.processes, self.home = hosts, processes, home
        self.cluster = Cluster(hosts, processes, home, lease=LEASE,
                               coordinator_log=home / "coordinator.log")
        self.logs = home / "clients"
        self.names: dict[int, str] = {}  # a client's pid -> its name
        self.logs.mkdir()
        self.script = home / "client.py"
        self.script.write_text(CLIENT)
        self.agents = {h: self.start(h) for h in EXECUTORS}
        wait_for(lambda: len(self.cluster.executors()) == 3, timeout=60, interval=0.2,
                 what="three executors to register")
        created = self.cluster.tq("topic", "create", TOPIC, "--replication-factor", "3")
        assert created.returncode == 0, created.stderr
        wait_for(lambda: self.partition()["isr"] and len(self.partition()["isr"]) == 3,
                 timeout=30, interval=0.2, what="three in-sync replicas")

    def start(self, host: str) -> subprocess.Popen[Any]:
        return self.cluster.executor(host, "--brokers", "1", "--verbose",
                                     log=self.home / f"executor-{host}.log")

    def partition(self) -> dict[str, Any]:
        """Partition 0 as the catalog has it (`tq topic describe`)."""
        done = self.cluster.tq("topic", "describe", TOPIC, "--json", "--timeout", "2")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["partitions"][0]

    def host_of(self, broker_id: int) -> str:
        (host,) = [h for h in EXECUTORS
                   if (self.data(h) / "broker.id").read_text().strip() == str(broker_id)]
        return host

    def data(self, host: str) -> Path:
        return self.home / f"executor-{host}"

    def client(self, host: str, name: str, *args: str) -> subprocess.Popen[Any]:
        """CLIENT on `host`, logging to clients/NAME.log until clients/NAME.stop exists (each
        its own: a subscriber stopped with the publisher would miss the last records)."""
        client = self.processes.start(
            self.hosts.argv(host, str(self.script), args[0], self.cluster.coordinator, TOPIC,
                            str(self.logs / f"{name}.log"), str(self.logs / f"{name}.stop"),
                            *args[1:]),
            env=self.cluster.env, cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=(self.logs / f"{name}.err").open("a"))
        self.names[client.pid] = name
        return client

    def lines(self, name: str) -> list[list[str]]:
        path = self.logs / f"{name}.log"
        return [line.split(" ", 3) for line in path.read_text().splitlines()] \
            if path.exists() else []

    def acked(self, name: str) -> dict[str, float]:
        """Value -> when the publisher `name` had it acknowledged."""
        return {p[1]: float(p[2]) for p in self.lines(name) if p[0] == "acked"}

    def sent(self, name: str) -> dict[str, float]:
        """Value -> when the publisher `name` began sending it."""
        return {p[1]: float(p[2]) for p in self.lines(name) if p[0] == "send"}

    def read(self, name: str) -> list[tuple[int, str]]:
        return [(int(p[1]), p[2]) for p in self.lines(name) if p[0] == "read"]

    def stop_clients(self, *clients: subprocess.Popen[Any]) -> None:
        for client in clients:
            (self.logs / f"{self.names[client.pid]}.stop").touch()
        for client in clients:
            assert client.wait(timeout=60) == 0, self.errors()

    def errors(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in self.logs.glob("*.err"))

    def wait(self, condition: Callable[[], Any], *, timeout: float, what: str) -> Any:
        """wait_for(condition), failing with the tails of the executors' logs (which say
        what the brokers did: roles, ISR proposals, fetches refused)."""
        try:
            return wait_for(condition, timeout=timeout, interval=0.2, what=what)
        except AssertionError as exc:
            tails = "\n".join(f"--- executor-{h}.log\n" + "\n".join(
                (self.home / f"executor-{h}.log").read_text().splitlines()[-40:])
                for h in EXECUTORS if (self.home / f"executor-{h}.log").exists())
            raise AssertionError(f"{exc}\n{tails}") from None

    def log_bytes(self, host: str) -> bytes | None:
        directory = partition_dir(self.data(host), f"{TOPIC}-0")
        if directory is None:
            return None
        return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))

    def identical_replicas(self) -> bytes:
        """The bytes every replica holds, once they hold the same (waited for)."""
        found = wait_for(lambda: len(logs := {self.log_bytes(h) for h in EXECUTORS}) == 1
                         and logs, timeout=60, interval=0.2,
                         what="every replica to hold the same bytes")
        (data,) = found
        assert data
        return data

    def everything(self) -> list[str]:
        """Every record of the topic, read from the start by `tq consume` on host c."""
        return [value for _, value in self.everything_at()]

    def everything_at(self) -> list[tuple[int, str]]:
        """Every record of the topic as `everything`, with its offset."""
        done = self.cluster.tq("consume", TOPIC, "--json")
        assert done.returncode == 0, done.stderr
        return [(e["offset"], e["value"]) for e in map(json.loads, done.stdout.splitlines())
                if "value" in e]

    def replica_batches(self, host: str) -> list[tuple[int, int, int, list[str]]]:
        """What `host`'s replica holds, batch by batch: (first offset, next offset, leader
        epoch, the values)."""
        return [(b.base_offset, b.next_offset, b.partition_leader_epoch,
                 [(r.value or b"").decode(errors="replace") for r in b.records])
                for b in iter_batches(self.log_bytes(host) or b"")]

    def divergence(self, read: list[tuple[int, str]], stored: list[tuple[int, str]]) -> str:
        """Why what the subscriber read is not a prefix of what `tq consume` read: where they
        part (offset and value on each side), each replica's log end and leader epochs (epoch
        -> first offset), the catalog's partition, and the leadership moves the logs tell."""
        at = next((i for i, (r, s) in enumerate(zip(read, stored, strict=False))
                   if r != s),
                  min(len(read), len(stored)))
        near = slice(max(0, at - 3), at + 4)
        lines = [f"read and stored part at index {at} ({len(read)} read, {len(stored)} stored)",
                 f"  read:   {read[near]}", f"  stored: {stored[near]}",
                 f"  catalog: {self.partition()}"]
        offsets = {o for o, _ in (read[near] + stored[near])}
        for host in EXECUTORS:
            batches = self.replica_batches(host)
            epochs: dict[int, int] = {}
            for first, _, epoch, _ in batches:
                epochs.setdefault(epoch, first)
            held = [(first, values) for first, _, _, values in batches if first in offsets]
            lines.append(f"  replica {host}: log end {batches[-1][1] if batches else 0}, "
                         f"epochs {epochs}, near the parting {held}")
        moves = ("replica role", "truncat", "expired", "the leader of", "moved",
                 "resubscrib", "subscription ended", "leader epoch")
        for path in [self.home / "coordinator.log",
                     *(self.home / f"executor-{h}.log" for h in EXECUTORS),
                     *sorted(self.logs.glob("*.err"))]:
            if path.exists():
                lines += [f"  {path.name}: {line[:160]}" for line in
                          path.read_text().splitlines() if any(m in line for m in moves)]
        return "\n".join(lines)


def _once_in_order(read: list[tuple[int, str]]) -> list[str]:
    """The values read, checked: each offset once and growing, each value once, and each
    publisher's values in the order it sent them (it sends one after the other)."""
    offsets = [o for o, _ in read]
    assert offsets == sorted(set(offsets)), "offsets delivered twice or out of order"
    values = [v for _, v in read]
    assert len(values) == len(set(values)), "a record delivered twice"
    for prefix in {v[0] for v in values}:
        numbers = [int(v[1:]) for v in values if v[0] == prefix]
        assert numbers == sorted(numbers), f"publisher {prefix}'s records out of order"
    return values


def test_the_leaders_host_killed_under_a_steady_publisher_and_subscriber(
        hosts: Hosts, processes: Processes, tmp_path: Path) -> None:
    cluster = Replicated(hosts, processes, tmp_path)
    subscriber = cluster.client("c", "sub", "subscribe")
    publisher = cluster.client("c", "pub", "publish", "p", "follow")
    cluster.wait(lambda: len(cluster.acked("pub")) >= 100, timeout=60,
             what="100 records acknowledged")

    before = cluster.partition()
    victim = cluster.host_of(before["broker"])
    killed_at = time.time()
    os.killpg(cluster.agents[victim].pid, signal.SIGKILL)
    cluster.agents[victim].wait(timeout=10)
    served = cluster.wait(lambda: _acked_since(cluster, "pub", killed_at), timeout=60,
                      what="an acknowledgement from a new leader")
    moved = cluster.partition()
    assert moved["broker"] != before["broker"]
    assert moved["leader_epoch"] == before["leader_epoch"] + 1
    print(f"\nnew leader serving {min(served) - killed_at:.2f} s after the SIGKILL "
          f"(lease {LEASE} s)")
    print(_timeline(cluster, killed_at, min(served)))
    cluster.wait(lambda: len(_acked_since(cluster, "pub", killed_at)) >= 100,
             timeout=60, what="100 records acknowledged by the new leader")

    cluster.stop_clients(publisher)
    acked = cluster.acked("pub")
    cluster.wait(lambda: set(acked) <= {v for _, v in cluster.read("sub")}, timeout=60,
             what="the subscriber to get every acknowledged record")
    cluster.stop_clients(subscriber)
    read = _once_in_order(cluster.read("sub"))
    assert set(read) <= set(cluster.sent("pub"))
    stored = cluster.everything()
    assert len(stored) == len(set(stored)) and set(acked) <= set(stored)
    assert read == stored[:len(read)]


def _timeline(cluster: Replicated, killed_at: float, served: float) -> str:
    """What happened after the SIGKILL, in seconds from it, from the logs: the first lease
    the coordinator saw expire, the new leader taking its role, the publisher hearing of it
    from the catalog and moving there, the new leader's first acknowledgement."""
    def logged(path: Path, text: str) -> tuple[float, str] | None:
        """The first line of `path` after the SIGKILL containing `text`: (time, line)."""
        for line in path.read_text().splitlines() if path.exists() else []:
            if text not in line:
                continue
            try:  # "%(created).3f ..." (the clients) or "%(asctime)s ..." (tq's)
                when = float(line.split(" ", 1)[0])
            except ValueError:
                try:
                    when = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                except ValueError:
                    continue
            if when >= killed_at:
                return when, line
        return None

    events = [("the coordinator saw a lease expire",
               logged(cluster.home / "coordinator.log", "expired"))]
    events += [(f"executor-{h} took the leadership",
                logged(cluster.home / f"executor-{h}.log", f"{TOPIC}-0: leader at epoch"))
               for h in EXECUTORS]
    events += [("the publisher heard of it from the catalog",
                logged(cluster.logs / "pub.err", f"the leader of {TOPIC}-0 is now")),
               ("the publisher moved",
                logged(cluster.logs / "pub.err", "broker moved from"))]
    lines = [f"  {found[0] - killed_at:6.2f} s  {what}: {found[1][-90:]}"
             for what, found in events if found is not None]
    lines.append(f"  {served - killed_at:6.2f} s  the new leader acknowledged")
    return "timeline after the SIGKILL:\n" + "\n".join(sorted(lines))


def _acked_since(cluster: Replicated, name: str, since: float) -> list[float]:
    """When the records `name` began sending after `since` were acknowledged: a dead leader
    acknowledged none of them (one sent before may be answered by it just after `since`)."""
    acked = cluster.acked(name)
    return [acked[v] for v, t in cluster.sent(name).items() if t > since and v in acked]


def test_a_cut_off_leader_acknowledges_nothing_it_cannot_replicate(
        hosts: Hosts, processes: Processes, tmp_path: Path) -> None:
    cluster = Replicated(hosts, processes, tmp_path)
    subscriber = cluster.client("c", "sub", "subscribe")
    publisher = cluster.client("c", "pub", "publish", "p", "follow")
    before = cluster.partition()
    cut = cluster.host_of(before["broker"])
    # A publisher on the leader's own host, writing to that broker only.
    pinned = cluster.client(cut, "pinned", "publish", "q", "pinned")
    cluster.wait(lambda: len(cluster.acked("pub")) >= 50 and len(cluster.acked("pinned")) >= 20,
             timeout=60, what="both publishers acknowledged")

    hosts.set_link(cut, up=False)
    cut_at = time.time()
    moved = cluster.wait(lambda: (p := cluster.partition())["broker"] != before["broker"] and p,
                     timeout=60, what="a new leader elected")
    assert moved["leader_epoch"] == before["leader_epoch"] + 1
    assert cluster.host_of(moved["broker"]) != cut
    cluster.wait(lambda: len([t for t in cluster.acked("pub").values() if t > cut_at]) >= 50,
             timeout=60, what="the new leader to acknowledge records")
    cluster.wait(lambda: any(v.encode() in (cluster.log_bytes(cut) or b"")
                         for v, t in cluster.sent("pinned").items() if t > cut_at),
             timeout=30, what="the cut leader to append a write it cannot replicate")
    unreplicable = {v for v, t in cluster.sent("pinned").items() if t > cut_at}

    hosts.set_link(cut, up=True)
    cluster.wait(lambda: len(cluster.partition()["isr"]) == 3, timeout=60,
             what="the old leader back in the ISR")
    cluster.stop_clients(publisher, pinned)
    acked = cluster.acked("pub") | cluster.acked("pinned")
    # Nothing sent to the cut leader after the cut was acknowledged.
    assert not unreplicable & set(acked)
    data = cluster.identical_replicas()
    for value in unreplicable:
        assert value.encode() not in data
    cluster.wait(lambda: set(acked) <= {v for _, v in cluster.read("sub")}, timeout=60,
             what="the subscriber to get every acknowledged record")
    cluster.stop_clients(subscriber)
    read = _once_in_order(cluster.read("sub"))
    stored_at = cluster.everything_at()
    stored = [value for _, value in stored_at]
    assert len(stored) == len(set(stored)) and set(acked) <= set(stored)
    assert not unreplicable & (set(read) | set(stored))
    assert cluster.read("sub") == stored_at[:len(read)], \
        cluster.divergence(cluster.read("sub"), stored_at)
    print(f"\n{len(acked)} acknowledged, {len(unreplicable)} written to the cut leader, "
          f"none of them served")


@pytest.mark.parametrize("lost_role", ["follower", "leader"])
def test_a_host_whose_data_dir_is_lost_is_rebuilt_from_the_leader(
        hosts: Hosts, processes: Processes, tmp_path: Path, lost_role: str) -> None:
    cluster = Replicated(hosts, processes, tmp_path)
    publisher = cluster.client("c", "pub", "publish", "p", "follow")
    cluster.wait(lambda: len(cluster.acked("pub")) >= 100, timeout=60,
             what="100 records acknowledged")
    before = cluster.partition()
    leader = cluster.host_of(before["broker"])
    (lost, *_) = [leader] if lost_role == "leader" else [h for h in EXECUTORS if h != leader]
    data = cluster.data(lost)
    broker_id = int((data / "broker.id").read_text())
    agent = cluster.agents[lost]
    if lost_role == "leader":  # its host dies, and its disk with it
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
    else:
        agent.terminate()
        assert agent.wait(timeout=30) == 0
    shutil.rmtree(data)  # the disk is gone, broker id and all
    cluster.wait(lambda: len(cluster.partition()["isr"]) == 2, timeout=30,
             what=f"the lost {lost_role} out of the ISR")
    assert cluster.partition()["broker"] != broker_id
    count = len(cluster.acked("pub"))
    cluster.wait(lambda: len(cluster.acked("pub")) >= count + 50, timeout=60,
             what="records acknowledged without it")

    cluster.agents[lost] = cluster.start(lost)
    cluster.wait(lambda: len(cluster.partition()["isr"]) == 3, timeout=60,
             what="the rebuilt host back in the ISR")
    assert int((data / "broker.id").read_text()) == broker_id  # the host's id, given back
    assert sorted(cluster.partition()["isr"]) == sorted(before["replicas"])
    cluster.stop_clients(publisher)
    acked = cluster.acked("pub")
    cluster.identical_replicas()
    stored = cluster.everything()
    assert len(stored) == len(set(stored)) and set(acked) <= set(stored)
