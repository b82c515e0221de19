"""The cluster secret: a file of mode 0600 holding the key every RPC message is signed with.

`load_or_create_secret(path)` creates the file (and its folder, 0700) when it is missing,
atomically, so two processes starting together agree on one key; it refuses a file that group
or other may read or write, or that another user owns, as ssh does with private keys. Nor is a
secret written into a folder other users may write (other, or a group other than its owner's
own), or that belongs to another user (root aside): they could replace the file tq just wrote
(`check_secret_folder`, for credential files too). The key is the file's content with
surrounding whitespace stripped (64 hex characters when we create it), so a key written by
hand or by another tool works too; a file over 4 KiB is refused, by every reader alike, rather
than cut.

This module reads and writes that one file. It must not sign anything or touch sockets.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from querylib._state_file import fsync_dir

from ._errors import SecretFileError

__all__ = ["MIN_SECRET_BYTES", "check_secret_folder", "default_secret_path",
           "load_or_create_secret", "load_secret", "read_private_file"]

MIN_SECRET_BYTES = 16  # below 128 bits a MAC key is guessable offline
MAX_KEY_FILE_BYTES = 4096  # a key or a credential's JSON; every reader takes the same


def default_secret_path() -> Path:
    """`$TQ_HOME/secret`, where TQ_HOME defaults to ~/.tq (next to cluster.json)."""
    home = os.environ.get("TQ_HOME") or os.path.join(os.path.expanduser("~"), ".tq")
    return Path(home) / "secret"


def read_private_file(path: Path, max_bytes: int = MAX_KEY_FILE_BYTES) -> bytes:
    """The content of a key or credential file, checked as ssh checks private keys (regular,
    ours, mode 0600 or stricter, not a symlink), and whole: a longer file is refused, not cut
    (a cut key would differ from one read by a reader with another bound);
    SecretFileError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError as exc:
        raise SecretFileError(f"secret file {path} does not exist; start the coordinator "
                              "(tq up) to create it, or pass the right path") from exc
    except OSError as exc:
        raise SecretFileError(f"cannot open secret file {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        _check_mode(path, st)
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise SecretFileError(f"secret file {path} holds more than {max_bytes} bytes; a key "
                              "or credential is far shorter: pass the right file")
    return data


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """The key in the secret file at `path`; SecretFileError when missing, too open or short."""
    path = Path(path)
    key = read_private_file(path).strip()
    if len(key) < MIN_SECRET_BYTES:
        raise SecretFileError(f"secret file {path} holds {len(key)} bytes; at least "
                              f"{MIN_SECRET_BYTES} are needed (delete it to have one created)")
    return key


def load_or_create_secret(path: str | os.PathLike[str]) -> bytes:
    """The key in the secret file at `path`, creating the file with a fresh key if missing."""
    path = Path(path)
    if not path.exists():
        _create(path)
    return load_secret(path)


def _check_mode(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SecretFileError(f"secret file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise SecretFileError(
            f"secret file {path} is accessible by group/other (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}")
    getuid = getattr(os, "getuid", None)
    if getuid is not None and st.st_uid != getuid():
        raise SecretFileError(f"secret file {path} belongs to uid {st.st_uid}, not to you "
                              f"(uid {getuid()}); use your own secret file")


def check_secret_folder(path: Path) -> None:
    """Refuse (SecretFileError) to write the secret or credential file `path` into a folder
    that other users may write (other, or a group that is not its owner's own: `_own_group`),
    or that belongs to another user than us or root: whoever
    may write the folder may replace the file (even a sticky /tmp lets its owner of the name
    go first), so tq would hand out, or sign with, a key someone else chose. OpenSSH refuses
    keys in such folders (StrictModes). tq does not chmod the folder itself: it may be shared
    on purpose, and one of another user's is not ours to change."""
    folder = path.parent
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise SecretFileError(f"cannot use folder {folder} for secret file {path}: "
                              f"{exc.strerror}") from exc
    getuid = getattr(os, "getuid", None)
    if getuid is not None and st.st_uid not in (getuid(), 0):
        raise SecretFileError(f"folder {folder} belongs to uid {st.st_uid}, not to you (uid "
                              f"{getuid()}): its owner could replace secret file {path}; "
                              "write it into a folder of your own")
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and not _own_group(st)):
        raise SecretFileError(
            f"folder {folder} is writable by group/other (mode {stat.S_IMODE(st.st_mode):04o}):"
            f" another user could replace secret file {path}; run: chmod 700 {folder}, or "
            "write it elsewhere")


def _own_group(st: os.stat_result) -> bool:
    """Whether the folder's group is its owner's own (a user private group, as Debian and
    Ubuntu give each user, where umask 002 makes every new folder group-writable): named as
    its owner, its owner's primary group, no other members. Nobody else may write it then."""
    try:
        import grp
        import pwd

        owner = pwd.getpwuid(st.st_uid)
        group = grp.getgrgid(st.st_gid)
    except (ImportError, KeyError):
        return False
    return (owner.pw_gid == st.st_gid and group.gr_name == owner.pw_name
            and not group.gr_mem)


def _create(path: Path) -> None:
    """Write a fresh key to a private temp file, then link it into place.

    link() fails if `path` appeared meanwhile, so a concurrent creator's key wins and both
    processes then read the same file; no reader ever sees a half-written key. The folder is
    fsynced after, so a power loss keeps the link.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_secret_folder(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, secrets.token_hex(32).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    except OSError as exc:
        raise SecretFileError(f"cannot create secret file {path}: {exc.strerror}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    try:
        # The link (ours or a concurrent creator's) must outlive a power loss: the cluster
        # signs with this key from now on.
        fsync_dir(path.parent)
    except OSError as exc:
        raise SecretFileError(f"cannot create secret file {path}: {exc.strerror}") from exc
