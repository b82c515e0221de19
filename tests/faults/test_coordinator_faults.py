"""Faults against a real coordinator process: SIGKILL under a load of changes loses nothing that
was acknowledged; hostile requests and garbage frames get typed errors or are dropped while
everyone else is served; a corrupt catalog topic stops start-up with one clear line."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import zmq

from catalog import CatalogError, Resources, SessionKind, TqError, UserError, catalog_topic
from querylib.cluster import Cluster
from querylib.cluster import messages as m
from querylib.log import PartitionLog, partition_dir_name
from querylib.records import DIFF_HEADER, TIME_HEADER, encode_batch, encode_int64
from querylib.rpc import (
    BlockingClient,
    InternalServerError,
    RpcProtocolError,
    load_secret,
)
from tests.conftest import Processes
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq, tq_env
from tests.querylib.rpc._support import authenticate

LOADER = """
import asyncio, sys
from querylib.cluster import AsyncCluster

async def main(prefix):
    cluster = await AsyncCluster.connect(lease=30.0, timeout=2.0)
    async def worker(j):
        i = 0
        while True:
            name = f"{prefix}-{j}-{i}"
            await cluster.create_topic(name)
            print(name, flush=True)   # only after the coordinator acknowledged it
            i += 1
    try:
        await asyncio.gather(*(worker(j) for j in range(8)))
    except Exception as exc:
        print(f"stopped: {type(exc).__name__}", file=sys.stderr, flush=True)

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    return tmp_path


def test_acknowledged_changes_survive_sigkill_under_load(processes: Processes,
                                                         home: Path) -> None:
    # Frequent checkpoints, so crashes also land between a checkpoint's blocks and its index.
    coordinator = CoordinatorProcess(processes, home, checkpoint_updates=40).start()
    acked: set[str] = set()
    for round_ in range(2):
        loader = processes.python("-c", LOADER, f"r{round_}", env=tq_env(home), cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = []
        while len(lines) < 30 + 30 * round_:
            line = loader.stdout.readline()  # type: ignore[union-attr]
            assert line, loader.stderr.read()  # type: ignore[union-attr]
            lines.append(line.strip())
        coordinator.kill()  # mid-stream: changes are in flight
        out, _ = loader.communicate(timeout=60)
        acked |= set(lines) | set(out.split())
        coordinator.start()
        with Cluster.connect(session=False) as cluster:
            topics = {t.short_name for t, _ in cluster.snapshot("topics")["topics"].records}
        missing = acked - topics
        assert not missing, f"acknowledged but lost after round {round_}: {sorted(missing)[:5]}"


def test_hostile_requests_get_typed_errors(processes: Processes, home: Path) -> None:
    coordinator = CoordinatorProcess(processes, home).start()
    secret = load_secret(home / "secret")
    with BlockingClient(coordinator.address, secret, timeout=10) as client:
        session = client.request(m.OpenSession(lease_ms=5000)).session_id
        hostile = [
            m.Heartbeat(session_id=10**12),
            m.Heartbeat(session_id=-1),
            m.OpenSession(kind=SessionKind.QUERY),
            m.OpenSession(kind=SessionKind.QUERY, query_id=10**9, process=0),
            m.OpenSession(query_id=1, process=0),
            m.OpenSession(resume=424242),
            m.CreateTopic(session_id=session, name="x" * 10_000),
            m.CreateTopic(session_id=session, name="bad name"),
            m.CreateTopic(session_id=session, name="__catalog.topics"),
            m.CreateTopic(session_id=session, name="ok", partitions=10**9),
            m.CreateTopic(session_id=session, name="ok", partitions=-3),
            m.CreateTopic(session_id=session, name="ok", locations=(999, 998)),
            m.CreateTopic(session_id=session, name="ok", record_type="r" * 100_000),
            m.RegisterBroker(session_id=session, host="h" * 10_000, address="tcp://x:1"),
            m.DeleteTopic(session_id=session, name="__catalog.sessions", force=True),
            m.Publish(session_id=session, name="persistent://a/b"),
            m.Subscribe(session_id=session, name="nope", wait_ms=-5),
            m.RegisterExecutor(session_id=session, host="h", broker_id=77,
                               resources=Resources(cores=-1, memory=0, disk=0, slots=0)),
            m.SubmitQuery(session_id=session, name="q", program="p", processes=10**8),
            m.SubmitQuery(session_id=session, name="q", program="p", processes=1,
                          executors=(5, 6)),
            m.ReportExit(session_id=session, query_id=3, process=0, exit_code=1),
            m.KillQuery(session_id=session, query_id=-4),
        ]
        for request in hostile:
            with pytest.raises(TqError) as info:
                client.request(request)
            assert not isinstance(info.value, InternalServerError), (request, info.value)
            assert isinstance(info.value, CatalogError | UserError | RpcProtocolError), (
                request, info.value)
        # A long wait is clamped, not honoured forever, and does not hold anything up.
        started = time.monotonic()
        with pytest.raises(TqError):
            client.request(m.LookupTopic(name="never", wait_ms=10**12), timeout=0.5)
        assert time.monotonic() - started < 5

        # Garbage frames from an unsigned peer (that passed the handshake) are dropped; the
        # server keeps serving.
        sock = authenticate(zmq.Context.instance().socket(zmq.DEALER), secret)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(coordinator.address)
        for frames in ([b""], [b"\x00" * 32, b"junk"], [b"x" * 100_000] * 3, [b"\xff"] * 50):
            sock.send_multipart(frames)
        sock.close()
        info = client.request(m.GetCatalogInfo())
        assert info.collections["topics"] == catalog_topic("topics")
        assert client.request(m.Heartbeat(session_id=session)).lease_ms == 5000


def test_a_corrupt_catalog_stops_start_up_with_one_line(processes: Processes,
                                                         home: Path) -> None:
    coordinator = CoordinatorProcess(processes, home).start()
    assert coordinator.stop() == 0
    path = coordinator.data / "broker" / partition_dir_name(catalog_topic("topics"), 0)
    log = PartitionLog.open(path)
    log.append(encode_batch([(1, None, b"\x92\x01\x02",
                              ((TIME_HEADER, encode_int64(1)), (DIFF_HEADER, encode_int64(1))))]))
    log.close()
    result = tq(home, "coordinator", "--data", str(coordinator.data), "--listen",
                coordinator.address)
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert "__catalog.topics" in line and line.startswith("tq: error:")
