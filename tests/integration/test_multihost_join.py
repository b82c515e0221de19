"""Joining hosts with tokens across network namespaces (needs root and `ip netns`; skipped
otherwise; DESIGN §6 "Joining a host", §12 "Joining a host"). The coordinator listens on
every interface of host `c` and advertises its address; `tq token create` there; `tq executor
--join TOKEN` on host `a`, with no address, credential or listen option, registers a broker
at a's routable address (never 0.0.0.0 or loopback) and runs a query whose output `tq logs`
on host c reads from that broker. The same token is refused on host `b`, as are an expired
and a wrong one, and none of them registers anything.

The namespaces are test_multihost.py's `hosts` fixture (tests/_netns.py).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests._netns import Hosts
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration import test_multihost

hosts = test_multihost.hosts  # the fixture: namespaces c, a and b

pytestmark = pytest.mark.timeout(240)

PROGRAM = textwrap.dedent('''
    import os
    import querylib

    def main(ctx):
        with ctx.publish("joined-numbers", serde="json") as out:
            out.send(0, [1, 2, 3])
        print(f"RAN ON {os.environ['TQ_EXECUTOR_ID']}", flush=True)

    querylib.execute(main)
''')


class Coordinator:
    """`tq coordinator` on host c, on 0.0.0.0, advertising c's address; tq commands on c."""

    def __init__(self, hosts: Hosts, processes: Processes, home: Path) -> None:
        self.hosts, self.processes, self.home = hosts, processes, home
        self.env = tq_env(home)
        port = free_port()
        self.address = f"tcp://{hosts.address['c']}:{port}"
        processes.start(hosts.argv("c", "-m", "querylib.cli", "coordinator", "--data",
                                   str(home / "coordinator"), "--listen",
                                   f"tcp://0.0.0.0:{port}", "--advertise",
                                   hosts.address["c"]),
                        env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
        wait_for(lambda: (home / "cluster.json").exists(), timeout=60,
                 what="the coordinator to start")

    def tq(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A tq command on host c, finding the coordinator through $TQ_HOME/cluster.json."""
        return subprocess.run(self.hosts.argv("c", "-m", "querylib.cli", *args), env=self.env,
                              cwd=ROOT, capture_output=True, text=True, timeout=120)

    def token(self, *args: str) -> str:
        done = self.tq("token", "create", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def executors(self) -> dict[str, int]:
        done = self.tq("status", "--json")
        assert done.returncode == 0, done.stderr
        return {e["host"]: e["executor_id"] for e in json.loads(done.stdout)["executors"]}


def _join(hosts: Hosts, host: str, token: str, home: Path) -> list[str]:
    return hosts.argv(host, "-m", "querylib.cli", "executor", "--join", token, "--data",
                      str(home / f"executor-{host}"), "--slots", "2", "--brokers", "1")


def test_a_host_joins_with_a_token_and_no_address_options(
        hosts: Hosts, processes: Processes, tmp_path: Path) -> None:
    coordinator = Coordinator(hosts, processes, tmp_path / "c")
    token = coordinator.token("--ttl", "10m")
    home_a = tmp_path / "a"
    agent = processes.start(_join(hosts, "a", token, home_a), env=tq_env(home_a), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    joined = wait_for(lambda: coordinator.executors(), timeout=60, interval=0.2,
                      what="the joined executor to register")
    ((host_name, executor_id),) = joined.items()
    program = tmp_path / "numbers.py"
    program.write_text(PROGRAM)
    done = coordinator.tq("submit", str(program), "--executor", str(executor_id), "--wait")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"RAN ON {executor_id}" in done.stdout
    # The topic lives on the joined host's broker, registered at a's address with the port
    # it bound on 0.0.0.0; host c reads it there.
    described = coordinator.tq("topic", "describe", "joined-numbers", "--json")
    assert described.returncode == 0, described.stderr
    addresses = {part["address"] for part in json.loads(described.stdout)["partitions"]}
    assert len(addresses) == 1, described.stdout
    assert addresses.pop().startswith(f"tcp://{hosts.address['a']}:"), described.stdout
    read = coordinator.tq("consume", "joined-numbers")
    assert read.returncode == 0 and read.stdout.split() == ["1", "2", "3"], (read.stdout,
                                                                          read.stderr)
    assert host_name and agent.poll() is None

    # The same token on host b: refused with one line, nothing registered.
    home_b = tmp_path / "b"
    again = subprocess.run(_join(hosts, "b", token, home_b), env=tq_env(home_b), cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "used already" in again.stderr, again.stderr
    # An expired one and a wrong one too.
    expired = coordinator.token("--ttl", "1s")
    wait_for(lambda: "expired" in coordinator.tq("token", "list").stdout, timeout=30,
             interval=0.2, what="the one-second token to expire")
    done = subprocess.run(_join(hosts, "b", expired, home_b), env=tq_env(home_b), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "expired" in done.stderr, done.stderr
    valid = coordinator.token()
    parts = valid.split(".")  # prefix, addresses, id, secret[, the coordinator's CURVE key]
    parts[3] = parts[3][:-4] + ("AAAA" if not parts[3].endswith("AAAA") else "BBBB")
    wrong = ".".join(parts)
    done = subprocess.run(_join(hosts, "b", wrong, home_b), env=tq_env(home_b), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "refused join token" in done.stderr, done.stderr
    assert coordinator.executors() == joined
    assert agent.poll() is None
