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
"""

import ctypes
import json
import os
import select
import signal
import socket
import sys

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
        readable, _, _ = select.select([sock, wake_r], [], [])
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
                    _become(request, fds, zygote, [sock.fileno(), wake_r, wake_w])
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

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=sys.stdin.encoding,
        errors=sys.stdin.errors)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding,
                                  errors=old.errors, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run(entry: str) -> None:
    """Run `entry` as `__main__`, as `python entry` does, then exit as it would."""
    import types

    module = types.ModuleType("__main__")
    module.__file__ = entry
    module.__cached__ = None
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    try:
        with open(entry, "rb") as source:
            code = compile(source.read(), entry, "exec")
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != entry:
            tb = tb.tb_next
        exc.with_traceback(tb or exc.__traceback__)  # the program's frames, not ours
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv)
