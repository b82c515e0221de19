"""Subscribing to partitions of a topic on one broker, with credit and resumption (DESIGN §5),
as an asyncio `AsyncSubscriber`.

`SubscriberCore` (shared with the blocking `Subscriber`) keeps one broker subscription per
partition. It accepts a delivery only if it starts exactly where the last one ended, so the
stream it hands on has no gap and no duplicate; whenever the broker loses a subscription (it
ended one, the session expired, the broker restarted) the core subscribes again from the
offset after the last batch it received. It grants credit as the application consumes bytes
(half a window at a time), so at most a window (plus one batch) is ever buffered. While the
broker does not answer, its link keeps reopening the session (and following the broker to a
new address); if the link gives up, the error is handed on like data, so the application
sees it instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from catalog.errors import TqError, UserError
from querylib.errors import CorruptDataError, OffsetOutOfRangeError
from querylib.rpc import Notification, error_from_body

from ._errors import UnknownPartitionError
from ._session import RECONNECT_TIMEOUT, BrokerLink, Locate, WatchLeader
from ._stream import (
    Data,
    EndOfStream,
    Event,
    FrontierMerge,
    PartitionMark,
    Values,
    events_of,
    value_events_of,
)
from .messages import (
    CreditNotify,
    Delivery,
    Incarnation,
    ListPartitions,
    StartAt,
    SubscribeRequest,
    SubscriptionEnded,
    UnsubscribeRequest,
)

if TYPE_CHECKING:
    from querylib.rpc import Credential

__all__ = ["AsyncSubscriber", "Chunk", "SubscriberCore", "decode_chunk"]

logger = logging.getLogger("querylib.broker")

_BASE_OFFSET = struct.Struct(">q")  # a stored batch's first field


class Chunk(msgspec.Struct, frozen=True):
    """Delivered batches of one partition, contiguous with the previous chunk."""

    partition: int
    offset: int
    next_offset: int
    skip_below: int
    data: memoryview | bytes


@dataclass
class _PartitionSub:
    partition: int
    start: StartAt
    sub_id: int = 0
    received: int | None = None   # offset after the last accepted delivery
    skip_below: int = 0
    unconsumed: int = 0           # bytes handed on, not yet consumed by the application
    end_at_start: int = 0         # the log end when first subscribed (for non-follow reads)
    granted: int = 0              # credit given to the current subscription, in all
    delivered: int = 0            # bytes it delivered
    early: list[Notification] | None = None  # deliveries that beat the first subscribe reply
    early_end: Notification | None = None  # the end of the subscription, if that beat it too
    confirmed: int = 0            # the last sub_id the broker answered


class SubscriberCore:
    """Broker subscriptions for some partitions of a topic; runs on the link's loop."""

    def __init__(self, link: BrokerLink, topic: str, partitions: list[int] | None,
                 start: StartAt | dict[int, StartAt], *, credit: int,
                 sink: Callable[[Chunk | TqError], None], create: bool = False,
                 incarnation: Incarnation | None = None) -> None:
        self.link = link
        self.topic = topic
        self.credit = credit
        self.create = create
        self.incarnation = incarnation or Incarnation(0, 0)  # the catalog's topic, if known
        self._requested = partitions
        self._start = start
        self._sink = sink
        self._ids = itertools.count(1)
        self.subs: dict[int, _PartitionSub] = {}
        self._by_id: dict[int, _PartitionSub] = {}
        self.initial_frontiers: dict[int, int] = {}
        self.initial_epochs: dict[int, int] = {}
        self._resubscribing: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # What the application consumed on its own thread (a blocking Subscriber's caller)
        # and the loop has not taken into `unconsumed` yet, per partition; whether the loop
        # was asked to take it (`consumed_elsewhere`).
        self._elsewhere: dict[int, int] = {}
        self._take_asked = False
        self._elsewhere_lock = threading.Lock()

    async def open(self) -> None:
        partitions = self._requested
        if partitions is None:
            listed = await self.link.request(ListPartitions(topic=self.topic))
            partitions = [p.partition for p in listed.partitions]
            if not partitions:
                if not self.create:
                    raise UnknownPartitionError(f"the broker has no partitions of topic "
                                                f"{self.topic!r}")
                partitions = [0]
        assert self.link.opened is not None  # the link is started
        self.credit = min(self.credit, self.link.opened.max_credit)
        for p in partitions:
            start = self._start.get(p, "earliest") if isinstance(self._start, dict) \
                else self._start
            self.subs[p] = _PartitionSub(p, start)
        self.link.on_notify(Delivery, self._on_delivery)
        self.link.on_notify(SubscriptionEnded, self._on_ended)
        self.link.on_reopen.append(self._resubscribe_all)
        self.link.on_failure.append(self._sink)
        for sub in self.subs.values():
            # Until the broker answered it (here, or a reopen below subscribed every partition).
            while sub.confirmed == 0 or sub.confirmed != sub.sub_id:
                generation = self.link.generation
                try:
                    await self._subscribe(sub, first=True)
                    break
                except TqError as exc:
                    # A replica that has not taken the leadership the catalog gave it yet, or
                    # a leader that moved: the link waits (and follows `locate`).
                    if not self.link.lost(exc) or self.link.closed:
                        raise
                await self.link.reopen(generation)  # subscribes every partition again

    async def _subscribe(self, sub: _PartitionSub, *, first: bool = False) -> None:
        start = sub.start if sub.received is None else sub.received
        for partition, nbytes in self._take_elsewhere().items():
            self.subs[partition].unconsumed -= nbytes  # no grant: the subscription is new
        credit = max(0, self.credit - sub.unconsumed)
        sub_id = next(self._ids)
        self._by_id.pop(sub.sub_id, None)
        sub.sub_id = sub_id
        sub.granted, sub.delivered = credit, 0
        self._by_id[sub_id] = sub  # before the request: deliveries may beat the reply
        reply = await self.link.request(SubscribeRequest(
            session=self.link.session, sub_id=sub_id, topic=self.topic,
            partition=sub.partition, start=start, credit=credit, create=self.create,
            topic_id=self.incarnation.topic_id, topic_created_ms=self.incarnation.created_ms))
        if sub.sub_id != sub_id:
            return  # superseded while we waited
        sub.confirmed = sub_id
        if sub.received is None:
            sub.received = reply.offset
            sub.skip_below = reply.offset
            sub.end_at_start = reply.log_end
            self.initial_frontiers[sub.partition] = reply.frontier or 0
            self.initial_epochs[sub.partition] = reply.epoch
            early, sub.early = sub.early or [], None
            for note in early:
                self._on_delivery(note)
            ended, sub.early_end = sub.early_end, None
            if ended is not None:
                self._on_ended(ended)
        if first:
            logger.debug("subscribed %s-%d at %d", self.topic, sub.partition, reply.offset)

    # -- notifications (on the loop, must be quick) ---------------------------------------

    def _on_delivery(self, note: Notification) -> None:
        message: Delivery = note.message  # type: ignore[assignment]  # routed here by type
        sub = self._by_id.get(message.sub_id)
        if sub is None:
            return  # from a subscription we replaced
        if sub.received is None:
            # The broker may push before its subscribe reply reaches us: hold these until the
            # reply says where the subscription starts (bounded by the credit we granted).
            sub.early = [*(sub.early or []), note]
            return
        starts = _frame_starts(message, note.payload)
        if message.offset != sub.received or starts is None:
            # Cannot happen with a correct broker; never hand on a gap or a duplicate.
            logger.warning("%s-%d: delivery at %d, expected %s: resubscribing", self.topic,
                           sub.partition, message.offset, sub.received)
            self._spawn(self._unsubscribe(sub.sub_id))  # the broker still feeds the old one
            self._resubscribe_soon(sub)
            return
        sub.received = message.next_offset
        for i, data in enumerate(note.payload):  # a chunk a frame, each contiguous with the last
            sub.unconsumed += len(data)
            sub.delivered += len(data)
            self._sink(Chunk(sub.partition, starts[i], starts[i + 1], sub.skip_below, data))

    def _on_ended(self, note: Notification) -> None:
        message: SubscriptionEnded = note.message  # type: ignore[assignment]  # routed by type
        sub = self._by_id.get(message.sub_id)
        if sub is None:
            return
        if sub.received is None:
            sub.early_end = note  # after the deliveries it ended behind, once the reply is in
            return
        del self._by_id[message.sub_id]
        error = error_from_body(message.error)
        if isinstance(error, (OffsetOutOfRangeError, CorruptDataError)):
            # Retention deleted our position, or the next offsets are damaged on disk:
            # resubscribing would meet the same; only the application can decide.
            self._sink(error)
            return
        logger.info("%s-%d: subscription ended (%s): resubscribing", self.topic, sub.partition,
                    error)
        self._resubscribe_soon(sub)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unsubscribe(self, sub_id: int) -> None:
        try:
            await self.link.request(UnsubscribeRequest(session=self.link.session, sub_id=sub_id),
                                    timeout=5.0)
        except TqError as exc:
            logger.debug("unsubscribe %d: %s", sub_id, exc)

    def _resubscribe_soon(self, sub: _PartitionSub) -> None:
        self._by_id.pop(sub.sub_id, None)
        if sub.partition in self._resubscribing:
            return
        self._resubscribing.add(sub.partition)
        self._spawn(self._resubscribe(sub))

    async def _resubscribe(self, sub: _PartitionSub) -> None:
        try:
            while not self.link.closed and self.link.failure is None:
                generation = self.link.generation
                try:
                    await self._subscribe(sub)
                    return
                except TqError as exc:
                    if self.link.closed or self.link.failure is not None:
                        return  # closing, or the link gave up (and said so)
                    if not self.link.lost(exc):
                        self._sink(exc)
                        return
                    logger.info("%s-%d: resubscribe: %s", self.topic, sub.partition, exc)
                try:
                    await self.link.reopen(generation)  # resubscribes everything
                except TqError as exc:
                    if self.link.failure is None:
                        self._sink(exc)
                    return
                if sub.confirmed == sub.sub_id:
                    return  # the reopen subscribed it again
        finally:
            self._resubscribing.discard(sub.partition)

    async def _resubscribe_all(self) -> None:
        """The link reopened the session: every partition again from where it was. A lost
        connection meanwhile is the link's to retry (it calls this again)."""
        for sub in self.subs.values():
            try:
                await self._subscribe(sub)
            except TqError as exc:
                if self.link.lost(exc):
                    raise
                self._sink(exc)

    # -- credit ----------------------------------------------------------------------------

    def unconsumed(self, partition: int) -> int:
        """Bytes of `partition` handed on and not consumed by the application yet."""
        with self._elsewhere_lock:
            return self.subs[partition].unconsumed - self._elsewhere.get(partition, 0)

    def consumed(self, partition: int, nbytes: int) -> None:
        """The application processed `nbytes` of this partition: maybe grant more credit.

        Keeps what the broker may still send plus what waits for the application near the
        window: grants the difference once it reaches half a window. Computed from totals of
        the current subscription, so nothing drifts across resubscriptions; the broker's
        view of the credit is never above ours (grants and deliveries in flight)."""
        sub = self.subs[partition]
        sub.unconsumed -= nbytes
        if sub.sub_id not in self._by_id:
            return  # between subscriptions: the next one starts with the room there is
        room = self.credit - (sub.granted - sub.delivered) - sub.unconsumed
        if room * 2 >= self.credit:
            sub.granted += room
            self._spawn(self._grant(sub.sub_id, room))

    def consumed_elsewhere(self, partition: int, nbytes: int) -> bool:
        """`consumed`, from a thread other than the loop's: counted here, and True when the
        loop should run `take_consumed` now because a grant may be due. So a blocking
        Subscriber's caller wakes the loop when credit is to go back, not at every chunk
        (each wake is a self-pipe write and a thread switch, only to lower a counter).

        A grant's room changes only as the application consumes (a delivery raises
        `delivered` and `unconsumed` alike), so testing at each consumption asks for the
        take whenever `consumed` would have granted. The loop's fields are read without its
        lock: a read racing a delivery may test low, which only defers the take to the
        consumption of the chunk that delivery brings; racing a take or a resubscription
        it tests high (one wake too many)."""
        with self._elsewhere_lock:
            held = self._elsewhere[partition] = self._elsewhere.get(partition, 0) + nbytes
            if self._take_asked:
                return False
            sub = self.subs[partition]
            room = self.credit - (sub.granted - sub.delivered) - (sub.unconsumed - held)
            self._take_asked = room * 2 >= self.credit
            return self._take_asked

    def take_consumed(self) -> None:
        """On the loop: what was consumed elsewhere, as `consumed` (granting when due)."""
        for partition, nbytes in self._take_elsewhere().items():
            self.consumed(partition, nbytes)

    def _take_elsewhere(self) -> dict[int, int]:
        with self._elsewhere_lock:
            taken, self._elsewhere, self._take_asked = self._elsewhere, {}, False
        return taken

    async def _grant(self, sub_id: int, nbytes: int) -> None:
        try:
            await self.link.notify(CreditNotify(session=self.link.session, sub_id=sub_id,
                                                nbytes=nbytes))
        except TqError as exc:  # lost with the connection (or the link gave up): resubscribed
            logger.debug("credit grant failed: %s", exc)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in self.subs.values():
            if sub.sub_id in self._by_id:
                await self._unsubscribe(sub.sub_id)
        self._by_id.clear()


class ChunkDecoder:
    """Turns chunks into events, tracking consumed positions and the merged frontier. Pure;
    used on whichever thread consumes."""

    def __init__(self, core: SubscriberCore, *, follow: bool, values: bool = False) -> None:
        self.core = core
        self.follow = follow
        self.values = values  # Values events (values only, decoded by runs) instead of Data
        self.positions: dict[int, int] = {}
        self.merge: FrontierMerge | None = None

    def start(self) -> None:
        self.positions = {p: s.skip_below for p, s in self.core.subs.items()}
        self.merge = FrontierMerge(dict(self.core.initial_frontiers),
                                   history={p: s.end_at_start for p, s in self.core.subs.items()},
                                   epochs=dict(self.core.initial_epochs))

    def done(self) -> bool:
        """Without follow: every partition consumed up to its end when we subscribed."""
        if self.follow:
            return False
        return all(self.positions[p] >= s.end_at_start for p, s in self.core.subs.items())

    def decode(self, chunk: Chunk) -> Iterator[tuple[Event | Values | None, int, int]]:
        """(event or None, partition, position after it) for the chunk's contents; the last
        item (None) moves the position past the whole chunk (control batches, skipped
        records). Apply positions as the application takes each event."""
        assert self.merge is not None
        p = chunk.partition
        items = value_events_of(chunk.data, p, skip_below=chunk.skip_below) if self.values \
            else decode_chunk(chunk)
        for item in items:
            if isinstance(item, PartitionMark):
                for event in self.merge.mark(item):
                    yield event, p, item.next_offset
                continue
            self.merge.data(p)
            if epoch := self.merge.epochs[p]:  # a later run's records (DESIGN §5 "Epochs")
                item = msgspec.structs.replace(item, epoch=epoch)
            if isinstance(item, Values):
                yield item, p, item.next_offset
            else:
                yield item, p, item.records[-1].offset + 1
        yield None, p, chunk.next_offset

    def take(self, item: tuple[Event | Values | None, int, int]) -> Event | Values | None:
        event, partition, position = item
        self.positions[partition] = max(self.positions[partition], position)
        return event


def decode_chunk(chunk: Chunk) -> Iterator[Data | PartitionMark]:
    return events_of(chunk.data, chunk.partition, skip_below=chunk.skip_below)


def _frame_starts(message: Delivery, payload: Sequence[Any]) -> list[int] | None:
    """The offset each payload frame of a delivery starts at, then its `next_offset`: the
    first frame starts at `offset`, each later one (a replicated partition's run: a whole
    batch or more a frame, none empty) at its first batch's base offset, strictly increasing
    within the delivery's range; None if they are not so (a broker's bug)."""
    if not payload:
        return None
    starts = [message.offset]
    for frame in payload[1:]:
        if len(frame) < 8:
            return None
        base = _BASE_OFFSET.unpack_from(frame)[0]
        if not starts[-1] < base < message.next_offset:
            return None
        starts.append(base)
    return [*starts, message.next_offset]


class AsyncSubscriber:
    """Events from partitions of a topic: `Data`, `Progress`, `EndOfStream`.

        async with AsyncSubscriber(address, "events", secret=key, start="earliest") as sub:
            async for event in sub:
                ...
    """

    def __init__(self, address: str, topic: str, partitions: int | list[int] | None = None, *,
                 secret: bytes | Credential, start: StartAt | dict[int, StartAt] = "earliest",
                 credit: int = 1024 * 1024, follow: bool = True, lease: float = 10.0,
                 timeout: float = 30.0, create: bool = False,
                 incarnation: Incarnation | None = None, locate: Locate | None = None,
                 reconnect_timeout: float = RECONNECT_TIMEOUT,
                 watch_leader: WatchLeader | None = None) -> None:
        if isinstance(partitions, int):
            partitions = [partitions]
        if credit <= 0:
            raise UserError("credit must be a positive number of bytes")
        self.link = BrokerLink(address, secret, lease=lease, timeout=timeout, locate=locate,
                               reconnect_timeout=reconnect_timeout, watch_leader=watch_leader)
        self._chunks: deque[Chunk | TqError] = deque()
        self._wakeup = asyncio.Event()
        self.core = SubscriberCore(self.link, topic, partitions, start, credit=credit,
                                   sink=self._put, create=create, incarnation=incarnation)
        self.decoder = ChunkDecoder(self.core, follow=follow)
        self._ready: deque[tuple[Event | Values | None, int, int]] = deque()
        self._finished = False

    def _put(self, item: Chunk | TqError) -> None:
        self._chunks.append(item)
        self._wakeup.set()

    async def start(self) -> AsyncSubscriber:
        await self.link.start()
        await self.core.open()
        self.decoder.start()
        return self

    async def __aenter__(self) -> AsyncSubscriber:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def positions(self) -> dict[int, int]:
        """Per partition, the offset after the last record handed to the application."""
        return dict(self.decoder.positions)

    @property
    def frontier(self) -> int | None:
        """The frontier (minimum over the partitions) as of the last event handed out."""
        return self.decoder.merge.published if self.decoder.merge else None

    @property
    def epoch(self) -> int:
        """The epoch of `frontier` (DESIGN §5 "Epochs")."""
        return self.decoder.merge.published_epoch if self.decoder.merge else 0

    async def next_event(self, timeout: float | None = None) -> Event | Values | None:
        """The next event; None at the end of a non-follow read or after `timeout` seconds."""
        while True:
            while self._ready:
                event = self.decoder.take(self._ready.popleft())
                if event is not None:
                    return event
            if self.decoder.done():
                return None
            if not self._chunks:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
                except TimeoutError:
                    return None
                continue
            item = self._chunks.popleft()
            if isinstance(item, TqError):
                raise item
            self._ready.extend(self.decoder.decode(item))
            self.core.consumed(item.partition, len(item.data))

    def __aiter__(self) -> AsyncSubscriber:
        return self

    async def __anext__(self) -> Event | Values:
        """The next event; iteration stops after EndOfStream (or at the end of a non-follow
        read)."""
        if self._finished:
            raise StopAsyncIteration
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        self._finished = isinstance(event, EndOfStream)
        return event

    async def close(self) -> None:
        try:
            await self.core.close()
        finally:
            await self.link.close()
