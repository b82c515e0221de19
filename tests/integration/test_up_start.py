"""Starting `tq up` as a newcomer meets it (issue 14, problem 2): default ports that are taken
(7400/7401 for the coordinator and its catalog broker, 7600, 9092) move to free ones, each
endpoint printed once; a second `tq up` under the same TQ_HOME is refused, naming the running
one, and leaves its cluster.json alone; a data dir in use names the process holding it; a
cluster.json left by a killed tq up is replaced, and the restart says what it waits for."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(240)

DEFAULT_PORTS = (7400, 7401, 7600, 9092)


def _tq(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querylib.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@contextmanager
def _holding(ports: tuple[int, ...]) -> Iterator[list[int]]:
    """Listen on each of `ports` that is free; yields those we hold (the others are taken by
    someone else already: taken either way)."""
    with ExitStack() as stack:
        held = []
        for port in ports:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            sock.listen()
            held.append(port)
        yield held


class _UpDefaults(Up):
    """`tq up` with every default but those in `extra` (no --listen: the default ports), ready
    once cluster.json is its own (a killed one's may be there before)."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        self.env = tq_env(home)
        self._spawn("--slots", "1", "--grace", "2", *extra)

        def written() -> bool:
            if self.proc.poll() is not None:
                return True
            try:
                return json.loads((home / "cluster.json").read_text())["pid"] == self.proc.pid
            except (OSError, ValueError):
                return False

        wait_for(written, timeout=60, what="tq up to write cluster.json")
        assert self.proc.poll() is None, self.stderr()
        self.info = json.loads((home / "cluster.json").read_text())


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_taken_default_ports_move_to_free_ones_and_each_endpoint_is_printed_once(
        tmp_path: Path):
    with _holding(DEFAULT_PORTS) as held:
        up = _UpDefaults(tmp_path)
        try:
            info = up.info
            # A default port someone else held may be free again by now: only those we hold
            # are certainly taken.
            for field, default in (("coordinator", 7400), ("catalog_broker", 7401),
                                   ("connector", 7600), ("kafka", 9092)):
                assert info[field], info
                if default in held:
                    assert _port(info[field]) != default, info
            listed = up.tq("topics")
            assert listed.returncode == 0, listed.stderr
        finally:
            err = up.stop()
    assert "Traceback" not in err and "cannot listen" not in err, err
    for port in held:
        assert err.count(f"port {port} is taken") == 1, err
    for address in (info["coordinator"], info["catalog_broker"], info["kafka"],
                    info["connector"]):
        # Each endpoint once (not followed by a digit: 127.0.0.1:4012 is in 127.0.0.1:40123).
        assert len(re.findall(re.escape(address) + r"(?!\d)", err)) == 1, (address, err)


def test_a_named_listen_port_whose_next_port_is_taken_says_which_and_why(tmp_path: Path):
    port = free_port()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port + 1))
        blocker.listen()
        done = _tq(tq_env(tmp_path), "up", "--listen", f"tcp://127.0.0.1:{port}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"127.0.0.1:{port + 1} for the catalog broker (the coordinator's port + 1)" \
        in done.stderr


def test_a_second_up_under_the_same_home_is_refused_and_the_first_runs_on(tmp_path: Path):
    with Up(tmp_path) as first:
        written = (tmp_path / "cluster.json").read_text()
        second = _tq(first.env, "up", "--listen", f"tcp://127.0.0.1:{free_port()}",
                     "--data", str(tmp_path / "other"))
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert f"a tq cluster already runs under TQ_HOME={tmp_path}" in second.stderr
        assert f"pid {first.proc.pid}" in second.stderr
        assert first.info["coordinator"] in second.stderr
        assert "another TQ_HOME" in second.stderr
        # Its cluster.json is untouched, and the first cluster still answers through it.
        assert (tmp_path / "cluster.json").read_text() == written
        listed = first.tq("topics")
        assert listed.returncode == 0, listed.stderr


def test_tq_coordinator_under_the_home_of_a_running_up_is_refused(tmp_path: Path):
    with Up(tmp_path) as first:
        written = (tmp_path / "cluster.json").read_text()
        second = _tq(first.env, "coordinator", "--listen",
                     f"tcp://127.0.0.1:{free_port()}", "--data", str(tmp_path / "other"))
        assert second.returncode == 2, second.stderr
        assert f"pid {first.proc.pid}" in second.stderr
        assert (tmp_path / "cluster.json").read_text() == written


def test_a_data_dir_in_use_names_the_process_holding_it(tmp_path: Path):
    data = tmp_path / "data"
    with Up(tmp_path / "home", "--data", str(data)) as first:
        other_home = tmp_path / "other-home"
        second = _tq(tq_env(other_home), "up", "--listen", f"tcp://127.0.0.1:{free_port()}",
                     "--data", str(data))
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert f"data directory {data}" in second.stderr
        assert f"in use by process {first.proc.pid} (tq up " in second.stderr
        assert not (other_home / "cluster.json").exists()
        assert first.tq("topics").returncode == 0


def test_a_killed_ups_cluster_file_is_replaced_and_the_restart_says_what_it_waits_for(
        tmp_path: Path):
    listen = f"tcp://127.0.0.1:{free_port()}"
    # One broker, so one executor session whatever the cores (a shard has a session too).
    first = Up(tmp_path, "--listen", listen, "--brokers", "1")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=30)
    first.stop()
    stale = json.loads((tmp_path / "cluster.json").read_text())
    assert stale["pid"] == first.proc.pid  # left behind by the killed process
    with _UpDefaults(tmp_path, "--listen", listen) as second:
        assert second.info["pid"] == second.proc.pid != stale["pid"]
        assert second.tq("topics").returncode == 0
        # The previous run's executor session does not come back (the new agent closes it
        # and opens its own): once the recovery lease has passed, tq up says so.
        wait_for(lambda: "recovery lease over" in second.stderr(), timeout=60,
                 what="the end of the recovery lease")
        said = second.stderr()
    assert "restarted with 1 session of the previous run (1 executor)" in said, said
    assert "waiting up to 10s (the recovery lease)" in said, said
    assert "0 sessions of the previous run came back (0 executors), 1 gone" in said, said


def test_a_second_tq_broker_on_a_data_dir_names_the_first(tmp_path: Path):
    env = tq_env(tmp_path)
    data = tmp_path / "broker-data"
    port = free_port()
    first = subprocess.Popen(
        [sys.executable, "-m", "querylib.cli", "broker", "--data", str(data), "--listen",
         f"tcp://127.0.0.1:{port}"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "listening on" in first.stderr.readline()  # type: ignore[union-attr]
        second = _tq(env, "broker", "--data", str(data), "--listen",
                     f"tcp://127.0.0.1:{free_port()}", timeout=30)
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert f"data directory {data} is in use by process {first.pid} (tq broker " \
            in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=30)
        first.stderr.close()  # type: ignore[union-attr]
