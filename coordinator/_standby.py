"""A warm standby (DESIGN §3 "Coordinator failover"): while another coordinator is active, keep
the catalog current in memory from etcd, so that at takeover only the tail is left to read.

`start` reads the catalog (checkpoint + log) once and follows etcd's log from there;
`take_over`, called once this coordinator is elected (the deposed one can write nothing more),
stops following and applies the commits the watch had not delivered yet. A gap (a checkpoint
the watch does not see, as when the first active seeds etcd) or a failed watch makes it read
everything again: never a catalog that skipped a change.

Owns its follow task and its catalog; writes nothing, to etcd or anywhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from catalog import Catalog

from ._failover import Commit, EtcdCatalog, ReadCatalog

__all__ = ["WarmStandby"]

logger = logging.getLogger("coordinator")


class WarmStandby:
    """The catalog as etcd holds it, kept current while this coordinator waits to be elected."""

    def __init__(self, etcd: EtcdCatalog) -> None:
        self.etcd = etcd
        self.catalog = Catalog()
        self.reads = 0      # whole reads: the first, and one after each gap or compaction
        self.followed = 0   # changes applied from the watch
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read the catalog, then follow etcd's log in a task of its own."""
        read = await self.etcd.read()
        self._load(read)
        self._task = asyncio.get_running_loop().create_task(
            self.etcd.follow(read, self._apply, self._reread), name="etcd standby follow")

    async def take_over(self) -> Catalog:
        """Elected: stop following; the catalog with every commit etcd holds."""
        await self.close()
        tail = await self.etcd.commits_after(self.catalog.version)
        if tail is None or not self._applied(tail):
            self._load(await self.etcd.read())
        return self.catalog

    async def close(self) -> None:
        """Stop following. A watch that had failed is logged here (its catalog is still
        right, only behind: `take_over` reads what it lacks)."""
        task, self._task = self._task, None
        if task is None:
            return
        # Cancelled until it is done: Python 3.11's asyncio.wait_for (inside aetcd's watch
        # creation) can swallow a cancellation that meets its result, and the follow would
        # then go on watching while the coordinator waited for it.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.05)
        outcome = None if task.cancelled() else task.exception()
        if isinstance(outcome, Exception):
            logger.warning("coordinator: following etcd as a standby stopped at catalog "
                           "version %d: %s", self.catalog.version, outcome)

    def _load(self, read: ReadCatalog) -> None:
        self.catalog = Catalog.replay(read.updates)
        self.reads += 1

    async def _apply(self, commits: list[Commit]) -> None:
        if not self._applied(commits):
            logger.info("coordinator: a gap after catalog version %d in etcd's log: reading "
                        "it whole", self.catalog.version)
            self._load(await self.etcd.read())

    async def _reread(self, fresh: ReadCatalog) -> None:
        self._load(fresh)

    def _applied(self, commits: Sequence[Commit]) -> bool:
        """Apply the changes after our version; False (nothing applied) on a gap."""
        changes = [(v, u) for v, u in commits if v > self.catalog.version]
        if changes and changes[0][0] != self.catalog.version + 1:
            return False
        for version, updates in changes:
            self.catalog.apply_committed(version, updates)
            self.followed += 1
        return True
