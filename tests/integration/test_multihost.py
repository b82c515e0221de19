"""Three hosts in network namespaces (needs root and `ip netns`; skipped otherwise): a
coordinator in one, an executor in each of two others, linked by veth pairs to a bridge in the
coordinator's namespace. A query runs across both executors; cutting one executor's link
fails the query and kills its processes on both hosts (the cut executor kills its own when
its lease runs out; the coordinator kills the rest). Once the link is back, the same executor
process rejoins by itself with a new session (a new executor id, its broker's id kept) and
runs a new query.

Everything lives inside the namespaces the test creates (nothing touches the host's network);
they are deleted in a finally.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests._netns import Cluster, Hosts, netns_hosts
from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT

pytestmark = pytest.mark.timeout(240)

LEASE = 2.0
SUBNET = "10.199.7"

SLEEPER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        name = f"{os.environ['TQ_EXECUTOR_ID']}-{os.getpid()}"
        Path(sys.argv[1], name).write_text("")
        while True:
            time.sleep(0.2)

    querylib.execute(main)
''')


@pytest.fixture
def hosts(processes: Processes) -> Iterator[Hosts]:
    with netns_hosts(processes.stop_all, "cab", subnet=SUBNET) as made:
        yield made


def _pids(folder: Path, count: int) -> dict[int, int]:
    """executor id -> pid of the processes that wrote their marker into `folder`."""
    names = wait_for(lambda: len(found := list(folder.iterdir())) >= count and found,
                     timeout=60, what=f"{count} query processes to start")
    return dict(tuple(map(int, p.name.split("-"))) for p in names)  # type: ignore[union-attr]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_query_across_two_hosts_survives_a_cut_link_cleanly(
        hosts: Hosts, processes: Processes, tmp_path: Path) -> None:
    cluster = Cluster(hosts, processes, tmp_path, lease=LEASE)
    cluster.executor("a")
    cut = cluster.executor("b")
    ids = wait_for(lambda: len(e := cluster.executors()) == 2 and e, timeout=60,
                   interval=0.2, what="both executors to register")
    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    first = tmp_path / "first"
    first.mkdir()
    query_id = cluster.submit(program, [ids["host-a"], ids["host-b"]], str(first))
    pids = _pids(first, 2)
    assert set(pids) == {ids["host-a"], ids["host-b"]}
    assert cluster.query(query_id)["state"] == "running"

    hosts.set_link("b", up=False)
    query = wait_for(lambda: (q := cluster.query(query_id))["state"] != "running" and q,
                     timeout=LEASE * 10, interval=0.2, what="the query to fail")
    assert query["state"] == "failed" and f"lost executor {ids['host-b']}" in query["reason"]
    wait_for(lambda: all(_gone(p) for p in pids.values()), timeout=30,
             what="the query's processes on both hosts to be killed")
    assert cut.poll() is None  # it killed its processes and keeps trying to rejoin

    hosts.set_link("b", up=True)
    rejoined = wait_for(lambda: (e := cluster.executors()).get("host-b") not in
                        (None, ids["host-b"]) and e, timeout=60, interval=0.2,
                        what="host b's executor to rejoin by itself")
    assert rejoined["host-a"] == ids["host-a"]
    assert cut.poll() is None  # the same process, not a restarted one
    second = tmp_path / "second"
    second.mkdir()
    again = cluster.submit(program, [rejoined["host-b"]], str(second))
    assert set(_pids(second, 1)) == {rejoined["host-b"]}
    assert cluster.query(again)["state"] == "running"
    killed = cluster.tq("kill", str(again))
    assert killed.returncode == 0, killed.stderr
    cut.terminate()
    _, stderr = cut.communicate(timeout=30)
    assert cut.returncode == 0, stderr
    assert "lost the coordinator" in stderr
    assert f"rejoined the coordinator as executor {rejoined['host-b']}" in stderr


PUBLISHER = textwrap.dedent('''
    import querylib

    def main(ctx):
        with ctx.publish("secrets", serde="bytes") as pub:
            pub.send(0, [b"%s"])
            pub.advance_to(1)

    querylib.execute(main)
''')

# Captures every frame crossing the bridge (AF_PACKET: no tcpdump needed) into a file until
# the stop file appears (bounded: 120 s, 64 MiB).
CAPTURE = textwrap.dedent('''
    import os, socket, sys, time
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sock.bind(("br0", 0))
    sock.settimeout(0.1)
    out, stop, ready = sys.argv[1:4]
    deadline, size = time.monotonic() + 120, 0
    with open(out, "wb") as f:
        open(ready, "w").close()
        while not os.path.exists(stop) and time.monotonic() < deadline and size < 64 << 20:
            try:
                frame = sock.recv(65536)
            except socket.timeout:
                continue
            f.write(frame)
            size += len(frame)
''')


def test_links_between_hosts_are_curve(hosts: Hosts, processes: Processes,
                                       tmp_path: Path) -> None:
    """Servers bound to the namespaces' addresses are CURVE servers: a query on host a
    publishes a known value, a consumer on host c reads it back through a's broker, and a
    capture of everything crossing the bridge meanwhile holds CURVE greetings, never a PLAIN
    one, never the value, never a principal's name."""
    value = f"value-{uuid.uuid4().hex}"
    capture, stop, ready = tmp_path / "bridge.bin", tmp_path / "stop", tmp_path / "ready"
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE)
    capturing = processes.start(hosts.argv("c", str(script), str(capture), str(stop),
                                           str(ready)), cwd=ROOT)
    wait_for(ready.exists, timeout=30, what="the capture to start")
    cluster = Cluster(hosts, processes, tmp_path, lease=LEASE)
    cluster.executor("a")
    ids = wait_for(lambda: len(e := cluster.executors()) == 1 and e, timeout=60,
                   interval=0.2, what="the executor to register")
    program = tmp_path / "publisher.py"
    program.write_text(PUBLISHER % value)
    query_id = cluster.submit(program, [ids["host-a"]])
    wait_for(lambda: cluster.query(query_id)["state"] == "finished", timeout=60,
             interval=0.2, what="the publisher to finish")
    read = cluster.tq("consume", "secrets", "--from", "earliest", "--count", "1")
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == value
    brokers = cluster.tq("catalog", "brokers", "--json")
    assert brokers.returncode == 0, brokers.stderr
    stop.touch()
    assert capturing.wait(timeout=30) == 0
    seen = capture.read_bytes()
    assert b"CURVE" in seen and b"PLAIN" not in seen  # ZMTP greetings name the mechanism
    assert value.encode() not in seen
    for principal in (b"admin", b"query:"):
        assert principal not in seen
    assert json.loads((tmp_path / "cluster.json").read_text())["coordinator_key"]
    assert hosts.address["a"] in brokers.stdout and '"curve_key": ""' not in brokers.stdout
