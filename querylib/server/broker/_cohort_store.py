"""Pending cohorts on disk, beside the partition log (DESIGN §5 "Collective publishing").

A partition whose cohort still waits for writers keeps it in `<partition dir>/
cohorts.json`: `{"cohorts": [[name, writers expected, [writers joined...]], ...]}`,
oldest first. It is replaced atomically (`querylib._state_file.replace_file`: a `.tmp` file
of its own, fsynced, renamed, the directory fsynced; the log's recovery removes a `.tmp` a
crash left) and removed when no cohort waits. A file is tiny (at most `max_cohorts` cohorts)
and changes only when a cohort starts, a writer joins one or a cohort completes, so it costs
nothing on the data path.

Before cohorts had their name the file was `writer-groups.json`, `{"groups": [...]}` with the
same entries: a partition directory holding only that file loads it, and the next save
replaces it with `cohorts.json` (the old file goes once the new one is durable).

`load_cohorts` and `save_cohorts` block (run them on a thread); `CohortSaver` is the shell's
per-partition writer: one save at a time, coalesced to the latest revision asked.

Must not: decide anything about cohorts (the core does), or touch the log's own files.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor

import msgspec

from catalog.errors import StorageError
from querylib._state_file import fsync_dir, replace_file

from ._events import CohortsSaved, CohortsSaveFailed, PartitionId, SaveCohorts, Stimulus
from ._frontier import MAX_COHORT_NAME, MAX_WRITER_NAME, MAX_WRITERS, SavedCohort

__all__ = ["COHORTS_FILE", "LEGACY_FILE", "CohortSaver", "load_cohorts", "save_cohorts"]

logger = logging.getLogger("querylib.broker")

COHORTS_FILE = "cohorts.json"
LEGACY_FILE = "writer-groups.json"  # written before cohorts had their name
_MAX_FILE = 4 * 1024 * 1024  # far above 64 cohorts of 4096 short names; a bound, not a size


class _File(msgspec.Struct):
    cohorts: list[tuple[str, int, list[str]]]


class _LegacyFile(msgspec.Struct):
    groups: list[tuple[str, int, list[str]]]


def load_cohorts(directory: str) -> tuple[SavedCohort, ...]:
    """The pending cohorts saved in a partition directory (none if there is no file; the
    legacy `writer-groups.json` when there is no `cohorts.json`). A file that cannot be read
    or parsed is reported and ignored: the partition then opens as it did before cohorts were
    saved (its writers rejoin as plain producers)."""
    for name, kind in ((COHORTS_FILE, _File), (LEGACY_FILE, _LegacyFile)):
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_FILE + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.error("%s: cannot read the saved cohorts: %s", path, exc)
            return ()
        return _parse(path, data, kind)
    return ()


def _parse(path: str, data: bytes, kind: type[_File] | type[_LegacyFile]
           ) -> tuple[SavedCohort, ...]:
    try:
        if len(data) > _MAX_FILE:
            raise ValueError(f"larger than {_MAX_FILE} bytes")
        parsed = msgspec.json.decode(data, type=kind)
        entries = parsed.cohorts if isinstance(parsed, _File) else parsed.groups
        cohorts = tuple(SavedCohort(name, writers, tuple(joined))
                        for name, writers, joined in entries)
        for g in cohorts:
            if (not 0 < len(g.name) <= MAX_COHORT_NAME or not 0 < g.writers <= MAX_WRITERS
                    or len(g.joined) > MAX_WRITERS
                    or any(not 0 < len(w) <= MAX_WRITER_NAME for w in g.joined)):
                raise ValueError(f"cohort {g.name[:80]!r} is out of bounds")
    except (msgspec.DecodeError, ValueError) as exc:
        logger.error("%s: ignoring damaged saved cohorts: %s", path, exc)
        return ()
    return cohorts


def save_cohorts(directory: str, cohorts: tuple[SavedCohort, ...]) -> None:
    """Replace the saved cohorts of a partition directory atomically (remove them if none);
    a legacy `writer-groups.json` goes once the new state is durable."""
    path = os.path.join(directory, COHORTS_FILE)
    try:
        if cohorts:
            data = msgspec.json.encode(_File([(g.name, g.writers, list(g.joined))
                                              for g in cohorts]))
            replace_file(path, data, mode=0o644)
        elif _unlink(path):
            fsync_dir(directory)
        if _unlink(os.path.join(directory, LEGACY_FILE)):  # once, after an upgrade
            fsync_dir(directory)
    except OSError as exc:
        raise StorageError(f"cannot save the cohorts in {directory}: {exc}") from exc


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class CohortSaver:
    """Performs `SaveCohorts` for one partition on `executor`: one write at a time, and a save
    asked while one runs is folded into the next write (only the latest revision counts).
    Reports CohortsSaved / CohortsSaveFailed through `report`."""

    def __init__(self, pid: PartitionId, directory: str, executor: Executor,
                 report: Callable[[Stimulus], None]) -> None:
        self.pid = pid
        self.directory = directory
        self._executor = executor
        self._report = report
        self._latest: SaveCohorts | None = None
        self._task: asyncio.Task[None] | None = None

    def submit(self, save: SaveCohorts) -> None:
        self._latest = save
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name=f"save cohorts {self.pid[0]}-{self.pid[1]}")

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._latest is not None:
                save, self._latest = self._latest, None
                try:
                    await loop.run_in_executor(self._executor, save_cohorts, self.directory,
                                               save.cohorts)
                except StorageError as exc:
                    logger.error("%s-%s: %s", *self.pid, exc)
                    self._report(CohortsSaveFailed(self.pid, save.revision, exc))
                else:
                    self._report(CohortsSaved(self.pid, save.revision))
        finally:
            self._task = None

    async def close(self) -> None:
        """Finish the save in progress and any asked meanwhile."""
        while self._task is not None:
            await asyncio.shield(self._task)
