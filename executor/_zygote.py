"""The fork server's program: import what every query imports once, then fork a query process
per request. Run through the launcher (so the executor's death kills it) as
`python _zygote.py SOCKFD`; it talks to the executor (`_forkserver.py`) over that Unix
SOCK_SEQPACKET socket, one JSON message per packet:

    executor -> zygote   {"id": n, "entry": path, "args": [...], "cwd": dir, "env": {...}}
                         with four descriptors (SCM_RIGHTS): stdin, stdout, stderr, errfd
    zygote -> executor   {"ready": pid}                      once, after the imports
                         {"id": n, "pid": pid} | {"id": n, "error": reason}
                         {"exit": pid, "code": c}            c < 0: killed by signal -c

A forked child becomes what `_launcher.py` + exec would have made: the leader of a new session
and process group, killed (PR_SET_PDEATHSIG) when the zygote dies (which dies with the
executor), stdin/stdout/stderr on the given descriptors, in its work directory, with its
environment, `sys.argv` and `sys.path[0]` those of `python ENTRY ARGS`, unbuffered output,
and ENTRY run as `__main__`. It closes errfd once it is set up (the executor reads EOF there:
started) or writes the reason it could not be.

What differs from a fresh interpreter, and why it is acceptable: the modules imported here are
already imported (a program's own module of the same name as one of them is not seen), the
hash seed is the zygote's (as PYTHONHASHSEED would make it), and variables read only at
interpreter start (PYTHON*, LD_*) are the zygote's: the executor forks only processes whose
environment, apart from TQ_*, is the one the zygote started with.

Single-threaded by design (fork is safe only so); it refuses to serve if an import started a
thread.

It is also the runner of every query process: `python _zygote.py --run ENTRY ARGS...` (the
launcher's path) runs ENTRY exactly as a forked child does, so an uncaught exception is
handled the same way on both paths: its traceback is printed without tq's frames, and one
line saying why (type, message, the program's own file:line) goes to $TQ_FAILURE_FILE for the
executor to report with the exit code (DESIGN §6 "Why a query failed").
"""

import ctypes
import json
import os
import select
import signal
import socket
import sys
import sysconfig
import traceback

_PR_SET_PDEATHSIG = 1
_MAX_REQUEST = 1 << 20
# What queries import (to register, then to publish and subscribe): once here, not per process.
PRELOAD = ("querylib.api._runner", "querylib.api._context", "querylib.api._runtime",
           "querylib.cluster", "querylib.api._publisher", "querylib.api._subscription",
           "querylib.api.serdes", "querylib.broker._blocking", "querylib.records",
           "cloudpickle", "setproctitle")


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[1]))
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass  # a query imports it itself (and reports the error) if it needs it
    import threading

    if threading.active_count() != 1:
        _send(sock, {"error": "an import started a thread: forking is unsafe"})
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to be woken: reaped below
    zygote = os.getpid()
    _send(sock, {"ready": zygote})
    while True:
        watched: list[socket.socket | int] = [sock, wake_r]
        readable, _, _ = select.select(watched, [], [])
        if wake_r in readable:
            while _drain(wake_r):
                pass
            _reap(sock)
        if sock in readable:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 4)
            if not msg:
                return  # the executor closed: our children die with us (death signal)
            request = json.loads(msg)
            try:
                pid = os.fork()
            except OSError as exc:
                _send(sock, {"id": request["id"], "error": f"fork: {exc.strerror or exc}"})
                pid = -1
            if pid == 0:
                try:
                    # The socket object, not its number: left open, the object would
                    # close that number at the child's exit, whatever the child opened there
                    # since (a zmq eventfd: its context aborts).
                    sock.close()
                    _become(request, fds, zygote, [wake_r, wake_w])
                except BaseException:  # never a second zygote: whatever went wrong, go
                    os._exit(127)
                _run(request["entry"])  # never returns
            for fd in fds:
                os.close(fd)
            if pid > 0:
                _send(sock, {"id": request["id"], "pid": pid})


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except (BrokenPipeError, ConnectionResetError):
        sys.exit(0)  # the executor is gone: so are we (and our children, by their signal)


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _become(request: dict, fds: list[int], zygote: int, inherited: list[int]) -> None:
    """In the child: what the launcher and exec would have set up."""
    stdin, stdout, stderr, errfd = fds
    try:
        os.setsid()
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != zygote:
            raise OSError(0, "the executor's fork server exited before the process started")
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        # `tq query 12 clicks 1/2` in ps, not the zygote's command line. Before the environment
        # changes: setproctitle finds the space it may use from the process's first one.
        from querylib.api._env import set_process_title

        set_process_title(request["env"])
        os.environ.clear()
        os.environ.update(request["env"])
        _fresh_std_streams()
        entry = request["entry"]
        sys.argv = [entry, *request["args"]]
        sys.path[0] = os.path.dirname(entry)
        import importlib

        importlib.invalidate_caches()
    except Exception as exc:  # the executor reads the reason as an exec failure's
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        os.write(errfd, (reason or type(exc).__name__).encode(errors="replace"))
        os._exit(127)
    os.close(errfd)  # EOF: started


def _fresh_std_streams() -> None:
    """Text streams on the new descriptors, unbuffered as PYTHONUNBUFFERED=1 (which every
    query process has, so every forked one) makes them."""
    import io

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(  # type: ignore[misc]  # Final in typeshed
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=sys.stdin.encoding,
        errors=sys.stdin.errors)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding,
                                  errors=old.errors, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run(entry: str) -> None:
    """Run `entry` as `__main__`, as `python entry` does, then exit as it would; an uncaught
    exception prints its traceback without tq's frames and is reported (`_report`)."""
    import types

    module = types.ModuleType("__main__")
    module.__file__ = entry
    vars(module).update(__cached__=None, __builtins__=__builtins__)
    sys.modules["__main__"] = module
    try:
        with open(entry, "rb") as source:
            code = compile(source.read(), entry, "exec")
        exec(code, module.__dict__)
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            record_failure(" ".join(str(exc.code).split())[:_MAX_FAILURE])  # sys.exit("why")
        raise
    except BaseException as exc:
        _report(exc, entry)
        if isinstance(exc, KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)
    sys.exit(0)


def run_program(argv: list[str]) -> None:
    """`python _zygote.py --run ENTRY ARGS...` (the launcher's path, when no fork serves):
    what a forked child does after `_become`, so both paths fail the same way."""
    entry = os.path.abspath(argv[0])
    sys.argv = [entry, *argv[1:]]
    sys.path[0] = os.path.dirname(entry)
    _run(entry)


# -- failures (DESIGN §6 "Why a query failed") ------------------------------------------------
# An uncaught exception of the program is printed as Python prints it, minus tq's own frames,
# and summed up in one line written to $TQ_FAILURE_FILE (set by the executor; the first writer
# wins), which the executor reads when the process exits and sends with its exit code.

_TQ_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name)
                 + os.sep for name in ("querylib", "executor", "catalog", "coordinator"))
_MAX_FAILURE = 1000  # characters of the one-line summary


def _is_tq(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_TQ_DIRS)


def _is_library(filename: str) -> bool:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    path = os.path.abspath(filename)
    return filename.startswith("<frozen ") or any(
        path.startswith(os.path.join(root, "")) for root in roots)


def _without_tq(tb: traceback.TracebackException) -> None:
    """Drop tq's frames from `tb` and the exceptions it chains to, in place."""
    seen: set[int] = set()
    todo = [tb]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        kept = [f for f in current.stack if not _is_tq(f.filename)]
        current.stack = traceback.StackSummary.from_list(kept)
        todo += [t for t in (current.__cause__, current.__context__) if t is not None]


def describe_failure(exc: BaseException, entry: str) -> str:
    """One line: the exception's type and message, and the program's own innermost frame
    (file:line, relative to the program's directory), tq's and libraries' frames left out."""
    kind = type(exc).__name__
    if isinstance(exc, SyntaxError):
        message = exc.msg or ""
        where: tuple[str, int, str] | None = (exc.filename or "?", exc.lineno or 0, "")
    else:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _is_tq(f.filename)]
        own = [f for f in frames if not _is_library(f.filename)] or frames
        where = (own[-1].filename, own[-1].lineno or 0, own[-1].name) if own else None
    text = f"{kind}: {message}" if message else kind
    if where is not None:
        filename, line, function = where
        home = os.path.join(os.path.dirname(entry), "")
        if os.path.abspath(filename).startswith(home):
            filename = os.path.abspath(filename)[len(home):]
        text += f" (at {filename}:{line}" + (f" in {function})" if function and
                                               function != "<module>" else ")")
    return text[:_MAX_FAILURE]


def record_failure(line: str) -> None:
    """Write `line` to $TQ_FAILURE_FILE unless a failure was recorded already."""
    path = os.environ.get("TQ_FAILURE_FILE")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return  # the first failure is the one that counts
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as out:
        out.write(line)


def _report(exc: BaseException, entry: str) -> None:
    record_failure(describe_failure(exc, entry))
    tb = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _without_tq(tb)
    sys.stderr.write("".join(tb.format()))
    sys.stderr.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run_program(sys.argv[2:])
    else:
        main(sys.argv)
