"""Program packs: a file or a directory as one deterministic tar, and the safe unpacking of one.

A *pack* is an uncompressed POSIX (pax) tar whose bytes depend only on the program's names,
contents and executable bits: members sorted by path, mtime 0, uid/gid 0, no user or group
names, modes normalised to 0644/0755. So packing the same tree twice, on any host, gives the
same bytes and the same sha256: the artifact's content address (DESIGN §6). A single file
packs as a one-member tar named after the file. `__pycache__` directories and `*.pyc` files
are left out, so running a program does not change its address.

Unpacking treats the blob as hostile: uncompressed only (no decompression bomb), at most
`max_members` members, only regular files and directories (no links, devices, fifos or sparse
files), relative names without `..`, no duplicates; then tarfile's `data` filter as a second
line. Nothing here touches the cache or the network.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from catalog.errors import StorageError

from ._errors import InvalidArtifactError

__all__ = ["DEFAULT_MAX_MEMBERS", "pack_bytes", "pack_path", "sha256_hex", "tree_size",
           "unpack"]

DEFAULT_MAX_MEMBERS = 10_000
_SKIPPED_DIRS = frozenset({"__pycache__"})
_SKIPPED_SUFFIXES = (".pyc",)
_BLOCK = 512


def sha256_hex(blob: bytes | memoryview) -> str:
    """The content address of a blob: 64 lowercase hex digits."""
    return hashlib.sha256(blob).hexdigest()


def _walk(root: Path, rel: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative posix path, entry) under `root`, sorted by name at every level."""
    try:
        entries = sorted(os.scandir(root / rel if rel else root), key=lambda e: e.name)
    except OSError as exc:
        raise InvalidArtifactError(f"cannot list {root / rel}: {exc.strerror}") from exc
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
        raise InvalidArtifactError(f"no such file or directory: {path}") from exc
    except OSError as exc:
        raise InvalidArtifactError(f"cannot read {path}: {exc.strerror}") from exc
    if stat.S_ISREG(top.st_mode):
        return [(path.name, path, top)]
    if not stat.S_ISDIR(top.st_mode):
        raise InvalidArtifactError(f"{path} is neither a file nor a directory")
    found = []
    for rel, entry in _walk(path):
        # A symlink to a file packs as the file's content (follow); a symlink to a directory
        # could loop and is refused; special files have no place in a program.
        if entry.is_symlink() and entry.is_dir():
            raise InvalidArtifactError(f"{path / rel} is a symlink to a directory; "
                                       "copy the directory instead")
        try:
            st = entry.stat()
        except OSError as exc:
            raise InvalidArtifactError(f"cannot read {path / rel}: {exc.strerror}") from exc
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise InvalidArtifactError(f"{path / rel} is not a regular file or directory")
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
    """The deterministic pack of a file or directory; InvalidArtifactError when it cannot be
    packed or the pack would exceed `max_bytes`."""
    path = Path(path)
    members = _members(path)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, file, st in members:
            is_dir = stat.S_ISDIR(st.st_mode)
            info = _info(name, is_dir=is_dir, size=st.st_size,
                         executable=bool(st.st_mode & 0o111))
            if out.tell() + _BLOCK + info.size > max_bytes:
                raise InvalidArtifactError(f"{path} packs to more than {max_bytes} bytes")
            if is_dir:
                tar.addfile(info)
                continue
            try:
                with open(file, "rb") as f:
                    data = f.read(info.size + 1)
            except OSError as exc:
                raise InvalidArtifactError(f"cannot read {file}: {exc.strerror}") from exc
            if len(data) != info.size:
                raise InvalidArtifactError(f"{file} changed while it was being packed")
            tar.addfile(info, io.BytesIO(data))
    blob = out.getvalue()
    if len(blob) > max_bytes:
        raise InvalidArtifactError(f"{path} packs to more than {max_bytes} bytes")
    return blob


def pack_bytes(name: str, data: bytes, *, executable: bool = False) -> bytes:
    """The pack of a single file named `name` holding `data` (a program fetched by URL)."""
    _check_name(name)
    if "/" in name:
        raise InvalidArtifactError(f"a single-file pack needs a plain file name, not {name!r}")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(name, is_dir=False, size=len(data), executable=executable),
                    io.BytesIO(data))
    return out.getvalue()


def _check_name(name: str) -> str:
    """The normalised member name, or InvalidArtifactError if it could land outside the tree."""
    if not name or "\x00" in name or "\\" in name or name.startswith("/"):
        raise InvalidArtifactError(f"unsafe member name in pack: {name[:80]!r}")
    norm = posixpath.normpath(name)
    if norm == "." or norm.startswith("../") or norm == ".." or "/../" in f"/{norm}/":
        raise InvalidArtifactError(f"unsafe member name in pack: {name[:80]!r}")
    return norm


def unpack(blob: bytes, dest: str | os.PathLike[str], *,
           max_members: int = DEFAULT_MAX_MEMBERS) -> list[str]:
    """Unpack a pack into the (new, empty) directory `dest`; returns the member names.
    InvalidArtifactError for anything but plain files and directories with safe names."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(blob), mode="r:")
    except tarfile.TarError as exc:
        raise InvalidArtifactError(f"not a program pack (an uncompressed tar): {exc}") from exc
    with tar:
        members: list[tarfile.TarInfo] = []
        seen: set[str] = set()
        try:
            for member in tar:
                if len(members) >= max_members:
                    raise InvalidArtifactError(f"pack has more than {max_members} members")
                if not (member.isreg() or member.isdir()) or member.issparse():
                    raise InvalidArtifactError(f"pack member {member.name[:80]!r} is not a "
                                               "regular file or directory")
                name = _check_name(member.name)
                if name in seen:
                    raise InvalidArtifactError(f"pack member {name[:80]!r} appears twice")
                seen.add(name)
                members.append(member)
        except tarfile.TarError as exc:
            raise InvalidArtifactError(f"corrupt program pack: {exc}") from exc
        if not members:
            raise InvalidArtifactError("the program pack is empty")
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.TarError as exc:
            raise InvalidArtifactError(f"pack refused while unpacking: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"cannot unpack the program into {dest}: {exc}") from exc
    return [m.name for m in members]
