"""Shared pieces of the Kafka interop tests: a `tq kafka`-equivalent listener in a child process
(real process, real socket on a free 127.0.0.1 port, real data directory) that can be stopped
and started again on the same port, and topics written and read through querylib.log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from querylib.log import PartitionLog
from querylib.records import Record, encode_batch, frontier_batch, iter_batches
from tests.conftest import Processes, free_port, wait_for

# Group timeouts low enough for fast rebalance tests, as the issue asks.
_SERVER = """
import sys
from querylib.server import run_kafka
from querylib.server.kafka import GroupConfig
sys.exit(run_kafka(sys.argv[1], "127.0.0.1", int(sys.argv[2]),
                   group_config=GroupConfig(min_session_timeout_ms=500)))
"""


class KafkaServer:
    def __init__(self, processes: Processes, data_dir: Path) -> None:
        self.processes = processes
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The listener's stderr (a file: a pipe nobody reads could fill and block it)."""
        return self.data_dir.parent / "kafka-listener.log"

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text()[-2000:]
        except FileNotFoundError:
            return ""

    def start(self) -> KafkaServer:
        with open(self.log_path, "ab") as log:
            self.proc = self.processes.python("-c", _SERVER, str(self.data_dir), str(self.port),
                                              stderr=log)
        wait_for(self._accepting, timeout=30, what="the Kafka listener to accept connections")
        return self

    def _accepting(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"listener exited: {self.log_tail()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """Stop cleanly (SIGTERM: the logs are closed, the clean-shutdown markers left)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        assert self.proc.returncode == 0, self.log_tail()
        self.proc = None


Entry = tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]

T0 = 1_700_000_000_000


def sample_entries(count: int, prefix: str = "") -> list[Entry]:
    """Records with keys (one null), values (one null), headers (one null value), distinct
    timestamps."""
    entries: list[Entry] = []
    for i in range(count):
        key = None if i == 1 else f"{prefix}key-{i}".encode()
        value = None if i == 2 else f"{prefix}value-{i}".encode() * (1 + i % 3)
        headers = [("h", f"{i}".encode()), ("empty", None)] if i % 2 else []
        entries.append((T0 + 1000 * i, key, value, headers))
    return entries


def write_topic(data_dir: Path, topic: str, partition: int, entries: Sequence[Entry],
                per_batch: int = 3, frontier: bool = True) -> None:
    """Append entries through querylib.log (before the listener opens the directory), with a
    tq frontier control batch in the middle that Kafka clients must skip."""
    with PartitionLog.open(data_dir / f"{topic}-{partition}") as log:
        for start in range(0, len(entries), per_batch):
            log.append(encode_batch(list(entries[start:start + per_batch])))
            if frontier and start == 0:
                log.append(frontier_batch(1, timestamp=T0))


def read_topic(data_dir: Path, topic: str, partition: int = 0) -> list[Record]:
    """Every data record of a partition, through querylib.log (listener stopped)."""
    with PartitionLog.open(data_dir / f"{topic}-{partition}") as log:
        records: list[Record] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            data = log.read(offset, 1 << 20)
            for batch in iter_batches(data):
                offset = batch.next_offset
                if not batch.is_control:
                    records.extend(batch.records)
        return records


def read_batches(data_dir: Path, topic: str, partition: int = 0) -> list:
    with PartitionLog.open(data_dir / f"{topic}-{partition}") as log:
        return list(iter_batches(log.read(0, 1 << 30)))


def as_tuples(records: Sequence[Record]) -> list[Entry]:
    return [(r.timestamp, r.key, r.value, list(r.headers)) for r in records]


def run(args: Sequence[str], **kwargs) -> subprocess.CompletedProcess[bytes]:
    kwargs.setdefault("timeout", 30)
    return subprocess.run(list(args), capture_output=True, check=False, **kwargs)


def read_to_end(bootstrap: str, topic: str, isolation: str = "read_committed",
                timeout: float = 30.0) -> list[bytes]:
    """Every value a confluent-kafka consumer in `isolation` reads of partition 0 of `topic`
    up to the end it sees (the last stable offset for read_committed)."""
    import confluent_kafka

    c = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"read-{isolation}-{topic}",
        "enable.auto.commit": False, "isolation.level": isolation,
        "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    got: list[bytes] = []
    try:
        c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = c.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    return got
                raise AssertionError(message.error())
            got.append(message.value())
        raise AssertionError(f"the {isolation} consumer did not reach the end of {topic}")
    finally:
        c.close()
