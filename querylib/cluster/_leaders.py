"""Where the catalog says replicated partitions are led, for the clients writing and reading
them: `LeaderWatch` (DESIGN §5 "Replication", "Clients follow the catalog").

A broker link notices on its own that its broker died only after a lease of silence (10 s by
default), though the controller may have moved the partition's leadership long before (an
executor's lease, 2 s in a test). So a link that knows its topic and partition (a producer's,
a subscriber's) watches the catalog: `watch(topic, partition, moved)` calls `moved()` whenever
the partition's leader (its broker, its leader epoch, its topic's incarnation) is another than
the one the link knows; the link then asks `locate` and moves (querylib/broker/_session.py).

Cost, for a process with clients of many topics: one follower of the catalog's `topics`
collection per cluster connection, however many partitions are watched (a subscriber of one
catalog topic on the coordinator's broker, as every executor holds), started with the first
watch and stopped when the last one ends; the view of topics it keeps is the collection's
size, as an executor's. A catalog change costs each watching process one delivery, and a
leader change each of its links of that partition one look-up.

A leader that moves while a watch starts (after the client looked its leader up, before the
follower's view holds the change) is told too: a watch names the leader its client started at
(`since`, `leader_of` the TopicInfo its address came from), and each watcher is compared with
the view on its own (when it begins, if the view is there, and at every snapshot and change),
not only with what the view held before; a leader older than the one a watcher knows (a view
that lags the client's look-up) is no news. A watch naming no leader is told once at its first
comparison (the client checks with one look-up). Runs on the cluster's loop: `watch` and the
function it returns are called there; `moved` callbacks run there and must be quick (a link
hands the word to its own loop).
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
from .messages import partition_leader

if TYPE_CHECKING:
    from ._session import AsyncCluster

__all__ = ["Leader", "LeaderWatch", "leader_of"]

logger = logging.getLogger("querylib.cluster")

_RETRY_FOLLOW = 1.0  # seconds before following the catalog again after an error

# A partition's leader as the catalog names it: (topic id, broker id, leader epoch).
Leader = tuple[int, int, int]


def leader_of(topic: Topic, partition: int) -> Leader | None:
    """Partition `partition`'s leader in `topic` (None: no such partition)."""
    if not 0 <= partition < len(topic.locations):
        return None
    return partition_leader(topic, partition)


def _older(leader: Leader | None, than: Leader | None) -> bool:
    """Whether `leader` comes before `than` (an earlier incarnation, or an earlier epoch of
    the same one): a view that has not caught up with a client's look-up yet."""
    if leader is None or than is None:
        return False
    return (leader[0], leader[2]) < (than[0], than[2])


class _Unknown:
    """A watcher's leader before its first comparison when its watch named none."""


_UNKNOWN = _Unknown()


class _Watcher:
    __slots__ = ("known", "moved")

    def __init__(self, moved: Callable[[], None], known: Leader | None | _Unknown) -> None:
        self.moved = moved
        self.known = known


class LeaderWatch:
    """The leaders of the partitions watched through one cluster connection."""

    def __init__(self, cluster: AsyncCluster) -> None:
        self._cluster = cluster
        self._watchers: dict[tuple[str, int], dict[int, _Watcher]] = {}
        # The followed view of the collection, by short name (a name's topic deleted and
        # created again may show both until the change that does it is complete).
        self._topics: dict[str, dict[Topic, int]] = {}
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._snapshot = False  # the view holds the collection (a snapshot came)
        self._holds = 0  # `hold`s: follow on while nothing is watched

    @property
    def following(self) -> bool:
        """Whether the catalog is being followed (some partition is watched)."""
        return self._task is not None

    def watch(self, topic: str, partition: int, moved: Callable[[], None], *,
              since: Leader | None = None) -> Callable[[], None]:
        """Call `moved()` whenever partition `partition` of `topic` gets another leader than
        the one its client knows: `since` at first (`leader_of` the topic its client looked
        up; not given: unknown, so told at the first comparison); returns the function that
        ends this watch."""
        key = (topic, partition)
        watch_id = next(self._ids)
        watcher = _Watcher(moved, _UNKNOWN if since is None else since)
        self._watchers.setdefault(key, {})[watch_id] = watcher
        if self._snapshot:  # the view may already be past what the client looked up
            asyncio.get_running_loop().call_soon(self._compare, key, watch_id)
        self._start()

        def stop() -> None:
            watchers = self._watchers.get(key)
            if watchers is None or watchers.pop(watch_id, None) is None:
                return
            if not watchers:
                del self._watchers[key]
            self._stop_when_idle()

        return stop

    def hold(self) -> Callable[[], None]:
        """Follow the catalog from now on even while no partition is watched, until the
        returned function is called: for a process whose clients come and go (Spark tasks a
        worker runs one after another), so each does not pay for a new snapshot."""
        self._holds += 1
        self._start()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._holds -= 1
                self._stop_when_idle()

        return release

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._follow(), name="catalog leaders of watched partitions")

    def _stop_when_idle(self) -> None:
        if not self._watchers and not self._holds and self._task is not None:
            self._task.cancel()
            self._task = None
            self._topics.clear()
            self._snapshot = False

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
                        self._snapshot = True
                        self._changed(touched)
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

    def _changed(self, touched: set[str] | None) -> None:
        """Compare the watchers of each partition of a `touched` topic (None: any) with the
        view."""
        for key, watchers in list(self._watchers.items()):
            if touched is None or key[0] in touched:
                for watch_id in list(watchers):
                    self._compare(key, watch_id)

    def _compare(self, key: tuple[str, int], watch_id: int) -> None:
        """Tell one watcher if the view names another leader than the one it knows."""
        watcher = self._watchers.get(key, {}).get(watch_id)
        if watcher is None or not self._snapshot:
            return
        leader = self._leader(key)
        known = watcher.known
        if not isinstance(known, _Unknown) and (leader == known or _older(leader, known)):
            return
        watcher.known = leader
        logger.info("catalog: the leader of %s-%d is now %s", *key, leader)
        watcher.moved()

    def _leader(self, key: tuple[str, int]) -> Leader | None:
        best: Leader | None = None
        name, partition = key
        for topic in self._topics.get(name, {}):  # the newest incarnation, if two
            found = leader_of(topic, partition)
            if found is not None and (best is None or found > best):
                best = found
        return best
