"""The fork server (DESIGN §6): one pre-imported Python per executor (`_zygote.py`) forks query
processes, so a process starts without an interpreter start and the imports every query makes
(~170 ms of CPU each; 4 processes on 2 cores ~0.35 s of a submit).

    forks = ForkServer(python, env)
    forks.start()                       # in the background; `await forks.ready()` to wait
    launched = await forks.spawn(spec, entry, work_dir, attempt, env)   # None: not ready
    await forks.close()

A process is forked only when the zygote runs and the process's environment, apart from TQ_*,
is the one the zygote started with (variables read at interpreter start must match); anything
else goes through the launcher as before (`_spawn.launch` decides). The zygote runs behind the
launcher, so the executor's death kills it, and its death kills its children (their death
signal). If it dies, its processes are reported killed (SIGKILL, which is what befell them)
and it is restarted for later spawns, a few times at most.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import ExecFailedError
from ._spawn import (
    Launched,
    SpawnSpec,
    exec_result,
    launch_command,
    pipe_reader,
    query_environment,
)

__all__ = ["ForkServer", "ZYGOTE", "startup_env", "zygote_environment"]

logger = logging.getLogger("executor")

ZYGOTE = Path(__file__).with_name("_zygote.py")
_MAX_STARTS = 5
_MAX_MESSAGE = 64 * 1024


def zygote_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The zygote's environment: a query process's from `base`, without its TQ_* variables."""
    return startup_env(query_environment(SpawnSpec(query_id=0, process=0), base=base,
                                         work_dir=""))


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment a forked process inherits from the zygote's start."""
    return {k: v for k, v in env.items() if not k.startswith("TQ_")}


class ForkServer:
    """Forks query processes from a zygote started with interpreter `python` and `env`."""

    def __init__(self, python: str, env: Mapping[str, str], *,
                 start_timeout: float = 60.0) -> None:
        self.python = python
        self.env = dict(env)
        self.start_timeout = start_timeout
        self.pid: int | None = None
        self.counters = {"starts": 0, "forked": 0, "deaths": 0}
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Task[bool] | None = None
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._ids = itertools.count()
        self._lock = asyncio.Lock()
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the zygote in the background (again, if it died) unless it runs or is
        starting, or has been started too often."""
        if self._closed or self._sock is not None or self.counters["starts"] >= _MAX_STARTS:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.get_running_loop().create_task(
                self._start(), name="executor fork server")

    async def ready(self) -> bool:
        """Wait until the zygote serves (True) or failed to start (False)."""
        self.start()
        if self._starting is not None:
            await asyncio.shield(self._starting)
        return self.pid is not None

    def can_fork(self, env: Mapping[str, str]) -> bool:
        return self.pid is not None and startup_env(env) == startup_env(self.env)

    async def _start(self) -> bool:
        self.counters["starts"] += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_fd, write_fd = os.pipe()
        argv = launch_command(self.python, ZYGOTE, [str(theirs.fileno())], errfd=write_fd,
                              parent_pid=os.getpid())
        proc = None
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    env=self.env, start_new_session=True, pass_fds=(write_fd, theirs.fileno()))
            finally:
                os.close(write_fd)
                theirs.close()
            failure = await exec_result(read_fd, self.start_timeout)
            if failure is None:
                failure = await self._hello(ours, proc)
        except OSError as exc:
            failure = exc.strerror or str(exc)
        except BaseException:  # cancelled (closing): leave nothing behind
            await self._abandon(ours, proc)
            raise
        finally:
            os.close(read_fd)
        if failure is not None:
            logger.warning("the fork server did not start (%s): query processes start "
                           "through the launcher", failure)
            await self._abandon(ours, proc)
            return False
        return True

    async def _abandon(self, sock: socket.socket, proc: asyncio.subprocess.Process | None
                       ) -> None:
        """A zygote that did not start: close its socket, reap it."""
        await self._gone()
        sock.close()
        await _reap(proc)

    async def _hello(self, sock: socket.socket, proc: asyncio.subprocess.Process) -> str | None:
        """Serve `sock` from now on; None once the zygote says it is ready, else why not."""
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        hello: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._replies[-1] = hello
        self._sock, self._proc = sock, proc
        loop.add_reader(sock.fileno(), self._readable)
        try:
            message = await asyncio.wait_for(hello, self.start_timeout)
        except (TimeoutError, ExecFailedError) as exc:
            return str(exc) or "no answer"
        self.pid = message.get("ready")
        return message.get("error")

    async def close(self) -> None:
        """Stop the zygote (its processes should have been stopped first). Idempotent."""
        self._closed = True
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        await self._gone()

    async def _gone(self) -> None:
        """The zygote is gone or must go: fail what waits on it, reap it."""
        sock, proc = self._sock, self._proc
        self._sock = self._proc = None
        self.pid = None
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(ExecFailedError("the executor's fork server exited",
                                                    reason="fork server exited"))
        self._replies.clear()
        for exited in self._exits.values():
            if not exited.done():
                exited.set_result(-signal.SIGKILL)  # its death signal killed them
        self._exits.clear()
        await _reap(proc)

    # -- messages -------------------------------------------------------------------------

    def _readable(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.counters["deaths"] += not self._closed
                loop = asyncio.get_running_loop()
                loop.remove_reader(sock.fileno())  # once: EOF stays readable
                loop.create_task(self._died())
                return
            self._dispatch(json.loads(data))

    async def _died(self) -> None:
        await self._gone()
        if not self._closed:
            logger.warning("the fork server exited; starting another")
            self.start()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "exit" in message:
            exited = self._exits.pop(message["exit"], None)
            if exited is not None and not exited.done():
                exited.set_result(int(message["code"]))
            return
        if "pid" in message:  # before anything else can arrive about that pid
            message["exited"] = self._exits[message["pid"]] = \
                asyncio.get_running_loop().create_future()
        reply = self._replies.pop(message.get("id", -1), None)
        if reply is not None and not reply.done():
            reply.set_result(message)
        elif "pid" in message:  # its spawn gave up waiting (cancelled, timed out): unwanted
            _kill(message["pid"])

    # -- forking --------------------------------------------------------------------------

    async def spawn(self, spec: SpawnSpec, entry: Path, work_dir: Path, attempt: int,
                    env: Mapping[str, str], timeout: float = 30.0) -> Launched | None:
        """Fork `python entry spec.args` in `work_dir` with `env`; None when the zygote does
        not serve (the caller uses the launcher). ExecFailedError if it cannot start."""
        async with self._lock:
            if not self.can_fork(env):
                return None
            return await self._fork(spec, entry, work_dir, attempt, env, timeout)

    async def _fork(self, spec: SpawnSpec, entry: Path, work_dir: Path, attempt: int,
                    env: Mapping[str, str], timeout: float) -> Launched:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started_r, started_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        ident = next(self._ids)
        reply: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._replies[ident] = reply
        request = {"id": ident, "entry": str(entry), "args": list(spec.args),
                   "cwd": str(work_dir), "env": dict(env)}
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()],
                            [devnull, out_w, err_w, started_w])
            message = await asyncio.wait_for(reply, timeout)
            if "error" in message:
                raise ExecFailedError(f"cannot start process {spec.process} of query "
                                      f"{spec.query_id}: {message['error']}",
                                      reason=message["error"])
        except BaseException:
            self._replies.pop(ident, None)
            for fd in (out_r, err_r, started_r):
                os.close(fd)
            raise
        finally:
            for fd in (devnull, out_w, err_w, started_w):
                os.close(fd)
        pid, exited = message["pid"], message["exited"]
        pipes = [out_r, err_r]  # ours to close until a reader takes one
        closers = []
        try:
            try:
                failure = await exec_result(started_r, timeout)
            finally:
                os.close(started_r)
            stdout, close_out = await pipe_reader(pipes.pop(0))
            closers.append(close_out)
            stderr, close_err = await pipe_reader(pipes.pop(0))
            closers.append(close_err)
        except BaseException:
            _kill(pid)  # cancelled while it started: nobody would supervise it
            for close in closers:
                close()
            for fd in pipes:
                os.close(fd)
            raise

        def close_pipes() -> None:
            close_out()
            close_err()

        launched = Launched(spec, pid, stdout, stderr, exited, close_pipes, work_dir, attempt,
                            [self.python, str(entry), *spec.args])
        if failure is not None:
            _kill(pid)
            await launched.exit_code()
            close_pipes()
            raise ExecFailedError(f"cannot start process {spec.process} of query "
                                  f"{spec.query_id}: {failure}", reason=failure)
        self.counters["forked"] += 1
        return launched


async def _reap(proc: asyncio.subprocess.Process | None) -> None:
    """Wait for the zygote to exit (it does once its socket closes); kill it after 5 s."""
    if proc is None or proc.returncode is not None:
        return
    try:
        await asyncio.wait_for(proc.wait(), 5.0)
    except TimeoutError:
        proc.kill()
        await proc.wait()


def _kill(pid: int) -> None:
    """SIGKILL a forked child and its group (it may not have made its group yet; the zygote
    reaps it, so the pid is not reused before its exit is reported)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
