"""Small state files replaced whole, durably: cluster.json, an executor's broker.id,
broker.session, broker.endpoints and cluster.namespace, a joined host's coordinator.json, the
coordinator's namespace, a Kafka listener's .tq-kafka.json, and beside a partition's segments
its topic.json, cohorts.json, recovery-point-offset-checkpoint, log-start-offset-checkpoint,
leader-epoch-checkpoint and <base>.damage.

    replace_file(path, data)             # the old content or the new one, never a mix

The new content goes to a temporary file beside `path` with a name of its own (the pid and
random bytes), made new (O_CREAT | O_EXCL | O_NOFOLLOW): two writers of two files of one
folder, or of one file, never share it, and a link planted in the folder is never followed.
It is fsynced, renamed over `path` and the folder fsynced, so a power loss leaves the old file
or the new one, neither empty nor half written. A failed write removes its temporary file.

Must not: read, lock, or decide what a file holds. Files appended to in place (a partition
log's segments and indexes) are not replaced here; nor is the transaction history, a cache
written without fsync on purpose (`querylib.server.broker._txn_index`).
"""

from __future__ import annotations

import os
import secrets

__all__ = ["fsync_dir", "replace_file"]


def replace_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace the file at `path` by one holding `data` (created with `mode`), atomically and
    durably (see the module docstring); OSError as the OS said it."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(folder or ".")


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Force a folder's entries (a rename into it) to disk."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
