"""Producing into one partition of one broker: the credit window, acknowledgements, frontier
and end-of-stream (DESIGN §5), as an asyncio `AsyncProducer`.

`ProducerCore` is the part the blocking `Producer` shares: it sends encoded batches in order,
never with its window exhausted (the broker grants a window of unacknowledged bytes; an
acknowledgement gives the batch's bytes back), and remembers the first failure to raise it
from the next call, as Kafka's producer does.

Both run over either link: a `BrokerLink` (RPC, a broker in another process) or a
`PortLink` (`BrokerPort.link`, the broker in this process), so tq's own writers and remote
clients produce through the same code and the same admission.

It is an idempotent producer, as Kafka's (DESIGN §5 "Idempotent producers"): it has a random
producer id and numbers the records it sends into its partition, stamped in each batch's header
(producerId, producerEpoch 0, baseSequence). When the connection is lost (the broker restarted,
maybe at another address, or stopped answering) it keeps every request not yet acknowledged,
and once its link has reopened the session it rejoins the partition and sends them all again,
in order: the broker answers a batch it appended before with the offsets it got then, so
nothing is lost and nothing stored twice. A request the broker refused is not sent again; the
refusal is raised. A restarted process is a new producer (a new id); a reconnected one is the
same. A producer that had sent its end of stream and finds the stream ended when it rejoins
(its end was appended, its answer lost) says so (`ending`, its producer id and last sequence):
the broker then answers what it sends again without reopening the stream (DESIGN §5
"Idempotent producers").
"""

from __future__ import annotations

import asyncio
import secrets
import struct
import threading
import time as _time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from catalog.errors import TqError, UserError
from querylib.errors import InvalidLengthError
from querylib.records import (
    HEADER_SIZE,
    SEQUENCE_MODULUS,
    Batch,
    SplitBatch,
    batch_head,
    encode_batch,
    read_header,
    stamp_producer_split,
)
from querylib.records._header import PRODUCER_OFFSET
from querylib.rpc import Credential, error_from_body

from ._credit import CreditWindow
from ._errors import DuplicateSequenceError
from ._session import (
    RECONNECT_TIMEOUT,
    BrokerLink,
    LinkSource,
    Locate,
    SessionLink,
    WatchLeader,
)
from ._stream import Headers, with_time
from .messages import (
    AdvanceRequest,
    Done,
    EndStreamRequest,
    Incarnation,
    OpenProducerRequest,
    ProduceBatchesRequest,
    Produced,
    ProducedBatches,
    ProduceRequest,
)

__all__ = ["AsyncProducer", "Cohort", "ProducerCore", "new_producer_id", "open_link"]

# A record waiting for its batch, as `encode_batch` takes it: (timestamp_ms, key, value,
# headers), the logical time already among the headers (`with_time`).
Entry = tuple[int, bytes | None, bytes | None, Headers]
Claim = tuple[int, int, int]  # producer id, producer epoch, base sequence


class Stamping(TypedDict, total=False):
    """What an idempotent producer's encoder stamps on a batch (`ProducerCore.stamping`)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
_PRODUCER_ID = struct.Struct(">q")

# Stored once, offsets forgotten by the broker (DuplicateSequenceError): acknowledged.
_STORED_BEFORE = Produced(base_offset=-1, next_offset=-1)


def now_ms() -> int:
    return _time.time_ns() // 1_000_000


def new_producer_id() -> int:
    """A producer id for one producer session: random in [2^62, 2^63), so it collides with
    no id the Kafka listener hands out (broker id << 32 | n) and, for practical purposes,
    with no other tq producer of the partition."""
    return (1 << 62) | secrets.randbits(62)


@dataclass(frozen=True, slots=True)
class Cohort:
    """A producer's place in a collective publication: it is `writer` (e.g. a process index)
    of `name`, which has `writers` distinct writers. The partition's frontier does not move,
    nor its stream end, until all of them have joined (DESIGN §5 "Collective publishing")."""

    name: str
    writer: str
    writers: int


@dataclass(eq=False)
class _Out:
    """A request sent and not yet answered for good: sent again after a reconnect."""

    request: Any
    cost: int
    payload: Sequence[Any]
    done: asyncio.Future[Any]
    attempt: int = 0            # bumped each time it goes out


class ProducerCore:
    """Ordered, windowed, idempotent sends of encoded batches into one partition (on the
    link's loop). `claim` may be called from any thread."""

    def __init__(self, link: SessionLink, topic: str, partition: int, *, create: bool = True,
                 max_in_flight: int = 64, cohort: Cohort | None = None,
                 reopen: bool = False, incarnation: Incarnation | None = None,
                 idempotent: bool = True, epoch: int = 0) -> None:
        self.link = link
        self.topic = topic
        self.partition = partition
        self.create = create
        self.incarnation = incarnation  # the catalog's topic, when known
        self.cohort = cohort
        self.reopen = reopen  # go on writing a partition whose stream ended
        self.epoch = epoch  # with reopen: the run we write for (DESIGN §5 "Epochs")
        self.max_in_flight = max_in_flight
        self.producer_id = new_producer_id() if idempotent else -1
        self.window = CreditWindow(0)
        self.frontier = 0           # this producer's own frontier
        self.joined_epoch = 0       # the partition's epoch when we joined it
        self.last_acked: Produced | None = None
        self.acked_batches = 0
        self.resent = 0             # requests sent again after a reconnect
        self._acked_frontier = 0    # the frontier of the last acknowledged advance
        self._claimed = 0           # records numbered so far (sequences are this mod 2^31)
        self._claims = threading.Lock()
        self._control_cost = 64
        self._order = asyncio.Lock()  # FIFO: batches go out in the order send_batch was called
        # Set when a sender waiting for room may go on: once a quarter of the window and of
        # the in-flight limit are free again (`_roomy`), not at every acknowledgement, so a
        # saturated producer sends in bursts: one wake of its sender (and of zmq's I/O
        # thread) per burst, not per batch.
        self._room = asyncio.Event()
        self._window_size = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reopening: set[asyncio.Task[None]] = set()  # after a lost answer (_attempt)
        self._outstanding: deque[_Out] = deque()  # in the order sent
        self._error: TqError | None = None
        self._ended = False

    async def open(self) -> None:
        opened = self.link.opened
        assert opened is not None, "start the link first"
        self._control_cost = opened.control_cost
        self._loop = asyncio.get_running_loop()  # asked once: 3.11 asks getpid() each time
        reply = await self.link.request(self._open_request(rejoin=False))
        self.window = CreditWindow(reply.window)
        self._window_size = reply.window
        self.frontier = max(self.frontier, reply.frontier)
        self.joined_epoch = reply.epoch
        self._acked_frontier = self.frontier
        self._room.set()
        self.link.on_reopen.append(self._rejoin)
        self.link.on_failure.append(self._give_up)

    def claim(self, records: int) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) to stamp on the next batch of `records`
        records. Batches must be sent in the order of their claims."""
        with self._claims:
            base = self._claimed % SEQUENCE_MODULUS
            self._claimed += records
        return self.producer_id, 0, base

    def _unclaim(self, batch: Batch, claim: Claim | None = None) -> None:
        """Give back the sequence numbers claimed for a batch that will not be sent (`claim`,
        or those an encoder of ours stamped into it), unless a later batch has numbers
        already (then the broker refuses the next one with OutOfOrderSequenceError, as it
        should: a gap)."""
        if self.producer_id < 0:
            return
        header = read_header(batch_head(batch))
        producer_id, _, base = claim or (header.producer_id, 0, header.base_sequence)
        if producer_id != self.producer_id:
            return
        records = header.last_offset_delta + 1
        with self._claims:
            if self._claimed >= records and \
                    (self._claimed - records) % SEQUENCE_MODULUS == base:
                self._claimed -= records

    def stamping(self, records: int) -> Stamping:
        """The encoder arguments (`producer_id`, `producer_epoch`, `base_sequence`) for the
        next batch of `records` records; none for a producer that is not idempotent."""
        if self.producer_id < 0:
            return {}
        producer_id, epoch, base = self.claim(records)
        return {"producer_id": producer_id, "producer_epoch": epoch, "base_sequence": base}

    def claim_for(self, batch: Batch) -> Claim | None:
        """Claim the numbers `stamp` gives `batch` (None when it needs none: it carries a
        producer already, as an encoder of ours stamps it for free, or we are not
        idempotent), so a caller that orders its batches under a lock numbers them there
        and stamps them later, off that lock (`stamp(batch, claim)`)."""
        if self.producer_id < 0:
            return None
        head = batch_head(batch)
        if len(head) >= HEADER_SIZE and _PRODUCER_ID.unpack_from(head, PRODUCER_OFFSET)[0] >= 0:
            return None  # stamped (the usual case, once per batch: only that field is read)
        header = read_header(head)
        if header.producer_id >= 0:
            return None
        return self.claim(header.last_offset_delta + 1)

    def stamp(self, batch: Batch, claim: Claim | None = None) -> Batch:
        """The batch with this producer's id and its next sequence (or `claim`, from
        `claim_for`), if it carries no producer yet: then a SplitBatch, a new header and a
        view of the records, sent as two frames (a CRC pass; the records are never
        copied)."""
        if claim is None:
            claim = self.claim_for(batch)
            if claim is None:
                return batch
        return stamp_producer_split(batch, *claim)  # type: ignore[arg-type]  # a Claim's fields

    async def _rejoin(self) -> None:
        """The link reopened the session (the broker restarted or forgot us, or stopped
        answering for a while): join the partition again, restate the frontier it
        acknowledged, then send every unanswered request again, in order."""
        if self._ended and not self._outstanding:
            return
        try:
            reply = await self.link.request(self._open_request(rejoin=True))
            frontier = reply.frontier  # ours as the broker has it
            if self._acked_frontier > frontier and not self._ended:
                # Everything below it was acknowledged before it: safe to state first.
                await self.link.request(AdvanceRequest(
                    session=self.link.session, topic=self.topic, partition=self.partition,
                    frontier=self._acked_frontier))
                frontier = self._acked_frontier
        except TqError as exc:
            if self.link.lost(exc):
                raise  # the link tries again (elsewhere, when the leader moved)
            self._fail_all(exc)
            return
        for out in list(self._outstanding):
            if isinstance(out.request, AdvanceRequest) and out.request.frontier <= frontier:
                self._resolve(out, Done())  # the broker has it already (only its reply was lost)
                continue
            self.resent += 1
            self._transmit(out)
            await asyncio.sleep(0)  # on the wire before the next

    def _give_up(self, error: TqError) -> None:
        self._fail_all(error)

    def _open_request(self, *, rejoin: bool) -> OpenProducerRequest:
        cohort = self.cohort
        topic = self.incarnation or Incarnation(0, 0)
        resend: dict[str, Any] = {}
        if rejoin:
            # What the broker needs to tell whether everything we send again is stored
            # already: then an ended stream answers it and is not reopened.
            with self._claims:
                last = (self._claimed - 1) % SEQUENCE_MODULUS if self._claimed else -1
            resend = {"rejoin": True, "producer_id": self.producer_id, "last_sequence": last,
                      "ending": self._ending()}
        if cohort is not None:
            resend |= {"cohort": cohort.name, "writer": cohort.writer, "writers": cohort.writers}
        return OpenProducerRequest(session=self.link.session, topic=self.topic,
                                   partition=self.partition, create=self.create,
                                   reopen=self.reopen, epoch=self.epoch,
                                   topic_id=topic.topic_id,
                                   topic_created_ms=topic.created_ms, **resend)

    def _ending(self) -> bool:
        """Whether our end of stream was sent (nothing of ours may follow it)."""
        return self._ended or any(isinstance(out.request, EndStreamRequest)
                                  for out in self._outstanding)

    def fail_later(self, error: TqError) -> None:
        """Keep `error` for the next call to raise (a send nobody waited for failed)."""
        if self._error is None:
            self._error = error

    def check(self) -> None:
        """Raise the first failure of an earlier send, once."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    async def send_batch(self, batch: Batch,
                         claim: Claim | None = None) -> asyncio.Future[Produced | None]:
        """Queue one encoded batch (stamped with this producer's id and next sequence, or
        `claim`, unless it carries a producer already); waits while the window is exhausted.
        Returns a future of its acknowledgement, or None if the batch failed (the failure is
        raised by a later call)."""
        return await self._issue(*self._batch_request(batch, claim))

    def _batch_request(self, batch: Batch, claim: Claim | None
                       ) -> tuple[ProduceRequest, int, list[Any]]:
        """`send_batch`'s request, its cost and its payload (the batch stamped)."""
        self.check()
        if self._ended:
            raise UserError("this producer has ended its stream; open a new one")
        opened = self.link.opened
        if opened is not None and len(batch) > opened.max_batch_bytes:
            # Said here: the broker's socket refuses a message this big without an answer.
            self._unclaim(batch, claim)
            raise InvalidLengthError(f"batch of {len(batch)} bytes exceeds the broker's "
                                     f"maximum of {opened.max_batch_bytes}")
        stamped = self.stamp(batch, claim)
        frames = [stamped.head, stamped.body] if type(stamped) is SplitBatch else [stamped]
        return ProduceRequest(session=self.link.session, topic=self.topic,
                              partition=self.partition), len(stamped), frames

    async def send_batches(self, batches: Sequence[tuple[Batch, Claim | None]]
                           ) -> asyncio.Future[Any]:
        """Several encoded batches (each with its claim, as `send_batch`) in ONE request
        (ProduceBatchesRequest: one message, one MAC, one reply, as a Kafka ProduceRequest
        carries several), appended in this order; at most `max_batch_bytes` in all. The
        future resolves to the list of their acknowledgements (Produced each), or None if a
        batch failed (raised by a later call). One batch goes as `send_batch` does."""
        return await self._issue(*self._group_request(batches))

    def _group_request(self, batches: Sequence[tuple[Batch, Claim | None]]
                       ) -> tuple[Any, int, list[Any]]:
        """`send_batches`' request, its cost and its payload (one batch: `send_batch`'s)."""
        if len(batches) == 1:
            return self._batch_request(*batches[0])
        self.check()
        if self._ended:
            raise UserError("this producer has ended its stream; open a new one")
        opened = self.link.opened
        parts: list[Any] = []
        for batch, claim in batches:
            stamped = self.stamp(batch, claim)
            parts += (stamped.head, stamped.body) if type(stamped) is SplitBatch else (stamped,)
        frame = b"".join(parts)  # one frame: small batches, or a copy paid once per request
        if opened is not None and len(frame) > opened.max_batch_bytes:
            for batch, claim in batches:
                self._unclaim(batch, claim)
            raise InvalidLengthError(f"batches of {len(frame)} bytes in all exceed the "
                                     f"broker's maximum of {opened.max_batch_bytes} per request")
        return ProduceBatchesRequest(
            session=self.link.session, topic=self.topic, partition=self.partition,
            batches=len(batches)), len(frame), [frame]

    def can_send_now(self) -> bool:
        """Whether a request issued now leaves at once: nothing waits before it, the window
        is open, a slot is free and the link is up (then `send_now` need not wait)."""
        return (not self._order.locked() and self.window.can_send()
                and len(self._outstanding) < self.max_in_flight and self.link.ready.is_set())

    def send_now(self, batches: Sequence[tuple[Batch, Claim | None]]) -> asyncio.Future[Any]:
        """`send_batches` without waiting, when `can_send_now` said so (on the loop): the
        request leaves in the caller's loop callback, with no task and no turn of the loop
        in between (a blocking Producer's sender, woken for one batch, sends it there)."""
        return self._issue_now(*self._group_request(batches))

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
        """Wait for every request in flight (sent again as often as reconnects need); raise
        the first failure."""
        while self._outstanding:
            await asyncio.gather(*(out.done for out in list(self._outstanding)),
                                 return_exceptions=True)
        self.check()

    async def _issue(self, request: Any, cost: int, payload: Sequence[Any]) -> asyncio.Future[Any]:
        async with self._order:
            while (not self.window.can_send() or len(self._outstanding) >= self.max_in_flight
                   or not self.link.ready.is_set()):
                if not self.link.ready.is_set():
                    await self.link.ready.wait()  # a reconnect is sending older ones again
                    continue
                self._room.clear()
                await self._room.wait()
            return self._issue_now(request, cost, payload)

    def _issue_now(self, request: Any, cost: int, payload: Sequence[Any]
                   ) -> asyncio.Future[Any]:
        self.window.consume(cost)
        loop = self._loop or asyncio.get_running_loop()
        out = _Out(request, cost, payload, loop.create_future())
        self._outstanding.append(out)
        # Sent before this returns (RpcClient sends at once when a slot is free; else it
        # queues for one, first come first served): requests reach the wire in the order
        # issued, as the broker appends in arrival order, with no task and no hop through
        # the loop per batch; the answer comes back to `_answered` from the receive loop.
        self._transmit(out)
        return out.done

    def _transmit(self, out: _Out) -> None:
        out.attempt += 1
        attempt, generation = out.attempt, self.link.generation
        self.link.send_request(
            out.request, lambda reply, error: self._answered(out, attempt, generation, reply,
                                                             error),
            payload=out.payload)

    def _answered(self, out: _Out, attempt: int, generation: int, reply: Any,
                  error: BaseException | None) -> None:
        """The answer to one attempt at `out` (on the loop, from the link's receive loop)."""
        if error is None and type(reply) is ProducedBatches:
            try:
                reply = _each_produced(reply)
            except TqError as exc:
                error = exc
        if isinstance(error, DuplicateSequenceError):
            reply, error = _STORED_BEFORE, None
        if error is None:
            self._resolve(out, reply)
            return
        if out.done.done() or attempt != out.attempt:
            return  # sent again since: that attempt answers
        if not isinstance(error, TqError):  # a bug, or the loop closing: the caller hears it
            self._resolve(out, error=TqError(f"sending to the broker failed: {error!r}"))
            return
        if not self.link.lost(error) or self.link.closed:
            self._resolve(out, error=error)
            return
        loop = self._loop or asyncio.get_running_loop()
        task = loop.create_task(self._reopen(out, generation))
        self._reopening.add(task)
        task.add_done_callback(self._reopening.discard)

    async def _reopen(self, out: _Out, generation: int) -> None:
        """The connection was lost under `out`: reopen the session (then `_rejoin` sends it
        again, with every other request unanswered)."""
        try:
            await self.link.reopen(generation)
        except TqError as reopen_error:
            if self.link.failure is None:  # our own rejoin was refused, or a bug
                self._resolve(out, error=reopen_error)

    def _roomy(self) -> bool:
        """Whether a sender waiting for room is woken (see `_room`)."""
        outstanding = len(self._outstanding)
        return not outstanding or (
            outstanding <= self.max_in_flight - max(1, self.max_in_flight // 4)
            and self.window.available >= self._window_size // 4)

    def _resolve(self, out: _Out, reply: Any = None, *, error: TqError | None = None) -> None:
        if out.done.done():
            return
        self._outstanding.remove(out)
        self.window.grant(out.cost)
        if self._roomy():
            self._room.set()
        if error is not None:
            if self._error is None:
                self._error = error
            out.done.set_result(None)
            return
        if isinstance(reply, Produced):
            self._acked(reply)
            self.acked_batches += 1
        elif isinstance(out.request, ProduceBatchesRequest):
            for produced in reply:
                self._acked(produced)
            self.acked_batches += len(reply)
        elif isinstance(out.request, AdvanceRequest):
            self._acked_frontier = max(self._acked_frontier, out.request.frontier)
        out.done.set_result(reply)

    def _acked(self, produced: Produced) -> None:
        # Answers may complete out of order (a ProduceBatches' one reply waits for all its
        # batches, a lone batch after it may be answered in the same loop iteration first):
        # the last acknowledgement is the one furthest into the partition.
        last = self.last_acked
        if produced.base_offset >= 0 and (last is None or produced.next_offset > last.next_offset):
            self.last_acked = produced

    def _fail_all(self, error: TqError) -> None:
        for out in list(self._outstanding):
            self._resolve(out, error=error)


def _each_produced(reply: ProducedBatches) -> list[Produced]:
    """Each batch's acknowledgement from the answer to a ProduceBatchesRequest; a batch the
    broker stored before (DuplicateSequenceError) counts as acknowledged. Any other refusal
    is raised (the first), as for a lone batch: a lost session makes the producer rejoin and
    send the request again, whose batches stored meanwhile are then answered as duplicates."""
    produced = [Produced(base_offset=base, next_offset=nxt) for base, nxt in reply.offsets]
    for index, body in reply.errors:
        error = error_from_body(body)
        if not isinstance(error, DuplicateSequenceError):
            raise error
        produced[index] = _STORED_BEFORE
    return produced


def open_link(broker: str | LinkSource, *, secret: bytes | Credential | None,
              principal: str | None, lease: float, timeout: float,
              locate: Locate | None = None,
              reconnect_timeout: float = RECONNECT_TIMEOUT,
              watch_leader: WatchLeader | None = None) -> SessionLink:
    """A (not yet started) session with `broker`: over RPC for an address, else in-process.
    `locate`, `reconnect_timeout` and `watch_leader`: see BrokerLink."""
    if not isinstance(broker, str):
        if principal is None:
            raise UserError("an in-process producer names the principal it writes as")
        return broker.link(principal, lease=lease, timeout=timeout)
    if secret is None:
        raise UserError("a producer of a broker over RPC needs a credential (`secret`)")
    # Over RPC we write as the principal our credential authenticates, whatever we state.
    return BrokerLink(broker, secret, lease=lease, timeout=timeout, locate=locate,
                      reconnect_timeout=reconnect_timeout, watch_leader=watch_leader)


class AsyncProducer:
    """Records into one partition, batched, with logical times, frontier and end-of-stream.

        async with AsyncProducer("tcp://127.0.0.1:7500", "events", secret=key) as producer:
            await producer.send(b"value", key=b"k", time=3)
            await producer.advance(4)
        # leaving the block ends the stream (end-of-stream) and closes the session

    `broker` is an RPC address (with `secret`), or the `BrokerPort` of a broker in this
    process (with the `principal` to write as: tq's own writers are "system"). `reopen`
    goes on writing a partition whose stream ended (its writers rule must admit us).
    `locate` (a coroutine function) returns the broker's current address, for when it stops
    answering at this one; `watch_leader` tells when the catalog moved the partition's
    leader, to follow it at once (see BrokerLink).
    """

    def __init__(self, broker: str | LinkSource, topic: str, partition: int = 0, *,
                 secret: bytes | Credential | None = None, principal: str | None = None,
                 batch_records: int = 1000, batch_bytes: int = 1024 * 1024,
                 linger: float = 0.002, lease: float = 10.0, timeout: float = 30.0,
                 create: bool = True, cohort: Cohort | None = None,
                 reopen: bool = False, incarnation: Incarnation | None = None,
                 idempotent: bool = True, locate: Locate | None = None,
                 reconnect_timeout: float = RECONNECT_TIMEOUT, epoch: int = 0,
                 watch_leader: WatchLeader | None = None) -> None:
        self.link = open_link(broker, secret=secret, principal=principal, lease=lease,
                              timeout=timeout, locate=locate,
                              reconnect_timeout=reconnect_timeout, watch_leader=watch_leader)
        self.core = ProducerCore(self.link, topic, partition, create=create, cohort=cohort,
                                 reopen=reopen, incarnation=incarnation,
                                 idempotent=idempotent, epoch=epoch)
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
        self._pending.append((now_ms() if timestamp is None else timestamp, key, value,
                              headers if time is None else with_time(headers, time)))
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
        await self.core.send_batch(encode_batch(entries, **self.core.stamping(len(entries))))

    async def send_batch(self, batch: bytes) -> asyncio.Future[Produced | None]:
        """Send an already encoded batch (after the records pending before it); returns the
        future of its acknowledgement (see ProducerCore.send_batch)."""
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
