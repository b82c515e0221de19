"""The coordinator's store of uploaded program packs (DESIGN §6): `<data>/artifacts/<sha256>`,
content-addressed, written once by rename so a reader never sees half a pack.

Uploads are hostile input: the digest must be 64 hex digits, the bytes must hash to it, and a
pack is bounded in size. Must not: unpack or run anything (the executor does that).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from catalog import InvalidCommandError, NotFoundError, StorageError

__all__ = ["MAX_ARTIFACT_BYTES", "ArtifactStore"]

MAX_ARTIFACT_BYTES = 64 * 1024 * 1024  # the executor's cache takes no bigger pack either
_DIGEST = re.compile(r"[0-9a-f]{64}")


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

    def store(self, digest: str, frames: Iterable[bytes | memoryview]) -> int:
        """Keep the pack made of `frames` under `digest`; returns its size."""
        _checked(digest)
        blob = b"".join(bytes(f) for f in frames)
        if len(blob) > self.max_bytes:
            raise InvalidCommandError(f"the program pack is {len(blob)} bytes; at most "
                                      f"{self.max_bytes}")
        actual = hashlib.sha256(blob).hexdigest()
        if actual != digest:
            raise InvalidCommandError(f"the upload hashes to {actual}, not {digest}")
        target = self.directory / digest
        if target.exists():
            return len(blob)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            incoming = self.directory / f".incoming-{digest}-{os.getpid()}"
            with open(incoming, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(incoming, target)
        except OSError as exc:
            raise StorageError(f"cannot store the program pack: {exc}") from exc
        return len(blob)

    def load(self, digest: str) -> bytes:
        """The pack `digest`; NotFoundError if nobody uploaded it."""
        try:
            with open(self.directory / _checked(digest), "rb") as f:
                return f.read(self.max_bytes + 1)
        except FileNotFoundError as exc:
            raise NotFoundError(f"no program pack sha256:{digest}; submit it again") from exc
        except OSError as exc:
            raise StorageError(f"cannot read program pack {digest}: {exc}") from exc
