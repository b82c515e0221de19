"""Links between hosts: `python -m querylib.bench replication`.

Rows (each {"name", "figures", "baseline", "ratio", "goal"}, or {"name", "skipped"}):
- replication_curve_vs_plain: persisted pub->sub records/s (100-byte records in pre-built
  batches of 1000, appended to the broker's log, flush policy "never" as Kafka's default) with
  the publisher and subscriber in one network namespace and the broker in another, linked by
  a veth pair: the broker a CURVE server (DESIGN §2 "Handshake") against the same broker
  forced PLAIN, alternated round by round in this run, min/median/max of each, and the load
  average. Goal: CURVE >= 0.7x PLAIN (medians). Needs root and `ip netns`: skipped, saying
  why, otherwise.
- replication_rf3_vs_rf1: the same persisted pub->sub records/s through a partition
  replicated on three brokers (a leader and two followers fetching from it, DESIGN §5
  "Replication": the producer is answered and the subscriber served only below the high
  watermark, once both followers have the records) against one broker alone, alternated round
  by round, min/median/max and the load average. The three brokers are processes on this
  machine's loopback, their roles set as an executor sets them from the catalog: what is
  measured is the replication protocol's cost on the two cores the brokers, the producer and
  the subscriber share, not a network. Goal: RF 3 >= 0.5x RF 1 (medians). Beside the rates,
  the steadier figure: each broker's CPU seconds per million records (psutil, from the
  pub->sub start to its result: the leader, each follower, the broker alone), less swayed by
  whatever else shares the cores than a rate is; RF_ROUNDS rounds of each.

The namespaces are created here and deleted in a finally; nothing touches the host's network.
Each side is a process started with `ip netns exec` (this module's `_child`); the pub->sub
pair reuses the pubsub suite's producer and subscriber processes. Nothing here asserts the
numbers: they are what they are on the machine, shared with whatever else runs.

Must not: run without cleaning up its namespaces and processes.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

SUBNET = "10.198.9"
BATCHES = 2000  # of 1000 records: 2 million per measurement
ROUNDS = 3
RF_ROUNDS = 7  # rf3_vs_rf1's rounds take seconds each: more of them steady its medians


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _netns_missing() -> str:
    """Why network namespaces cannot be used here, or "" when they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe = f"tqbench{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"ip netns does not work here: {exc}"
    _ip("netns", "del", probe)
    return ""


class _Hosts:
    """Namespaces `pub` and `brk` joined by a veth pair: SUBNET.1 and SUBNET.2."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns = {"pub": f"tqbp{tag}", "brk": f"tqbb{tag}"}
        self.address = {"pub": f"{SUBNET}.1", "brk": f"{SUBNET}.2"}
        self.created: list[str] = []

    def create(self) -> _Hosts:
        for ns in self.ns.values():
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.ns["pub"], "link", "add", "eth0", "type", "veth", "peer", "name",
            "eth0", "netns", self.ns["brk"])
        for name, ns in self.ns.items():
            _ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def start(self, host: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", self.ns[host], sys.executable, "-m",
                                 __name__, *args], stdout=subprocess.PIPE, text=True)

    def delete(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The next JSON line `proc` prints (it runs a child of ours), within `timeout`."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"no word from {proc.args!r} within {timeout}s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{proc.args!r} exited with {proc.wait()}")
    found: dict[str, Any] = json.loads(line)
    return found


def _measure(hosts: _Hosts, work: str, secret_file: str, curve: bool,
             batches: int) -> float:
    """Records/s of one pub->sub run through a fresh broker in `brk`."""
    data = tempfile.mkdtemp(prefix="tq-bench-repl-", dir=work)
    port = 17000 + int(uuid.uuid4().int % 20000)
    broker = hosts.start("brk", "broker", data, f"tcp://{hosts.address['brk']}:{port}",
                         secret_file, "curve" if curve else "plain")
    try:
        ready = _line(broker, 60)
        pubsub = hosts.start("pub", "pubsub", ready["address"], ready["key"], secret_file,
                             str(batches))
        try:
            result = _line(pubsub, 600)
            pubsub.wait(60)  # it joins its producer and subscriber
        finally:
            if pubsub.poll() is None:
                pubsub.kill()
                pubsub.wait(30)
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(data, ignore_errors=True)
    return float(result["records"]) / max(float(result["seconds"]), 1e-9)


def _new_secret(work: str) -> str:
    """A fresh cluster secret file in `work` (mode 0600) for one bench row; its path."""
    path = os.path.join(work, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32).hex().encode())
    return path


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values)), "median": round(statistics.median(values)),
            "max": round(max(values))}


def curve_vs_plain(rounds: int = ROUNDS, batches: int = BATCHES) -> dict[str, Any]:
    name = "replication_curve_vs_plain"
    missing = _netns_missing()
    if missing:
        return {"name": name, "skipped": missing}
    work = tempfile.mkdtemp(prefix="tq-bench-repl-")
    secret_file = _new_secret(work)
    hosts = _Hosts()
    rates: dict[str, list[float]] = {"plain": [], "curve": []}
    loads = []
    try:
        hosts.create()
        for n in range(rounds):
            order = ("plain", "curve") if n % 2 == 0 else ("curve", "plain")
            for mode in order:
                rates[mode].append(_measure(hosts, work, secret_file, mode == "curve",
                                            batches))
                loads.append(os.getloadavg()[0])
    finally:
        hosts.delete()
        shutil.rmtree(work, ignore_errors=True)
    plain, curve = _spread(rates["plain"]), _spread(rates["curve"])
    return {
        "name": name,
        "figures": {"curve_records_per_s": curve, "rounds": rounds,
                    "records": batches * 1000, "record_bytes": 100, "flush": "never",
                    "loadavg_1m": {"min": round(min(loads), 2), "max": round(max(loads), 2)},
                    "note": "publisher and subscriber in one network namespace, the broker "
                            "in another (veth); rounds alternated"},
        "baseline": {"plain_records_per_s": plain},
        "ratio": round(curve["median"] / max(plain["median"], 1), 3),
        "goal": ">= 0.7x PLAIN (medians)",
    }


def _cpu_seconds(procs: list[subprocess.Popen[str]]) -> list[float]:
    """The CPU seconds (user + system) each of `procs` has used so far."""
    import psutil

    times = [psutil.Process(proc.pid).cpu_times() for proc in procs]
    return [t.user + t.system for t in times]


def _measure_replicated(work: str, secret_file: str, replicas: int,
                        batches: int) -> tuple[float, list[float]]:
    """Records/s of one pub->sub run through the leader of `replicas` fresh brokers on
    loopback (one: a broker alone, the unreplicated path), and each broker's CPU seconds
    per million records over the run (the leader first)."""
    brokers: list[subprocess.Popen[str]] = []
    try:
        role = {"replicas": list(range(1, replicas + 1)), "leader_address": ""}
        address = ""
        for broker_id in range(1, replicas + 1):
            data = tempfile.mkdtemp(prefix=f"tq-bench-rf-{broker_id}-", dir=work)
            spec = json.dumps({**role, "broker_id": broker_id}) if replicas > 1 else ""
            brokers.append(subprocess.Popen(
                [sys.executable, "-m", __name__, "broker", data, "tcp://127.0.0.1:0",
                 secret_file, "plain", spec], stdout=subprocess.PIPE, text=True))
            ready = _line(brokers[-1], 60)
            if broker_id == 1:
                address = ready["address"]
                role["leader_address"] = address
        before = _cpu_seconds(brokers)
        pubsub = subprocess.Popen([sys.executable, "-m", __name__, "pubsub", address, "",
                                   secret_file, str(batches)], stdout=subprocess.PIPE,
                                  text=True)
        try:
            result = _line(pubsub, 600)
            after = _cpu_seconds(brokers)
            pubsub.wait(60)
        finally:
            if pubsub.poll() is None:
                pubsub.kill()
                pubsub.wait(30)
    finally:
        for broker in brokers:
            broker.terminate()
        for broker in brokers:
            broker.wait(30)
    records = float(result["records"])
    spent = [a - b for a, b in zip(after, before, strict=True)]
    per_million = [seconds / max(records, 1.0) * 1e6 for seconds in spent]
    return records / max(float(result["seconds"]), 1e-9), per_million


def _cpu_spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def rf3_vs_rf1(rounds: int = RF_ROUNDS, batches: int = BATCHES) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="tq-bench-rf-")
    secret_file = _new_secret(work)
    rates: dict[int, list[float]] = {1: [], 3: []}
    cpu: dict[str, list[float]] = {"rf1_broker": [], "rf3_leader": [], "rf3_follower": []}
    loads = []
    try:
        for n in range(rounds):
            for replicas in ((1, 3) if n % 2 == 0 else (3, 1)):
                rate, per_million = _measure_replicated(work, secret_file, replicas, batches)
                rates[replicas].append(rate)
                if replicas == 1:
                    cpu["rf1_broker"].append(per_million[0])
                else:
                    cpu["rf3_leader"].append(per_million[0])
                    cpu["rf3_follower"] += per_million[1:]
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    one, three = _spread(rates[1]), _spread(rates[3])
    return {
        "name": "replication_rf3_vs_rf1",
        "figures": {"rf3_records_per_s": three, "rounds": rounds, "records": batches * 1000,
                    "record_bytes": 100, "flush": "never",
                    "cpu_s_per_million_records": {k: _cpu_spread(v) for k, v in cpu.items()},
                    "loadavg_1m": {"min": round(min(loads), 2), "max": round(max(loads), 2)},
                    "note": "three broker processes on loopback (a leader, two followers); "
                            "rounds alternated"},
        "baseline": {"rf1_records_per_s": one},
        "ratio": round(three["median"] / max(one["median"], 1), 3),
        "goal": ">= 0.5x RF 1 (medians)",
    }


def run() -> Iterator[dict[str, Any]]:
    yield curve_vs_plain()
    yield rf3_vs_rf1()


# -- the children, run inside a namespace -----------------------------------------------------


def _serve_broker(data: str, listen: str, secret_file: str, mode: str,
                  replica: str = "") -> None:
    """A broker; with `replica` (JSON: broker_id, replicas, leader_address), one replica of
    the bench's partition, led by broker 1 at epoch 1."""
    import asyncio
    import signal

    from querylib.rpc import load_credential
    from querylib.server.broker import BrokerServer, PartitionRole

    secret = load_credential(secret_file).key

    async def serve() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        server = BrokerServer(data, secret, curve=mode == "curve")
        try:
            address = await server.start(listen)
            if replica:
                spec = json.loads(replica)
                replicas = tuple(spec["replicas"])
                await server.replication.set_role("bench", 0, PartitionRole(
                    topic_id=1, partition=0, leader_id=1, leader_epoch=1, replicas=replicas,
                    isr=replicas, leader_address=spec["leader_address"]),
                    broker_id=spec["broker_id"])
            print(json.dumps({"address": address, "key": server.public_key}), flush=True)
            await stop.wait()
        finally:
            await server.close()

    asyncio.run(serve())


def _with_key(target: Any, key: str, address: str, *args: Any) -> None:
    from querylib.rpc import remember_server_key

    if key:  # a CURVE server's ("" for a PLAIN one)
        remember_server_key(address, key)
    target(address, *args)


def _pubsub(address: str, key: str, secret_file: str, batches: int) -> None:
    import multiprocessing

    from querylib.bench import _pubsub as p
    from querylib.rpc import load_credential

    secret = load_credential(secret_file).key
    mp = multiprocessing.get_context("spawn")
    results: Any = mp.Queue()
    children = []
    for target, mode in ((p._subscriber_process, "headers"), (p._producer_process, "prebuilt")):
        child = mp.Process(target=_with_key, args=(target, key, address, secret, "bench",
                                                   batches * (1000 if target is
                                                              p._subscriber_process else 1),
                                                   mode, results), daemon=True)
        child.start()
        children.append(child)
        assert p._get(results, children, 120) == "ready"
    result = p._get(results, children, 600)
    print(json.dumps({"records": result["records"], "seconds": result["seconds"]}), flush=True)
    for child in children:
        child.join(30)


def _child(argv: list[str]) -> None:
    if argv[0] == "broker":
        _serve_broker(*argv[1:6])
    elif argv[0] == "pubsub":
        _pubsub(argv[1], argv[2], argv[3], int(argv[4]))
    else:
        raise SystemExit(f"unknown child {argv[0]!r}")


if __name__ == "__main__":
    _child(sys.argv[1:])
