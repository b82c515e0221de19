"""Children never outlive their executor: an executor-like parent process is SIGKILLed (no
cleanup runs) and its query process, which ignores SIGTERM and SIGHUP, dies with it through
PR_SET_PDEATHSIG armed by the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from executor import pack_path
from executor._spawn import LAUNCHER
from tests.conftest import wait_for
from tests.executor._support import alive, write_program
from tests.integration._broker_helpers import Lines

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux only")

STUBBORN = """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        time.sleep(1)
"""


def test_sigkill_of_the_parent_leaves_no_orphan(processes, tmp_path):
    from executor import ArtifactCache

    src = write_program(tmp_path / "src" / "job.py", STUBBORN)
    artifact = ArtifactCache(tmp_path / "artifacts").install(pack_path(src, max_bytes=1 << 20))
    parent = processes.python("-m", "tests.executor._parent", str(artifact.program),
                              str(tmp_path / "work"), stdout=subprocess.PIPE, text=True)
    out = Lines(parent)
    (started,) = out.wait("child")
    child = started["child"]
    out.wait("line")
    assert [item["line"] for item in out.having("line")] == ["ready"]
    assert alive(child) and os.getsid(child) == child  # its own session, not the parent's
    try:
        os.kill(parent.pid, signal.SIGKILL)
        assert parent.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: not alive(child), timeout=20, what="the orphaned child to die")
    finally:
        if alive(child):
            os.killpg(child, signal.SIGKILL)


def test_the_launcher_does_not_start_a_program_once_its_parent_is_gone():
    read_fd, write_fd = os.pipe()
    try:
        # PARENT_PID 1 is not our pid: the launcher behaves as if the executor had died.
        proc = subprocess.run([sys.executable, "-I", "-S", str(LAUNCHER), str(write_fd), "1",
                               "--", "/bin/sh", "-c", "echo started"], pass_fds=(write_fd,),
                              capture_output=True, text=True, timeout=30)
        os.close(write_fd)
        write_fd = -1
        message = os.read(read_fd, 4096).decode()
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    assert proc.returncode == 126 and proc.stdout == ""
    assert "exited before the process started" in message
