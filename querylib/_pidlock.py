"""A lock file a process holds for as long as it runs, with its pid and command line written in
it, so that a process refused the lock can name the one holding it: `tq up` and `tq coordinator`
hold `$TQ_HOME/cluster.lock` (whose cluster.json it is) and their data directories.

    lock = PidLock(path)                 # $TQ_HOME/cluster.lock, say
    if not lock.acquire():
        raise SomeUserError(f"... held by {lock.holder()}")
    ...
    lock.release()

    lock = hold_data_dir(data)           # <data>/tq.lock, or DataDirInUseError naming the holder

An flock belongs to the open file: it ends with the process however the process ends (SIGKILL
too), so a lock left by a killed process is simply taken; and the descriptor is close-on-exec,
so the processes tq starts do not inherit it.

Must not: remove the file (another process may be about to lock it), wait for a lock, or
open the file through a symbolic link (StorageError says so).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
from pathlib import Path

from querylib.errors import DataDirInUseError, StorageError

__all__ = ["PidLock", "hold_data_dir"]

_MAX_BYTES = 4096


class PidLock:
    """An exclusive, non-blocking flock on one file, with our pid and command line in it."""

    FILE = "tq.lock"  # the name used inside a data directory

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock and write who we are into the file; False if another holds it."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            # Not through a link: one planted in a folder others can write would make us
            # truncate the file it points to and write our pid into it.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                         0o600)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise StorageError(f"lock file {self.path} is a symbolic link; remove it (tq "
                               "makes its own)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps({"pid": os.getpid(), "command": _command()}) + "\n").encode())
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # releases the flock; the file stays (see the module's docstring)

    def holder_pid(self) -> int | None:
        """The pid the holder wrote, if it could be read."""
        pid = self._read().get("pid")
        return pid if isinstance(pid, int) and pid > 0 else None

    def holder(self) -> str:
        """The process holding the lock, for a message: `process 123 (tq up --data d)`."""
        found = self._read()
        pid, command = found.get("pid"), found.get("command")
        if not isinstance(pid, int):
            return "another process"
        return f"process {pid}" + (f" ({command})" if isinstance(command, str) and command
                                   else "")

    def _read(self) -> dict[str, object]:
        try:
            with open(self.path, "rb") as f:
                raw = json.loads(f.read(_MAX_BYTES))
        except (OSError, ValueError):  # gone, unreadable, or being written this instant
            return {}
        return raw if isinstance(raw, dict) else {}

    def __enter__(self) -> PidLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold_data_dir(path: str | os.PathLike[str]) -> PidLock:
    """Lock a server's data directory (`<path>/tq.lock`, our pid in it) for as long as the
    server runs; DataDirInUseError naming the holder when another process has it."""
    lock = PidLock(Path(path) / PidLock.FILE)
    if lock.acquire():
        return lock
    raise DataDirInUseError(f"data directory {path} is in use by {lock.holder()}; stop that "
                            "process, or choose another --data")


def _command() -> str:
    """How a user would recognise this process: `tq up --data d` rather than python's argv."""
    argv = list(sys.argv)
    if argv and (argv[0].endswith(("/tq", "querylib/cli/__main__.py")) or argv[0] == "-m"):
        argv[0] = "tq"
    text = " ".join(argv)
    return text if len(text) <= 200 else text[:197] + "..."
