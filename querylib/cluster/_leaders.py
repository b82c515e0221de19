"""Where the catalog says replicated partitions are led, for the clients writing and reading
them: `LeaderWatch` (DESIGN §5 "Replication", "Clients follow the catalog").

A broker link notices on its own that its broker died only after a lease of silence (10 s by
default), though the controller may have moved the partition's leadership long before (an
executor's lease, 2 s in a test). So a link that knows its topic and partition (a producer's,
a subscriber's) watches the catalog: `watch(topic, partition, moved)` calls `moved()` whenever
the partition's leader (its broker, its leader epoch, its topic's incarnation) changes from what
it was when the watch began; the link then asks `locate` and moves (querylib/broker/_session.py).

Cost, for a process with clients of many topics: one follower of the catalog's `topics`
collection per cluster connection, however many partitions are watched (a subscriber of one
catalog topic on the coordinator's broker, as every executor holds), started with the first
watch and stopped when the last one ends; the view of topics it keeps is the collection's
size, as an executor's. A catalog change costs each watching process one delivery, and a
leader change each of its links of that partition one look-up.

A leader that moves while the follower starts (between a link's look-up and the snapshot) is
not told: that link notices as before (a refusal from the old leader, or its lease). Runs on
the cluster's loop: `watch` and the function it returns are called there; `moved` callbacks
run there and must be quick (a link hands the word to its own loop).
Must not: decide where a client goes (its `locate` asks the catalog), or write anything.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from catalog import Record, Topic, TqError

from ._follow import Snapshot

if TYPE_CHECKING:
    from ._session import AsyncCluster

__all__ = ["LeaderWatch"]

logger = logging.getLogger("querylib.cluster")

_RETRY_FOLLOW = 1.0  # seconds before following the catalog again after an error

# A partition's leader as the catalog names it: (topic id, broker id, leader epoch).
Leader = tuple[int, int, int]


class LeaderWatch:
    """The leaders of the partitions watched through one cluster connection."""

    def __init__(self, cluster: AsyncCluster) -> None:
        self._cluster = cluster
        self._watchers: dict[tuple[str, int], dict[int, Callable[[], None]]] = {}
        self._leaders: dict[tuple[str, int], Leader | None] = {}  # as last told
        # The followed view of the collection, by short name (a name's topic deleted and
        # created again may show both until the change that does it is complete).
        self._topics: dict[str, dict[Topic, int]] = {}
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._snapshot = False  # the view holds the collection (a snapshot came)

    @property
    def following(self) -> bool:
        """Whether the catalog is being followed (some partition is watched)."""
        return self._task is not None

    def watch(self, topic: str, partition: int, moved: Callable[[], None]) -> Callable[[], None]:
        """Call `moved()` whenever partition `partition` of `topic` gets another leader; returns
        the function that ends this watch."""
        key = (topic, partition)
        watch_id = next(self._ids)
        self._watchers.setdefault(key, {})[watch_id] = moved
        if key not in self._leaders and self._snapshot:
            self._leaders[key] = self._leader(key)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._follow(), name="catalog leaders of watched partitions")

        def stop() -> None:
            watchers = self._watchers.get(key)
            if watchers is None or watchers.pop(watch_id, None) is None:
                return
            if not watchers:
                del self._watchers[key]
                self._leaders.pop(key, None)
            if not self._watchers and self._task is not None:
                self._task.cancel()
                self._task = None
                self._topics.clear()
                self._snapshot = False

        return stop

    async def close(self) -> None:
        self._watchers.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _follow(self) -> None:
        while True:
            try:
                async with self._cluster.follow("topics") as follower:
                    async for event in follower:
                        if isinstance(event, Snapshot):
                            self._topics.clear()
                            self._count(event.records)
                            touched = None
                        else:
                            touched = self._count(event.updates)
                        self._changed(touched, first=not self._snapshot)
                        self._snapshot = True
            except TqError as exc:  # the coordinator is away or restarting: follow again
                logger.info("catalog leaders: %s; following again", exc)
                await asyncio.sleep(_RETRY_FOLLOW)

    def _count(self, updates: Iterable[tuple[Record, int]]) -> set[str]:
        """Apply `updates` to the view; the names of the topics they touched."""
        touched = set()
        for record, diff in updates:
            if not isinstance(record, Topic):
                continue
            name = record.short_name
            touched.add(name)
            counts = self._topics.setdefault(name, {})
            count = counts.get(record, 0) + diff
            if count > 0:
                counts[record] = count
            else:
                counts.pop(record, None)
                if not counts:
                    del self._topics[name]
        return touched

    def _changed(self, touched: set[str] | None, *, first: bool) -> None:
        """Tell the watchers of each partition of a `touched` topic (None: any) whose leader is
        not the one last told (on the first snapshot, only learn them)."""
        for key, watchers in list(self._watchers.items()):
            if touched is not None and key[0] not in touched:
                continue
            leader = self._leader(key)
            if first or key not in self._leaders:
                self._leaders[key] = leader
                continue
            if leader == self._leaders[key]:
                continue
            self._leaders[key] = leader
            logger.info("catalog: the leader of %s-%d is now %s", *key, leader)
            for moved in list(watchers.values()):
                moved()

    def _leader(self, key: tuple[str, int]) -> Leader | None:
        best: Leader | None = None
        name, partition = key
        for topic in self._topics.get(name, {}):  # the newest incarnation, if two
            if partition < len(topic.locations):
                epoch = topic.leader_epochs[partition] if topic.leader_epochs else 0
                found = topic.topic_id, topic.locations[partition], epoch
                if best is None or found > best:
                    best = found
        return best
