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
        stop = watch.watch("kept", 0, lambda: told.append("p0"), since=(7, 1, 0))
        watch.watch("kept", 1, lambda: told.append("p1"), since=(7, 2, 0))
        await _settle()
        assert watch.following and cluster.follows == 1  # one follower for every watch
        first = _topic(1, 0)
        cluster.events.put_nowait(Snapshot("topics", 1, [(first, 1)]))
        await _settle()
        assert told == []  # the snapshot names the leaders the clients started at

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
        watch.watch("kept", 0, lambda: told.append(0), since=(7, 1, 0))
        unrelated = _topic(5, 0, topic_id=9, name="unrelated")
        cluster.events.put_nowait(Diff("topics", 2, [(unrelated, 1)]))
        await _settle()
        assert told == []  # the leader it started from (the view's too) has not changed
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


def test_a_hold_keeps_the_follower_between_watches() -> None:
    """As Spark tasks a worker runs one after another: the follower (and its view) outlives
    each task's watch while held, and the next watch starts from the view at once."""
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        release = watch.hold()
        await _settle()
        assert watch.following and cluster.follows == 1  # held: followed with no watch
        cluster.events.put_nowait(Snapshot("topics", 1, [(_topic(2, 1), 1)]))
        await _settle()
        told: list[str] = []
        watch.watch("kept", 0, lambda: told.append("first"), since=(7, 2, 1))()
        assert watch.following
        watch.watch("kept", 0, lambda: told.append("stale"), since=(7, 1, 0))
        await _settle()
        assert told == ["stale"] and cluster.follows == 1  # the same follower's view
        release()
        release()  # twice: nothing more
        assert watch.following  # a watch is still open
        await watch.close()

    asyncio.run(main())


def test_a_leader_moved_before_the_snapshot_is_told_to_a_watch_begun_before_it() -> None:
    """The start race: the client looked its leader up (broker 1, epoch 0), the controller
    moved it, then the follower's first snapshot came, already naming broker 2."""
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        told: list[str] = []
        watch.watch("kept", 0, lambda: told.append("p0"), since=(7, 1, 0))
        watch.watch("kept", 1, lambda: told.append("p1"), since=(7, 2, 0))
        await _settle()
        cluster.events.put_nowait(Snapshot("topics", 3, [(_topic(2, 1, isr=(2,)), 1)]))
        await _settle()
        assert told == ["p0"]  # partition 1 stayed where its client found it
        await watch.close()

    asyncio.run(main())


def test_a_watch_begun_after_the_view_moved_on_is_told_at_once() -> None:
    """The view already holds a leader newer than the one the client looked up."""
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        watch.watch("other", 0, lambda: None)
        cluster.events.put_nowait(Snapshot("topics", 3, [(_topic(2, 1, isr=(2,)), 1)]))
        await _settle()
        told: list[int] = []
        watch.watch("kept", 0, lambda: told.append(0), since=(7, 1, 0))
        await _settle()
        assert told == [0]
        await watch.close()

    asyncio.run(main())


def test_a_view_behind_the_clients_look_up_is_no_news() -> None:
    """The client looked up epoch 1 (broker 2) before the view caught up from epoch 0: neither
    the older view nor its catching up tells it anything."""
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        told: list[int] = []
        watch.watch("kept", 0, lambda: told.append(0), since=(7, 2, 1))
        first = _topic(1, 0)
        cluster.events.put_nowait(Snapshot("topics", 1, [(first, 1)]))
        await _settle()
        moved = _topic(2, 1, isr=(2,))
        cluster.events.put_nowait(Diff("topics", 2, [(first, -1), (moved, 1)]))
        await _settle()
        assert told == []
        back = _topic(1, 2)
        cluster.events.put_nowait(Diff("topics", 3, [(moved, -1), (back, 1)]))
        await _settle()
        assert told == [0]
        await watch.close()

    asyncio.run(main())


def test_a_watch_naming_no_leader_is_told_once_at_its_first_comparison() -> None:
    """Without `since` a watcher cannot know whether the view moved past its client: it is
    told once (its link checks with a look-up), then only of changes."""
    async def main() -> None:
        cluster = _Cluster()
        watch = LeaderWatch(cluster)  # type: ignore[arg-type]  # a fake cluster
        told: list[str] = []
        watch.watch("kept", 0, lambda: told.append("early"))
        first = _topic(1, 0)
        cluster.events.put_nowait(Snapshot("topics", 1, [(first, 1)]))
        await _settle()
        assert told == ["early"]
        watch.watch("kept", 0, lambda: told.append("late"))
        await _settle()
        assert told == ["early", "late"]
        shrunk = _topic(1, 0, isr=(1, 2))
        cluster.events.put_nowait(Diff("topics", 2, [(first, -1), (shrunk, 1)]))
        await _settle()
        assert told == ["early", "late"]
        await watch.close()

    asyncio.run(main())
