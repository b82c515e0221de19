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
bound (it knows who uploaded what): it `reserve`s an upload's declared size for its user as
the upload starts, and `reserved` counts what the user's unfinished uploads may still grow to.

Uploads are hostile input: the digest must be 64 hex digits, the bytes must hash to it, a
pack is bounded in size, chunks must come in order, and every chunk must declare the digest
and size its upload started with and fit within that size (else the upload is refused and
its file removed). Must not: unpack or run anything (the executor does that).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
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


@dataclass(slots=True)
class _Upload:
    """What an unfinished upload declared as it started, and whose it is."""

    digest: str
    size: int
    owner: str
    at: float  # time.time() of its start or last chunk: an hour later it is stale


class ArtifactStore:
    """Packs by sha256 under `directory` (blocking: call it off the event loop, except
    `reserve`, `reserved`, `release` and `abandon`, which touch no disk or unlink one file)."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_bytes: int = MAX_ARTIFACT_BYTES) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        # Unfinished uploads by upload (session): the loop reserves, the chunks (on threads)
        # check against them and drop the refused ones.
        self._uploads: dict[str, _Upload] = {}
        self._lock = threading.Lock()

    def reserve(self, digest: str, upload: str, size: int, owner: str) -> None:
        """`upload` (a session of `owner`) starts the pack `digest` of `size` bytes, in place
        of its unfinished other: its chunks are held to that, and `reserved(owner)` counts it
        until `release` (once the pack is stored), its refusal, or an hour without a chunk."""
        self._check_size(size)
        with self._lock:
            self._uploads[upload] = _Upload(_checked(digest), size, owner, time.time())

    def reserved(self, owner: str, *, besides: str) -> int:
        """The bytes `owner`'s unfinished uploads other than `besides` declared."""
        with self._lock:
            return sum(u.size for key, u in self._uploads.items()
                       if u.owner == owner and key != besides)

    def release(self, upload: str) -> None:
        """`upload` ended (its pack is stored): it reserves nothing any more."""
        with self._lock:
            self._uploads.pop(upload, None)

    def abandon(self, upload: str) -> None:
        """`upload`'s session ended: its unfinished upload reserves nothing any more, and the
        file it left goes (one unlink, when it left one: cheap enough for the event loop).
        OSError if the file cannot be removed (`_remove_stale` takes it an hour later)."""
        with self._lock:
            declared = self._uploads.pop(upload, None)
        if declared is not None:
            (self.directory / f"{_INCOMING}{declared.digest}-{upload}").unlink(missing_ok=True)

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self.max_bytes:
            raise InvalidCommandError(f"the program pack is {size} bytes; at most "
                                      f"{self.max_bytes}")

    def receive(self, digest: str, upload: str, offset: int, size: int,
                frames: Iterable[bytes | memoryview]) -> int:
        """Take the chunk at `offset` of the pack `digest` of `size` bytes, sent by `upload`
        (a session); returns the bytes held. The chunk that completes the pack stores it (the
        caller then `release`s the upload). A chunk at offset 0 `reserve`s for the owner of
        the upload's reservation, nobody's if there is none."""
        _checked(digest)
        self._check_size(size)
        data = b"".join(bytes(f) for f in frames)
        incoming = self.directory / f"{_INCOMING}{digest}-{upload}"
        with self._lock:
            declared = self._uploads.get(upload)
            if offset == 0:  # (re)starts it, as `reserve` did on the coordinator's loop
                owner = "" if declared is None else declared.owner
                declared = self._uploads[upload] = _Upload(digest, size, owner, time.time())
            elif declared is not None:
                declared.at = time.time()
        if declared is not None and (declared.digest, declared.size) != (digest, size):
            self._refuse(upload, self.directory / f"{_INCOMING}{declared.digest}-{upload}")
            other = "" if declared.digest == digest else f" of pack sha256:{declared.digest}"
            raise InvalidCommandError(
                f"an upload chunk declares a pack of {size} bytes, sha256:{digest}, but its "
                f"upload declared {declared.size} bytes{other}; upload the pack again")
        if offset < 0 or offset + len(data) > size:
            self._refuse(upload, incoming)
            raise InvalidCommandError(f"a chunk of {len(data)} bytes at offset {offset} does "
                                      f"not fit a pack of {size} bytes; upload the pack again")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if offset == 0:
                self._remove_stale(upload)
            elif (declared is None or not incoming.exists()
                    or incoming.stat().st_size != offset):
                raise InvalidCommandError(f"upload chunk at offset {offset} does not follow "
                                          "what was received; upload the pack again")
            with open(incoming, "wb" if offset == 0 else "ab") as f:
                f.write(data)
                held = f.tell()
                if held < size:
                    return held
                f.flush()
                os.fsync(f.fileno())
            return self._complete(digest, upload, incoming, size)
        except OSError as exc:
            raise StorageError(f"cannot store the program pack: {exc}") from exc

    def _complete(self, digest: str, upload: str, incoming: Path, size: int) -> int:
        sha = hashlib.sha256()
        with open(incoming, "rb") as f:
            while block := f.read(1 << 20):
                sha.update(block)
        actual = sha.hexdigest()
        if actual != digest:
            incoming.unlink()
            self.release(upload)
            raise InvalidCommandError(f"the upload hashes to {actual}, not {digest}")
        target = self.directory / digest
        if target.exists():
            incoming.unlink()
            os.utime(target)  # stored anew: `prune` counts its hour from now
        else:
            os.replace(incoming, target)
        return size

    def _refuse(self, upload: str, incoming: Path) -> None:
        """`upload` sent what it did not declare: it ends, and what it left goes."""
        try:
            incoming.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot remove a refused program pack upload: {exc}") from exc
        self.release(upload)

    def _remove_stale(self, upload: str) -> None:
        """Before `upload` (a session) starts a pack: remove the incoming files of its other
        uploads, and everyone's an hour old, with what those reserved."""
        cutoff = time.time() - STALE_UPLOAD_SECONDS
        with self._lock:
            for key in [k for k, u in self._uploads.items() if u.at < cutoff and k != upload]:
                del self._uploads[key]
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
