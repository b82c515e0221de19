"""A `tq executor` child that says on a pipe when it is ready: tq up's executor
(querylib/cli/_up_executor.py) and an executor's broker shards (`_shard.py`).

    proc, fields = await start_ready_child(["--shard", "1", ...], "broker shard 1")

The child gets `--parent-pid` (it dies with this process: querylib._parent) and
`--ready-fd N`, writes one JSON line there once ready and closes it. EOF with no line means
it exited first: ExecutorExitedError names how (`exit_text`) and carries its code.

Must not: decide what to do when a ready child exits later (its owner does).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import ExecutorExitedError

__all__ = ["exit_text", "start_ready_child"]

_STOP_DEADLINE = 10.0  # seconds a child that failed its start has after SIGTERM


async def start_ready_child(argv: Sequence[str], what: str
                            ) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    """Start `tq executor *argv` and wait for its ready line: the process and the line's
    fields. Raises ExecutorExitedError when it exits before; stops it on any failure."""
    read_fd, write_fd = os.pipe()
    try:
        # On the loop's thread (create_subprocess_exec forks there): the child's death signal
        # fires when this thread dies.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "querylib.cli", "executor", *argv,
            "--parent-pid", str(os.getpid()), "--ready-fd", str(write_fd),
            pass_fds=(write_fd,), stdin=asyncio.subprocess.DEVNULL)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    try:
        line = await asyncio.to_thread(_read_all, read_fd)  # EOF: ready, or gone
        if not line.strip():
            code = await proc.wait()
            raise ExecutorExitedError(f"{what} (pid {proc.pid}) {exit_text(code)} before it "
                                      "was ready", code if code > 0 else 1)
        return proc, json.loads(line)
    except BaseException:
        if proc.returncode is None:  # cancelled, or a line that is not ours: stop it
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), _STOP_DEADLINE)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        raise


def exit_text(code: int) -> str:
    """How a child ended, from its return code: "exited with code 3", "was killed by
    SIGKILL"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _read_all(fd: int) -> str:
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read().decode()
