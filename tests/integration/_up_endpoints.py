"""A real `tq up` child process with its broker endpoints (connector, Kafka) on the ports a
test gives, the `tq` commands run against it, and reading a topic back through a querylib
subscriber on the broker the catalog names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from querylib.broker import Data, EndOfStream, Subscriber
from querylib.cluster import Cluster
from querylib.records import Record
from querylib.rpc import load_secret
from tests.conftest import free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env


class UpWithEndpoints:
    """`tq up` with its endpoints on free ports (or as given), stopped at the end."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        self.env = tq_env(home)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "querylib.cli", "up", "--listen",
             f"tcp://127.0.0.1:{free_port()}", "--slots", "1", *extra],
            env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        wait_for(lambda: (home / "cluster.json").exists() or self.proc.poll() is not None,
                 timeout=60, what="tq up to write cluster.json")
        assert self.proc.poll() is None, self.proc.stderr.read()  # type: ignore[union-attr]
        self.info = json.loads((home / "cluster.json").read_text())

    def tq(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "querylib.cli", *args], env=self.env,
                              cwd=ROOT, capture_output=True, text=True, timeout=120, input=stdin)

    def cluster(self) -> Cluster:
        return Cluster.connect(self.info["coordinator"], secret_file=self.info["secret_file"],
                               session=False)

    def read(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """Every record of partition 0 of `topic` up to its end-of-stream."""
        return [(r.key, r.value) for r in self.records(topic)]

    def records(self, topic: str, count: int | None = None) -> list[Record]:
        """The records of partition 0 of `topic`, through the broker the catalog names: the
        first `count`, or all up to end-of-stream."""
        with self.cluster() as cluster:
            info = cluster.lookup_topic(topic)
        address = info.brokers[info.topic.locations[0]]
        secret = load_secret(self.info["secret_file"])
        records = []
        with Subscriber(address, info.topic.topic_name.short, [0], secret=secret,
                        start="earliest") as sub:
            while True:
                event = sub.next_event(30)
                assert event is not None, "the subscriber saw no end-of-stream"
                if isinstance(event, Data):
                    records += event.records
                    if count is not None and len(records) >= count:
                        return records
                elif isinstance(event, EndOfStream):
                    return records

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        err = self.proc.stderr.read()  # type: ignore[union-attr]
        self.proc.stderr.close()  # type: ignore[union-attr]
        return err
