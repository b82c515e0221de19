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

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

__all__ = ["Hosts", "ip", "netns_hosts", "netns_works"]


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
