"""The coordinator's store of uploaded program packs (DESIGN §6): `<data>/artifacts/<sha256>`,
content-addressed, written once by rename so a reader never sees half a pack.

Packs arrive in chunks (`UploadArtifact`, at most ARTIFACT_CHUNK_BYTES each, so no message to
the coordinator is big: DESIGN §2 "Limits"), appended in order to
`.incoming-<sha256>-<upload>` (one upload per session); the last chunk's arrival checks the
whole file against the digest and renames it into place. A session uploads one pack at a
time: starting one removes what its unfinished others left. Incoming files left by uploads
nobody finished are removed when they are an hour old, and so are stored packs no live query
runs, an hour after they were stored (`prune`, as each upload starts; a pack uploaded again is
stored anew). How much a user may hold of packs no query runs yet is the coordinator's to
bound (it knows who uploaded what).

Uploads are hostile input: the digest must be 64 hex digits, the bytes must hash to it, a
pack is bounded in size, chunks must come in order. Must not: unpack or run anything (the
executor does that).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Collection, Iterable
from pathlib import Path

from catalog import InvalidCommandError, NotFoundError, StorageError

__all__ = ["MAX_ARTIFACT_BYTES", "ArtifactStore"]

MAX_ARTIFACT_BYTES = 64 * 1024 * 1024  # the executor's cache takes no bigger pack either
STALE_UPLOAD_SECONDS = 3600.0
_DIGEST = re.compile(r"[0-9a-f]{64}")
_INCOMING = ".incoming-"


def _checked(digest: str) -> str:
    if not _DIGEST.fullmatch(digest):
        raise InvalidCommandError(f"not a sha256 digest (64 lowercase hex digits): "
                                  f"{digest[:80]!r}")
    return digest


class ArtifactStore:
    """Packs by sha256 under `directory` (blocking: call it off the event loop)."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_bytes: int = MAX_ARTIFACT_BYTES) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes

    def receive(self, digest: str, upload: str, offset: int, size: int,
                frames: Iterable[bytes | memoryview]) -> int:
        """Take the chunk at `offset` of the pack `digest` of `size` bytes, sent by `upload`
        (a session); returns the bytes held. The chunk that completes the pack stores it."""
        _checked(digest)
        if not 0 <= size <= self.max_bytes:
            raise InvalidCommandError(f"the program pack is {size} bytes; at most "
                                      f"{self.max_bytes}")
        data = b"".join(bytes(f) for f in frames)
        if offset < 0 or offset + len(data) > size:
            raise InvalidCommandError(f"a chunk of {len(data)} bytes at offset {offset} does "
                                      f"not fit a pack of {size} bytes")
        incoming = self.directory / f"{_INCOMING}{digest}-{upload}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if offset == 0:
                self._remove_stale(upload)
            elif not incoming.exists() or incoming.stat().st_size != offset:
                raise InvalidCommandError(f"upload chunk at offset {offset} does not follow "
                                          "what was received; upload the pack again")
            with open(incoming, "wb" if offset == 0 else "ab") as f:
                f.write(data)
                held = f.tell()
                if held < size:
                    return held
                f.flush()
                os.fsync(f.fileno())
            return self._complete(digest, incoming, size)
        except OSError as exc:
            raise StorageError(f"cannot store the program pack: {exc}") from exc

    def _complete(self, digest: str, incoming: Path, size: int) -> int:
        sha = hashlib.sha256()
        with open(incoming, "rb") as f:
            while block := f.read(1 << 20):
                sha.update(block)
        actual = sha.hexdigest()
        if actual != digest:
            incoming.unlink()
            raise InvalidCommandError(f"the upload hashes to {actual}, not {digest}")
        target = self.directory / digest
        if target.exists():
            incoming.unlink()
            os.utime(target)  # stored anew: `prune` counts its hour from now
        else:
            os.replace(incoming, target)
        return size

    def _remove_stale(self, upload: str) -> None:
        """Before `upload` (a session) starts a pack: remove the incoming files of its other
        uploads, and everyone's an hour old."""
        cutoff = time.time() - STALE_UPLOAD_SECONDS
        for path in self.directory.glob(f"{_INCOMING}*"):
            try:
                if path.name.endswith(f"-{upload}") or path.stat().st_mtime < cutoff:
                    path.unlink()
            except FileNotFoundError:
                pass

    def prune(self, keep: Collection[str]) -> list[str]:
        """Remove the stored packs not in `keep` (digests: those live queries run) stored
        more than an hour ago; the digests removed."""
        cutoff = time.time() - STALE_UPLOAD_SECONDS
        removed: list[str] = []
        try:
            paths = list(self.directory.iterdir())
        except FileNotFoundError:
            return removed
        for path in paths:
            if not _DIGEST.fullmatch(path.name) or path.name in keep:
                continue
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed.append(path.name)
            except FileNotFoundError:
                pass
        return sorted(removed)

    def size_of(self, digest: str) -> int | None:
        """The stored pack's size in bytes, None when it is not stored."""
        try:
            return (self.directory / _checked(digest)).stat().st_size
        except FileNotFoundError:
            return None

    def load(self, digest: str) -> bytes:
        """The pack `digest`; NotFoundError if nobody uploaded it."""
        try:
            with open(self.directory / _checked(digest), "rb") as f:
                return f.read(self.max_bytes + 1)
        except FileNotFoundError as exc:
            raise NotFoundError(f"no program pack sha256:{digest}; submit it again") from exc
        except OSError as exc:
            raise StorageError(f"cannot read program pack {digest}: {exc}") from exc
