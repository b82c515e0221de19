"""Bounded cleanup of what ended queries leave on an executor's disk (DESIGN §6 "Executor
disk cleanup"): work directories and cached artifacts.

    prune_work_dirs(data / "work", keep=50, running={Path(...), ...}, max_bytes=4 << 30)
    prune_artifacts(cache, unused_for=86400.0, running={digest, ...}, now=time.time(),
                    max_bytes=4 << 30)

A work directory (`<query>-<process>-<attempt>`) of a process that is not running is
removed once it is older than the newest `keep` of them, by modification time, so the
recent ones stay for a post-mortem; and while those of ended processes hold more than
`max_bytes`, the oldest of them go too. An artifact is removed once it has not been used for
`unused_for` seconds: a spawn marks its use by touching the artifact's directory
(`touch_artifact`); and while the cache holds more than `max_bytes`, the least recently used
go too (the same eviction, `_oldest_past`). One a running process uses is never removed.
Sizes count symlinks as links, never what they point to. Each pruning of artifacts first
removes what unfinished removals and interrupted installs left
(`ArtifactCache.clean_incoming`).

Blocking file I/O, meant for a worker thread; no asyncio, no decisions about queries.
Must not: remove anything a running process uses, or anything that is not a work directory
or an artifact (names are checked).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import TypeVar

from ._artifacts import ArtifactCache, remove_tree

__all__ = ["cache_bytes", "prune_artifacts", "prune_work_dirs", "touch_artifact"]

_WORK_DIR = re.compile(r"\d+-\d+-\d+")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_T = TypeVar("_T")


def _age_key(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def prune_work_dirs(root: str | os.PathLike[str], *, keep: int,
                    running: Collection[Path] = (), max_bytes: int | None = None) -> list[Path]:
    """Remove the work directories under `root` beyond the newest `keep`, except those of
    running processes; then, while the others (those of ended processes) hold more than
    `max_bytes`, the oldest of them. Returns what was removed, in that order (what would
    not go is logged, and left for the next call)."""
    if keep < 0:
        raise ValueError("keep is >= 0")
    root = Path(root)
    try:
        # Not a symlink named like one: it would be measured and removed where it points.
        dirs = [Path(e.path) for e in os.scandir(root)
                if e.is_dir(follow_symlinks=False) and _WORK_DIR.fullmatch(e.name)]
    except FileNotFoundError:
        return []
    busy = {Path(p).resolve() for p in running}
    idle = sorted((p for p in dirs if p.resolve() not in busy), key=_age_key, reverse=True)
    # The running ones count toward `keep`: they are the newest in use.
    spare = max(keep - (len(dirs) - len(idle)), 0)
    removed = [path for path in idle[spare:] if remove_tree(path)]
    if max_bytes is not None:
        ended = [(_age_key(p), p, _tree_bytes(p)) for p in idle[:spare]]
        removed += _oldest_past(max_bytes, ended, remove_tree)
    return removed


def touch_artifact(cache: ArtifactCache, digest: str) -> None:
    """Mark an artifact used now (its directory's modification time)."""
    found = cache.lookup(digest)
    if found is not None:
        try:
            os.utime(found.root)
        except OSError:
            pass  # a mark missed makes the artifact look older: it is fetched again if needed


def prune_artifacts(cache: ArtifactCache, *, unused_for: float, now: float,
                    running: Collection[str] = (), max_bytes: int | None = None) -> list[str]:
    """Remove artifacts not used for `unused_for` seconds (before `now`, wall-clock seconds)
    and not used by a running process; then, while the cache holds more than `max_bytes`,
    the least recently used of the others. Returns the digests removed, in that order.
    First, what removals that would not finish and interrupted installs left goes."""
    cache.clean_incoming()
    removed = []
    kept: list[tuple[float, str, int]] = []  # (last used, digest, bytes)
    for digest in cache.digests():
        if not _DIGEST.fullmatch(digest):
            continue
        found = cache.lookup(digest)
        if found is None:
            continue
        used = _age_key(found.root)
        if digest not in running and now - used > unused_for and cache.remove(digest):
            removed.append(digest)
            continue
        kept.append((used, digest, _tree_bytes(found.root)))
    if max_bytes is not None:
        removed += _oldest_past(max_bytes, kept, cache.remove, running=running)
    return removed


def _oldest_past(max_bytes: int, entries: Iterable[tuple[float, _T, int]],
                 remove: Callable[[_T], bool], *, running: Collection[_T] = ()) -> list[_T]:
    """While `entries` (last used, what, bytes) hold more than `max_bytes` in all, remove
    the least recently used not `running` (they count, but stay); what went, oldest first."""
    entries = sorted(entries, key=lambda entry: entry[0])
    total = sum(size for _, _, size in entries)
    removed = []
    for _, item, size in entries:
        if total <= max_bytes:
            break
        if item not in running and remove(item):
            removed.append(item)
            total -= size
    return removed


def cache_bytes(cache: ArtifactCache) -> int:
    """The bytes of the cache's artifacts (their packs and unpacked programs)."""
    total = 0
    for digest in cache.digests():
        found = cache.lookup(digest)
        if found is not None:
            total += _tree_bytes(found.root)
    return total


def _tree_bytes(root: Path) -> int:
    """The bytes of the files under `root`, symlinks as links (never what they point to)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass  # going meanwhile
    return total
