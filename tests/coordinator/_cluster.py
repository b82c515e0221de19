"""A real `tq coordinator` process for integration and fault tests, and client processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Processes, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


def tq_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TQ_HOME"] = str(home)
    env.pop("TQ_COORDINATOR", None)
    env["TQ_CONSOLE_PORT"] = "-1"  # no web console unless a test asks for one
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def query_env(home: Path, query_id: int, process: int, processes: int,
              workers: int) -> dict[str, str]:
    """What an executor gives process `process` of a query: its TQ_* variables and a credential
    of its own (principal query:ID, derived from the cluster secret as the coordinator mints
    it; DESIGN §12), for tests that start a query's processes themselves."""
    from querylib.rpc import Credential, load_secret, principal_key, write_credential

    path = home / f"query-{query_id}-{process}.credential"
    if not path.exists():
        principal = f"query:{query_id}"
        write_credential(path, Credential(principal, principal_key(
            load_secret(home / "secret"), principal)))
    return tq_env(home) | {"TQ_QUERY_ID": str(query_id), "TQ_PROCESS_INDEX": str(process),
                           "TQ_PROCESS_COUNT": str(processes), "TQ_WORKERS": str(workers),
                           "TQ_CREDENTIALS": str(path)}


def tq(home: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a `tq` command to completion (with the coordinator commands registered)."""
    return subprocess.run([sys.executable, "-m", "querylib.cli", *args],
                          capture_output=True, text=True, env=tq_env(home), cwd=ROOT,
                          timeout=timeout)


class CoordinatorProcess:
    """`tq coordinator` on fixed free ports, so a restart comes back at the same addresses."""

    def __init__(self, processes: Processes, home: Path, *, recovery_lease: float = 10.0,
                 checkpoint_updates: int = 4096, extra: tuple[str, ...] = ()) -> None:
        self.processes = processes
        self.extra = extra  # more `tq coordinator` options (--etcd ...)
        self.home = home
        self.data = home / "coordinator"
        self.port = free_port()
        self.broker_port = free_port()
        self.recovery_lease = recovery_lease
        self.checkpoint_updates = checkpoint_updates
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True) -> CoordinatorProcess:
        """Start it; with `wait`, until it serves (wrote cluster.json)."""
        self.proc = self.processes.python(
            "-m", "querylib.cli", "coordinator", "--data", str(self.data),
            "--listen", self.address, "--broker-listen", f"tcp://127.0.0.1:{self.broker_port}",
            "--recovery-lease", str(self.recovery_lease),
            "--checkpoint-updates", str(self.checkpoint_updates), *self.extra,
            env=tq_env(self.home), cwd=ROOT, stderr=subprocess.PIPE)
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Until it serves: it wrote cluster.json (a standby does once it took over)."""
        assert self.proc is not None
        pid = self.proc.pid

        def ready() -> bool:
            if self.proc.poll() is not None:  # type: ignore[union-attr]
                raise AssertionError(f"coordinator exited: {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
            try:
                return json.loads((self.home / "cluster.json").read_text())["pid"] == pid
            except (OSError, ValueError, KeyError):
                return False

        wait_for(ready, timeout=timeout, what="the coordinator to write cluster.json")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, cluster.json stays behind."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def client_process(processes: Processes, home: Path, *args: str) -> tuple[subprocess.Popen[str],
                                                                        dict[str, Any]]:
    """A `tests.coordinator._client` process; returns it and the JSON line it prints once its
    session holds what it was asked to hold."""
    (client,) = client_processes(processes, home, list(args))
    return client


def client_processes(processes: Processes, home: Path, *arg_lists: list[str]
                     ) -> list[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """Several client processes started at once (interpreter start-up is the slow part)."""
    procs = [processes.python("-m", "tests.coordinator._client", *args, env=tq_env(home),
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for args in arg_lists]
    out = []
    for proc in procs:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"client failed: {proc.stderr.read()}")  # type: ignore[union-attr]
        out.append((proc, json.loads(line)))
    return out
