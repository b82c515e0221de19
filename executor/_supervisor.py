"""Supervising the query processes of one executor (DESIGN §6): start them, deliver their output
line by line, report how they ended, kill them. The asyncio shell of the agent's process
handling; it owns one monitor task per process and waits for each before it forgets it.

    supervisor = Supervisor(work_root=data / "work", sink=forwarder, on_exit=report)
    running = await supervisor.spawn(spec, artifact.program)
    ...
    code = await supervisor.kill(spec.key)      # SIGTERM to the group, SIGKILL after grace
    await supervisor.close()                    # kill_all, then wait for every monitor

Per process, the monitor:
1. pumps stdout and stderr through a LineSplitter into `sink(LogLine)`, awaiting the sink, so
   a slow sink slows the child's writes (the pipe fills) instead of growing a buffer here;
2. waits for the main process to exit, then terminates what is left of its process group
   (nothing may outlive the query's main process);
3. drains the pipes to EOF (bounded by `drain_timeout`: a grandchild that escaped the group
   with our pipe could hold it open forever), then calls `on_exit(ExitReport)` exactly once,
   after the process's last line went to the sink.

Exit codes follow subprocess: >= 0 an exit status, < 0 killed by that signal. `killed` says
the supervisor itself was asked to stop the process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import ExecFailedError, ExecutorError, ProcessExistsError, UnknownProcessError
from ._forkserver import ForkServer, zygote_environment
from ._lines import DEFAULT_MAX_LINE, LineSplitter
from ._process_groups import signal_process_group, terminate_process_group
from ._spawn import Launched, SpawnSpec, launch, read_failure

__all__ = ["ExitReport", "LogLine", "LogSink", "Running", "Supervisor"]

logger = logging.getLogger("executor")

_READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line (or one piece of an over-long line) a query process wrote."""

    query_id: int
    process: int
    stream: str               # "stdout" or "stderr"
    text: str                 # without its newline; undecodable bytes replaced (U+FFFD)
    timestamp_ms: int         # when the executor read it
    continues: bool = False   # a piece of a longer line: the next piece follows


@dataclass(frozen=True, slots=True)
class ExitReport:
    query_id: int
    process: int
    exit_code: int            # < 0: killed by that signal
    killed: bool              # the supervisor was asked to stop it (kill, shutdown)
    pid: int
    work_dir: Path
    failure: str = ""         # why it failed, in its own words (its TQ_FAILURE_FILE), or ""


LogSink = Callable[[LogLine], Awaitable[None]]
ExitCallback = Callable[[ExitReport], Awaitable[None]]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Running:
    """A supervised process."""

    launched: Launched
    started_ms: int
    killed: bool = False
    exited: asyncio.Future[ExitReport] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    monitor: asyncio.Task[None] | None = None

    @property
    def spec(self) -> SpawnSpec:
        return self.launched.spec

    @property
    def pid(self) -> int:
        return self.launched.pid

    async def wait(self) -> ExitReport:
        """The exit report, once the process ended and its last line went to the sink."""
        return await asyncio.shield(self.exited)


async def _discard(report: ExitReport) -> None:
    return None


class Supervisor:
    """The query processes of this executor, keyed by (query id, process index)."""

    def __init__(self, *, work_root: str | os.PathLike[str], sink: LogSink,
                 on_exit: ExitCallback = _discard, grace: float = 5.0,
                 drain_timeout: float = 5.0, max_line: int = DEFAULT_MAX_LINE,
                 python: str | None = None, base_env: Mapping[str, str] | None = None,
                 fork_server: bool = True) -> None:
        self.work_root = Path(work_root)
        self.sink = sink
        self.on_exit = on_exit
        self.grace = grace
        self.drain_timeout = drain_timeout
        self.max_line = LineSplitter(max_line).max_line  # refuses a useless maximum now
        self.python = python
        self.base_env = base_env
        self.fork_server = fork_server
        self._forks: ForkServer | None = None
        self._running: dict[tuple[int, int], Running] = {}
        self._starting: set[tuple[int, int]] = set()
        self._monitors: set[asyncio.Task[None]] = set()  # until each has called on_exit
        self._closing = False
        self.counters = {"lines": 0, "sink_failures": 0, "undrained": 0}

    # -- queries about what runs ----------------------------------------------------------

    def running(self) -> list[Running]:
        return list(self._running.values())

    def get(self, key: tuple[int, int]) -> Running:
        try:
            return self._running[key]
        except KeyError:
            raise UnknownProcessError(f"process {key[1]} of query {key[0]} does not run "
                                      "here") from None

    # -- start ----------------------------------------------------------------------------

    async def start(self, *, wait: bool = False) -> None:
        """Start the fork server (in the background unless `wait`). A spawn waits for it
        while it starts; if it cannot start, processes start through the launcher."""
        if not self.fork_server or self._closing:
            return
        if self._forks is None:
            base = os.environ if self.base_env is None else self.base_env
            self._forks = ForkServer(self.python or sys.executable, zygote_environment(base))
        self._forks.start()
        if wait:
            await self._forks.ready()

    @property
    def forks(self) -> ForkServer | None:
        """The fork server, when it forks for this supervisor's interpreter."""
        forks = self._forks
        if forks is None or forks.python != (self.python or sys.executable):
            return None
        return forks

    async def spawn(self, spec: SpawnSpec, program: str | os.PathLike[str]) -> Running:
        """Start and supervise process `spec.process` of a query from the unpacked artifact
        `program`. ProcessExistsError if that process runs here already; ExecFailedError if
        it cannot start."""
        key = spec.key
        if self._closing:
            raise ExecutorError("the executor is shutting down; it starts no more processes")
        if key in self._running or key in self._starting:
            raise ProcessExistsError(f"process {spec.process} of query {spec.query_id} runs "
                                     "here already")
        self._starting.add(key)
        try:
            await self.start(wait=True)  # at once when it serves, or could not start
            launched = await launch(spec, program, work_root=self.work_root,
                                    python=self.python, base_env=self.base_env,
                                    forks=self.forks)
        except ExecFailedError as exc:
            if self._closing:  # close() stopped the fork server under this start
                raise ExecutorError("the executor is shutting down; it starts no more "
                                    "processes") from exc
            raise
        finally:
            self._starting.discard(key)
        if self._closing:
            # close() ran while this one was starting: it must not outlive the supervisor.
            signal_process_group(launched.pid, signal.SIGKILL)
            await launched.exit_code()
            launched.close_pipes()
            raise ExecutorError("the executor is shutting down; it starts no more processes")
        run = Running(launched, _now_ms())
        self._running[key] = run
        run.monitor = asyncio.get_running_loop().create_task(
            self._monitor(run), name=f"supervise {spec.query_id}/{spec.process}")
        self._monitors.add(run.monitor)
        run.monitor.add_done_callback(self._monitors.discard)
        return run

    # -- stop -----------------------------------------------------------------------------

    async def kill(self, key: tuple[int, int], grace: float | None = None) -> ExitReport:
        """SIGTERM to the process group, SIGKILL to whatever is left after `grace` seconds;
        returns once the process is reported (its exit report)."""
        return await self._kill(self.get(key), grace)

    async def _kill(self, run: Running, grace: float | None) -> ExitReport:
        run.killed = True
        await terminate_process_group(run.pid, self.grace if grace is None else grace)
        return await asyncio.shield(run.exited)

    async def kill_all(self, grace: float | None = None) -> list[ExitReport]:
        """Kill every process (in parallel: one grace period in all, not one each)."""
        runs = list(self._running.values())
        return list(await asyncio.gather(*(self._kill(run, grace) for run in runs)))

    async def wait(self, key: tuple[int, int]) -> ExitReport:
        """The exit report of a process that runs now (UnknownProcessError once it has been
        reported; keep the Running handle to wait later)."""
        return await self.get(key).wait()

    async def close(self, grace: float | None = None) -> None:
        """Start nothing more, kill every process, wait for every monitor. Idempotent."""
        self._closing = True
        await self.kill_all(grace)
        await asyncio.gather(*self._monitors, return_exceptions=True)
        if self._forks is not None:
            await self._forks.close()

    # -- the monitor ----------------------------------------------------------------------

    async def _monitor(self, run: Running) -> None:
        spec = run.spec
        loop = asyncio.get_running_loop()
        pumps = [loop.create_task(self._pump(spec, run.launched.stdout, "stdout")),
                 loop.create_task(self._pump(spec, run.launched.stderr, "stderr"))]
        try:
            code = await run.launched.exit_code()
            # Whatever the main process left in its group goes with it.
            await terminate_process_group(run.pid, self.grace)
            _, late = await asyncio.wait(pumps, timeout=self.drain_timeout)
            if late:
                run.launched.close_pipes()
                self.counters["undrained"] += 1
                logger.warning("query %s process %s: output still open %ss after exit (a "
                               "process left the group with it); stopped reading",
                               spec.query_id, spec.process, self.drain_timeout)
        except BaseException:
            # Cancelled (the loop is going away): nobody waiting on this process may hang.
            self._running.pop(spec.key, None)
            run.exited.cancel()
            raise
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        failure = "" if code == 0 or run.killed else read_failure(run.launched.work_dir)
        report = ExitReport(spec.query_id, spec.process, code, run.killed, run.pid,
                            run.launched.work_dir, failure)
        del self._running[spec.key]
        run.exited.set_result(report)
        try:
            await self.on_exit(report)
        except Exception:
            # The report callback is the agent's; a bug there must not leave this process
            # looking alive. Logged with its traceback, not hidden.
            logger.exception("on_exit failed for query %s process %s", spec.query_id,
                             spec.process)

    async def _pump(self, spec: SpawnSpec, stream: asyncio.StreamReader, name: str) -> None:
        splitter = LineSplitter(self.max_line)
        delivering = True
        while True:
            data = await stream.read(_READ_CHUNK)
            pieces = splitter.feed(data) if data else splitter.close()
            if delivering:
                delivering = await self._deliver(spec, name, pieces)
            if not data:
                return

    async def _deliver(self, spec: SpawnSpec, name: str,
                       pieces: list[tuple[bytes, bool]]) -> bool:
        now = _now_ms()
        try:
            for line, continues in pieces:
                await self.sink(LogLine(spec.query_id, spec.process, name,
                                        line.decode("utf-8", errors="replace"), now, continues))
                self.counters["lines"] += 1
        except Exception:
            # A failing sink must not wedge the query on a full pipe: keep draining, deliver
            # nothing more from this stream, and say so loudly once.
            self.counters["sink_failures"] += 1
            logger.exception("log sink failed for query %s process %s %s; its further output "
                             "is discarded", spec.query_id, spec.process, name)
            return False
        return True
