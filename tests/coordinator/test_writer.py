"""The catalog writer's frontiers on a real broker: a commit advances each topic it touched once,
untouched topics wait for `catch_up` (or the sweep), and a follower of an untouched collection
still gets its snapshot at once because asking where to start catches it up."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

import coordinator._server
from catalog import COLLECTIONS
from coordinator import Coordinator
from coordinator._writer import CatalogWriter
from querylib.cluster import AsyncCluster, Snapshot
from querylib.log import LogConfig
from querylib.server.broker import BrokerServer
from tests.conftest import wait_for_async

from ._driver import Driver

SECRET = b"0123456789abcdef0123456789abcdef"
NEVER = 3600.0  # a sweep interval no test lives to see


def _record_advances(writer: CatalogWriter) -> dict[str, list[int]]:
    """Every frontier each collection's producer is asked to advance to, from now on."""
    seen: dict[str, list[int]] = {c: [] for c in COLLECTIONS}
    for collection, producer in writer._cores.items():
        real = producer.advance

        async def advance(frontier: int, real=real, collection=collection) -> None:
            seen[collection].append(frontier)
            await real(frontier)

        producer.advance = advance  # type: ignore[method-assign]
    return seen


def _frontiers(writer: CatalogWriter) -> dict[str, int]:
    return {c: p.core.frontier for c, p in writer._cores.items()}


def test_a_commit_advances_each_touched_topic_once_and_nothing_else(tmp_path: Path) -> None:
    driver = Driver()  # bootstrap: brokers, topics, counters
    driver.host()      # an executor agent: sessions, brokers, executors, counters (a few changes)
    driver.session()
    changes = driver.persisted
    last = changes[-1].version
    touched = {collection for change in changes for collection, _, _ in change.updates}
    assert len(changes) > 3 and len(touched) > 2 and set(COLLECTIONS) - touched

    async def main() -> None:
        broker = BrokerServer(tmp_path, SECRET, log_config=LogConfig(flush="always"))
        await broker.start(None)
        writer = CatalogWriter(broker.port, on_committed=lambda version: None,
                               on_failed=lambda exc: None, sweep_interval=NEVER)
        try:
            await writer.start(0)
            await wait_for_async(lambda: set(_frontiers(writer).values()) == {1},
                                 what="the start's catch-up")
            advances = _record_advances(writer)
            for change in changes:  # one event-loop turn: one commit
                writer.submit(change)
            await writer.drain()
            assert writer.committed == last and writer.statistics["commits"] == 1
            await wait_for_async(lambda: all(_frontiers(writer)[c] == last + 1 for c in touched),
                                 what="the touched topics' frontiers")
            assert advances == {c: [last + 1] if c in touched else [] for c in COLLECTIONS}

            writer.catch_up()  # a follower is about to start: the others catch up, once
            await wait_for_async(lambda: set(_frontiers(writer).values()) == {last + 1},
                                 what="every frontier")
            assert advances == {c: [last + 1] for c in COLLECTIONS}
        finally:
            await writer.close()
            await broker.close()

    asyncio.run(main())


def test_untouched_topics_catch_up_within_the_sweep_interval(tmp_path: Path) -> None:
    driver = Driver()
    change = driver.persisted[0]

    async def main() -> None:
        broker = BrokerServer(tmp_path, SECRET, log_config=LogConfig(flush="always"))
        await broker.start(None)
        writer = CatalogWriter(broker.port, on_committed=lambda version: None,
                               on_failed=lambda exc: None, sweep_interval=0.05)
        try:
            await writer.start(0)
            writer.submit(change)
            await writer.drain()
            # Nobody asks: the sweep alone brings every topic to the committed version.
            await wait_for_async(lambda: set(_frontiers(writer).values()) == {change.version + 1},
                                 what="the sweep")
        finally:
            await writer.close()
            await broker.close()

    asyncio.run(main())


def test_a_follower_of_an_untouched_collection_gets_its_snapshot_without_a_sweep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator._server, "CatalogWriter",
                        functools.partial(CatalogWriter, sweep_interval=NEVER))

    async def main() -> None:
        coord = Coordinator(tmp_path, SECRET, listen="tcp://127.0.0.1:0",
                            broker_listen="tcp://127.0.0.1:0")
        await coord.start()
        try:
            assert coord.endpoint is not None
            async with AsyncCluster(coord.endpoint, SECRET, lease=5.0) as cluster:
                created = await cluster.create_topic("numbers", 2)  # topics, counters
                follower = await cluster.follow("drops").start()  # untouched since start
                try:
                    first = await follower.next_event(timeout=10)
                    assert isinstance(first, Snapshot), first
                    assert first.version >= created.version and first.records == []
                finally:
                    await follower.close()
        finally:
            await coord.close()

    asyncio.run(main())


def test_a_cancelled_write_is_not_a_failure(tmp_path: Path) -> None:
    """Cancellation (the loop going away under a write) is never a failure: the writer stops
    without calling `on_failed`, and whoever drains it is not handed the cancellation."""
    driver = Driver()
    change = driver.persisted[0]
    failures: list[BaseException] = []

    async def main() -> None:
        broker = BrokerServer(tmp_path, SECRET, log_config=LogConfig(flush="always"))
        await broker.start(None)
        writer = CatalogWriter(broker.port, on_committed=lambda version: None,
                               on_failed=failures.append, sweep_interval=NEVER)
        blocked = asyncio.Event()

        async def append(*args: object) -> None:
            blocked.set()
            await asyncio.Event().wait()  # until cancelled

        try:
            await writer.start(0)
            writer._append = append  # type: ignore[method-assign]
            writer.submit(change)
            await asyncio.wait_for(blocked.wait(), 10)
            assert writer._writing is not None
            writer._writing.cancel()
            await writer.drain()
            assert (failures, writer.failed, writer.committed) == ([], None, 0)
        finally:
            await writer.close()
            await broker.close()

    asyncio.run(main())
