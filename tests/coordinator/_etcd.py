"""A real etcd process for the failover tests: free ports on 127.0.0.1 (or an address of a
network namespace, tests/_netns.py), its own data dir."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for

ETCD = shutil.which("etcd")
needs_etcd = pytest.mark.skipif(ETCD is None, reason="etcd not installed (Debian etcd-server)")


_PROBE = ("import json, sys, urllib.request\n"
          "with urllib.request.urlopen(sys.argv[1], timeout=2) as reply:\n"
          "    sys.exit(json.loads(reply.read()).get('health') != 'true')\n")


def _healthy(url: str, wrap: Sequence[str]) -> bool:
    """etcd's /health says true: it listens and has a leader (it accepts connections before
    that, and a client's first request may then wait out its deadline). With `wrap` (a
    command prefix such as `ip netns exec NS`), asked from where etcd runs."""
    if wrap:
        try:
            return subprocess.run([*wrap, sys.executable, "-c", _PROBE, url],
                                  capture_output=True, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.loads(reply.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


@contextmanager
def etcd_server(data: Path, *, host: str = "127.0.0.1",
                wrap: Sequence[str] = ()) -> Iterator[str]:
    """Start one etcd member listening on `host`, its command prefixed with `wrap` (e.g.
    `ip netns exec NS`, which execs etcd: the process stopped is etcd itself); yields its
    client address (HOST:PORT); stops it after."""
    assert ETCD is not None
    client, peer = free_port(), free_port()
    log = (data.parent / f"{data.name}.log").open("wb")
    process = subprocess.Popen(
        [*wrap, ETCD, "--name", "tq-test", "--data-dir", str(data),
         "--listen-client-urls", f"http://{host}:{client}",
         "--advertise-client-urls", f"http://{host}:{client}",
         "--listen-peer-urls", f"http://{host}:{peer}",
         "--initial-advertise-peer-urls", f"http://{host}:{peer}",
         "--initial-cluster", f"tq-test=http://{host}:{peer}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        health = f"http://{host}:{client}/health"
        wait_for(lambda: process.poll() is not None or _healthy(health, wrap), timeout=60,
                 interval=0.05, what="etcd healthy")
        assert process.poll() is None, (data.parent / f"{data.name}.log").read_text()
        yield f"{host}:{client}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
