"""`LeaderWatch` (querylib/cluster/_leaders.py): which catalog changes tell a watcher that its
partition's leader moved, fed catalog events by a fake follower (the real one is a broker
subscription, proved end to end in tests/integration/test_replication_leader_watch.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from catalog import Topic, TopicKind
from catalog._records import SystemRef
from querylib.cluster._follow import Diff, Snapshot
from querylib.cluster._leaders import LeaderWatch


def _topic(leader: int, epoch: int, *, isr: tuple[int, ...] = (1, 2, 3),
           topic_id: int = 7, name: str = "kept") -> Topic:
    return Topic(topic_id=topic_id, name=f"persistent://public/default/{name}", partitions=2,
                 record_type="bytes", kind=TopicKind.STREAM, owner=SystemRef(),
                 locations=(leader, 2), internal=False, created_at_ms=topic_id,
                 replicas=((1, 2, 3), (2, 3, 1)), isr=(isr, (2, 3, 1)),
                 leader_epochs=(epoch, 0))


class _Follower:
    """What `cluster.follow("topics")` gives: the events put in `events`."""

    def __init__(self, events: asyncio.Queue[Any]) -> None:
        self.events = events

    async def __aenter__(self) -> _Follower:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    def __aiter__(self) -> _Follower:
        return self

    async def __anext__(self) -> Any:
        return await self.events.get()


class _Cluster:
    def __init__(self) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.follows = 0

    def follow(self, collection: str) -> _Follower:
        assert collection == "topics"
        self.follows += 1
        return _Follower(self.events)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_watcher_is_told_when_its_partitions_leader_changes_and_only_then() -> None:
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        told: list[str] = []
        stop = watch.watch("kept", 0, lambda: told.append("p0"))
        watch.watch("kept", 1, lambda: told.append("p1"))
        await _settle()
        assert watch.following and cluster.follows == 1  # one follower for every watch
        first = _topic(1, 0)
        cluster.events.put_nowait(Snapshot("topics", 1, [(first, 1)]))
        await _settle()
        assert told == []  # the snapshot only teaches where the leaders are

        shrunk = _topic(1, 0, isr=(1, 2))  # the ISR shrinks: the leader stays
        cluster.events.put_nowait(Diff("topics", 2, [(first, -1), (shrunk, 1)]))
        await _settle()
        assert told == []

        moved = _topic(2, 1, isr=(2,))  # the controller moves partition 0's leadership
        cluster.events.put_nowait(Diff("topics", 3, [(shrunk, -1), (moved, 1)]))
        await _settle()
        assert told == ["p0"]

        again = _topic(2, 1, topic_id=8)  # deleted and created again: another incarnation,
        cluster.events.put_nowait(Diff("topics", 4, [(moved, -1), (again, 1)]))
        await _settle()
        assert told == ["p0", "p0", "p1"]  # every partition of which is elsewhere

        stop()
        back = _topic(1, 2, topic_id=8)
        cluster.events.put_nowait(Diff("topics", 5, [(again, -1), (back, 1)]))
        await _settle()
        assert told == ["p0", "p0", "p1"]  # partition 0 no longer watched
        await watch.close()
        assert not watch.following

    asyncio.run(main())


def test_a_watch_begun_after_the_snapshot_starts_from_the_view() -> None:
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        stop_other = watch.watch("other", 0, lambda: None)
        first = _topic(1, 0)
        cluster.events.put_nowait(Snapshot("topics", 1, [(first, 1)]))
        await _settle()
        told: list[int] = []
        watch.watch("kept", 0, lambda: told.append(0))
        unrelated = _topic(5, 0, topic_id=9, name="unrelated")
        cluster.events.put_nowait(Diff("topics", 2, [(unrelated, 1)]))
        await _settle()
        assert told == []  # the leader it started from (the view's) has not changed
        moved = _topic(3, 1)
        cluster.events.put_nowait(Diff("topics", 3, [(first, -1), (moved, 1)]))
        await _settle()
        assert told == [0]
        stop_other()
        assert watch.following  # one watch is left
        await watch.close()

    asyncio.run(main())


def test_the_follower_stops_with_the_last_watch() -> None:
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        stops = [watch.watch("kept", p, lambda: None) for p in (0, 1)]
        await _settle()
        stops[0]()
        assert watch.following
        stops[1]()
        stops[1]()  # twice: nothing more
        assert not watch.following
        watch.watch("kept", 0, lambda: None)  # and starts again with a new one
        await _settle()
        assert watch.following and cluster.follows == 2
        await watch.close()

    asyncio.run(main())
