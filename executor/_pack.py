"""Program packs on the executor: the safe unpacking of one, and packing (which lives in
`querylib.artifacts`, so that `tq submit` computes the same digest) with the executor's errors.

Unpacking treats the blob as hostile: uncompressed only (no decompression bomb), at most
`max_members` members, only regular files and directories (no links, devices, fifos or sparse
files), relative names without `..`, no duplicates, no file that is also a directory; then
tarfile's `data` filter as a second line. Nothing here touches the cache or the network.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile

from catalog.errors import StorageError
from querylib import artifacts as _artifacts
from querylib.artifacts import PackError, sha256_hex, tree_size

from ._errors import InvalidArtifactError

__all__ = ["DEFAULT_MAX_MEMBERS", "pack_bytes", "pack_path", "sha256_hex", "tree_size",
           "unpack"]

DEFAULT_MAX_MEMBERS = 10_000
MAX_NAME_BYTES = 1024  # a member's path; a program tree needs far less


def _translated(error: PackError) -> InvalidArtifactError:
    return InvalidArtifactError(str(error))


def pack_path(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The deterministic pack of a file or directory (`querylib.artifacts.pack_path`);
    InvalidArtifactError when it cannot be packed or would exceed `max_bytes`."""
    try:
        return _artifacts.pack_path(path, max_bytes=max_bytes)
    except PackError as exc:
        raise _translated(exc) from exc


def pack_bytes(name: str, data: bytes, *, executable: bool = False) -> bytes:
    """The pack of a single file named `name` holding `data` (a program fetched by URL)."""
    _check_name(name)
    try:
        return _artifacts.pack_bytes(name, data, executable=executable)
    except PackError as exc:
        raise _translated(exc) from exc


def _check_name(name: str) -> str:
    """The normalised member name, or InvalidArtifactError if it could land outside the tree
    or is too long for the disk (a component past NAME_MAX, or so deep that creating its
    directories, one recursive call per level, would overflow Python's stack)."""
    if not name or "\x00" in name or "\\" in name or name.startswith("/"):
        raise InvalidArtifactError(f"unsafe member name in pack: {name[:80]!r}")
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_NAME_BYTES or any(len(part) > 255 for part in encoded.split(b"/")):
        raise InvalidArtifactError(f"member name too long in pack: {name[:80]!r}... (at most "
                                   f"{MAX_NAME_BYTES} bytes, 255 between slashes)")
    norm = posixpath.normpath(name)
    if norm == "." or norm.startswith("../") or norm == ".." or "/../" in f"/{norm}/":
        raise InvalidArtifactError(f"unsafe member name in pack: {name[:80]!r}")
    return norm


def unpack(blob: bytes, dest: str | os.PathLike[str], *,
           max_members: int = DEFAULT_MAX_MEMBERS) -> list[str]:
    """Unpack a pack into the (new, empty) directory `dest`; returns the member names.
    InvalidArtifactError for anything but plain files and directories with safe names."""
    # Besides TarError, tarfile lets out what hostile headers cause: RecursionError (it reads
    # a run of pax or GNU long-name headers by recursing once per header), ValueError (a
    # sparse map or number int() cannot read), OverflowError (an mtime os.utime cannot set).
    try:
        tar = tarfile.open(fileobj=io.BytesIO(blob), mode="r:")
    except (tarfile.TarError, RecursionError, ValueError) as exc:
        raise InvalidArtifactError(f"not a program pack (an uncompressed tar): {exc}") from exc
    with tar:
        members: list[tarfile.TarInfo] = []
        seen: set[str] = set()
        files: set[str] = set()
        parents: set[str] = set()  # directories the members' names imply
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
                if member.isreg():
                    files.add(name)
                parent = posixpath.dirname(name)
                while parent and parent not in parents:
                    parents.add(parent)
                    parent = posixpath.dirname(parent)
                members.append(member)
        except (tarfile.TarError, RecursionError, ValueError) as exc:
            raise InvalidArtifactError(f"corrupt program pack: {exc}") from exc
        if not members:
            raise InvalidArtifactError("the program pack is empty")
        # Else the OS refuses it half way through, which would read as this host's fault.
        clashes = files & parents
        if clashes:
            raise InvalidArtifactError(f"pack member {min(clashes)[:80]!r} is both a file and "
                                       "a directory")
        try:
            tar.extractall(dest, members=members, filter="data")
        except (tarfile.TarError, ValueError, OverflowError) as exc:
            raise InvalidArtifactError(f"pack refused while unpacking: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"cannot unpack the program into {dest}: {exc}") from exc
    return [m.name for m in members]
