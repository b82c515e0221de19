"""Producing into one partition of one broker: the credit window, acknowledgements, frontier
and end-of-stream (DESIGN §5), as an asyncio `AsyncProducer`.

`ProducerCore` is the part the blocking `Producer` shares: it sends encoded batches in order,
never with its window exhausted (the broker grants a window of unacknowledged bytes; an
acknowledgement gives the batch's bytes back), and remembers the first failure to raise it
from the next call, as Kafka's producer does. A failed batch is not retried: only
acknowledged batches are known to be stored.

Both run over either link: a `BrokerLink` (RPC, a broker in another process) or a
`PortLink` (`BrokerPort.link`, the broker in this process), so tq's own writers and remote
clients produce through the same code and the same admission.
"""

from __future__ import annotations

import asyncio
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from catalog.errors import TqError, UserError
from querylib.errors import InvalidLengthError

from ._credit import CreditWindow
from ._link import BrokerLink, SessionLink
from ._messages import (
    AdvanceRequest,
    EndStreamRequest,
    Incarnation,
    OpenProducerRequest,
    Produced,
    ProduceRequest,
)
from ._stream import Headers, encode_records

if TYPE_CHECKING:  # the port (and the broker's vocabulary) is only for in-process writers
    from ._port import BrokerPort

__all__ = ["AsyncProducer", "ProducerCore", "WriterGroup", "open_link"]

Entry = tuple[bytes | None, bytes | None, Headers, int, int | None]


def now_ms() -> int:
    return int(_time.time() * 1000)


@dataclass(frozen=True, slots=True)
class WriterGroup:
    """A producer's place in a collective publication: it is `writer` (e.g. a process index)
    of `name`, which has `writers` distinct writers. The partition's frontier does not move,
    nor its stream end, until all of them have joined (DESIGN §11 "Collective publishing")."""

    name: str
    writer: str
    writers: int


class ProducerCore:
    """Ordered, windowed sends of encoded batches into one partition (on the link's loop)."""

    def __init__(self, link: SessionLink, topic: str, partition: int, *, create: bool = True,
                 max_in_flight: int = 64, group: WriterGroup | None = None,
                 reopen: bool = False, incarnation: Incarnation | None = None) -> None:
        self.link = link
        self.topic = topic
        self.partition = partition
        self.create = create
        self.incarnation = incarnation  # the catalog's topic, when known
        self.group = group
        self.reopen = reopen  # go on writing a partition whose stream ended
        self.max_in_flight = max_in_flight
        self.window = CreditWindow(0)
        self.frontier = 0           # this producer's own frontier
        self.last_acked: Produced | None = None
        self.acked_batches = 0
        self._control_cost = 64
        self._order = asyncio.Lock()  # FIFO: batches go out in the order send_batch was called
        self._room = asyncio.Event()
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._error: TqError | None = None
        self._ended = False

    async def open(self) -> None:
        opened = self.link.opened
        assert opened is not None, "start the link first"
        self._control_cost = opened.control_cost
        reply = await self.link.request(self._open_request(rejoin=False))
        self.window = CreditWindow(reply.window)
        self.frontier = max(self.frontier, reply.frontier)
        self._room.set()
        self.link.on_reopen.append(self._rejoin)

    async def _rejoin(self) -> None:
        """The broker forgot our session (restart, expiry): join the partition again and
        restate our frontier. Batches in flight at that moment fail and are reported."""
        if self._ended:
            return
        reply = await self.link.request(self._open_request(rejoin=True))
        if self.frontier > reply.frontier:
            await self.link.request(AdvanceRequest(session=self.link.session, topic=self.topic,
                                                   partition=self.partition,
                                                   frontier=self.frontier))

    def _open_request(self, *, rejoin: bool) -> OpenProducerRequest:
        group = self.group
        topic = self.incarnation or Incarnation(0, 0)
        if group is None:
            return OpenProducerRequest(session=self.link.session, topic=self.topic,
                                       partition=self.partition, create=self.create,
                                       reopen=self.reopen, topic_id=topic.topic_id,
                                       topic_created_ms=topic.created_ms)
        return OpenProducerRequest(session=self.link.session, topic=self.topic,
                                   partition=self.partition, create=self.create,
                                   group=group.name, writer=group.writer,
                                   writers=group.writers, rejoin=rejoin, reopen=self.reopen,
                                   topic_id=topic.topic_id, topic_created_ms=topic.created_ms)

    def fail_later(self, error: TqError) -> None:
        """Keep `error` for the next call to raise (a send nobody waited for failed)."""
        if self._error is None:
            self._error = error

    def check(self) -> None:
        """Raise the first failure of an earlier send, once."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    async def send_batch(self, batch: bytes | memoryview) -> asyncio.Task[Produced | None]:
        """Queue one encoded batch; waits while the window is exhausted. Returns the task of
        its request: it resolves to the acknowledgement, or to None if the batch failed (the
        failure is raised by a later call)."""
        self.check()
        if self._ended:
            raise UserError("this producer has ended its stream; open a new one")
        opened = self.link.opened
        if opened is not None and len(batch) > opened.max_batch_bytes:
            # Said here: the broker's socket refuses a message this big without an answer.
            raise InvalidLengthError(f"batch of {len(batch)} bytes exceeds the broker's "
                                     f"maximum of {opened.max_batch_bytes}")
        return await self._issue(ProduceRequest(session=self.link.session, topic=self.topic,
                                                partition=self.partition), len(batch), [batch])

    async def advance(self, frontier: int) -> None:
        """Promise no more records with time < `frontier`; the broker publishes the minimum
        over the partition's producers."""
        self.check()
        if frontier < self.frontier:
            raise UserError(f"frontier may only advance: {frontier} < {self.frontier}")
        if frontier == self.frontier:
            return
        self.frontier = frontier
        await self._issue(AdvanceRequest(session=self.link.session, topic=self.topic,
                                         partition=self.partition, frontier=frontier),
                          self._control_cost, [])

    async def end(self) -> None:
        """End-of-stream for this producer; waits until everything is acknowledged."""
        if self._ended:
            return
        await self._issue(EndStreamRequest(session=self.link.session, topic=self.topic,
                                           partition=self.partition), self._control_cost, [])
        self._ended = True
        await self.flush()

    async def flush(self) -> None:
        """Wait for every request in flight; raise the first failure."""
        while self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)
        self.check()

    async def _issue(self, request: Any, cost: int, payload: Sequence[Any]) -> asyncio.Task[Any]:
        async with self._order:
            while not self.window.can_send() or len(self._in_flight) >= self.max_in_flight:
                self._room.clear()
                await self._room.wait()
            self.window.consume(cost)
            task = asyncio.get_running_loop().create_task(self._send(request, cost, payload))
            self._in_flight.add(task)
            # Let the task put its request on the wire before the next one is issued: the
            # broker appends in arrival order.
            await asyncio.sleep(0)
            return task

    async def _send(self, request: Any, cost: int, payload: Sequence[Any]) -> Any:
        try:
            reply = await self.link.request(request, payload=payload)
            if isinstance(reply, Produced):
                self.last_acked = reply
                self.acked_batches += 1
            return reply
        except TqError as exc:
            if self._error is None:
                self._error = exc
            return None
        finally:
            self.window.grant(cost)
            self._in_flight.discard(asyncio.current_task())  # type: ignore[arg-type]
            self._room.set()


def open_link(broker: str | BrokerPort, *, secret: bytes | None, principal: str | None,
              lease: float, timeout: float) -> SessionLink:
    """A (not yet started) session with `broker`: over RPC for an address, else in-process."""
    if not isinstance(broker, str):
        if principal is None:
            raise UserError("an in-process producer names the principal it writes as")
        return broker.link(principal, lease=lease, timeout=timeout)
    if secret is None:
        raise UserError("a producer of a broker over RPC needs a credential (`secret`)")
    # Over RPC we write as the principal our credential authenticates, whatever we state.
    return BrokerLink(broker, secret, lease=lease, timeout=timeout)


class AsyncProducer:
    """Records into one partition, batched, with logical times, frontier and end-of-stream.

        async with AsyncProducer("tcp://127.0.0.1:7500", "events", secret=key) as producer:
            await producer.send(b"value", key=b"k", time=3)
            await producer.advance(4)
        # leaving the block ends the stream (end-of-stream) and closes the session

    `broker` is an RPC address (with `secret`), or the `BrokerPort` of a broker in this
    process (with the `principal` to write as: tq's own writers are "system"). `reopen`
    goes on writing a partition whose stream ended (its writers rule must admit us).
    """

    def __init__(self, broker: str | BrokerPort, topic: str, partition: int = 0, *,
                 secret: bytes | None = None, principal: str | None = None,
                 batch_records: int = 1000, batch_bytes: int = 1024 * 1024,
                 linger: float = 0.002, lease: float = 10.0, timeout: float = 30.0,
                 create: bool = True, group: WriterGroup | None = None,
                 reopen: bool = False, incarnation: Incarnation | None = None) -> None:
        self.link = open_link(broker, secret=secret, principal=principal, lease=lease,
                              timeout=timeout)
        self.core = ProducerCore(self.link, topic, partition, create=create, group=group,
                                 reopen=reopen, incarnation=incarnation)
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.linger = linger
        self._pending: list[Entry] = []
        self._pending_bytes = 0
        self._linger_task: asyncio.Task[None] | None = None

    async def start(self) -> AsyncProducer:
        await self.link.start()
        await self.core.open()
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        await self.close(end=exc_type is None)

    @property
    def frontier(self) -> int:
        return self.core.frontier

    async def send(self, value: bytes | None, *, key: bytes | None = None,
                   headers: Headers = (), timestamp: int | None = None,
                   time: int | None = None) -> None:
        """Add a record; sends a batch when full (or after `linger` seconds)."""
        if time is not None and time < self.core.frontier:
            raise UserError(f"record time {time} is below this producer's frontier "
                            f"{self.core.frontier}")
        self._pending.append((key, value, headers, now_ms() if timestamp is None else timestamp,
                              time))
        self._pending_bytes += len(value or b"") + len(key or b"") + 16
        if len(self._pending) >= self.batch_records or self._pending_bytes >= self.batch_bytes:
            await self._send_pending()
        elif self._linger_task is None:
            self._linger_task = asyncio.get_running_loop().create_task(self._linger())

    async def _linger(self) -> None:
        await asyncio.sleep(self.linger)
        self._linger_task = None
        try:
            await self._send_pending()
        except TqError as exc:  # nobody awaits this task: the next call raises it
            self.core.fail_later(exc)

    async def _send_pending(self) -> None:
        if self._linger_task is not None and self._linger_task is not asyncio.current_task():
            self._linger_task.cancel()
            self._linger_task = None
        if not self._pending:
            return
        entries, self._pending, self._pending_bytes = self._pending, [], 0
        await self.core.send_batch(encode_records(entries))

    async def send_batch(self, batch: bytes) -> asyncio.Task[Produced | None]:
        """Send an already encoded batch (after the records pending before it); returns the
        task of its request (see ProducerCore.send_batch)."""
        await self._send_pending()
        return await self.core.send_batch(batch)

    async def advance(self, frontier: int) -> None:
        await self._send_pending()
        await self.core.advance(frontier)

    async def flush(self) -> None:
        await self._send_pending()
        await self.core.flush()

    async def close(self, *, end: bool = True) -> None:
        """Send what is pending, end the stream (unless `end` is False: then the partition's
        frontier no longer waits for us, but the stream goes on), close the session."""
        try:
            await self._send_pending()
            if end:
                await self.core.end()
            else:
                await self.core.flush()
        finally:
            await self.link.close()
