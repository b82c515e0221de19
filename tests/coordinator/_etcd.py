"""A real etcd process for the failover tests: 127.0.0.1 free ports, its own data dir."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for

ETCD = shutil.which("etcd")
needs_etcd = pytest.mark.skipif(ETCD is None, reason="etcd not installed (Debian etcd-server)")


def _healthy(port: int) -> bool:
    """etcd's /health says true: it listens and has a leader (it accepts connections before
    that, and a client's first request may then wait out its deadline)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return json.loads(reply.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


@contextmanager
def etcd_server(data: Path) -> Iterator[str]:
    """Start one etcd member; yields its client address (HOST:PORT); stops it after."""
    assert ETCD is not None
    client, peer = free_port(), free_port()
    log = (data.parent / f"{data.name}.log").open("wb")
    process = subprocess.Popen(
        [ETCD, "--name", "tq-test", "--data-dir", str(data),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"tq-test=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or _healthy(client), timeout=60,
                 interval=0.05, what="etcd healthy")
        assert process.poll() is None, (data.parent / f"{data.name}.log").read_text()
        yield f"127.0.0.1:{client}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
