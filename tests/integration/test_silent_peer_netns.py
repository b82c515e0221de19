"""A peer that goes silent without closing (its host gone, a partition) loses its connection.

Real RPC server and client processes in network namespaces (`tests/_netns.py`): the client's
host is cut off by taking its link down, so neither a FIN nor a RST ever arrives. Without TCP
keepalive and a bound on unacknowledged data the server's side of the connection stayed
ESTABLISHED for ever, a descriptor and zmq's queues held per vanished host. The short
keepalive `Limits` here stand for the defaults (30 s idle, 10 s between probes, 3 probes);
`unacked_timeout` is off by default (the kernel retransmits to a vanished peer for about 15
minutes) and set here where data is on the way to the vanished peer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests._netns import Hosts, netns_hosts
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT

pytestmark = pytest.mark.timeout(120)

SHORT = {"keepalive_idle": 1, "keepalive_interval": 1, "keepalive_count": 2}
UNACKED = {"unacked_timeout": 3}  # only where data is on the way to the peer

SERVER = """
import asyncio, json, sys
from querylib.rpc import Limits, RpcServer
from tests.querylib.rpc._support import SECRET, Delivery, Handlers

async def main():
    # Bound where another host reaches it: a CURVE server, its key told to the client.
    server = RpcServer(SECRET, limits=Limits(**json.loads(sys.argv[2])), server_key=SECRET)
    handlers = Handlers()
    handlers.install(server)
    await server.start(sys.argv[1])
    print(server.public_key, flush=True)
    for seq in range(100_000):  # 64 KiB every 10 ms to each peer that sent a Credit
        for peer in set(handlers.peers):
            server.notify(peer, Delivery(seq), payload=[bytes(64 * 1024)])
        await asyncio.sleep(0.01)

asyncio.run(main())
"""

# The client pings once; with "pushed" it then sends a Credit, after which the server pushes
# to it every 10 ms, so once its host is gone the server's data goes unacknowledged (keepalive
# alone never probes then: TCP retransmits for about 15 minutes).
CLIENT = """
import asyncio, json, sys
from querylib.rpc import Limits, Ping, RpcClient
from tests.querylib.rpc._support import SECRET, Credit

async def main():
    client = RpcClient(sys.argv[1], SECRET, limits=Limits(**json.loads(sys.argv[2])),
                       timeout=10.0, server_key=sys.argv[4])
    await client.connect()
    await client.exchange(Ping())
    if sys.argv[3] == "pushed":
        await client.notify(Credit(amount=1))
        await client.notifications.get()  # the server pushes to us now
    print("connected", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _connections(hosts: Hosts, port: int) -> list[int]:
    """The bytes queued to send (Send-Q) on each connection to the server's port that its
    host's kernel holds ESTABLISHED."""
    done = subprocess.run(["ip", "netns", "exec", hosts.ns["c"], "ss", "-Htn", "state",
                           "established", f"( sport = :{port} )"],
                          capture_output=True, text=True, timeout=30, check=True)
    return [int(line.split()[1]) for line in done.stdout.splitlines() if line.strip()]


def _established(hosts: Hosts, port: int) -> int:
    return len(_connections(hosts, port))


def _start(hosts: Hosts, processes: Processes, host: str, code: str,
           *args: str) -> tuple[subprocess.Popen[Any], str]:
    """The script started on `host`, and the first line it printed (it is ready then)."""
    proc = processes.start(hosts.argv(host, "-c", code, *args), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().strip()
    assert line, proc.stderr.read()
    return proc, line


@pytest.mark.parametrize("traffic", ["idle", "pushed"])
def test_the_server_drops_the_connection_of_a_peer_whose_host_vanished(
        processes: Processes, tmp_path: Path, traffic: str) -> None:
    with netns_hosts(processes.stop_all, "ca", subnet="10.199.41") as hosts:
        port = free_port()
        address = f"tcp://{hosts.address['c']}:{port}"
        limits = json.dumps(SHORT | (UNACKED if traffic == "pushed" else {}))
        server, server_key = _start(hosts, processes, "c", SERVER, address, limits)
        _start(hosts, processes, "a", CLIENT, address, limits, traffic, server_key)
        assert _established(hosts, port) == 1
        if traffic == "idle":  # nothing on the way to the peer as it vanishes
            wait_for(lambda: _connections(hosts, port) == [0], timeout=30,
                     what="the server's last message to be acknowledged")
        hosts.set_link("a", up=False)  # no FIN, no RST: the host is simply gone
        wait_for(lambda: _established(hosts, port) == 0, timeout=60,
                 what="the server to drop the vanished peer's connection")
        assert server.poll() is None  # and it goes on serving


def test_a_reader_that_stalls_keeps_its_connection(processes: Processes) -> None:
    """A live peer that stops reading (here stopped outright) is not a vanished one: its kernel
    answers the probes of its full receive window, so keepalive never drops it (an
    `unacked_timeout` would: it counts from the first probe, answered or not)."""
    with netns_hosts(processes.stop_all, "ca", subnet="10.199.42") as hosts:
        port = free_port()
        address = f"tcp://{hosts.address['c']}:{port}"
        limits = json.dumps(SHORT)
        server, server_key = _start(hosts, processes, "c", SERVER, address, limits)
        client, _ = _start(hosts, processes, "a", CLIENT, address, limits, "pushed",
                           server_key)
        os.killpg(client.pid, signal.SIGSTOP)
        try:
            # Its window fills: the server's kernel holds what the peer cannot take.
            wait_for(lambda: sum(_connections(hosts, port)) > 64 * 1024, timeout=30,
                     what="the stopped reader's receive window to fill")
            # Three times the bound the vanished idle peer above was dropped within.
            deadline = time.monotonic() + 3 * (SHORT["keepalive_idle"] + SHORT[
                "keepalive_interval"] * SHORT["keepalive_count"])
            while time.monotonic() < deadline:
                assert _established(hosts, port) == 1
                time.sleep(0.5)
        finally:
            os.killpg(client.pid, signal.SIGCONT)
        assert server.poll() is None and client.poll() is None
