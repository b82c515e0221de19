"""The per-host artifact cache and the async fetcher in front of it (DESIGN §6).

Programs are content-addressed: an artifact is a pack (`_pack`) named by its sha256. The cache
keeps each one under `<data>/artifacts/<sha256>/`:

    pack.tar     the verified blob (kept to re-verify, and to hand to peers later)
    program/     the unpacked program, made read-only so a query cannot change what the next
                 run of the same digest executes (root ignores the bits; that is accepted)

An install hashes the blob first (DigestMismatchError if it is not what was asked for),
unpacks into `artifacts/.incoming-*`, and renames that directory into place: the rename is
the commit, so a directory named by a digest is always complete. Two installers racing for
the same digest both succeed (the loser drops its copy). Removal renames the directory out of
its digest's name before deleting it. An install removes its `.incoming-*` directory as it
ends, installed or refused; a crash, or a removal that would not finish (logged), leaves only
`.incoming-*` litter, which `clean_incoming()` removes: at start and at every cleanup
(`prune_artifacts`), never an install of this cache in progress. Power loss between rename
and writeback is not covered (no fsync): `verify()` re-hashes the kept pack when in doubt.

`ArtifactCache` is blocking; `ArtifactFetcher` is the asyncio front the agent uses: it runs
reads, downloads and installs on worker threads, asks the uploader callback (later: an RPC to
the coordinator) for uploaded blobs, and fetches each artifact once however many spawns wait
for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from catalog.errors import StorageError

from ._errors import ArtifactMissingError, DigestMismatchError, FetchFailedError, FetchReason
from ._fetch import Source, check_digest, fetch_file, fetch_http, parse_source
from ._pack import DEFAULT_MAX_MEMBERS, sha256_hex, unpack

__all__ = ["DEFAULT_MAX_ARTIFACT_BYTES", "Artifact", "ArtifactCache", "ArtifactFetcher",
           "Uploader"]

logger = logging.getLogger("executor")

DEFAULT_MAX_ARTIFACT_BYTES = 64 * 1024 * 1024
_INCOMING = ".incoming-"

Uploader = Callable[[str], Awaitable[bytes | None]]
"""Returns the uploaded pack with this digest (hex), or None if nobody has it."""


@dataclass(frozen=True)
class Artifact:
    """An installed program: its digest and where it lives."""

    digest: str
    root: Path

    @property
    def program(self) -> Path:
        """The unpacked program (a directory holding the file, or the packed tree)."""
        return self.root / "program"

    @property
    def pack(self) -> Path:
        return self.root / "pack.tar"


def _read_only(tree: Path) -> None:
    for dirpath, _, filenames in os.walk(tree):
        for name in filenames:
            path = os.path.join(dirpath, name)
            mode = os.stat(path).st_mode
            os.chmod(path, 0o555 if mode & 0o111 else 0o444)
        os.chmod(dirpath, 0o555)


def remove_tree(path: Path) -> bool:
    """Remove a tree (a work directory, an artifact's); False (logged) if some of it would
    not go: the caller's next cleanup tries again."""
    failures: list[str] = []

    # Read-only trees (an artifact's program, on purpose; what a query leaves in its work
    # directory) give way once each directory is writable again: make it so and retry.
    def writable_then_retry(func: Callable[[str], object], name: str, _exc: object) -> None:
        parent = os.path.dirname(name)
        for target in (parent, name):
            try:
                os.chmod(target, os.stat(target).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            except OSError:
                pass
        try:
            func(name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            failures.append(f"{name}: {exc.strerror or exc}")

    shutil.rmtree(path, onerror=writable_then_retry)
    if failures:
        logger.warning("cannot remove all of %s (%d left, e.g. %s); trying again at the next "
                       "cleanup", path, len(failures), failures[0])
    return not failures


class ArtifactCache:
    """Installed artifacts under `directory` (normally `<data>/artifacts`)."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
                 max_members: int = DEFAULT_MAX_MEMBERS) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_members = max_members
        # The `.incoming-*` names of this cache's installs in progress (on worker threads):
        # `clean_incoming` leaves them be.
        self._installing: set[str] = set()
        self._lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the artifact cache {self.directory}: "
                               f"{exc.strerror}") from exc

    def lookup(self, digest: str) -> Artifact | None:
        """The installed artifact with this digest, or None (a cache miss)."""
        digest = check_digest(digest)
        root = self.directory / digest
        return Artifact(digest, root) if root.is_dir() else None

    def require(self, digest: str) -> Artifact:
        found = self.lookup(digest)
        if found is None:
            raise ArtifactMissingError(f"artifact sha256:{digest} is not in this host's cache")
        return found

    def digests(self) -> list[str]:
        return sorted(p.name for p in self.directory.iterdir()
                      if p.is_dir() and not p.name.startswith("."))

    def install(self, blob: bytes, *, expected: str | None = None) -> Artifact:
        """Verify and install a pack; returns the artifact (already there: a cache hit).
        DigestMismatchError when `expected` is given and the blob hashes otherwise;
        FetchFailedError(TOO_LARGE) above `max_bytes`; InvalidArtifactError for a bad pack."""
        if len(blob) > self.max_bytes:
            raise FetchFailedError(f"artifact of {len(blob)} bytes is more than the maximum of "
                                   f"{self.max_bytes}", reason=FetchReason.TOO_LARGE)
        actual = sha256_hex(blob)
        if expected is not None and check_digest(expected) != actual:
            raise DigestMismatchError(f"artifact hashes to sha256:{actual}, expected "
                                      f"sha256:{expected}", expected=expected, actual=actual)
        found = self.lookup(actual)
        if found is not None:
            return found
        incoming = self.directory / f"{_INCOMING}{actual[:16]}-{secrets.token_hex(4)}"
        with self._lock:
            self._installing.add(incoming.name)
        try:
            try:
                incoming.mkdir()
                (incoming / "pack.tar").write_bytes(blob)
            except OSError as exc:
                raise StorageError(f"cannot write into the artifact cache: {exc}") from exc
            unpack(blob, incoming / "program", max_members=self.max_members)
            try:
                _read_only(incoming / "program")
                os.rename(incoming, self.directory / actual)
            except OSError as exc:
                found = self.lookup(actual)
                if found is not None:
                    return found  # another installer won the race; its copy is the same
                raise StorageError(f"cannot install artifact {actual}: {exc}") from exc
        finally:
            if incoming.exists():  # refused, or another installer won: what is left goes now
                remove_tree(incoming)
            with self._lock:
                self._installing.discard(incoming.name)
        return Artifact(actual, self.directory / actual)

    def verify(self, digest: str) -> None:
        """Re-hash the kept pack; DigestMismatchError if it changed on disk."""
        artifact = self.require(digest)
        try:
            actual = sha256_hex(artifact.pack.read_bytes())
        except OSError as exc:
            raise StorageError(f"cannot read {artifact.pack}: {exc.strerror}") from exc
        if actual != artifact.digest:
            raise DigestMismatchError(f"cached pack {artifact.pack} hashes to {actual}",
                                      expected=artifact.digest, actual=actual)

    def remove(self, digest: str) -> bool:
        """Delete an installed artifact (a running process keeps its open files). The rename
        out of its digest's name comes first, so a crash half way, or a tree that would not
        all go (logged), leaves `.incoming-*` litter for `clean_incoming()`, never a
        half-deleted tree that `lookup` would hand out."""
        found = self.lookup(digest)
        if found is None:
            return False
        doomed = self.directory / f"{_INCOMING}{found.digest[:16]}-{secrets.token_hex(4)}"
        try:
            os.rename(found.root, doomed)
        except FileNotFoundError:
            return False  # another remover was first
        remove_tree(doomed)
        return True

    def clean_incoming(self) -> int:
        """Remove what interrupted installs and unfinished removals left behind, but not
        this cache's installs in progress; returns how many went whole (what would not go
        is logged, and left for the next call). Call before serving, and at each cleanup."""
        with self._lock:
            busy = set(self._installing)
        stale = [p for p in self.directory.iterdir()
                 if p.name.startswith(_INCOMING) and p.name not in busy]
        return sum(remove_tree(path) for path in stale)


class ArtifactFetcher:
    """Makes sure an artifact is installed, fetching it from its source once.

        fetcher = ArtifactFetcher(cache, upload=fetch_blob_from_coordinator)
        artifact = await fetcher.ensure("sha256:...")          # an uploaded program
        artifact = await fetcher.ensure("file:///srv/job.py")
        artifact = await fetcher.ensure("https://host/job.py", digest="...")

    Concurrent `ensure` calls for the same source share one fetch; a caller that is
    cancelled does not cancel the fetch for the others. `close()` cancels fetches in flight.
    """

    def __init__(self, cache: ArtifactCache, *, upload: Uploader | None = None,
                 timeout: float = 30.0) -> None:
        self.cache = cache
        self.upload = upload
        self.timeout = timeout
        self._inflight: dict[tuple[str, str | None], asyncio.Task[Artifact]] = {}
        self.fetches = 0  # fetches that went to a source (cache misses), for tests and stats

    async def ensure(self, source: str, digest: str | None = None) -> Artifact:
        parsed = parse_source(source, digest)
        if parsed.digest is not None:
            found = self.cache.lookup(parsed.digest)
            if found is not None:
                return found
        key = (parsed.text, parsed.digest)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(parsed),
                                                          name=f"fetch {parsed.text[:80]}")
            self._inflight[key] = task
            task.add_done_callback(lambda _t: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    async def _fetch(self, source: Source) -> Artifact:
        self.fetches += 1
        max_bytes = self.cache.max_bytes
        if source.kind == "upload":
            if self.upload is None:
                raise ArtifactMissingError(f"artifact sha256:{source.location} is not cached "
                                           "and this executor has no uploader to ask")
            blob = await self.upload(source.location)
            if blob is None:
                raise ArtifactMissingError(f"nobody holds artifact sha256:{source.location}; "
                                           "submit the program again")
        elif source.kind == "file":
            blob = await asyncio.to_thread(fetch_file, source.location, max_bytes=max_bytes)
        else:
            blob = await asyncio.to_thread(fetch_http, source.location, max_bytes=max_bytes,
                                           timeout=self.timeout)
        return await asyncio.to_thread(self.cache.install, blob, expected=source.digest)

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
