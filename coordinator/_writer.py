"""Appending catalog changes to the catalog topics: group commit, counters last, frontiers after.

The core emits one `Persist` per change; the writer collects whatever arrived while the last
commit was being written into the next commit (group commit: one batch per collection per commit,
and under load one fsync serves many changes). A commit is written in two steps:

  1. the batches of every collection but `counters`, in parallel, and wait until each is durable;
  2. the `counters` batch, and wait until it is durable: the commit is done.

Only then does `on_committed(version)` let the core answer the commit's requests (the counters
topic is the commit record; see `_journal`). A checkpoint queued after some changes is written
once they are committed: every collection's block in parallel (encoded on a thread: a block is
the whole collection), then its entry in `__catalog_checkpoints`, then `on_checkpointed`.
Frontiers follow commits: the topics a commit touched advance to version + 1 right away, once
per topic per commit, so a follower sees Progress past a change as soon as it is durable. An
untouched topic holds no record the lag could hide, so it advances only when someone needs its
frontier: `catch_up()` (the shell calls it when it answers `GetCatalogInfo`, which a follower
asks before it subscribes, so its snapshot at the reported version comes at once) and otherwise
within `sweep_interval` (1 s) of the first commit it missed: one timer however many commits
come meanwhile, never on a commit's own path. Each advance is a control batch the broker makes
durable; sweeping every topic after each commit cost ~8 such appends per change.

Durability is the broker's: the coordinator's broker runs with flush "always", so a batch is
acknowledged only once fsynced. Catalog changes are few next to data and each one is something
a client was told happened (an id handed out, a topic created), so each must survive a machine
crash, not only a process crash; group commit keeps the fsync cost per commit, not per change.

Any failure to append is fatal to the coordinator (`on_failed`): its memory would run ahead of
the log, which is the source of truth. Restarting recovers from the log. Cancellation (the
loop going away under a write) is no failure: the writer stops (`stopped`), writes nothing
more and calls nothing; what it had not committed is recovered from the log like a crash.

It writes through the in-process door of the coordinator's own broker (`BrokerPort`), as tq
itself ("system": the catalog topics are internal), the same way any producer writes: the
broker's core admits it, grants its windows and acknowledges once durable.

Owns its producers (one broker session each) and its two tasks; decides nothing about the
catalog.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from catalog import COLLECTIONS, CollectionName, StorageError, Update, catalog_topic
from querylib.broker import AsyncProducer, Produced
from querylib.server.broker import BrokerPort

from ._events import Persist, WriteCheckpoint
from ._failover import EtcdCatalog
from ._journal import (
    CHECKPOINT_TOPIC,
    CheckpointEntry,
    TimedUpdate,
    encode_block,
    encode_checkpoint,
    encode_updates,
    group_updates,
)

__all__ = ["CatalogWriter"]

logger = logging.getLogger("coordinator")


class CatalogWriter:
    """Writes changes to the `__catalog.*` partitions of the broker in this process."""

    def __init__(self, port: BrokerPort, *, on_committed: Callable[[int], None],
                 on_failed: Callable[[BaseException], None],
                 on_checkpointed: Callable[[int, dict[str, int]], None] | None = None,
                 lease: float = 10.0, sweep_interval: float = 1.0,
                 replica: EtcdCatalog | None = None) -> None:
        self.port = port
        self.replica = replica  # etcd, when standbys follow: each commit goes there too
        self._lease = lease
        self._cores: dict[str, AsyncProducer] = {}
        self._on_committed = on_committed
        self._on_failed = on_failed
        self._on_checkpointed = on_checkpointed
        self._index: AsyncProducer | None = None
        self.sweep_interval = sweep_interval
        self._queue: list[Persist | WriteCheckpoint] = []
        self._writing: asyncio.Task[None] | None = None
        self._frontiers: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._touched: set[str] = set()
        self._catch_up = False
        self._sweep_timer: asyncio.TimerHandle | None = None
        self.committed = 0
        self.failed: BaseException | None = None
        self.stopped = False  # cancelled under a write: it writes nothing more
        self.statistics = {"commits": 0, "changes": 0, "batches": 0, "checkpoints": 0}

    async def start(self, committed: int) -> None:
        """Open the producers; frontiers of every collection catch up to `committed` + 1."""
        self.committed = committed
        for collection in COLLECTIONS:
            producer = AsyncProducer(self.port, catalog_topic(collection), 0,
                                     principal="system", lease=self._lease, create=True)
            await producer.start()
            self._cores[collection] = producer
        self._index = AsyncProducer(self.port, CHECKPOINT_TOPIC, 0, principal="system",
                                    lease=self._lease, create=True)
        await self._index.start()
        self._touched.update(COLLECTIONS)
        self._frontiers = asyncio.get_running_loop().create_task(
            self._advance_frontiers(), name="catalog frontiers")
        self._wake.set()

    async def append_now(self, updates: dict[str, list[TimedUpdate]], wall_ms: int) -> None:
        """Append updates outside any change (recovery's compensation) and wait until durable."""
        await self._append(updates, wall_ms)

    def submit(self, item: Persist | WriteCheckpoint) -> None:
        """Queue a change (committed after every change submitted before it) or a checkpoint
        (written once every change submitted before it is committed)."""
        if self.failed is not None or self.stopped:
            return
        self._queue.append(item)
        if self._writing is None:
            self._writing = asyncio.get_running_loop().create_task(
                self._write_commits(), name="catalog writer")

    def catch_up(self) -> None:
        """Advance every collection's frontier to the committed version + 1 soon: a follower
        is about to wait for a snapshot at a version its collection may not have reached."""
        self._catch_up = True
        self._wake.set()

    async def drain(self) -> None:
        """Wait until every submitted change is committed (or the writer failed or stopped)."""
        while (writing := self._writing) is not None:
            await asyncio.wait([writing])  # its end, not its outcome (a cancellation is its own)

    async def close(self) -> None:
        await self.drain()
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        if self._frontiers is not None:
            self._frontiers.cancel()
            await asyncio.gather(self._frontiers, return_exceptions=True)
        for producer in [*self._cores.values(), *filter(None, [self._index])]:
            try:
                # A catalog topic never ends: leave without an end-of-stream.
                await producer.close(end=False)
            except Exception as exc:  # closing anyway; the log keeps what was acknowledged
                logger.warning("coordinator: closing %s: %s", producer.core.topic, exc)

    # -- commits --------------------------------------------------------------------------------

    async def _write_commits(self) -> None:
        try:
            while self._queue and self.failed is None and not self.stopped:
                checkpoint = next((i for i, item in enumerate(self._queue)
                                   if isinstance(item, WriteCheckpoint)), len(self._queue))
                commit = self._queue[:checkpoint]
                try:
                    if commit:
                        del self._queue[:checkpoint]
                        await self._write_commit(cast("list[Persist]", commit))  # no checkpoint
                        if self.replica is not None:  # before it is answered (DESIGN §3)
                            await self.replica.append([(c.version, list(c.updates))
                                                       for c in cast("list[Persist]", commit)])
                    else:
                        item = self._queue.pop(0)
                        assert isinstance(item, WriteCheckpoint)  # what ended the commit
                        await self._write_checkpoint(item)
                        continue
                except asyncio.CancelledError:
                    self.stopped = True
                    logger.info("coordinator: catalog write cancelled; %d changes queued "
                                "behind it are not written", len(self._queue))
                    raise
                except Exception as exc:
                    self.failed = exc
                    logger.critical("coordinator: cannot append to the catalog topics: %s", exc)
                    self._on_failed(exc)
                    return
                self.committed = commit[-1].version
                self.statistics["commits"] += 1
                self.statistics["changes"] += len(commit)
                self._on_committed(self.committed)
                self._wake.set()
        finally:
            self._writing = None

    async def _write_commit(self, commit: list[Persist]) -> None:
        per = group_updates(commit)
        counters = per.pop("counters", [])
        wall_ms = commit[-1].wall_ms
        await self._append(per, wall_ms)
        await self._append({"counters": counters}, wall_ms)
        self._touched.update(per)
        self._touched.add("counters")

    async def _write_checkpoint(self, checkpoint: WriteCheckpoint) -> None:
        loop = asyncio.get_running_loop()
        wall_ms = int(time.time() * 1000)
        sent: list[tuple[str, AsyncProducer, list[asyncio.Future[Produced | None]]]] = []
        for collection, records in checkpoint.contents.items():
            # Encoding a whole collection takes a while: not on the event loop.
            batches = await loop.run_in_executor(None, encode_block, checkpoint.version,
                                                 records, wall_ms)
            producer = self._cores[collection]
            sent.append((collection, producer,
                         [await producer.send_batch(batch) for batch in batches]))
        offsets = {}
        for collection, producer, tasks in sent:
            replies = [await task for task in tasks]
            if replies[0] is None or any(reply is None for reply in replies):
                await producer.flush()
                raise StorageError(f"checkpoint of {producer.core.topic} failed")
            offsets[collection] = replies[0].base_offset
        assert self._index is not None
        entry = CheckpointEntry(version=checkpoint.version, offsets=offsets)
        if await (await self._index.send_batch(encode_checkpoint(entry, wall_ms))) is None:
            await self._index.flush()
            raise StorageError(f"appending to {CHECKPOINT_TOPIC} failed")
        if self.replica is not None:  # etcd keeps this checkpoint and the commits after it
            await self.replica.checkpoint(checkpoint.version, [
                Update(cast("CollectionName", collection), record, count)
                for collection, records in checkpoint.contents.items()
                for record, count in records])
        self.statistics["checkpoints"] += 1
        if self._on_checkpointed is not None:
            self._on_checkpointed(checkpoint.version, offsets)

    async def _append(self, updates: dict[str, list[TimedUpdate]], wall_ms: int) -> None:
        sent: list[tuple[AsyncProducer, asyncio.Future[Produced | None]]] = []
        for collection, timed in updates.items():
            producer = self._cores[collection]
            for batch in encode_updates(timed, wall_ms):
                sent.append((producer, await producer.send_batch(batch)))
                self.statistics["batches"] += 1
        for producer, task in sent:
            if await task is None:
                await producer.flush()  # raises the failure the producer recorded
                raise StorageError(f"append to {producer.core.topic} failed")

    def _sweep_due(self) -> None:
        self._sweep_timer = None
        self.catch_up()

    # -- frontiers -----------------------------------------------------------------------------

    async def _advance_frontiers(self) -> None:
        """One task for all frontiers, so advances coalesce: under load one advance per topic
        covers every change committed while the previous advance was being issued."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            target = self.committed + 1
            touched, self._touched = self._touched, set()
            if self._catch_up:
                self._catch_up = False
                touched = set(self._cores)
            for collection in touched:
                core = self._cores[collection]
                if core.frontier < target:
                    await core.advance(target)
            behind = any(c.frontier < target for c in self._cores.values())
            if behind and self._sweep_timer is None:  # one timer, however many commits come
                self._sweep_timer = loop.call_later(self.sweep_interval, self._sweep_due)
