"""Blocking `Producer` and `Subscriber` for scripts and threads: the asyncio cores on a loop
thread of their own (`querylib.rpc._bridge.LoopThread`, as `querylib.rpc.BlockingClient`).

CPU work stays on the caller's thread: a producer encodes its batches where `send` is called
and crosses to the loop once per batch; a subscriber decodes where it iterates, and the loop
thread only moves delivered bytes into a queue. So the loop thread stays responsive (heartbeats,
acknowledgements) however busy the application is. One exception, small and bounded: a
pre-built batch (`send_batch`) gets its producer numbers on the caller's thread, in order, but
its new header and CRC pass (~5 us per 100 KB) on the loop thread, so the caller does not hold
the producer's lock through it while the loop waits for that lock.

Both carry on across a restart of their broker (DESIGN §5 "Restarts"): given `locate`, a plain
function returning the broker's current address (the catalog's), they also follow it to a new
address; given `watch_leader` too (`Cluster.watch_leader` bound to the topic and partition),
they move to a new leader as soon as the catalog names it, not after a lease of silence
(DESIGN §5 "Replication"). They give up, raising BrokerUnavailableError, after
`reconnect_timeout` seconds without reaching it.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from time import time_ns as _now_ns  # `send` inlines `now_ms`: a call less per record
from typing import TYPE_CHECKING, Any

from catalog.errors import TqError, UserError
from querylib.records import RunBatch, encode_batch
from querylib.rpc._bridge import LoopThread

from ._producer import Claim, Cohort, Entry, ProducerCore, now_ms
from ._session import RECONNECT_TIMEOUT, BrokerLink, Locate, WatchLeader
from ._stream import EndOfStream, Event, Headers, Values, with_time
from ._subscriber import Chunk, ChunkDecoder, SubscriberCore
from .messages import Incarnation, StartAt

if TYPE_CHECKING:
    from querylib.rpc import Credential

__all__ = ["Producer", "Subscriber"]

# A Producer's outbox: batches waiting for its loop, at least two, up to _GROUP_BATCHES of them
# or _OUTBOX_BYTES. Those that pile up while earlier ones are in flight leave together (up to
# _GROUP_BATCHES and _GROUP_BYTES, and the broker's largest batch), as one
# ProduceBatchesRequest: joined into one frame, a copy paid once per request, against a
# message, a MAC, a zmq hand-off on each side and a reply per batch. Small batches amortise a
# request over hundreds, 100 KB ones over two (at 64 KiB those went one a request, and the
# broker spent about 13% more CPU per batch). The bound keeps what one request costs the
# broker's loop short: a neighbour's message waits behind it (1 MiB groups raised a probe's
# latency beside a bulk stream).
_GROUP_BATCHES = 256
_GROUP_BYTES = 256 * 1024
# Big batches wait up to this many bytes; a caller blocked on a full outbox is woken once it is
# half empty, not at every batch the loop takes (each wake is a thread switch, on each side).
_OUTBOX_BYTES = 1024 * 1024


def _async_locate(locate: Callable[[], str | None] | None) -> Locate | None:
    """A blocking `locate` (it asks the coordinator) run off the loop thread."""
    if locate is None:
        return None

    async def run() -> str | None:
        return await asyncio.to_thread(locate)

    return run


def _check_bytes_like(values: list[bytes | None], allow_none: bool) -> None:
    """TypeError unless every value is bytes-like (or None, when allowed): one C-speed pass,
    so a send split over several batches fails before its first part is queued."""
    try:
        b"".join(values)  # type: ignore[arg-type]  # finding out: TypeError caught
        return
    except TypeError:
        pass
    for value in values:
        if value is None and allow_none:
            continue
        try:
            memoryview(value)  # type: ignore[arg-type]  # finding out: TypeError caught
        except TypeError:
            raise TypeError(f"record values are bytes-like or None, not "
                            f"{type(value).__name__}") from None


def _estimate(values: list[bytes | None], tail: int) -> int:
    """Bytes `values` will take in a batch, guessed from the first (exact when all have its
    length, as a publisher's usually do)."""
    first = values[0]
    try:
        length = len(first) if first is not None else 0
    except TypeError:
        length = 0
    return len(values) * (length + tail + 10)


class Producer:
    """Records into one partition of one broker, blocking when the window is exhausted.

        with Producer("tcp://127.0.0.1:7500", "events", secret=key) as producer:
            producer.send(b"hello", time=0)
            producer.advance(1)
        # leaving the block ends the stream and waits for every acknowledgement

    `send` batches records (`batch_records`, `batch_bytes`, or after `linger` seconds); a
    failure of an earlier batch is raised by a later call. It writes as the principal of
    `secret` (DESIGN §12); `reopen`: go on writing a partition whose stream ended, in a new
    `epoch` when that is above the partition's (DESIGN §5 "Epochs").
    Idempotent unless told otherwise: a batch sent again after a reconnect is stored once
    (see ProducerCore).
    """

    def __init__(self, address: str, topic: str, partition: int = 0, *, secret: bytes | Credential,
                 batch_records: int = 1000, batch_bytes: int = 1024 * 1024,
                 linger: float = 0.002, lease: float = 10.0, timeout: float = 30.0,
                 create: bool = True, cohort: Cohort | None = None,
                 incarnation: Incarnation | None = None, reopen: bool = False,
                 idempotent: bool = True, locate: Callable[[], str | None] | None = None,
                 reconnect_timeout: float = RECONNECT_TIMEOUT, epoch: int = 0,
                 watch_leader: WatchLeader | None = None) -> None:
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.timeout = timeout
        self._thread = LoopThread(f"tq-producer {topic}-{partition}", owner="a Producer")
        # Records pending and encoded batches waiting for the loop, shared with the linger
        # timer. Batches leave the outbox in order, one sender task at a time, those waiting
        # together in one request; the caller blocks while the outbox is full
        # (`_outbox_full_locked`: the window is exhausted), which is the backpressure.
        # `_mutex` is the condition's own lock: `send`, once per record, takes it directly
        # (a Condition's `with` costs two Python-level calls more).
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._pending: list[Entry] = []
        self._pending_bytes = 0
        self._runs = RunBatch()  # runs from send_values, encoded as they come
        # Batches for the loop to send, in order, each with the sequence numbers claimed for
        # it when it has to be stamped still (ProducerCore.claim_for).
        self._outbox: deque[tuple[Any, Claim | None]] = deque()
        self._outbox_bytes = 0
        self._sender: asyncio.Task[None] | None = None
        # A sender task is scheduled or running: it takes what the outbox gets until it finds
        # it empty, so adding a batch meanwhile wakes no loop (a wake is a write to the loop's
        # self-pipe and a thread switch: a third of a busy producer's CPU when it was per batch).
        self._sender_wanted = False
        self._failure: BaseException | None = None
        self._blocked = False  # a caller waits for room in the outbox, not yet woken
        self._linger_armed = False
        self._closed = False
        link_options: dict[str, Any] = {"lease": lease, "timeout": timeout,
                                        "locate": _async_locate(locate),
                                        "reconnect_timeout": reconnect_timeout,
                                        "watch_leader": watch_leader}
        try:
            self.link, self.core = self._thread.call(self._open(
                lambda: BrokerLink(address, secret, **link_options),
                topic, partition, create, cohort, reopen, incarnation, idempotent, epoch))
        except BaseException:
            self._thread.close()
            raise

    @staticmethod
    async def _open(make_link: Callable[[], BrokerLink], topic: str, partition: int,
                    create: bool, cohort: Cohort | None, reopen: bool,
                    incarnation: Incarnation | None, idempotent: bool,
                    epoch: int) -> tuple[BrokerLink, ProducerCore]:
        link = make_link()  # on the loop thread, where it runs
        await link.start()
        core = ProducerCore(link, topic, partition, create=create, cohort=cohort, reopen=reopen,
                            incarnation=incarnation, idempotent=idempotent, epoch=epoch)
        try:
            await core.open()
        except BaseException:
            await link.close()
            raise
        return link, core

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(end=exc_type is None)

    @property
    def frontier(self) -> int:
        return self.core.frontier

    @property
    def epoch(self) -> int:
        """The partition's epoch when we joined it (DESIGN §5 "Epochs")."""
        return self.core.joined_epoch

    @property
    def last_acked(self) -> Any:
        """The acknowledgement furthest into the partition (`Produced(base_offset,
        next_offset)`), or None."""
        return self.core.last_acked

    def send(self, value: bytes | None, *, key: bytes | None = None, headers: Headers = (),
             timestamp: int | None = None, time: int | None = None) -> None:
        # Once per record, so every step counts: the entry is built as `encode_batch` takes
        # it, and the lock is taken by hand (`with` on a lock costs more than the lock).
        if self._closed:
            raise UserError("the producer is closed")
        if time is not None:
            if time < self.core.frontier:
                raise UserError(f"record time {time} is below this producer's frontier "
                                f"{self.core.frontier}")
            headers = with_time(headers, time)
        entry = (_now_ns() // 1_000_000 if timestamp is None else timestamp, key, value, headers)
        self._mutex.acquire()
        try:
            if self._runs.count:  # runs from `send_values` go first, in a batch of their own
                self._enqueue_locked()
            pending = self._pending
            pending.append(entry)
            self._pending_bytes += len(value or b"") + len(key or b"") + 16
            full = len(pending) >= self.batch_records or self._pending_bytes >= self.batch_bytes
            if not full and not self._linger_armed:
                self._linger_armed = True
                self._thread.soon(self._arm_linger)
        finally:
            self._mutex.release()
        if full:
            self._send_pending()

    def send_values(self, values: Iterable[bytes | None], *, headers: Headers = (),
                    timestamp: int | None = None, time: int | None = None,
                    allow_none: bool = True) -> None:
        """Many keyless records sharing headers, timestamp and time: what `send` does for each,
        encoded a run at a time (`RunBatch`), several times cheaper than record by record.
        The values are copied before this returns. TypeError (and nothing sent) for a value
        that is not bytes-like, or None when not `allow_none`."""
        if self._closed:
            raise UserError("the producer is closed")
        if time is not None and time < self.core.frontier:
            raise UserError(f"record time {time} is below this producer's frontier "
                            f"{self.core.frontier}")
        stamp = now_ms() if timestamp is None else timestamp
        if time is not None:
            headers = with_time(headers, time)
        tail = sum(len(n) + len(v or b"") + 2 for n, v in headers)
        values = values if isinstance(values, list) else list(values)
        done, total = 0, len(values)
        while done < total:
            with self._lock:
                if self._pending or self._runs.count >= self.batch_records:
                    self._enqueue_locked()  # records from `send` go first; a full batch goes
                runs = self._runs
                chunk = values[done:done + self.batch_records - runs.count]
                if done == 0 and len(chunk) < total:
                    _check_bytes_like(values, allow_none)  # all or nothing
                room = self.batch_bytes - runs.size
                if len(chunk) > 1 and (guess := _estimate(chunk, tail)) > room:
                    chunk = chunk[:max(1, room * len(chunk) // guess)]
                run = runs.encode(stamp, headers, chunk, allow_none=allow_none)
                if run.size > room and len(chunk) > 1:  # as many as fit, at least one
                    chunk = chunk[:max(1, room * len(chunk) // run.size)]
                    run = runs.encode(stamp, headers, chunk, allow_none=allow_none)
                runs.add(run)
                done += len(chunk)
                full = runs.count >= self.batch_records or runs.size >= self.batch_bytes
                if not full and not self._linger_armed:
                    self._linger_armed = True
                    self._thread.soon(self._arm_linger)
            if full:
                self._send_pending()

    def _send_pending(self) -> None:
        """Encode what is pending on this thread and queue it for the loop; blocks while the
        outbox is full (the broker's window is exhausted)."""
        with self._lock:
            self._wait_for_room_locked()
            self._raise_failure()
            if self._pending or self._runs.count:
                self._enqueue_locked()

    def _enqueue_locked(self) -> None:
        """What is pending becomes a batch in the outbox: the records from `send`, or the runs
        from `send_values` (never both: each kind flushes the other before it adds)."""
        if self._pending:
            entries, self._pending, self._pending_bytes = self._pending, [], 0
            self._put_locked(encode_batch(entries, **self.core.stamping(len(entries))), None)
        if self._runs.count:
            runs, self._runs = self._runs, RunBatch()
            self._put_locked(runs.build(**self.core.stamping(runs.count)), None)
        self._wake_sender_locked()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _arm_linger(self) -> None:
        self._thread.loop.call_later(self.linger, self._linger_fired)

    def _linger_fired(self) -> None:
        # On the loop thread: never wait here; the outbox may hold one batch more than usual.
        with self._lock:
            self._linger_armed = False
            if self._pending or self._runs.count:
                try:
                    self._enqueue_locked()
                except (TypeError, ValueError) as exc:  # bad records: the next call raises it
                    self._failure = exc
                    self._lock.notify_all()

    def _wake_sender_locked(self) -> None:
        """Have a sender take the outbox: woken once per idle spell, not once per batch."""
        if not self._sender_wanted:
            self._sender_wanted = True
            self._thread.soon(self._start_sender)

    def _start_sender(self) -> None:
        if self._sender is not None and not self._sender.done():
            return  # it takes what was added
        with self._mutex:
            group = self._next_group_locked(())
        # While a request can leave at once (the window open, a slot free), it leaves here,
        # in this callback: a task, and a turn of the loop to start it, only once one waits.
        try:
            while group is not None and self.core.can_send_now():
                self.core.send_now(group)
                with self._mutex:
                    group = self._next_group_locked(group)
        except BaseException as exc:
            self._sender_failed(exc)
            return
        if group is not None:
            self._sender = self._thread.loop.create_task(self._send_outbox(group))

    async def _send_outbox(self, group: list[tuple[Any, Claim | None]] | None) -> None:
        while group is not None:
            try:  # one request for the group (one MAC, one reply; one batch as send_batch)
                await self.core.send_batches(group)
            except BaseException as exc:
                self._sender_failed(exc)
                return
            with self._mutex:
                group = self._next_group_locked(group)

    def _next_group_locked(self, sent: Sequence[Any]) -> list[tuple[Any, Claim | None]] | None:
        """One lock round per request: the group sent last (`sent`) leaves the outbox, the
        next is taken; None when the outbox is empty (the sender goes idle: the next batch
        wakes it). Called under `_mutex` (the condition's own lock: `with self._lock` costs
        two calls more)."""
        if sent:
            for _ in sent:
                self._outbox_bytes -= len(self._outbox.popleft()[0])
            if self._blocked and self._outbox_low_locked():
                self._blocked = False  # once: until a caller blocks again
                self._lock.notify_all()
        if not self._outbox:
            # The task returns without awaiting: it is done before the loop runs the
            # `_start_sender` a later batch schedules.
            self._sender_wanted = False
            return None
        return self._group_locked()

    def _sender_failed(self, exc: BaseException) -> None:
        with self._lock:
            self._failure = exc
            self._outbox.clear()
            self._outbox_bytes = 0
            self._sender_wanted = False
            self._lock.notify_all()

    def _group_locked(self) -> list[tuple[Any, Claim | None]]:
        """The batches at the head of the outbox that go in one request: as many as wait, up
        to _GROUP_BATCHES and _GROUP_BYTES (at least the first)."""
        opened = self.link.opened
        room = min(opened.max_batch_bytes, _GROUP_BYTES) if opened is not None else 0
        group = [self._outbox[0]]
        size = len(group[0][0])
        if size >= room or len(self._outbox) == 1:
            return group  # a big batch goes alone, uncopied
        for item in itertools.islice(self._outbox, 1, _GROUP_BATCHES):
            size += len(item[0])
            if size > room:
                break
            group.append(item)
        return group

    def _outbox_full_locked(self) -> bool:
        """Whether a caller waits before adding a batch: two wait, and either _GROUP_BATCHES
        or _OUTBOX_BYTES (the producer's backpressure; under it the small batches that pile
        up while the window or the in-flight limit holds them go as one request)."""
        return len(self._outbox) >= 2 and (len(self._outbox) >= _GROUP_BATCHES
                                           or self._outbox_bytes >= _OUTBOX_BYTES)

    def _wait_for_room_locked(self) -> None:
        """Block while the outbox is full (the broker's window is exhausted, the backpressure)
        until the loop has taken half of it, or a batch failed."""
        while self._outbox_full_locked() and self._failure is None:
            self._blocked = True
            self._lock.wait(0.5)

    def _outbox_low_locked(self) -> bool:
        """Whether callers waiting on a full outbox are woken: it is half empty."""
        return len(self._outbox) <= 1 or (len(self._outbox) <= _GROUP_BATCHES // 2
                                          and self._outbox_bytes <= _OUTBOX_BYTES // 2)

    def _put_locked(self, batch: Any, claim: Claim | None) -> None:
        self._outbox.append((batch, claim))
        self._outbox_bytes += len(batch)

    async def _drained(self) -> None:
        while self._sender is not None and not self._sender.done():
            await asyncio.shield(self._sender)

    def send_batch(self, batch: bytes) -> None:
        """Send an already encoded RecordBatch (after the records pending before it)."""
        with self._lock:
            self._wait_for_room_locked()
            self._raise_failure()
            if self._pending or self._runs.count:
                self._enqueue_locked()
            # Numbered here, in outbox order (sequences follow the order batches are sent);
            # stamped (a CRC pass) on the loop thread, off this lock.
            self._put_locked(batch, self.core.claim_for(batch))
            self._wake_sender_locked()

    def advance(self, frontier: int) -> None:
        """No more records with time < `frontier` from this producer."""
        self._send_pending()
        self._thread.call(self._after_outbox(self.core.advance, frontier))

    async def _after_outbox(self, fn: Any, *args: Any) -> Any:
        await self._drained()
        with self._lock:
            self._raise_failure()
        return await fn(*args)

    def flush(self) -> None:
        """Send what is pending and wait until everything is acknowledged."""
        self._send_pending()
        self._thread.call(self._after_outbox(self.core.flush))

    def close(self, *, end: bool = True) -> None:
        """Flush, end the stream (unless `end` is False), close the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._send_pending()
            self._thread.call(self._after_outbox(self.core.end if end else self.core.flush))
        finally:
            try:
                self._thread.call(self.link.close(clean=True), timeout=self.timeout)
            finally:
                self._thread.close()


class Subscriber:
    """Events from partitions of a topic on one broker: `Data`, `Progress`, `EndOfStream`.

        with Subscriber(address, "events", secret=key, start="earliest") as sub:
            for event in sub:          # stops after EndOfStream (or at the end, follow=False)
                ...
            sub.positions              # {partition: next offset}, to resume later

    With `values=True` it yields `Values(time, values, partition, next_offset)` instead of
    Data: record values only, cut out of tq-shaped batches without decoding each record.

    Resumes by itself when the broker loses the subscription (restart, expiry): from the
    offset after the last batch received, so no gap and no duplicate. While the broker is
    away it keeps trying (following `locate` to a new address); after `reconnect_timeout`
    seconds it gives up and `next_event` raises BrokerUnavailableError.
    """

    def __init__(self, address: str, topic: str, partitions: int | list[int] | None = None, *,
                 secret: bytes | Credential, start: StartAt | dict[int, StartAt] = "earliest",
                 credit: int = 1024 * 1024, follow: bool = True, lease: float = 10.0,
                 timeout: float = 30.0, create: bool = False, values: bool = False,
                 incarnation: Incarnation | None = None,
                 locate: Callable[[], str | None] | None = None,
                 reconnect_timeout: float = RECONNECT_TIMEOUT,
                 watch_leader: WatchLeader | None = None) -> None:
        if isinstance(partitions, int):
            partitions = [partitions]
        if credit <= 0:
            raise UserError("credit must be a positive number of bytes")
        self._queue: queue.SimpleQueue[Chunk | TqError] = queue.SimpleQueue()
        self._thread = LoopThread(f"tq-subscriber {topic}", owner="a Subscriber")
        self._closed = False
        self._finished = False
        self._pending: list[tuple[Event | Values | None, int, int]] = []
        link_options: dict[str, Any] = {"lease": lease, "timeout": timeout,
                                        "locate": _async_locate(locate),
                                        "reconnect_timeout": reconnect_timeout,
                                        "watch_leader": watch_leader}
        try:
            self.link, self.core = self._thread.call(self._open(
                address, secret, topic, partitions, start, credit, link_options, create,
                incarnation))
        except BaseException:
            self._thread.close()
            raise
        self.decoder = ChunkDecoder(self.core, follow=follow, values=values)
        self.decoder.start()

    async def _open(self, address: str, secret: bytes | Credential, topic: str,
                    partitions: list[int] | None, start: StartAt | dict[int, StartAt],
                    credit: int, link_options: dict[str, Any], create: bool,
                    incarnation: Incarnation | None) -> tuple[BrokerLink, SubscriberCore]:
        link = BrokerLink(address, secret, **link_options)
        await link.start()
        core = SubscriberCore(link, topic, partitions, start, credit=credit,
                              sink=self._queue.put, create=create, incarnation=incarnation)
        try:
            await core.open()
        except BaseException:
            await link.close()
            raise
        return link, core

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def next_chunk(self, timeout: float | None = None) -> Chunk | None:
        """The next delivered chunk of raw batches (for tools that want bytes, not events);
        the caller must hand it to `consumed` once processed. None after `timeout`."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, TqError):
            raise item
        return item

    def consumed(self, chunk: Chunk) -> None:
        """Mark a chunk processed: credit returns to the broker, positions move on."""
        self.decoder.positions[chunk.partition] = chunk.next_offset
        self._return_credit(chunk)

    def _return_credit(self, chunk: Chunk) -> None:
        # Counted on this thread; the loop is woken only when a grant may be due.
        if self.core.consumed_elsewhere(chunk.partition, len(chunk.data)):
            self._thread.soon(self.core.take_consumed)

    def next_event(self, timeout: float | None = None) -> Event | Values | None:
        """The next event; None after `timeout` seconds, or at the end of a non-follow read.

        A chunk's credit goes back as it is decoded, before its events are handed out: the
        broker counts a subscriber's lag from it (the console, `tq topic describe`), so a
        reader that took every record shows none, whether or not it asks again."""
        while True:
            while self._pending:
                event = self.decoder.take(self._pending.pop())
                if event is not None:
                    return event
            if self.decoder.done():
                return None
            chunk = self.next_chunk(timeout)
            if chunk is None:
                return None
            items = list(self.decoder.decode(chunk))
            self._return_credit(chunk)
            items.reverse()
            self._pending = items

    def __iter__(self) -> Iterator[Event | Values]:
        while not self._finished:
            event = self.next_event()
            if event is None:
                return
            self._finished = isinstance(event, EndOfStream)
            yield event

    def close(self) -> None:
        """Unsubscribe, close the session, stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.call(self._close(), timeout=30.0)
        finally:
            self._thread.close()

    async def _close(self) -> None:
        try:
            await self.core.close()
        finally:
            await self.link.close()
