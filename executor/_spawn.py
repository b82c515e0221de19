"""Starting one query process (DESIGN §6): ENTRY run as `python ENTRY ARGS...` would (through
the zygote's runner, `_zygote.py --run`, so failures are reported), in a fresh work directory,
in its own session and process group, stdin closed, stdout and stderr piped, with the TQ_*
environment the query library reads: forked by the fork server (`_forkserver.py`) when it
serves this process, else exec'ed behind the death-signal launcher (`_launcher.py`).

The environment and command are computed by pure functions (`query_environment`,
`launch_command`, `resolve_entry`); `launch` does the I/O. Supervision (reading the pipes,
waiting, killing) is `_supervisor`'s job, not this module's.

Children must not outlive their executor. On every normal path (kill, shutdown, the main
process's exit) the supervisor empties the process group with killpg. For an executor that
dies abruptly (SIGKILL, OOM killer), the launcher arms Linux's PR_SET_PDEATHSIG so the kernel
kills the query's main process; its limits are in `_launcher.py`.

Environment of a query process (every value a string):

    TQ_QUERY_ID        the query's id
    TQ_QUERY_NAME      the query's name (with the id and process index, the process's title)
    TQ_PROCESS_INDEX   this process, 0-based
    TQ_PROCESS_COUNT   how many processes the query has
    TQ_WORKERS         worker threads per process
    TQ_COORDINATOR     the coordinator's address (every one, comma-separated, with failover)
    TQ_PEERS           the query's processes' peer addresses, comma-separated, by index
    TQ_CREDENTIALS     its credential file (principal query:ID, key minted by the coordinator
                       for this query; DESIGN §12), never the cluster secret
    TQ_BROKER          this host's broker
    TQ_EXECUTOR_ID     the executor it runs on (empty if not known yet)
    TQ_WORK_DIR        its work directory (also its cwd)
    TQ_FAILURE_FILE    where the process writes one line saying why it failed (the zygote's
                       runner does for an uncaught exception; `read_failure` reads it back)
    PYTHONUNBUFFERED   1, so lines reach the log as they are printed

There is no TQ_SESSION: a query process opens its own session with its own lease, because its
liveness is not the executor's (the coordinator matches it to its placement by query id and
process index). TQ_* variables of the executor's own environment are not inherited (a stale
TQ_COORDINATOR must not leak into a query), except TQ_HOME.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ._errors import ExecFailedError

__all__ = ["Forks", "Launched", "SpawnSpec", "exec_result", "launch", "launch_command",
           "make_work_dir", "pipe_reader", "query_environment", "read_failure", "resolve_entry"]

LAUNCHER = Path(__file__).with_name("_launcher.py")
RUNNER = Path(__file__).with_name("_zygote.py")  # `--run ENTRY`: runs ENTRY as the fork would
FAILURE_FILE = ".tq-failure"
_MAX_FAILURE_BYTES = 2000
_MAX_ATTEMPTS = 10_000
_STREAM_LIMIT = 64 * 1024  # bytes buffered per pipe before reading pauses (backpressure)
# TQ_COORDINATOR_KEY: the coordinator's CURVE key (a query process reaches it as its
# executor does); TQ_RPC_CURVE: CURVE forced.
_KEPT_TQ_VARIABLES = frozenset({"TQ_HOME", "TQ_COORDINATOR_KEY", "TQ_RPC_CURVE"})


@dataclass(frozen=True)
class SpawnSpec:
    """What the coordinator asks for when it places process `process` of a query here."""

    query_id: int
    process: int                      # this process's index, 0 <= process < processes
    processes: int = 1                # how many processes the query has
    workers: int = 1                  # worker threads per process
    args: tuple[str, ...] = ()
    entry: str | None = None          # a file inside a directory artifact (else __main__.py)
    coordinator: str = ""
    peers: tuple[str, ...] = ()
    credentials: str = ""            # the process's credential file
    broker: str = ""
    executor_id: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables (TQ_* are ours)
    name: str = ""                    # the query's name (its processes' titles)

    @property
    def key(self) -> tuple[int, int]:
        return (self.query_id, self.process)


def query_environment(spec: SpawnSpec, *, base: Mapping[str, str],
                      work_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The query process's environment: `base` without its TQ_* variables, the spec's extra
    variables, then ours (which win)."""
    env = {k: v for k, v in base.items()
           if not k.startswith("TQ_") or k in _KEPT_TQ_VARIABLES}
    env.update(spec.env)
    env.update({
        "TQ_QUERY_ID": str(spec.query_id),
        "TQ_QUERY_NAME": spec.name,
        "TQ_PROCESS_INDEX": str(spec.process),
        "TQ_PROCESS_COUNT": str(spec.processes),
        "TQ_WORKERS": str(spec.workers),
        "TQ_COORDINATOR": spec.coordinator,
        "TQ_PEERS": ",".join(spec.peers),
        "TQ_CREDENTIALS": spec.credentials,
        "TQ_BROKER": spec.broker,
        "TQ_EXECUTOR_ID": "" if spec.executor_id is None else str(spec.executor_id),
        "TQ_WORK_DIR": os.fspath(work_dir),
        "TQ_FAILURE_FILE": os.path.join(os.fspath(work_dir), FAILURE_FILE),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def read_failure(work_dir: str | os.PathLike[str]) -> str:
    """The one line a process wrote to its TQ_FAILURE_FILE ("" if none), bounded."""
    try:
        with open(Path(work_dir) / FAILURE_FILE, "rb") as failure:
            data = failure.read(_MAX_FAILURE_BYTES)
    except OSError:
        return ""
    return " ".join(data.decode("utf-8", errors="replace").split())


def resolve_entry(program: str | os.PathLike[str], entry: str | None = None) -> Path:
    """The file to run inside an unpacked artifact: `entry` if named, else `__main__.py`, else
    the artifact's only top-level file. ExecFailedError when there is none, or `entry` would
    leave the artifact."""
    root = Path(program).resolve()
    if entry:
        path = (root / entry).resolve()
        if not path.is_relative_to(root):
            raise ExecFailedError(f"entry {entry!r} lies outside the program",
                                  reason="entry outside the program")
        if not path.is_file():
            raise ExecFailedError(f"the program has no file {entry!r}", reason="no such entry")
        return path
    main = root / "__main__.py"
    if main.is_file():
        return main
    top = list(root.iterdir()) if root.is_dir() else []
    if len(top) == 1 and top[0].is_file():
        return top[0]
    raise ExecFailedError("the program has no __main__.py and is not a single file: name the "
                          "entry to run", reason="no entry")


def launch_command(python: str, entry: Path, args: tuple[str, ...] | list[str], *,
                   errfd: int, parent_pid: int,
                   launcher_python: str | None = None) -> list[str]:
    """argv of the launcher that arms the death signal and execs `python entry args`."""
    return [launcher_python or sys.executable, "-I", "-S", str(LAUNCHER), str(errfd),
            str(parent_pid), "--", python, str(entry), *args]


def make_work_dir(root: str | os.PathLike[str], spec: SpawnSpec) -> tuple[Path, int]:
    """A new, empty `<root>/<query>-<process>-<n>` (n the first number not used yet), so a
    restarted process never sees an earlier attempt's files."""
    root = Path(root)
    prefix = f"{spec.query_id}-{spec.process}-"
    try:
        root.mkdir(parents=True, exist_ok=True)
        used = [int(p.name[len(prefix):]) for p in root.iterdir()
                if p.name.startswith(prefix) and p.name[len(prefix):].isdigit()]
        n = max(used, default=-1) + 1
        for attempt in range(n, n + _MAX_ATTEMPTS):
            path = root / f"{prefix}{attempt}"
            try:
                path.mkdir()
            except FileExistsError:
                continue  # a concurrent spawn took it
            return path, attempt
    except OSError as exc:
        raise ExecFailedError(f"cannot create a work directory under {root}: {exc.strerror}",
                              reason=f"work directory: {exc.strerror}") from exc
    raise ExecFailedError(f"no free work directory name under {root}",
                          reason="work directory names exhausted")


class _ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stream protocol of `create_subprocess_exec`, plus a future resolved with the exit
    code when the process itself exits. `Process.wait()` (Python 3.11) returns only once every
    pipe is closed too, which a grandchild holding stdout can put off forever."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[int] = loop.create_future()
        self._process: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._process = transport
        super().connection_made(transport)

    def process_exited(self) -> None:
        assert self._process is not None
        code = self._process.get_returncode()
        super().process_exited()  # (forgets the transport)
        if not self.exited.done():
            assert code is not None
            self.exited.set_result(code)


@dataclass
class Launched:
    """A started query process: the leader of its own session and process group, with its
    stdout and stderr pipes. Started through the launcher (exec'ed: same pid) or forked by
    the fork server (`_forkserver.py`)."""

    spec: SpawnSpec
    pid: int
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    exited: asyncio.Future[int]       # its exit code once it exited (< 0: killed by signal)
    close_pipes: Callable[[], None]   # drop our ends of its pipes
    work_dir: Path
    attempt: int
    argv: list[str]

    async def exit_code(self) -> int:
        """Wait for the process (not its pipes) to exit; < 0: killed by that signal."""
        return await asyncio.shield(self.exited)


class Forks(Protocol):
    """What `launch` needs of a fork server (`_forkserver.ForkServer`)."""

    async def spawn(self, spec: SpawnSpec, entry: Path, work_dir: Path, attempt: int,
                    env: Mapping[str, str], timeout: float = ...) -> Launched | None: ...


async def launch(spec: SpawnSpec, program: str | os.PathLike[str], *,
                 work_root: str | os.PathLike[str], python: str | None = None,
                 base_env: Mapping[str, str] | None = None,
                 start_timeout: float = 30.0, forks: Forks | None = None) -> Launched:
    """Start process `spec.process` of a query from the unpacked artifact `program`; returns
    once it runs the program (forked by `forks` when that serves this process, else exec'ed
    through the launcher). ExecFailedError (with the reason) if it cannot be.

    Call it from the thread that lives as long as the executor (the event loop's): the death
    signal fires when the *thread* that forked the child ends."""
    entry = resolve_entry(program, spec.entry)
    work_dir, attempt = make_work_dir(work_root, spec)
    env = query_environment(spec, base=os.environ if base_env is None else base_env,
                            work_dir=work_dir)
    if forks is not None:
        forked = await forks.spawn(spec, entry, work_dir, attempt, env, start_timeout)
        if forked is not None:
            return forked
    read_fd, write_fd = os.pipe()
    argv = launch_command(python or sys.executable, RUNNER, ["--run", str(entry), *spec.args],
                          errfd=write_fd, parent_pid=os.getpid())
    try:
        loop = asyncio.get_running_loop()
        try:
            # What create_subprocess_exec does, with a protocol that also reports the exit.
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitAwareProtocol(_STREAM_LIMIT, loop), *argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=work_dir, env=env,
                start_new_session=True, pass_fds=(write_fd,))
            proc = asyncio.subprocess.Process(transport, protocol, loop)
        except OSError as exc:
            raise ExecFailedError(f"cannot start {argv[0]}: {exc.strerror or exc}",
                                  reason=exc.strerror or str(exc)) from exc
        finally:
            os.close(write_fd)
        try:
            failure = await exec_result(read_fd, start_timeout)
        except BaseException:
            _kill_process_group(proc)  # cancelled while starting: nobody would supervise it
            raise
    finally:
        os.close(read_fd)
    if failure is not None:
        _kill_process_group(proc)
        await proc.wait()
        raise ExecFailedError(f"cannot start process {spec.process} of query {spec.query_id}: "
                              f"{failure}", reason=failure)
    assert proc.stdout is not None and proc.stderr is not None
    return Launched(spec, proc.pid, proc.stdout, proc.stderr, protocol.exited,
                    transport.close, work_dir, attempt, argv[argv.index("--") + 1:])


def _kill_process_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def pipe_reader(fd: int) -> tuple[asyncio.StreamReader, Callable[[], None]]:
    """A StreamReader on the read end `fd` of a pipe, and its closer. Owns `fd` from the call
    on (closed here if it fails)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_STREAM_LIMIT, loop=loop)
    pipe = os.fdopen(fd, "rb", 0)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    except BaseException:
        pipe.close()
        raise
    return reader, transport.close


async def exec_result(read_fd: int, timeout: float) -> str | None:
    """None once the process started (EOF on the pipe), else the reason it wrote."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()
    chunks: list[bytes] = []
    os.set_blocking(read_fd, False)

    def readable() -> None:
        try:
            data = os.read(read_fd, 4096)
        except BlockingIOError:
            return
        if data and sum(map(len, chunks)) < 4096:
            chunks.append(data)
        elif not data and not done.done():
            done.set_result(b"".join(chunks))

    loop.add_reader(read_fd, readable)
    try:
        message = await asyncio.wait_for(done, timeout)
    except TimeoutError:
        return f"the process did not start within {timeout}s"
    finally:
        loop.remove_reader(read_fd)
    return message.decode(errors="replace") if message else None
