"""The asyncio client shell: a DEALER socket, a frame pump, one timer for all deadlines.

    async with RpcClient("tcp://127.0.0.1:7400", secret) as client:
        reply = await client.request(Produce(...), payload=[batch], timeout=5)
        await client.notify(Credit(...))
        note = await client.notifications.get()         # or client.on_notify(Delivery, cb)

Any number of requests may be in flight (up to `Limits.max_in_flight`; more callers wait for a
slot); replies are matched to their request by id, in whatever order they arrive. Request
tracking and deadlines are the sans-I/O `RequestTracker` behind one loop timer; this module
only moves frames, resolves futures and counts what it drops (replies nobody waits for, bad
messages).

Requests without payload issued in one loop turn travel together: each is encoded when it is
issued (so a request over the limits fails its caller alone) and queued, and at the end of
the turn the queue goes out as one BATCH message (`_flush`; more past `Limits.max_batch`
and `max_batch_bytes`, a lone request as a plain message). The server answers those ready
together in one message too. Anything else sent (a request with payload, a notify) sends the
queue first, so requests reach the server in the order they were issued; while zmq's queue
to the server is full, what is sent waits in `_backlog`, in order, and calls run out at their
deadlines.

It connects with the PLAIN credential of its principal for the server's audience (DESIGN §2
"Handshake") and watches how each connection's handshake ends: a server that refuses the
credential fails every call in flight, and every call until a handshake succeeds, with
SecretRejectedError at once. zmq gives up a connection whose handshake failed, so the client
connects again itself, backing off, in case the server learns the credential later.
Use it from one event loop; `BlockingClient` wraps it for threads and plain scripts.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

import zmq

from catalog.errors import TqError

from ._codec import MAX_TTL, Buffer, Codec, Incoming, Limits
from ._credentials import COORDINATOR, Credential, handshake_token
from ._curve import client_keypair, server_key_of
from ._errors import (
    AddressError,
    ClientClosedError,
    ConnectionLostError,
    DeadlineExceededError,
    RpcError,
    RpcProtocolError,
    SecretRejectedError,
    UnexpectedReplyError,
    error_from_body,
)
from ._messages import Entry, ErrorBody, Kind, Notify, Reply, Request
from ._shell import (
    DISCONNECTED,
    HANDSHAKE_FAILED_AUTH,
    HANDSHAKE_SUCCEEDED,
    ConnectionWatch,
    DeadlineTimer,
    DropCounters,
    FramePump,
    log,
    new_socket,
)

__all__ = ["COPY_BELOW", "Notification", "RpcClient"]

R = TypeVar("R", bound=Reply)

NotifyCallback = Callable[["Notification"], object]
# `on_answer(reply, error)` of `RpcClient.send_request`: exactly one of them is None.
AnswerCallback = Callable[[Any, BaseException | None], None]

# Seconds before connecting again after a failed handshake, doubling while it keeps failing.
_RECONNECT_MIN, _RECONNECT_MAX = 0.1, 5.0

# Payload frames below this size are copied into zmq, not lent to it. Lending (pyzmq's
# zero-copy) costs more than copying a batch of up to about a megabyte: a Frame and a
# registration with pyzmq's garbage-collector thread (two getpid calls) on our thread, and,
# once zmq has sent it, a message from zmq's I/O thread to that collector thread, which wakes
# to drop the reference (~10 us and a thread wake per frame; copying 100 KB takes ~2 us).
# Copying also frees the caller's buffer at once: nothing waits for the collector.
COPY_BELOW = 1024 * 1024


class Notification:
    """A notify the server pushed: the message and its payload frames (zero-copy views)."""

    __slots__ = ("message", "payload")

    def __init__(self, message: Notify, payload: list[Buffer]) -> None:
        self.message = message
        self.payload = payload

    def __repr__(self) -> str:
        return f"Notification({self.message!r}, {len(self.payload)} payload frames)"


class _Slots:
    """Requests that may be in flight at once: a semaphore whose slot can also be taken
    without awaiting (`try_take`), by a caller that then sends at once; waiters are served
    first come first served (a slot freed goes to the oldest waiter)."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        if self._free <= 0 or self._waiters:
            return False
        self._free -= 1
        return True

    async def take(self) -> None:
        if self.try_take():
            return
        waiter = self.join()
        try:
            await waiter  # the slot is ours once it resolves (release hands it over)
        except BaseException:
            self.give_up(waiter)
            raise

    def join(self) -> asyncio.Future[None]:
        """Take a place in the queue now; the slot is the caller's once the future resolves
        (it awaits it, or gives it up with `give_up`)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def give_up(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self.release()  # handed to us as we gave up: pass it on
        elif waiter in self._waiters:
            self._waiters.remove(waiter)

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # handed over: _free stays as it is
                return
        self._free += 1


class _Call:
    """A request sent by `send_request`, as its tracker entry: the reply (or the failure)
    reaches its caller's callback as it arrives, in the receive loop, with no task and no
    future between (each would be a loop hop per request)."""

    __slots__ = ("client", "on_answer", "request_id", "request_type", "timeout", "_done")

    def __init__(self, client: RpcClient, request_id: int, request_type: type[Request[Any]],
                 timeout: float, on_answer: AnswerCallback) -> None:
        self.client = client
        self.request_id = request_id
        self.request_type = request_type
        self.timeout = timeout
        self.on_answer = on_answer
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, incoming: Incoming | None) -> None:
        if self._done:
            return
        try:
            reply = self.client._reply_of(self.request_type, incoming, self.timeout)
        except TqError as exc:  # the server's error, no reply in time, or an unexpected one
            self._finish(None, exc)
        else:
            self._finish(reply, None)

    def set_exception(self, exc: BaseException) -> None:
        if not self._done:
            self._finish(None, exc)

    def _finish(self, reply: Any, error: BaseException | None) -> None:
        self._done = True
        client = self.client
        if client._pending is not None:
            client._pending.forget(self.request_id)
        client._slots.release()
        try:
            self.on_answer(reply, error)
        except Exception:  # the caller's bug; the client must outlive it
            client._drops["answer_callback_error"] += 1
            log.exception("rpc client %s: answer callback for %s failed", client.address,
                          self.request_type.__name__)


class RpcClient:
    """Requests to and notifies from one server, over one DEALER socket."""

    def __init__(self, address: str, secret: bytes | Credential, *,
                 limits: Limits | None = None, timeout: float = 30.0,
                 context: zmq.Context[Any] | None = None, audience: str = COORDINATOR,
                 server_key: str | bytes | None = None) -> None:
        """`secret` is our credential (a bare cluster secret: the admin's); `audience` the
        kind of server we talk to (COORDINATOR, or BROKER: DESIGN §12). `server_key`: the
        server's CURVE public key (Z85): given, or remembered for `address`
        (`remember_server_key`), the link is CURVE (encrypted), else PLAIN."""
        self.address = address
        self.limits = limits = limits or Limits()
        self.timeout = _check_timeout(timeout)
        own = Credential.of(secret).for_audience(audience)
        self.principal = own.principal
        self._codec = Codec(own, role="client", limits=limits)
        self._token = handshake_token(own.key)
        self._own_key = own.key
        self.server_key = (server_key.encode() if isinstance(server_key, str)
                           else server_key) or server_key_of(address)
        self._context = context
        self._pending: DeadlineTimer[asyncio.Future[Incoming | None] | _Call] | None = None
        self._slots = _Slots(limits.max_in_flight)
        self._callbacks: dict[type[Notify], NotifyCallback] = {}
        self._on_lost: list[Callable[[], object]] = []
        self._queue: asyncio.Queue[Notification] = asyncio.Queue(limits.notify_queue)
        self._drops = DropCounters()
        # Why the server refuses our credential, from its last refusal until a handshake
        # succeeds: calls fail with SecretRejectedError at once meanwhile.
        self._refusal: str | None = None
        self._reconnect_delay = _RECONNECT_MIN
        self._reconnect: asyncio.TimerHandle | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump: FramePump | None = None
        self._watch: ConnectionWatch | None = None
        # A connection whose handshake succeeded carries our requests now (DESIGN §2
        # "Lost connections"): its drop fails them (`_lost`).
        self._up = False
        # Requests (their entries) issued this loop turn, sent together at its end.
        self._outbox: list[Entry] = []
        self._flush_scheduled = False
        # Messages zmq had no room for, oldest first, each with the requests it carries;
        # `_drain_backlog` sends them as room comes.
        self._backlog: deque[tuple[list[Buffer], list[int]]] = deque()
        self._backlog_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def session(self) -> bytes:
        """This client's session id (the server sees it as `ctx.session`)."""
        return self._codec.session

    @property
    def counters(self) -> dict[str, int]:
        """Messages dropped so far, by reason."""
        return self._drops.snapshot()

    @property
    def connected(self) -> bool:
        """Whether a connection to the server is up: its handshake succeeded and, as far as
        this client has heard, it has not dropped since."""
        return self._up

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered, failed or expired."""
        return len(self._pending) if self._pending is not None else 0

    @property
    def notifications(self) -> asyncio.Queue[Notification]:
        """Notifies of types without a callback, oldest first.

        Bounded by `Limits.notify_queue`; when full, new ones are dropped and counted
        ("notify_overflow"), so grant the server no more credit than the queue holds.
        """
        return self._queue

    def on_notify(self, message_type: type[Notify], callback: NotifyCallback) -> None:
        """Call `callback(notification)` in the receive loop for each notify of that type.

        It must be a plain, quick function (it holds up every reply behind it); hand long
        work to a task or a queue.
        """
        if not (isinstance(message_type, type) and issubclass(message_type, Notify)):
            raise TypeError(f"{message_type!r} is not a Notify class")
        if inspect.iscoroutinefunction(callback):
            raise TypeError("the notify callback must be a plain function, not async")
        self._callbacks[message_type] = callback

    def on_lost(self, callback: Callable[[], object]) -> None:
        """Call `callback()` in the receive loop each time the connection drops (after the
        calls it carried have failed): a holder of a session may reopen it at once, before
        any call of its own fails. Plain and quick, as a notify callback."""
        self._on_lost.append(callback)

    async def connect(self) -> RpcClient:
        """Create the socket and start receiving. zmq connects (and reconnects) by itself."""
        if self._sock is not None or self._closed:
            raise RuntimeError("an RpcClient connects once")
        self._loop = asyncio.get_running_loop()
        self._open()
        self._pending = DeadlineTimer(self._loop, self.limits.max_in_flight, _expire)
        return self

    def _open(self) -> None:
        """The socket to the server, with its monitor and its pump: at `connect`, and in place
        of one whose connection dropped (`_replace`)."""
        assert self._loop is not None
        sock = new_socket(zmq.DEALER, self.limits, self._context)
        sock.copy_threshold = COPY_BELOW  # see COPY_BELOW: lending costs more than copying
        if self.server_key is not None:
            public, secret_key = client_keypair(self._own_key)
            try:
                sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_key)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise AddressError(f"{self.server_key!r} is not a CURVE public key (40 "
                                   f"characters of Z85) for {self.address}") from exc
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret_key)
        else:
            sock.setsockopt(zmq.PLAIN_USERNAME, self.principal.encode())
            sock.setsockopt(zmq.PLAIN_PASSWORD, self._token)
        watch = ConnectionWatch(sock, self._loop, self._on_connection)
        try:
            sock.connect(self.address)
        except zmq.ZMQError as exc:
            watch.close()
            sock.close(linger=0)
            raise AddressError(f"cannot connect to {self.address}: {exc}") from exc
        self._sock = sock
        self._watch = watch
        self._pump = FramePump(sock, self._loop, small_frames=1, limits=self.limits,
                               on_message=self._on_message, on_drop=self._on_drop)

    def _replace(self) -> None:
        """Close the socket whose connection dropped and open another. zmq would keep what it
        still holds for the dropped connection (requests not yet written to it) and send it
        on the next one: closed with no linger, the socket discards it. (ZMQ_IMMEDIATE would
        discard it too, but also the replies that came with the drop, unread.)"""
        assert self._watch is not None and self._pump is not None and self._sock is not None
        self._watch.close()
        self._pump.close()
        self._sock.close(linger=0)
        self._open()

    async def close(self) -> None:
        """Fail calls in flight with ClientClosedError, stop receiving, close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for _, future in self._pending.close() if self._pending is not None else ():
            if not future.done():
                future.set_exception(ClientClosedError(f"client of {self.address} closed"))
        if self._reconnect is not None:
            self._reconnect.cancel()
        self._outbox.clear()
        self._backlog.clear()
        if self._backlog_task is not None:
            self._backlog_task.cancel()
        if self._pump is not None:
            self._pump.close()
        if self._watch is not None:
            self._watch.close()
        if self._sock is not None:
            self._sock.close(linger=0)

    async def __aenter__(self) -> RpcClient:
        if self._sock is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def request(self, request: Request[R], *, payload: Iterable[Buffer] = (),
                      timeout: float | None = None) -> R:
        """Send `request`, wait for its reply; raise the remote error or DeadlineExceeded."""
        reply, _ = await self.exchange(request, payload=payload, timeout=timeout)
        return reply

    async def exchange(self, request: Request[R], *, payload: Iterable[Buffer] = (),
                       timeout: float | None = None) -> tuple[R, list[Buffer]]:
        """Like `request`, also returning the reply's payload frames."""
        request_type = type(request)
        if not isinstance(request, Request):
            raise TypeError(f"{request_type.__name__} is not a Request")
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        pump, loop = self._require_open()
        if self._refusal is not None:
            raise SecretRejectedError(self._refusal)
        deadline = loop.time() + timeout
        if not self._slots.try_take():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.take()
            except TimeoutError:
                raise self._expired(type(request), timeout) from None
        if self._closed:  # closed while we waited for a slot
            self._slots.release()
            raise ClientClosedError(f"client of {self.address} is closed")
        pending = self._pending
        assert pending is not None
        request_id = pending.next_id()
        payload = payload if isinstance(payload, (list, tuple)) else list(payload)
        try:
            future: asyncio.Future[Incoming | None] = loop.create_future()
            pending.track(request_id, deadline, future)
            if payload:
                frames = self._codec.request(request_id, request, ttl=deadline - loop.time(),
                                             now=time.time(), payload=payload)
                if self._outbox:
                    self._flush()  # requests issued before this message go out before it
                self._send_now(frames, [request_id])  # or held in order while zmq has no room
            else:
                self._queue_request(self._codec.request_entry(request_id, request,
                                                              ttl=deadline - loop.time()))
            incoming = await future
        finally:
            pending.forget(request_id)
            self._slots.release()
        reply = self._reply_of(request_type, incoming, timeout)
        assert incoming is not None  # None raised DeadlineExceededError
        return reply, incoming.payload

    def _reply_of(self, request_type: type[Request[R]], incoming: Incoming | None,
                  timeout: float) -> R:
        """The reply `incoming` carries; raises the server's error, DeadlineExceededError
        (None: no reply in time) or UnexpectedReplyError."""
        if incoming is None:
            raise self._expired(request_type, timeout)
        body = incoming.body
        if incoming.header.kind == Kind.ERROR:
            raise error_from_body(cast(ErrorBody, body), request_type.error_type)
        if not isinstance(body, request_type.reply_type):
            raise UnexpectedReplyError(f"{request_type.__name__} answered with "
                                       f"{type(body).__name__}")
        return cast(R, body)  # a reply_type, checked above

    def send_request(self, request: Request[Any], on_answer: AnswerCallback, *,
                     payload: Sequence[Buffer] = (), timeout: float | None = None) -> None:
        """`request` as `request` sends it, without a coroutine: `on_answer(reply, None)` or
        `on_answer(None, error)` is called once, with what `request` would return or raise,
        from the receive loop (or from here, when it fails at once). Sent before this returns
        when a slot is free (else a task waits for one), in the order of calls: what a
        producer sending a batch per reply uses, so a request costs no task and no future.
        `on_answer` must be quick and must not block (it holds up the replies behind it)."""
        if self._closed:  # as `request` raises it, to the callback
            on_answer(None, ClientClosedError(f"client of {self.address} is closed"))
            return
        _, loop = self._require_open()
        if self._refusal is not None:
            on_answer(None, SecretRejectedError(self._refusal))
            return
        if not isinstance(request, Request):
            raise TypeError(f"{type(request).__name__} is not a Request")
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        if self._slots.try_take():
            self._issue(request, on_answer, payload, timeout)
        else:  # in the queue now: a call made after this one, even in this turn, goes after
            loop.create_task(self._request_later(self._slots.join(), request, on_answer,
                                                 payload, timeout, loop.time() + timeout))

    def _issue(self, request: Request[Any], on_answer: AnswerCallback,
               payload: Sequence[Buffer], timeout: float) -> None:
        """`send_request`, its slot taken."""
        loop = self._loop
        assert loop is not None
        pending = self._pending
        assert pending is not None
        request_id = pending.next_id()
        call = _Call(self, request_id, type(request), timeout, on_answer)
        deadline = loop.time() + timeout
        pending.track(request_id, deadline, call)
        try:
            if payload:
                frames = self._codec.request(request_id, request, ttl=timeout,
                                             now=time.time(), payload=payload)
            else:
                frames = None
                self._queue_request(self._codec.request_entry(request_id, request, ttl=timeout))
        except Exception as exc:  # over the limits: this call fails alone, as `request`'s
            call.set_exception(exc)
            return
        if frames is not None:
            if self._outbox:
                self._flush()  # requests issued before this message go out before it
            self._send_now(frames, [request_id])  # or held in order while zmq has no room

    async def _request_later(self, waiter: asyncio.Future[None], request: Request[Any],
                             on_answer: AnswerCallback, payload: Sequence[Buffer],
                             timeout: float, deadline: float) -> None:
        """`send_request` once `waiter` hands it a slot (all of them were taken)."""
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except TimeoutError:
            self._slots.give_up(waiter)
            on_answer(None, self._expired(type(request), timeout))
            return
        except BaseException:
            self._slots.give_up(waiter)
            raise
        left = deadline - asyncio.get_running_loop().time()
        failure: BaseException | None = None
        if self._closed:  # while it waited
            failure = ClientClosedError(f"client of {self.address} is closed")
        elif self._refusal is not None:
            failure = SecretRejectedError(self._refusal)
        elif left <= 0:
            failure = self._expired(type(request), timeout)
        if failure is not None:
            self._slots.release()
            on_answer(None, failure)
        else:
            self._issue(request, on_answer, payload, left)

    async def notify(self, message: Notify, payload: Iterable[Buffer] = ()) -> None:
        """Send a one-way message (a credit grant, a heartbeat). Waits only if queues are full."""
        pump, loop = self._require_open()
        if self._refusal is not None:
            raise SecretRejectedError(self._refusal)
        frames = self._codec.notify(message, now=time.time(), payload=payload)
        await self._send(pump, frames, loop.time() + self.timeout)

    # -- internals -------------------------------------------------------------------------

    def _require_open(self) -> tuple[FramePump, asyncio.AbstractEventLoop]:
        if self._closed:
            raise ClientClosedError(f"client of {self.address} is closed")
        if self._pump is None or self._loop is None:
            raise RuntimeError("call connect() (or use `async with`) first")
        return self._pump, self._loop

    def _expired(self, request_type: type[Request[Any]], timeout: float
                 ) -> DeadlineExceededError:
        return DeadlineExceededError(f"{request_type.rpc_tag} to {self.address}: no reply "
                                     f"within {timeout:g}s")

    def _queue_request(self, entry: Entry) -> None:
        """Send a request's entry at the end of this loop turn, with the others issued in it."""
        self._outbox.append(entry)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send the requests queued: one BATCH message (more past the batch bounds)."""
        self._flush_scheduled = False
        entries, self._outbox = self._outbox, []
        if self._closed or not entries:
            return
        now = time.time()
        for run, frames in self._codec.messages(entries, now=now):
            self._send_now(frames, [entry.id for entry in run])

    def _send_now(self, frames: list[Buffer], ids: Sequence[int]) -> None:
        """Send or, while zmq has no room (or older messages wait for it), hold in order."""
        assert self._pump is not None
        if not self._backlog:
            try:
                self._pump.send(frames)
                return
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                self._fail(ids, RpcError(f"send to {self.address} failed: {exc}"))
                return
        self._backlog.append((frames, list(ids)))
        if self._backlog_task is None:
            assert self._loop is not None
            self._backlog_task = self._loop.create_task(self._drain_backlog())

    async def _drain_backlog(self) -> None:
        """Send the held messages in order as zmq makes room (their calls' deadlines bound
        how long their callers wait)."""
        pump = self._pump
        assert pump is not None
        try:
            while self._backlog:
                frames, ids = self._backlog[0]
                try:
                    await pump.send_wait(frames)
                except zmq.ZMQError as exc:
                    self._fail(ids, RpcError(f"send to {self.address} failed: {exc}"))
                self._backlog.popleft()
        finally:
            if self._backlog_task is asyncio.current_task():  # not replaced by `_lost`
                self._backlog_task = None

    def _fail(self, ids: Iterable[int], exc: Exception) -> None:
        assert self._pending is not None
        for request_id in ids:
            future = self._pending.forget(request_id)
            if future is not None and not future.done():
                future.set_exception(exc)

    async def _send(self, pump: FramePump, frames: list[Buffer], deadline: float) -> None:
        """Send a notify, waiting (until `deadline`) while zmq has no room for it."""
        if self._outbox:
            self._flush()  # requests issued before this message go out before it
        if self._backlog:
            self._send_now(frames, [])  # behind the messages waiting for room
            return
        try:
            pump.send(frames)
            return
        except zmq.Again:
            pass
        except zmq.ZMQError as exc:
            raise RpcError(f"send to {self.address} failed: {exc}") from exc
        # The queue to the server is full (it is slow, or not there yet): wait for room.
        try:
            async with asyncio.timeout_at(deadline):
                await pump.send_wait(frames)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if pump is self._pump or self._closed or (current and current.cancelling()):
                raise
            return  # its socket was replaced (the connection dropped): it was for that one
        except TimeoutError:
            raise DeadlineExceededError(f"send to {self.address} blocked until the deadline "
                                        "(queue full)") from None
        except zmq.ZMQError as exc:
            raise RpcError(f"send to {self.address} failed: {exc}") from exc

    def _on_drop(self, reason: str) -> None:
        self._drops[reason] += 1

    def _on_message(self, parts: list[Any]) -> None:
        try:
            self._dispatch(parts)
        except Exception:  # a bug in this module; the client must outlive it
            self._drops["internal_error"] += 1
            log.exception("rpc client %s: bug while handling a message", self.address)

    def _dispatch(self, parts: list[Any]) -> None:
        try:
            messages = self._codec.decode_all(parts, time.time())
        except RpcProtocolError as exc:
            self._drops[exc.reason] += 1
            return
        pending = self._pending
        assert pending is not None  # set by start(), before any message
        for incoming in messages:
            if isinstance(incoming, RpcProtocolError):  # one bad reply of a batch
                self._drops[incoming.reason] += 1
                header = incoming.header
                if header is not None:
                    self._fail([header.id], incoming)
                continue
            if incoming.header.kind == Kind.NOTIFY:
                self._deliver(Notification(cast(Notify, incoming.body), incoming.payload))
                continue
            future = pending.forget(incoming.header.id)
            if future is None:
                self._drops["unknown_reply"] += 1  # late (its deadline passed) or never asked
            elif not future.done():
                future.set_result(incoming)  # a _Call answers its caller here and now

    def _on_connection(self, event: int, value: int) -> None:
        """How a connection's handshake ended, or that it dropped (ConnectionWatch)."""
        if event == HANDSHAKE_SUCCEEDED:
            self._refusal = None
            self._reconnect_delay = _RECONNECT_MIN
            self._up = True
            return
        if event == DISCONNECTED:
            if self._up:  # else it never carried a request: what waits, waits for the next
                self._up = False
                assert self._pump is not None
                self._pump.drain_now()  # the replies that came before it answer their calls
                self._replace()
                self._lost()
            return
        # zmq gave the connection up for good (it reconnects only after network errors).
        if event == HANDSHAKE_FAILED_AUTH and value == 400:
            self._drops["refused"] += 1
            self._refusal = (
                f"the server at {self.address} refused our signature key for "
                f"{self.principal}: it holds another cluster secret, or does not know "
                f"{self.principal} (removed, rotated or never added); use the secret file "
                f"or credential it issued")
            refused, why = True, self._refusal
        else:
            self._drops["handshake_failed"] += 1
            refused, why = False, (f"handshake with {self.address} failed (zmq event "
                                   f"{event}, {value}): is it a tq server of this version?")
            log.warning("rpc client %s: %s", self.address, why)
        assert self._pending is not None
        for future in self._pending.entries():  # each caller forgets its own
            if not future.done():
                future.set_exception(SecretRejectedError(why) if refused else RpcError(why))
        if self._reconnect is None and self._loop is not None:
            self._reconnect = self._loop.call_later(self._reconnect_delay, self._connect_again)
            self._reconnect_delay = min(self._reconnect_delay * 2, _RECONNECT_MAX)

    def _lost(self) -> None:
        """The connection carrying our requests dropped: the server's process died or closed
        it. Its replies are taken in and its socket replaced (`_replace`, discarding what
        zmq still held for it), so every request issued until now and unanswered fails at
        once, rather than at its deadline, with ConnectionLostError (outcome unknown, as at
        a deadline); those not yet handed to zmq are discarded too, so none reaches the next
        server behind its caller's back. Requests issued from here on go to the new socket."""
        assert self._pending is not None
        calls = self._pending.entries()
        self._outbox.clear()
        self._backlog.clear()  # notifies too: they were for the server that is gone
        if self._backlog_task is not None:
            self._backlog_task.cancel()
            self._backlog_task = None
        why = (f"the connection to {self.address} dropped before the reply came (the server "
               "stopped, or closed it): the outcome is unknown")
        for call in calls:  # a callback may issue requests: they go to the next connection
            if not call.done():
                call.set_exception(ConnectionLostError(why))
        for callback in list(self._on_lost):
            try:
                callback()
            except Exception:  # the holder's bug; the client must outlive it
                log.exception("rpc client %s: connection-lost callback failed", self.address)

    def _connect_again(self) -> None:
        self._reconnect = None
        if self._closed or self._sock is None:
            return
        try:
            self._sock.disconnect(self.address)
        except zmq.ZMQError:
            pass  # zmq forgot the endpoint already
        self._sock.connect(self.address)

    def _deliver(self, note: Notification) -> None:
        callback = self._callbacks.get(type(note.message))
        if callback is not None:
            try:
                callback(note)
            except Exception:
                # The callback is application code run by our loop: report, keep receiving.
                self._drops["notify_callback_error"] += 1
                log.exception("rpc client %s: notify callback for %s failed", self.address,
                              type(note.message).__name__)
            return
        try:
            self._queue.put_nowait(note)
        except asyncio.QueueFull:
            self._drops["notify_overflow"] += 1
            log.warning("rpc client %s: notify queue full, dropped a %s", self.address,
                        type(note.message).__name__)


def _expire(_request_id: int, future: asyncio.Future[Incoming | None] | _Call) -> None:
    if not future.done():
        future.set_result(None)  # the caller raises DeadlineExceededError, knowing the request


def _check_timeout(timeout: float) -> float:
    if not 0.0 < timeout <= MAX_TTL:
        raise ValueError(f"timeout must be in (0, {MAX_TTL:g}] seconds, not {timeout!r}")
    return float(timeout)
