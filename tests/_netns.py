"""Hosts in network namespaces for multi-host tests (needs root and `ip netns`; tests skip
otherwise; CI runs as root).

    made = Hosts("cab", subnet="10.199.7")   # `c` holds the bridge; a, b hang off it by veth
    made.create()
    subprocess.run(made.argv("a", "-m", "querylib.cli", ...))  # python, inside host a
    made.set_link("a", up=False)             # a cut off from every other host
    made.delete()                            # in a finally

The first name is the hub: its namespace holds the bridge (with the first address) and the
bridge ends of the other hosts' veth pairs, so taking one of those down cuts that host off from
all the others at once. Everything lives inside the namespaces (nothing touches the host's
network).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env

__all__ = ["Cluster", "Hosts", "ip", "netns_hosts", "netns_works"]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def netns_works() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"tqprobe{uuid.uuid4().hex[:6]}"
    try:
        ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError):
        return False
    ip("netns", "del", probe)
    return True


class Hosts:
    """Namespaces named by `names` (the first is the hub, with the bridge) on `subnet`.0/24:
    host i has address `subnet`.(i + 1)."""

    def __init__(self, names: str = "cab", *, subnet: str = "10.199.7") -> None:
        tag = uuid.uuid4().hex[:6]
        self.hub, self.spokes = names[0], names[1:]
        self.ns = {name: f"tq{name}{tag}" for name in names}
        self.address = {name: f"{subnet}.{i + 1}" for i, name in enumerate(names)}
        self.link = {name: f"tq{name}{tag}" for name in self.spokes}  # bridge side, in hub
        self.created: list[str] = []

    def create(self) -> Hosts:
        hub = self.ns[self.hub]
        for ns in self.ns.values():
            ip("netns", "add", ns)
            self.created.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "addr", "add", f"{self.address[self.hub]}/24", "dev", "br0")
        ip("-n", hub, "link", "set", "br0", "up")
        for name in self.spokes:
            ns, outer = self.ns[name], self.link[name]
            ip("-n", hub, "link", "add", outer, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            ip("-n", hub, "link", "set", outer, "master", "br0")
            ip("-n", hub, "link", "set", outer, "up")
            ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def set_link(self, name: str, up: bool) -> None:
        """Host `name`'s link to the bridge up or down: down, it reaches no other host."""
        ip("-n", self.ns[self.hub], "link", "set", self.link[name], "up" if up else "down")

    def argv(self, host: str, *args: str) -> list[str]:
        """This Python interpreter run with `args` inside host `host`."""
        return ["ip", "netns", "exec", self.ns[host], sys.executable, *args]

    def delete(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@contextmanager
def netns_hosts(stop_all: object, names: str = "cab", *,
                subnet: str = "10.199.7") -> Iterator[Hosts]:
    """Created hosts (the test skips without root and `ip netns`); on the way out,
    `stop_all()` (a tests.conftest.Processes' stop_all: nothing may be left inside the
    namespaces) and then every namespace is deleted."""
    if not netns_works():
        pytest.skip("needs root and working `ip netns`")
    made = Hosts(names, subnet=subnet)
    try:
        yield made.create()
    finally:
        stop_all()  # type: ignore[operator]
        made.delete()


class Cluster:
    """A coordinator (on host `host`, `c` unless said) and executors of `hosts`, and `tq`
    commands run on host `client` (the coordinator's host unless said); with
    `coordinator_log`, the coordinator logs what happens (--verbose) there. `options` are more
    `tq coordinator` options (--etcd ...); without `wait` (a standby), it is not waited for.
    `address` is its RPC address; `coordinator`, what executors and `tq` are given: that
    address, or a list of several coordinators a test sets."""

    def __init__(self, hosts: Hosts, processes: Processes, home: Path, *,
                 lease: float = 2.0, coordinator_log: Path | None = None, host: str = "c",
                 client: str | None = None, options: tuple[str, ...] = (),
                 wait: bool = True) -> None:
        self.hosts, self.processes, self.home, self.lease = hosts, processes, home, lease
        self.client = client or host
        self.env = tq_env(home)
        self.port = free_port()
        self.address = f"tcp://{hosts.address[host]}:{self.port}"
        self.coordinator = self.address
        self.process = processes.start(
            hosts.argv(host, "-m", "querylib.cli", "coordinator", "--data",
                       str(home / "coordinator"), "--listen", self.address,
                       "--broker-listen", f"tcp://{hosts.address[host]}:{free_port()}",
                       *(["--verbose"] if coordinator_log else []), *options),
            env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=coordinator_log.open("a") if coordinator_log else subprocess.DEVNULL)
        if wait:
            wait_for(lambda: (home / "cluster.json").exists(), timeout=60,
                     what="the coordinator to start")

    def executor(self, host: str, *options: str,
                 log: Path | None = None) -> subprocess.Popen[Any]:
        """`tq executor` on `host` (data in HOME/executor-HOST), `options` added; its stderr
        appended to `log`, else a pipe."""
        stderr: Any = subprocess.PIPE if log is None else log.open("a")
        return self.processes.start(
            self.hosts.argv(host, "-m", "querylib.cli", "executor", "--coordinator",
                            self.coordinator, "--data", str(self.home / f"executor-{host}"),
                            "--host", f"host-{host}", "--slots", "2", "--lease", str(self.lease),
                            "--grace", "1", "--broker-listen",
                            f"tcp://{self.hosts.address[host]}:{free_port()}", *options),
            env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, text=True)

    def tq(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.hosts.argv(self.client, "-m", "querylib.cli", *args,
                                              "--coordinator", self.coordinator),
                              env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)

    def status(self) -> dict[str, Any]:
        done = self.tq("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def executors(self) -> dict[str, int]:
        """host name -> executor id, of the executors registered now."""
        return {e["host"]: e["executor_id"] for e in self.status()["executors"]}

    def query(self, query_id: int) -> dict[str, Any]:
        done = self.tq("status", str(query_id), "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def submit(self, program: Path, executors: list[int], *args: str) -> int:
        pins = [arg for e in executors for arg in ("--executor", str(e))]
        done = self.tq("submit", str(program), "--processes", str(len(executors)), *pins,
                       "--", *args)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[0])
