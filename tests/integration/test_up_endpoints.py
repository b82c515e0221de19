"""The endpoints of a real `tq up`'s executor broker: `tq ingest` through its connector endpoint
(found in cluster.json) into new ingest topics, default namespace and tenant/ns, which the
catalog lists, owned by `ingest`, and a querylib subscriber reads back line by line; a
connector may not feed a partition the catalog places elsewhere. A taken port is said on
stderr and tq up goes on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import INGEST
from tests.conftest import free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up_endpoints import UpWithEndpoints

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-endpoints"),
                         "--connector-port", str(free_port()), "--kafka-port", "-1") as running:
        yield running


@pytest.mark.parametrize("topic", ["sensor-lines", "acme/plant/readings"])
def test_ingest_into_tq_up_is_in_the_catalog_and_readable(up: UpWithEndpoints, topic: str):
    assert up.info["connector"].startswith("127.0.0.1:")
    lines = [f"reading {i}" for i in range(500)]
    done = up.tq("ingest", topic, "-", "--instance", f"test-{topic}", stdin="\n".join(lines))
    assert done.returncode == 0, done.stderr
    listed = up.tq("topics", "--json")
    assert listed.returncode == 0, listed.stderr
    names = [json.loads(line)["name"] for line in listed.stdout.splitlines()]
    assert any(n.endswith(topic) for n in names), names
    with up.cluster() as cluster:
        found = cluster.lookup_topic(topic).topic
    assert found.owner == INGEST and found.partitions == 1
    assert up.read(topic) == [(None, line.encode()) for line in lines]


def test_a_partition_placed_elsewhere_is_refused(up: UpWithEndpoints):
    created = up.tq("topic", "create", "two-parts", "--partitions", "2")
    assert created.returncode == 0, created.stderr
    done = up.tq("ingest", "two-parts:5", "-", "--instance", "t5", "--timeout", "5",
                 stdin="x\n")
    assert done.returncode != 0
    assert "no partition 5" in done.stderr


def test_taken_ports_are_reported_and_tq_up_goes_on(tmp_path: Path):
    with socket.socket() as connector, socket.socket() as kafka:
        for blocker in (connector, kafka):
            blocker.bind(("127.0.0.1", 0))
            blocker.listen()
        ports = connector.getsockname()[1], kafka.getsockname()[1]
        running = UpWithEndpoints(tmp_path, "--connector-port", str(ports[0]),
                                  "--kafka-port", str(ports[1]), require_endpoints=False)
        try:
            assert running.info["connector"] == running.info["kafka"] == ""
            assert running.tq("topics").returncode == 0  # the rest of tq up works
        finally:
            err = running.stop()
    # Said once each (tq up says it; the log does not repeat it).
    assert err.count(f"port {ports[0]} for the connector endpoint is not available") == 1, err
    assert err.count(f"port {ports[1]} for the Kafka listener is not available") == 1, err
    assert "choose another with --connector-port" in err
    assert "choose another with --kafka-port" in err


def test_tq_broker_opens_a_connector_endpoint(tmp_path: Path):
    env = tq_env(tmp_path)
    port, connector = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "querylib.cli", "broker", "--data", str(tmp_path / "data"),
         "--listen", f"tcp://127.0.0.1:{port}", "--connector-port", str(connector)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        def listening() -> bool:
            assert proc.poll() is None, "tq broker exited"
            try:
                socket.create_connection(("127.0.0.1", connector), timeout=1).close()
            except OSError:
                return False
            return True

        wait_for(listening, timeout=30, what="the connector endpoint")

        def tq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "querylib.cli", *args], env=env,
                                  cwd=ROOT, capture_output=True, text=True, timeout=60,
                                  input=stdin)

        done = tq("ingest", "acme/lab/raw", "-", "--connector", f"127.0.0.1:{connector}",
                  stdin="a\nb\n")
        assert done.returncode == 0, done.stderr
        read = tq("consume", "acme/lab/raw", "--broker", f"tcp://127.0.0.1:{port}")
        assert read.returncode == 0, read.stderr
        assert read.stdout.split() == ["a", "b"]
        assert os.path.isdir(tmp_path / "data" / "acme%2Flab%2Fraw-0")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_any_free_port_is_the_previous_one_after_a_restart_when_free(tmp_path: Path):
    """Endpoints asked for "any free port" come back where they were (clients that knew them
    need not look them up); one whose port is taken meanwhile gets another."""
    options = ("--connector-port", "0", "--kafka-port", "0")
    first = UpWithEndpoints(tmp_path, *options)
    before = first.info
    first.stop()
    assert before["connector"] and before["kafka"]
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", int(before["connector"].rpartition(":")[2])))
        blocker.listen()
        second = UpWithEndpoints(tmp_path, *options, "--listen", before["coordinator"])
        try:
            assert second.info["kafka"] == before["kafka"]
            assert second.info["connector"] not in ("", before["connector"])
        finally:
            err = second.stop()
    assert "Traceback" not in err, err
