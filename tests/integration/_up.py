"""A real `tq up` child process (the coordinator, and its executor agent in a child of its own)
and the `tq` commands run against it, for integration tests of queries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import querylib
from catalog import Query
from querylib.cluster import Cluster
from tests.conftest import free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env

SLOTS = 3


class Up:
    """A `tq up` child process and the tq commands run against it."""

    def __init__(self, home: Path, *extra: str, slots: int | None = SLOTS,
                 require_endpoints: bool = True) -> None:
        """`slots=None`: tq up's default slot count. `require_endpoints`: fail, with what tq
        up said, when an endpoint on a port `extra` names did not open."""
        self.home = home
        self.env = tq_env(home)
        slot_args = [] if slots is None else ["--slots", str(slots)]
        # tq up's Kafka and connector endpoints default to well-known ports (moved when taken):
        # a test takes free ones unless it names its own
        port_args = [arg for option in ("--kafka-port", "--connector-port")
                     if option not in extra for arg in (option, "0")]
        self._spawn("--listen", f"tcp://127.0.0.1:{free_port()}", *slot_args, *port_args,
                    "--grace", "2", *extra)
        wait_for(lambda: (home / "cluster.json").exists() or self.proc.poll() is not None,
                 timeout=60, what="tq up to write cluster.json")
        assert self.proc.poll() is None, self.stderr()
        self.info = json.loads((home / "cluster.json").read_text())
        for option, name in (("--kafka-port", "kafka"), ("--connector-port", "connector")):
            if require_endpoints and option in extra \
                    and int(extra[extra.index(option) + 1]) >= 0 and not self.info.get(name):
                raise AssertionError(f"tq up opened no {name} endpoint on the port "
                                     f"{option} named: {self.stop()}")

    def _spawn(self, *args: str) -> None:
        """Start `tq up *args` in a session of its own. What it and its children log goes to
        a file, not a pipe: a pipe nobody reads until the end fills (64 KiB) and blocks
        whichever of them writes next."""
        self.killed = False  # stop() had to SIGKILL it
        self._stderr = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "querylib.cli", "up", *args], env=self.env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=self._stderr, text=True, start_new_session=True)

    def __enter__(self) -> Up:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connect(self) -> querylib.api.Context:
        """A querylib context on a client session of this cluster (close it, or use `with`)."""
        return querylib.connect(self.info["coordinator"], secret_file=self.info["secret_file"])

    def tq(self, *args: str, stdin: str | None = None,
           timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "querylib.cli", *args], env=self.env,
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              input=stdin)

    def executor_credential(self, name: str, path: Path) -> Path:
        """`tq user add NAME --role executor`: the credential of `executor:NAME`, at `path`."""
        made = self.tq("user", "add", name, "--role", "executor", "-o", str(path))
        assert made.returncode == 0, made.stderr
        return path

    def submit(self, program: Path, *args: str) -> int:
        done = self.tq("submit", str(program), *args)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[0])

    def query(self, query_id: int) -> Query:
        (query,) = [q for q in self.queries() if q.query_id == query_id]
        return query

    def ended(self, query_id: int) -> Query:
        return wait_for(lambda: (q := self.query(query_id)).ended and q, timeout=120,
                        interval=0.1, what=f"query {query_id} to end")

    def stop(self) -> str:
        """SIGTERM (SIGKILL after 30 s: then `killed` is set); returns what tq up wrote to
        stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.killed = True
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.stderr()

    def stderr(self) -> str:
        """What tq up (and its children) wrote to stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read()

    def cluster(self) -> Cluster:
        """A read-only client of this cluster (no session)."""
        return Cluster.connect(self.info["coordinator"], secret_file=self.info["secret_file"],
                               session=False)

    def queries(self) -> list[Query]:
        with self.cluster() as cluster:
            return [q for q, _ in cluster.snapshot("queries")["queries"].records
                    if isinstance(q, Query)]
