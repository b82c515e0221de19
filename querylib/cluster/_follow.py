"""Following a catalog collection: a consolidated snapshot, then every later diff (DESIGN §3).

A follower is an ordinary subscriber of the collection's topic `__catalog.<name>` on the
coordinator's broker (the broker's subscribe path; there is no second mechanism). It reads from
the earliest offset, and `CollectionView` turns what arrives into catalog events:

    Data(time=v, records)   updates of change v, each record's diff in its `tq.diff` header;
                            held until the frontier passes v
    Progress(f)             every change below f is complete: consolidate the held updates
                            with times < f into the contents

A follower starts at the collection's block of the latest checkpoint (the coordinator says
where): the marker record says how many records the block holds, and those records are the
collection at the checkpoint's version, so a late follower reads one collection's worth plus
the changes since, not the whole history. Other blocks it meets (later checkpoints) it skips,
as a follower reading from the earliest offset skips all of them.

The first event is a `Snapshot` at the first frontier at or past the catalog version the
coordinator reported when the follower started, so a follower that joins late does not see
history as a burst of diffs; then a `Diff` per frontier that changed something. Updates of a
change are only ever counted once their change is complete, so there is no gap and no double
count, at version 0 or at version 100,000. Updates of a change that a coordinator crash aborted
are taken back at the same time before the frontier passes it (see coordinator/_journal), so
they net to zero here.

`CollectionView` is pure (broker events in, catalog events out); the followers own their
subscriber. Must not: count an update before its frontier passed, or ask the coordinator for
anything but where to start.
"""

from __future__ import annotations

import asyncio
import time as _time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from catalog import (
    Broker,
    CatalogDecodeError,
    CorruptCatalogError,
    Record,
    TqError,
    catalog_topic,
    consolidate,
    decode_record,
)
from querylib.broker import AsyncSubscriber, Data, Progress
from querylib.broker.messages import StartAt
from querylib.records import DIFF_HEADER, TIME_HEADER, decode_int64
from querylib.rpc import ClientClosedError, DeadlineExceededError, remember_server_key

from . import messages as m
from ._format import COUNT_HEADER, SNAPSHOT_HEADER

if TYPE_CHECKING:
    from ._blocking import Cluster
    from ._session import AsyncCluster
    from .messages import CatalogInfo

# Seconds the coordinator has to say where the catalog broker is, asked while it does not
# answer (each reconnect attempt of the follower's link; DESIGN §3 "Coordinator failover").
_LOCATE_TIMEOUT = 2.0

__all__ = [
    "AsyncCollectionFollower",
    "read_collections",
    "CatalogEvent",
    "CollectionFollower",
    "CollectionView",
    "Diff",
    "Snapshot",
]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole collection at `version`: (record, multiplicity) pairs."""

    collection: str
    version: int
    records: list[tuple[Record, int]]


@dataclass(frozen=True, slots=True)
class Diff:
    """What changed up to `version` since the previous event, consolidated."""

    collection: str
    version: int
    updates: list[tuple[Record, int]]


CatalogEvent: TypeAlias = Snapshot | Diff


class CollectionView:
    """A collection rebuilt from its topic's events. `until`: emit the snapshot only once the
    frontier has passed this version. `block`: the version of the checkpoint whose block the
    events start with (None: they start at the earliest offset)."""

    def __init__(self, collection: str, *, until: int = 0, block: int | None = None) -> None:
        catalog_topic(collection)  # UnknownCollectionError names the valid ones
        self.collection = collection
        self.until = until
        self.block = block
        self.contents: dict[Record, int] = {}
        self.version: int | None = None  # None until the snapshot is out
        self.frontier = 0
        self._held: list[tuple[int, Record, int]] = []
        self._expected: int | None = None if block is not None else 0  # block records to come
        self._early_frontier = 0  # frontiers seen before the block was complete

    def feed(self, event: object) -> list[CatalogEvent]:
        if isinstance(event, Data):
            if event.time is None:
                raise CorruptCatalogError(f"{catalog_topic(self.collection)}: a record "
                                          "without tq.time")
            out: list[CatalogEvent] = []
            for record in event.records:
                out += self._record(event.time, record)
            return out
        if isinstance(event, Progress):
            if self._expected != 0:
                self._early_frontier = max(self._early_frontier, event.frontier)
                return []
            return self._advance(event.frontier)
        return []  # EndOfStream: catalog topics never end; nothing to do

    def _record(self, time: int, record: Any) -> list[CatalogEvent]:
        headers = _headers(record.headers)
        snapshot = headers.get(SNAPSHOT_HEADER)
        if self._expected is None:  # the first record must be the block's marker
            count = headers.get(COUNT_HEADER)
            if snapshot != self.block or count is None or count < 0:
                raise CorruptCatalogError(f"{catalog_topic(self.collection)}: the checkpoint "
                                          f"block of version {self.block} does not start here")
            self._expected = count
            return self._block_done() if count == 0 else []
        if snapshot is not None:
            if self._expected and snapshot == self.block and COUNT_HEADER not in headers:
                value = self._decode(record.value)
                self.contents[value] = self.contents.get(value, 0) + _need(headers, DIFF_HEADER)
                self._expected -= 1
                if not self._expected:
                    return self._block_done()
            return []  # another checkpoint's block: we have that state already
        if self.block is not None and time <= self.block:
            return []  # already in the block we started from
        self._held.append((time, self._decode(record.value), _need(headers, DIFF_HEADER)))
        return []

    def _block_done(self) -> list[CatalogEvent]:
        assert self.block is not None
        self.frontier = self.block + 1
        out: list[CatalogEvent] = []
        if self.block >= self.until:
            self.version = self.block
            out.append(Snapshot(self.collection, self.block, list(self.contents.items())))
        if self._early_frontier > self.frontier:
            out += self._advance(self._early_frontier)
        return out

    def _decode(self, value: bytes | None) -> Record:
        if value is None:
            raise CorruptCatalogError(f"{catalog_topic(self.collection)}: a record without "
                                      "a value")
        try:
            return decode_record(self.collection, value)
        except CatalogDecodeError as exc:
            raise CorruptCatalogError(f"{catalog_topic(self.collection)}: {exc}") from exc

    def _advance(self, frontier: int) -> list[CatalogEvent]:
        if frontier <= self.frontier:
            return []
        self.frontier = frontier
        held = self._held
        if all(t < frontier for t, _, _ in held):
            ready, self._held = held, []
        else:
            ready = [h for h in held if h[0] < frontier]
            self._held = [h for h in held if h[0] >= frontier]
        updates = consolidate((record, diff) for _, record, diff in ready)
        contents = self.contents
        for record, diff in updates:
            count = contents.get(record, 0) + diff
            if count < 0:
                raise CorruptCatalogError(f"{catalog_topic(self.collection)}: retracting "
                                          f"{record!r} below zero")
            if count:
                contents[record] = count
            else:
                del contents[record]
        version = frontier - 1
        if self.version is None:
            if version < self.until:
                return []
            self.version = version
            return [Snapshot(self.collection, version, list(contents.items()))]
        self.version = version
        return [Diff(self.collection, version, updates)] if updates else []


def _headers(headers: Any) -> dict[str, int]:
    out = {}
    try:
        for name, value in headers:
            if name in (DIFF_HEADER, SNAPSHOT_HEADER, COUNT_HEADER, TIME_HEADER):
                out[name] = decode_int64(value)
    except TqError as exc:
        raise CorruptCatalogError(f"a catalog record with a bad header: {exc}") from exc
    return out


def _need(headers: dict[str, int], name: str) -> int:
    value = headers.get(name)
    if value is None:
        raise CorruptCatalogError(f"a catalog record without {name}")
    return value


def _start(collection: str, info: CatalogInfo) -> tuple[CollectionView, StartAt]:
    """The view and the offset to start from: the latest checkpoint's block, else earliest."""
    checkpoint = info.checkpoint
    if checkpoint is None or collection not in checkpoint.offsets:
        return CollectionView(collection, until=info.version), "earliest"
    return (CollectionView(collection, until=info.version, block=checkpoint.version),
            checkpoint.offsets[collection])


def _learn_broker_keys(event: CatalogEvent) -> None:
    """Brokers seen in the catalog: this process's clients connect to each with CURVE exactly
    when its record has a CURVE key (DESIGN §2 "Handshake")."""
    for record, diff in event.records if isinstance(event, Snapshot) else event.updates:
        if diff > 0 and isinstance(record, Broker):
            remember_server_key(record.address, record.curve_key)


class AsyncCollectionFollower:
    """Catalog events of one collection, on asyncio.

        async with cluster.follow("topics") as follower:
            async for event in follower:      # Snapshot, then Diffs, forever
                ...
    """

    def __init__(self, cluster: AsyncCluster, collection: str, *,
                 credit: int = 4 * 1024 * 1024) -> None:
        self.cluster = cluster
        self.collection = collection
        self.credit = credit
        self.view = CollectionView(collection)
        self.restarts = 0  # how many times the catalog broker was found elsewhere
        self._subscriber: AsyncSubscriber | None = None
        self._ready: list[CatalogEvent] = []
        self._moved: CatalogInfo | None = None  # the coordinator names another catalog broker
        self._moved_event = asyncio.Event()
        self._address = ""  # the catalog broker followed

    async def start(self) -> AsyncCollectionFollower:
        await self._follow(await self.cluster.info())
        return self

    async def _follow(self, info: CatalogInfo) -> None:
        self.view, start = _start(self.collection, info)
        self._address = info.catalog_broker
        self._subscriber = AsyncSubscriber(
            info.catalog_broker, info.collections[self.collection], 0,
            secret=self.cluster.secret, start=start, credit=self.credit, follow=True,
            locate=self._locate)
        await self._subscriber.start()

    async def _locate(self) -> str | None:
        """Asked by the subscriber's link while the catalog broker does not answer: a
        coordinator that took over (DESIGN §3 "Coordinator failover") has its own catalog
        broker, whose catalog topics hold the same changes at other offsets, so the follower
        starts over there (a new Snapshot) instead of moving its subscription."""
        try:
            info = await self.cluster.request(m.GetCatalogInfo(), timeout=_LOCATE_TIMEOUT)
        except DeadlineExceededError:
            await self.cluster.find_active()  # may be another coordinator's turn
            info = await self.cluster.request(m.GetCatalogInfo(), timeout=_LOCATE_TIMEOUT)
        if info.catalog_broker and info.catalog_broker != self._address:
            self._address = info.catalog_broker  # asked again meanwhile: moved already
            self._moved = info
            self._moved_event.set()
        return None  # the link stays; the follower restarts

    async def _restart(self) -> None:
        info, self._moved = self._moved, None
        self._moved_event.clear()
        assert info is not None and self._subscriber is not None
        old, self._subscriber = self._subscriber, None
        await old.close()
        self._ready.clear()
        self.restarts += 1
        await self._follow(info)

    async def __aenter__(self) -> AsyncCollectionFollower:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def next_event(self, timeout: float | None = None) -> CatalogEvent | None:
        """The next catalog event; None after `timeout` seconds without one."""
        assert self._subscriber is not None, "start the follower first"
        deadline = None if timeout is None else _time.monotonic() + timeout
        while not self._ready:
            if self._moved is not None:
                await self._restart()
            left = None if deadline is None else max(0.0, deadline - _time.monotonic())
            event = await self._next_or_moved(left)
            if event is None:
                if self._moved is not None:
                    continue
                return None
            self._ready.extend(self.view.feed(event))
        ready = self._ready.pop(0)
        if self.collection == "brokers":
            _learn_broker_keys(ready)
        return ready

    async def _next_or_moved(self, timeout: float | None) -> Any:
        """The subscriber's next event, or None once the catalog broker was found elsewhere
        (or after `timeout`)."""
        assert self._subscriber is not None
        if self._moved is not None:
            return None
        nexting = asyncio.ensure_future(self._subscriber.next_event(timeout))
        moved = asyncio.ensure_future(self._moved_event.wait())
        try:
            await asyncio.wait({nexting, moved}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            moved.cancel()
            if not nexting.done():
                nexting.cancel()
                await asyncio.gather(nexting, return_exceptions=True)
        return nexting.result() if not nexting.cancelled() else None

    def __aiter__(self) -> AsyncIterator[CatalogEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[CatalogEvent]:
        while True:
            event = await self.next_event()
            if event is not None:
                yield event

    async def close(self) -> None:
        if self._subscriber is not None:
            subscriber, self._subscriber = self._subscriber, None
            await subscriber.close()


class CollectionFollower:
    """Catalog events of one collection, blocking (`with` / `for`): an AsyncCollectionFollower
    run on its cluster's loop thread, so it follows a takeover as that one does. Closed
    before its cluster is."""

    def __init__(self, cluster: Cluster, collection: str, *,
                 credit: int = 4 * 1024 * 1024) -> None:
        self.collection = collection
        self._call = cluster._call
        self._follower = AsyncCollectionFollower(cluster._async, collection, credit=credit)
        self._call(self._follower.start())

    @property
    def view(self) -> CollectionView:
        return self._follower.view

    def __enter__(self) -> CollectionFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_event(self, timeout: float | None = None) -> CatalogEvent | None:
        """The next catalog event; None after `timeout` seconds without one."""
        return self._call(self._follower.next_event(timeout))

    def __iter__(self) -> Iterator[CatalogEvent]:
        while True:
            event = self.next_event()
            if event is not None:
                yield event

    def snapshot(self, timeout: float | None = None) -> Snapshot | None:
        """The first event (a Snapshot), or None if it did not come within `timeout`."""
        event = self.next_event(timeout)
        assert event is None or isinstance(event, Snapshot)
        return event

    def close(self) -> None:
        try:
            self._call(self._follower.close())
        except ClientClosedError:  # its cluster closed first: the follower went with its loop
            pass


async def read_collections(cluster: AsyncCluster, collections: Iterable[str], *,
                           timeout: float = 30.0) -> dict[str, Snapshot]:
    """A snapshot of each collection (at the version the coordinator reported, or later), read
    concurrently; TqError if one does not arrive within `timeout` seconds."""
    names = list(dict.fromkeys(collections))
    for name in names:
        catalog_topic(name)  # UnknownCollectionError before anything starts
    followers = [AsyncCollectionFollower(cluster, name) for name in names]
    try:
        await asyncio.gather(*(f.start() for f in followers))
        events = await asyncio.gather(*(f.next_event(timeout) for f in followers))
    finally:
        await asyncio.gather(*(f.close() for f in followers), return_exceptions=True)
    out = {}
    for name, event in zip(names, events, strict=True):
        if not isinstance(event, Snapshot):
            raise TqError(f"no snapshot of {catalog_topic(name)} within {timeout:g}s from "
                          f"the catalog broker {cluster.catalog_broker}")
        out[name] = event
    return out
