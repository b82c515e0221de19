"""`tq ingest` through a broker process's connector endpoint, per dialect, with a small credit
window: every line lands in the topic exactly once, in order, ended by end-of-stream; running
it again stores nothing twice. One million records per dialect run as the `slow` tests (about
10 s each here, with a window of 128); the regular ones send 100,000 with a window of 64."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from querylib.log import PartitionLog
from querylib.records import (
    HEADER_SIZE,
    ControlType,
    control_of,
    decode_batch,
    iter_batches,
    read_header,
)
from querylib.records._header import ATTRIBUTES_OFFSET
from querylib.rpc import load_or_create_secret
from tests.conftest import Processes, free_port, wait_for

_Q = struct.Struct(">Q")
_MSGID = re.compile(rb"\x10tq\.msgid\x10(.{8})", re.S)
CREDITS = 64
TQ = [sys.executable, "-m", "querylib.cli"]


class Cluster:
    """A broker process with its connector endpoint, restartable on the same ports."""

    def __init__(self, processes: Processes, tmp: Path, *, credits: int = CREDITS) -> None:
        self.processes = processes
        self.data = tmp / "data"
        self.secret_file = str(tmp / "secret")
        load_or_create_secret(self.secret_file)
        self.port, self.connector_port = free_port(), free_port()
        self.credits = credits
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.connector_port}"

    def start(self) -> None:
        self.proc = self.processes.python(
            "-m", "querylib.server.connector", "--data", str(self.data), "--listen",
            f"tcp://127.0.0.1:{self.port}", "--connector-port", str(self.connector_port),
            "--secret-file", self.secret_file, "--credits", str(self.credits),
            stderr=subprocess.DEVNULL)

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the broker exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.connector_port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_for(listening, timeout=30, what="the connector endpoint to listen")

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0

    def ingest(self, topic: str, source: Path, dialect: str, *args: str,
               **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stderr", subprocess.PIPE)
        return self.processes.start([*TQ, "ingest", topic, str(source), "--connector",
                                     self.address, "--dialect", dialect, "--secret-file",
                                     self.secret_file, *args], text=True, **kwargs)

    def log_bytes(self, topic: str) -> int:
        path = self.data / f"{topic}-0"
        return sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".log")) \
            if path.exists() else 0

    def contents(self, topic: str) -> tuple[list[int], list[bytes], list]:
        """(message ids, first and last values, control types) of the topic, read from disk
        (stop the broker first). Ids are found by their header bytes, which the test's payloads
        cannot contain, and checked against each batch's record count: a million decoded
        records would cost seconds."""
        ids: list[int] = []
        ends: list[bytes] = []
        controls = []
        with PartitionLog.open(self.data / f"{topic}-0") as log:
            offset = log.log_start_offset
            while offset < log.log_end_offset:
                data = log.read(offset, 16 * 1024 * 1024)
                pos = 0
                while pos < len(data):
                    header = read_header(data, pos)
                    batch = data[pos:pos + header.size]
                    pos += header.size
                    offset = header.next_offset
                    if batch[ATTRIBUTES_OFFSET + 1] & 0x20:
                        controls.append(control_of(decode_batch(batch).records[0])[0])
                        continue
                    found = [_Q.unpack(m)[0] for m in _MSGID.findall(batch, HEADER_SIZE)]
                    assert len(found) == header.records_count
                    ids += found
                    if not ends:
                        ends.append(decode_batch(batch).records[0].value)
                    last = batch
            ends.append(decode_batch(last).records[-1].value)
        return ids, ends, controls


def lines_file(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        f.writelines(f"line-{i}\n" for i in range(n))
    return path


@pytest.fixture
def cluster(processes, tmp_path):
    c = Cluster(processes, tmp_path)
    c.start()
    return c


def _ingest_exactly_once(cluster: Cluster, tmp_path: Path, dialect: str, n: int, *,
                         again: bool = True) -> None:
    source = lines_file(tmp_path / "in.txt", n)
    proc = cluster.ingest("lines", source, dialect)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"ingested {n:,} lines into lines (0 already stored" in err
    if again:  # the same file and instance resume: nothing is sent twice
        proc = cluster.ingest("lines", source, dialect)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert f"ingested 0 lines into lines ({n:,} already stored" in err
    cluster.stop()
    ids, ends, controls = cluster.contents("lines")
    assert ids == list(range(n))
    assert ends == [b"line-0", f"line-{n - 1}".encode()]
    assert controls[-1] == ControlType.END_OF_STREAM


@pytest.mark.parametrize("dialect", ["draft", "released"])
def test_ingest_through_each_dialect_exactly_once(cluster, tmp_path, dialect):
    _ingest_exactly_once(cluster, tmp_path, dialect, 100_000)


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["draft", "released"])
def test_ingest_a_million_records_through_each_dialect(processes, tmp_path, dialect):
    # A window of 128 frames: ~7,800 round trips of credit for the million records.
    cluster = Cluster(processes, tmp_path, credits=128)
    cluster.start()
    _ingest_exactly_once(cluster, tmp_path, dialect, 1_000_000, again=False)


def test_ingest_json_lines_with_keys_and_event_times(cluster, tmp_path):
    source = tmp_path / "in.jsonl"
    rows = [{"value": "v0", "key": "k0", "timestamp": 1_700_000_000_000},
            {"value": {"nested": [1, 2]}},
            [1, 2, 3]]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = cluster.ingest("json", source, "released", "--format", "jsonl")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    cluster.stop()
    with PartitionLog.open(cluster.data / "json-0") as log:
        records = [r for b in iter_batches(log.read(0, 1 << 20)) if not b.is_control
                   for r in b.records]
    assert [r.value for r in records] == [b"v0", b'{"nested":[1,2]}', b"[1, 2, 3]"]
    assert records[0].key == b"k0" and records[0].timestamp == 1_700_000_000_000
    assert records[1].key is None


def test_ingest_reports_user_errors_in_one_line(cluster, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"value": 1}\nnot json\n')
    proc = cluster.ingest("bad", bad, "draft", "--format", "jsonl")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines()[-1].startswith("tq: error: line 2: not JSON")

    proc = cluster.ingest("x", tmp_path / "missing.txt", "draft")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no such file" in err

    refused = cluster.ingest("__consumer_offsets", lines_file(tmp_path / "a.txt", 3), "draft")
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 1 and "internal" in err
