"""One connector stream inside one connection: the ordered work it asks of the broker.

What a stream's frames ask for becomes a queue of operations, performed strictly one at a time
so that nothing is appended out of order and nothing is acknowledged before it is durable:

    OpenOp      NOTIFY: open the stream's broker session and a producer on the partition the
                stream name maps to (the broker's core admits it, or refuses it: a topic the
                stream may not write; an ended stream is refused only once something would
                be written), learn where the stream really stands
    DataOp      MESSAGEs: one record batch (consecutive messages coalesce while they wait)
    AdvanceOp   a BOUNDARY with id M: the producer's frontier becomes M + 1
    EndOp       EOS: the producer ends its stream

Every operation carries the credits of the frames it stands for; they go back to the connector
(with the stream's new point of reference) only once the operation's effect is durable. With one
operation in flight per stream, a failure can never leave a gap behind a later success.

The sink decides nothing about the protocol: it tells its connection (`SinkOwner`) what happened
and the connection answers the connector. No socket I/O here; broker calls go through a broker
session `Partitions` opens where the partition lives (`_partitions.py`): the in-process broker's
door (`BrokerPort.link`, as "anonymous": connectors are not authenticated yet), or broker RPC to
another broker of the host. A failed call to a remote broker leaves it unknown whether the
append became durable (its answer may be what was lost): the session is closed (after what it
carried) and the stream's point is checked against the data again at the next NOTIFY.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from catalog.errors import TqError
from querylib.broker import (
    AdvanceRequest,
    EndStreamRequest,
    OpenProducerRequest,
    ProduceRequest,
    SessionLink,
    StreamEndedError,
    UnknownBrokerSessionError,
)
from querylib.connector._errors import ConnectorProtocolError
from querylib.connector._events import MessageFlags
from querylib.connector._records import broker_topic, encode_messages, parse_stream_name

from ._offsets import StreamKey, StreamProgress
from ._partitions import Partitions, Remote

__all__ = ["AdvanceOp", "DataOp", "EndOp", "Message", "OpenOp", "SinkOwner", "StreamSink"]

logger = logging.getLogger("querylib.connector")

_EPHEMERAL = int(MessageFlags.EPHEMERAL)
_RECORD_OVERHEAD = 64  # a record's framing and headers beside its value, generously

Message = tuple[int, bytes, "int | None", "bytes | None", int]  # id, payload, time, key, flags


@dataclass
class OpenOp:
    name: str
    belief: int | None  # where the connector says the stream stands (its NOTIFY)
    first: bool = True  # the stream's first NOTIFY on this connection
    credits: int = 1


@dataclass
class DataOp:
    messages: list[Message] = field(default_factory=list)
    nbytes: int = 0
    credits: int = 0


@dataclass
class AdvanceOp:
    message_id: int
    credits: int = 1


@dataclass
class EndOp:
    credits: int = 0


Op = OpenOp | DataOp | AdvanceOp | EndOp


class Resolve(Protocol):
    """The endpoint's answer to a NOTIFY: the stream's progress record for the partition `name`
    maps to (checked against the data), or a TqError saying why the stream is refused."""

    async def __call__(self, sink: StreamSink, name: str) -> StreamProgress: ...


class SinkOwner(Protocol):
    """What a sink reports to its connection."""

    def opened(self, sink: StreamSink, op: OpenOp) -> None: ...
    def refused(self, sink: StreamSink, op: OpenOp, reason: str) -> None: ...
    def completed(self, sink: StreamSink, credits: int, processed: int | None) -> None: ...
    def failed(self, sink: StreamSink, credits: int, error: Exception) -> None: ...


class StreamSink:
    """The broker-side state of one stream of one connection, and its operation queue.
    `create`: a partition (and, under a catalog, an ingest topic) may be created for it."""

    def __init__(self, owner: SinkOwner, partitions: Partitions, key: StreamKey, source_id: int,
                 resolve: Resolve, save: Callable[[StreamKey, StreamProgress], None],
                 account: Callable[[int], None], *, lease: float, max_batch_records: int,
                 max_batch_bytes: int, create: bool = True) -> None:
        self.owner = owner
        self.partitions = partitions
        self.key = key
        self.stream_id = key[2]
        self.source_id = source_id
        self.session = f"tq.connector.{source_id:016x}"
        self.create = create
        self.link: SessionLink | None = None
        self.target: tuple[str, int] | None = None  # the partition its stream name maps to
        self.route: Remote | None = None  # where it lives (None: the in-process broker)
        self._resolve = resolve
        self._save = save
        self._account = account  # reports bytes of messages taken (+) and let go (-)
        self._lease = lease
        self._max_records = max_batch_records
        self._max_bytes = max_batch_bytes
        self.progress: StreamProgress | None = None  # set by the first OpenOp
        self.producing = False
        self.frontier = 0  # this producer's own frontier
        self.epoch = 0  # tq.time of the next records
        self.accepting = True  # False from a failure (and its NACK) to the NOTIFY that answers it
        self.ops: deque[Op] = deque()
        self._wake = asyncio.Event()
        self._stopping = False
        self.task: asyncio.Task[None] | None = None

    # -- building the queue (called by the connection, synchronously) -----------------------

    @property
    def processed(self) -> int | None:
        return None if self.progress is None else self.progress.processed

    def push(self, op: Op) -> None:
        self.ops.append(op)
        self._wake.set()

    def add_messages(self, messages: list[Message], nbytes: int) -> None:
        """Queue messages (`nbytes` on the wire); they join the last waiting DataOp while it
        has room (`max_batch_records`, `max_batch_bytes`)."""
        last = self.ops[-1] if self.ops else None
        op = last if type(last) is DataOp else None
        if nbytes > self._max_bytes:
            self._add_big(messages, op)
            return
        start, n = 0, len(messages)
        while start < n:
            if op is None or len(op.messages) >= self._max_records or op.nbytes >= self._max_bytes:
                op = DataOp()
                self.ops.append(op)
            take = min(n - start, self._max_records - len(op.messages))
            op.messages += messages[start:start + take]
            op.nbytes += nbytes * (start + take) // n - nbytes * start // n
            op.credits += take
            start += take
        self._account(nbytes)
        self._wake.set()

    def _add_big(self, messages: list[Message], op: DataOp | None) -> None:
        # A run bigger than a batch: measure each message, so no batch outgrows the cap by
        # more than its last message (which is below the maximum frame size).
        total = 0
        for message in messages:
            size = len(message[1]) + _RECORD_OVERHEAD
            if (op is None or len(op.messages) >= self._max_records
                    or (op.messages and op.nbytes + size > self._max_bytes)):
                op = DataOp()
                self.ops.append(op)
            op.messages.append(message)
            op.nbytes += size
            op.credits += 1
            total += size
        self._account(total)
        self._wake.set()

    def drain(self) -> int:
        """Drop every waiting operation; return the credits they held."""
        credits = sum(op.credits for op in self.ops)
        self._account(-sum(op.nbytes for op in self.ops if type(op) is DataOp))
        self.ops.clear()
        return credits

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"connector stream {self.stream_id}")

    async def stop(self, *, drain: bool = False) -> None:
        """Finish the operation in flight (its effect is real) and, with `drain`, the ones
        waiting too (the connector closed cleanly after sending them: an EOS must not be lost
        for want of a last read); drop the rest; close the broker session."""
        self._stopping = True
        if not drain:
            self.drain()
        self._wake.set()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        await self._close_link()

    async def _close_link(self) -> None:
        link, self.link = self.link, None
        self.producing = False
        if link is not None:
            # A session already gone (lease lapsed) holds no frontier back anyway.
            await link.close()

    async def _forgotten(self) -> None:
        self.producing = False  # the broker forgot the session: open the producer again

    # -- performing ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            while not self.ops:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
            op = self.ops.popleft()
            try:
                await self._perform(op)
            except ConnectorProtocolError as exc:
                self.owner.failed(self, self._halt(op), exc)
            except TqError as exc:
                self.producing = False
                credits = self._halt(op)
                if self.route is not None:
                    # Perhaps appended with its answer lost: check the data at the next NOTIFY.
                    if self.progress is not None:
                        self.progress.verified = False
                    await self._close_link()
                elif isinstance(exc, UnknownBrokerSessionError):
                    await self._close_link()  # a new session for the next operation
                self.owner.failed(self, credits, exc)
            except Exception as exc:
                # A bug of ours: the connection reports it and ends; the stream stops here.
                logger.exception("connector stream %d: bug", self.stream_id)
                self.owner.failed(self, op.credits, exc)
                return
            finally:
                if type(op) is DataOp:
                    self._account(-op.nbytes)

    def _halt(self, failed: Op) -> int:
        """After a failed operation nothing behind it may run (appending later messages would
        leave a gap the connector, rewound to `processed`, never fills): drop what waits and
        take nothing more until the stream is opened again. The credits of all of it."""
        self.accepting = False
        return failed.credits + self.drain()

    async def _perform(self, op: Op) -> None:
        if isinstance(op, DataOp):
            await self._data(op)
        elif isinstance(op, AdvanceOp):
            await self._advance(op)
        elif isinstance(op, EndOp):
            if self.producing:
                await self._ensure_producer()
                link, (topic, partition) = self._link(), self._pid()
                await link.request(EndStreamRequest(session=link.session, topic=topic,
                                                    partition=partition))
                self.producing = False
            self.owner.completed(self, op.credits, self.processed)
        else:
            await self._open(op)

    def _pid(self) -> tuple[str, int]:
        assert self.target is not None
        return self.target

    def _link(self) -> SessionLink:
        assert self.link is not None
        return self.link

    async def _ensure_producer(self) -> None:
        """A live session with a producer on the stream's partition: opened (created, if the
        stream may create it) as the broker's core admits it."""
        if self.link is None:
            link = self.link = self.partitions.link(self.route, lease=self._lease,
                                                    session=self.session)
            link.on_reopen.append(self._forgotten)
            self.producing = False
            try:
                await link.start()
            except BaseException:
                self.link = None
                raise
        if not self.producing:
            link, (topic, partition), route = self._link(), self._pid(), self.route
            opened = await link.request(OpenProducerRequest(
                session=link.session, topic=topic, partition=partition, create=self.create,
                create_topic=self.create and route is None,
                topic_id=0 if route is None else route.topic_id,
                topic_created_ms=0 if route is None else route.created_ms))
            self.producing = True
            self.frontier = opened.frontier
            self.epoch = max(self.epoch, opened.frontier)

    async def _open(self, op: OpenOp) -> None:
        try:
            topic, partition = parse_stream_name(op.name)
            target = (broker_topic(topic), partition)
            route = await self.partitions.route(target)
            if route != self.route:
                self.route = route
                await self._close_link()  # another broker: a session there
            if target != self.target:
                self.target = target
                self.producing = False  # a new partition (or the first NOTIFY)
            try:
                await self._ensure_producer()
            except StreamEndedError:
                # Refused only if something is to be written: a connector that resumes a
                # stream it ended itself has nothing left to send (every later operation
                # asks the broker again, and fails with this if it must append).
                pass
            self.progress = await self._resolve(self, op.name)
        except TqError as exc:
            self.owner.refused(self, op, str(exc))
            return
        self.owner.opened(self, op)

    async def _data(self, op: DataOp) -> None:
        messages = op.messages
        floor = self.processed
        if floor is not None and (messages[0][0] <= floor or messages[-1][0] <= floor):
            # Sent again after a reconnect, before the connection knew where the stream stood.
            messages = [m for m in messages if m[4] & _EPHEMERAL or m[0] > floor]
        last = None
        if messages:
            await self._ensure_producer()
            batch = encode_messages(messages, time=self.epoch, now_ms=int(time.time() * 1000),
                                    producer_id=self.source_id)
            link, (topic, partition) = self._link(), self._pid()
            reply = await link.request(ProduceRequest(session=link.session, topic=topic,
                                                      partition=partition), payload=[batch])
            assert self.progress is not None
            for m in reversed(messages):
                if not m[4] & _EPHEMERAL:
                    last = m[0]
                    break
            if last is not None:
                self.progress.processed = last
            self.progress.offset = reply.next_offset
            self._save(self.key, self.progress)
        self._completed(op.credits, last)

    def _completed(self, credits: int, processed: int | None) -> None:
        # Right before an EOS the new point waits for the EOS to be done too: a connector
        # that sees its last id acknowledged may consider the stream finished.
        if processed is not None and self.ops and type(self.ops[0]) is EndOp:
            processed = None
        self.owner.completed(self, credits, processed)

    async def _advance(self, op: AdvanceOp) -> None:
        mid = op.message_id
        floor = self.processed
        if floor is None or mid > floor:
            await self._ensure_producer()
            target = mid + 1
            if target > self.frontier:
                link, (topic, partition) = self._link(), self._pid()
                await link.request(AdvanceRequest(session=link.session, topic=topic,
                                                  partition=partition, frontier=target))
                self.frontier = target
            self.epoch = max(self.epoch, target)
            assert self.progress is not None
            self.progress.processed = mid
            self._save(self.key, self.progress)
            self._completed(op.credits, mid)
        else:
            self.owner.completed(self, op.credits, None)
