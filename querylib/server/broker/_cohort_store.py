"""Pending writer groups on disk, beside the partition log (DESIGN §5 "Collective publishing").

A partition whose writer group still waits for writers keeps it in `<partition dir>/
writer-groups.json`: `{"groups": [[name, writers expected, [writers joined...]], ...]}`,
oldest first. It is replaced atomically (written to a `.tmp` file, fsynced, renamed, the
directory fsynced; the log's recovery removes a `.tmp` a crash left) and removed when no
group waits. A file is tiny (at most `max_writer_groups` groups) and changes only when a
group starts, a writer joins one or a group completes, so it costs nothing on the data path.

`load_groups` and `save_groups` block (run them on a thread); `GroupSaver` is the shell's
per-partition writer: one save at a time, coalesced to the latest revision asked.

Must not: decide anything about groups (the core does), or touch the log's own files.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor

import msgspec

from catalog.errors import StorageError

from ._events import GroupsSaved, GroupsSaveFailed, PartitionId, SaveGroups, Stimulus
from ._frontier import MAX_GROUP_NAME, MAX_WRITER_NAME, MAX_WRITERS, SavedGroup

__all__ = ["GROUPS_FILE", "GroupSaver", "load_groups", "save_groups"]

logger = logging.getLogger("querylib.broker")

GROUPS_FILE = "writer-groups.json"
_MAX_FILE = 4 * 1024 * 1024  # far above 64 groups of 4096 short names; a bound, not a size


class _File(msgspec.Struct):
    groups: list[tuple[str, int, list[str]]]


def load_groups(directory: str) -> tuple[SavedGroup, ...]:
    """The pending groups saved in a partition directory (none if there is no file). A file
    that cannot be read or parsed is reported and ignored: the partition then opens as it did
    before groups were saved (its writers rejoin as plain producers)."""
    path = os.path.join(directory, GROUPS_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE + 1)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        logger.error("%s: cannot read the saved writer groups: %s", path, exc)
        return ()
    try:
        if len(data) > _MAX_FILE:
            raise ValueError(f"larger than {_MAX_FILE} bytes")
        parsed = msgspec.json.decode(data, type=_File)
        groups = tuple(SavedGroup(name, writers, tuple(joined))
                       for name, writers, joined in parsed.groups)
        for g in groups:
            if (not 0 < len(g.name) <= MAX_GROUP_NAME or not 0 < g.writers <= MAX_WRITERS
                    or len(g.joined) > MAX_WRITERS
                    or any(not 0 < len(w) <= MAX_WRITER_NAME for w in g.joined)):
                raise ValueError(f"group {g.name[:80]!r} is out of bounds")
    except (msgspec.DecodeError, ValueError) as exc:
        logger.error("%s: ignoring damaged saved writer groups: %s", path, exc)
        return ()
    return groups


def save_groups(directory: str, groups: tuple[SavedGroup, ...]) -> None:
    """Replace the saved groups of a partition directory atomically (remove them if none)."""
    path = os.path.join(directory, GROUPS_FILE)
    try:
        if not groups:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
        else:
            data = msgspec.json.encode(_File([(g.name, g.writers, list(g.joined))
                                              for g in groups]))
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename (or unlink) itself must survive a crash
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"cannot save the writer groups in {directory}: {exc}") from exc


class GroupSaver:
    """Performs `SaveGroups` for one partition on `executor`: one write at a time, and a save
    asked while one runs is folded into the next write (only the latest revision counts).
    Reports GroupsSaved / GroupsSaveFailed through `report`."""

    def __init__(self, pid: PartitionId, directory: str, executor: Executor,
                 report: Callable[[Stimulus], None]) -> None:
        self.pid = pid
        self.directory = directory
        self._executor = executor
        self._report = report
        self._latest: SaveGroups | None = None
        self._task: asyncio.Task[None] | None = None

    def submit(self, save: SaveGroups) -> None:
        self._latest = save
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name=f"save groups {self.pid[0]}-{self.pid[1]}")

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._latest is not None:
                save, self._latest = self._latest, None
                try:
                    await loop.run_in_executor(self._executor, save_groups, self.directory,
                                               save.groups)
                except StorageError as exc:
                    logger.error("%s-%s: %s", *self.pid, exc)
                    self._report(GroupsSaveFailed(self.pid, save.revision, exc))
                else:
                    self._report(GroupsSaved(self.pid, save.revision))
        finally:
            self._task = None

    async def close(self) -> None:
        """Finish the save in progress and any asked meanwhile."""
        while self._task is not None:
            await asyncio.shield(self._task)
