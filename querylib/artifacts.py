"""Program packs: a file or a directory as one deterministic tar, its content address.

A *pack* is an uncompressed POSIX (pax) tar whose bytes depend only on the program's names,
contents and executable bits: members sorted by path, mtime 0, uid/gid 0, no user or group
names, modes normalised to 0644/0755. So packing the same tree twice, on any host, gives the
same bytes and the same sha256: the artifact's content address (DESIGN §6). A single file
packs as a one-member tar named after the file. `__pycache__` directories and `*.pyc` files
are left out, so running a program does not change its address.

It lives in `querylib` because both sides need the same bytes: `tq submit` packs and uploads,
the executor (`executor._pack`) verifies and unpacks. Must not: unpack, touch a cache or the
network.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from catalog.errors import UserError

__all__ = ["PackError", "pack_bytes", "pack_path", "sha256_hex", "tree_size"]

_SKIPPED_DIRS = frozenset({"__pycache__"})
_SKIPPED_SUFFIXES = (".pyc",)
_BLOCK = 512


class PackError(UserError):
    """A path that cannot be packed (missing, special file, symlinked directory, too large,
    a backslash in a name)."""


def sha256_hex(blob: bytes | memoryview) -> str:
    """The content address of a blob: 64 lowercase hex digits."""
    return hashlib.sha256(blob).hexdigest()


def _walk(root: Path, rel: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative posix path, entry) under `root`, sorted by name at every level."""
    try:
        entries = sorted(os.scandir(root / rel if rel else root), key=lambda e: e.name)
    except OSError as exc:
        raise PackError(f"cannot list {root / rel}: {exc.strerror}") from exc
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name in _SKIPPED_DIRS:
                continue
            yield path, entry
            yield from _walk(root, path)
        elif entry.name.endswith(_SKIPPED_SUFFIXES):
            continue
        else:
            yield path, entry


def _members(path: Path) -> list[tuple[str, Path, os.stat_result]]:
    """(name in the pack, file on disk, its stat) for a file or a directory tree."""
    try:
        top = path.stat()
    except FileNotFoundError as exc:
        raise PackError(f"no such file or directory: {path}") from exc
    except OSError as exc:
        raise PackError(f"cannot read {path}: {exc.strerror}") from exc
    if stat.S_ISREG(top.st_mode):
        return [(path.name, path, top)]
    if not stat.S_ISDIR(top.st_mode):
        raise PackError(f"{path} is neither a file nor a directory")
    found = []
    for rel, entry in _walk(path):
        # A symlink to a file packs as the file's content (follow); a symlink to a directory
        # could loop and is refused; special files have no place in a program.
        if entry.is_symlink() and entry.is_dir():
            raise PackError(f"{path / rel} is a symlink to a directory; "
                                       "copy the directory instead")
        try:
            st = entry.stat()
        except OSError as exc:
            raise PackError(f"cannot read {path / rel}: {exc.strerror}") from exc
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise PackError(f"{path / rel} is not a regular file or directory")
        found.append((rel, path / rel, st))
    return found


def tree_size(path: str | os.PathLike[str]) -> int:
    """The size of the pack of `path`, give or take the pax headers (for limits)."""
    total = 2 * _BLOCK
    for _, _, st in _members(Path(path)):
        total += _BLOCK + (-(-st.st_size // _BLOCK) * _BLOCK if stat.S_ISREG(st.st_mode) else 0)
    return total


def _info(name: str, *, is_dir: bool, size: int, executable: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = 0o755 if is_dir or executable else 0o644
    info.size = 0 if is_dir else size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_path(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The deterministic pack of a file or directory; PackError when it cannot be
    packed or the pack would exceed `max_bytes`."""
    path = Path(path)
    members = _members(path)
    for name, file, _ in members:
        if "\\" in name:  # the executor refuses it as a Windows-style path: say so now
            raise PackError(f"{file} has a backslash in its name; rename it to pack it")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, file, st in members:
            is_dir = stat.S_ISDIR(st.st_mode)
            info = _info(name, is_dir=is_dir, size=st.st_size,
                         executable=bool(st.st_mode & 0o111))
            if out.tell() + _BLOCK + info.size > max_bytes:
                raise PackError(f"{path} packs to more than {max_bytes} bytes")
            if is_dir:
                tar.addfile(info)
                continue
            try:
                with open(file, "rb") as f:
                    data = f.read(info.size + 1)
            except OSError as exc:
                raise PackError(f"cannot read {file}: {exc.strerror}") from exc
            if len(data) != info.size:
                raise PackError(f"{file} changed while it was being packed")
            tar.addfile(info, io.BytesIO(data))
    blob = out.getvalue()
    if len(blob) > max_bytes:
        raise PackError(f"{path} packs to more than {max_bytes} bytes")
    return blob


def pack_bytes(name: str, data: bytes, *, executable: bool = False) -> bytes:
    """The pack of a single file named `name` holding `data` (a program fetched by URL)."""
    if not name or name in (".", "..") or "/" in name or "\x00" in name or "\\" in name:
        raise PackError(f"a single-file pack needs a plain file name, not {name!r}")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(name, is_dir=False, size=len(data), executable=executable),
                    io.BytesIO(data))
    return out.getvalue()
