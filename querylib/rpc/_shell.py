"""The I/O both asyncio shells share: whole zmq messages in and out of an event loop, one
timer for many deadlines, drop counters, and how a socket's handshakes ended.

Why not zmq.asyncio: it wraps every send and receive in a Future and goes through pyzmq's
Python-level flag and option enums; on this project's 2-core machines it measured at about
half of this pump's throughput for small round trips, and the coordinator needs >= 20k/s.
`FramePump` registers the socket's ZMQ_FD with the loop (`add_reader`) and calls the Cython
socket methods with integer flags. ZMQ_FD is edge-triggered: after *any* operation on the
socket, messages may be waiting without the fd signalling again. So the pump drains until
EAGAIN when the fd fires, and after sends re-reads ZMQ_EVENTS (`kick`) once per loop
iteration, scheduling a drain when something is readable. Nothing else touches the socket.
A drain is bounded in messages and bytes, and has zmq take newly readable peers into its fair
queue as it goes; a `fair` pump (a server's ROUTER) serves its peers in turn by bytes (deficit
round robin over messages received ahead, bounded), so one peer's backlog cannot hold up
another's messages or the loop (DESIGN §5 "Fair service").

Receiving enforces the frame-count and size limits while reading, so an oversized message is
consumed and dropped part by part instead of accumulated (zmq has buffered each part by then:
ZMQ_MAXMSGSIZE, set from `Limits.max_message_bytes`, is what bounds a part before it is
buffered). The first `small_frames` parts (a ROUTER's identity frame, the envelope) are copied
into bytes when they are small (a part of unsigned garbage is not copied just to be dropped);
payload parts stay zmq-owned buffers (zero-copy memoryviews).

`ConnectionWatch` reads a socket's monitor (zmq's socket events) the same way, for the outcome
of each connection's handshake (DESIGN §2 "Handshake") and the end of each connection: a client
learns there that the server refused its credential, or that the connection carrying its
requests dropped, which zmq reports nowhere else.

This module moves frames and keeps time. It must not decode, sign or interpret messages.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, cast

import zmq
from zmq.backend import Socket as _RawSocket
from zmq.utils.monitor import parse_monitor_message

from ._codec import Limits
from ._tracker import RequestTracker

T = TypeVar("T")

log = logging.getLogger("querylib.rpc")

_send = _RawSocket.send
_recv = _RawSocket.recv
_get = cast("Callable[[Any, int], int]", _RawSocket.get)  # read here: int options only
_SNDMORE = int(zmq.SNDMORE)
_DONTWAIT = int(zmq.DONTWAIT)
_RCVMORE = int(zmq.RCVMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)

# Leading parts up to this size are copied into bytes; bigger ones stay zero-copy buffers.
_COPY_LIMIT = 64 * 1024

# Messages, and bytes, handled per loop callback before yielding, so handler tasks, timers,
# other sockets and disk reads run while a burst is drained: a burst of large messages (a
# bulk producer's 100 KB batches) ends after about a megabyte, not after 64 of them.
RECV_BURST = 64
RECV_BURST_BYTES = 1024 * 1024

# Bytes received between two reads of ZMQ_EVENTS inside a burst. Reading it has zmq process
# its commands, among them "this peer has a message now": only then does its fair queue take
# that peer in turn. Left alone, zmq does so every 100 frames while messages keep coming, so
# one peer arriving behind another's backlog of large messages would wait for ~16-50 of them
# (DESIGN §5 "Fair service"). A read costs a poll(2) (a few microseconds): once per this many
# bytes, not per message.
FAIR_QUEUE_BYTES = 128 * 1024

# A fair pump (a server's ROUTER) takes its peers in turn by bytes, not by messages (deficit
# round robin): each turn a peer with messages waiting may be served FAIR_QUANTUM bytes more,
# so a peer of small messages (a 1 KB probe batch, a heartbeat) is not served one message per
# 100 KB batch of a bulk peer. To see whose messages wait, it receives ahead of serving, at most
# FAIR_HOLD_BYTES over all peers (zmq's own queues stay bounded by the receive HWM).
FAIR_QUANTUM = 64 * 1024
FAIR_HOLD_BYTES = 8 * 1024 * 1024
# A message this small, of a peer with none waiting, is served as it is received (its turn
# would come first anyway): requests and small batches cost no queueing.
FAIR_SMALL = 4 * 1024


def new_socket(kind: int, limits: Limits, context: zmq.Context[Any] | None = None
               ) -> zmq.Socket[Any]:
    """A socket with the options every RPC socket gets: no linger, bounded frames and queues,
    and TCP keepalive, so a connection whose peer vanished is dropped (Limits.keepalive_*,
    unacked_timeout; zmq passes unacked_timeout to Linux as TCP_USER_TIMEOUT)."""
    sock = (context or zmq.Context.instance()).socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, limits.receive_bytes)
    sock.setsockopt(zmq.SNDHWM, limits.hwm)
    sock.setsockopt(zmq.RCVHWM, limits.hwm if limits.recv_hwm is None else limits.recv_hwm)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, max(1, limits.keepalive_idle))
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, max(1, limits.keepalive_interval))
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, max(1, limits.keepalive_count))
    sock.setsockopt(zmq.TCP_MAXRT, max(0, round(limits.unacked_timeout * 1000)))
    return sock


class DropCounters(Counter[str]):
    """Messages dropped or refused, by reason (the RpcProtocolError `reason`, or the shell's)."""

    def snapshot(self) -> dict[str, int]:
        return dict(self)


class DeadlineTimer(Generic[T]):
    """A RequestTracker driven by one loop timer, armed for the earliest deadline only.

    `on_expired(id, entry)` runs for each request whose deadline passes while tracked. One
    timer for all requests, rather than one per request: a request then costs a dict insert
    and a heap push, and the timer is re-armed only when a new deadline is the earliest.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int,
                 on_expired: Callable[[int, T], None]) -> None:
        self._loop = loop
        self._tracker: RequestTracker[T] = RequestTracker(capacity)
        self._on_expired = on_expired
        self._timer: asyncio.TimerHandle | None = None
        self._when = math.inf

    def __len__(self) -> int:
        return len(self._tracker)

    def next_id(self) -> int:
        return self._tracker.next_id()

    def track(self, request_id: int, deadline: float, entry: T) -> None:
        self._tracker.add(request_id, deadline, entry)
        if deadline < self._when:
            self._arm(deadline)

    def forget(self, request_id: int) -> T | None:
        return self._tracker.pop(request_id)

    def entries(self) -> list[T]:
        """Everything tracked now (still tracked afterwards)."""
        return self._tracker.entries()

    def close(self) -> list[tuple[int, T]]:
        """Stop the timer; everything still tracked, for the owner to fail."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._when = -math.inf  # never arm again
        return self._tracker.clear()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._fire)
        self._when = deadline

    def _fire(self) -> None:
        # The loop may run a timer up to its clock resolution early: count it as on time.
        now = max(self._loop.time(), self._when)
        self._timer = None
        self._when = math.inf
        for request_id, entry in self._tracker.expired(now):
            self._on_expired(request_id, entry)
        upcoming = self._tracker.next_deadline()
        if upcoming is not None:
            self._arm(upcoming)


class FramePump:
    """Feeds every message arriving on `sock` to `on_message(parts)`; sends without blocking.

    `on_drop(reason)` is called instead for messages over the limits. Both run inside a loop
    callback and must not block. `on_burst_end()` runs as a receive burst ends, before what
    `send_soon` held goes out (a server sends the replies its burst answered then, in the
    same loop turn). Use from the loop's thread only.
    """

    def __init__(self, sock: zmq.Socket[Any], loop: asyncio.AbstractEventLoop, *,
                 small_frames: int, limits: Limits,
                 on_message: Callable[[list[Any]], None],
                 on_drop: Callable[[str], None],
                 on_send_error: Callable[[zmq.ZMQError], None] | None = None,
                 on_burst_end: Callable[[], None] | None = None,
                 fair: bool = False) -> None:
        self._sock = sock
        self._loop = loop
        self._small = small_frames
        # Parts we accept: the codec's limit plus the ROUTER identity frame when there is one.
        self._max_parts = limits.max_frames + (small_frames - 1)
        self._max_bytes = limits.receive_bytes
        self._on_message = on_message
        self._on_drop = on_drop
        self._on_send_error = on_send_error
        self._on_burst_end = on_burst_end
        # Messages `send_soon` holds while a burst is handled (None: not in a burst).
        self._held: list[Sequence[Any]] | None = None
        self._scheduled = False
        self._kick_scheduled = False
        self._writers: deque[asyncio.Future[None]] = deque()
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self._received = 0  # bytes of the message `_receive` returned last
        self._since_events = 0  # bytes received since ZMQ_EVENTS was last read
        # Fair pumps (ROUTER: a message's first part is its peer): messages received and not
        # yet served, by peer, each with its size; the peers with some, in turn order; what
        # each may be served before its turn ends.
        self._fair = fair
        self._waiting: dict[bytes, deque[tuple[list[Any], int]]] = {}
        self._turns: deque[bytes] = deque()
        self._deficit: dict[bytes, int] = {}
        self.waiting_bytes = 0
        self._closed = False
        loop.add_reader(self._fd, self._drain)
        self.kick()

    def close(self) -> None:
        """Stop watching the socket (the owner closes it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._waiting.clear()  # received, never to be served
        self._turns.clear()
        self._deficit.clear()
        self.waiting_bytes = 0
        while self._writers:
            writer = self._writers.popleft()
            if not writer.done():
                writer.cancel()

    def send(self, frames: Sequence[Any]) -> None:
        """Queue a whole message or raise (zmq.Again when the peer's queue is full).

        Buffers of zmq.COPY_THRESHOLD bytes or more are handed to zmq without a copy: the
        caller must not mutate them afterwards. zmq queues the rest of a multipart message
        once its first part is accepted, so Again can only come from the first part.
        What `send_soon` holds goes out before: on a fair pump (a ROUTER, whose first part is
        the peer) only what it holds for the same peer, so a push to one peer does not wait
        for replies held for others (each peer's messages keep their order).
        """
        if self._held:
            self._flush(frames[0] if self._fair else None)
        sock = self._sock
        last = len(frames) - 1
        try:
            for i in range(last):
                _send(sock, frames[i], _SNDMORE | _DONTWAIT, False, False)
            _send(sock, frames[last], _DONTWAIT, False, False)
        finally:
            if self._held is None:  # a burst reads ZMQ_EVENTS once as it ends
                self._schedule_kick()

    @property
    def in_burst(self) -> bool:
        """Whether a receive burst is being handled (`send_soon` holds until it ends)."""
        return self._held is not None

    def send_soon(self, frames: Sequence[Any]) -> None:
        """Like `send`, for a message whose sender does not wait to hear how it went (a
        server's reply): inside `on_message` it is held until the burst being handled ends,
        so a burst's replies wake zmq's I/O thread once rather than once each (order is kept:
        a `send` first sends what is held for its peer). A failure goes to `on_send_error`."""
        held = self._held
        if held is not None:
            held.append(frames)
            return
        try:
            self.send(frames)
        except zmq.ZMQError as exc:
            self._send_failed(exc)

    def _flush(self, peer: Any = None) -> None:
        """Send what is held: all of it, or (`peer`) what is held for that peer."""
        held = self._held
        if not held:
            return
        if peer is None:
            self._held = []
        else:
            mine = [frames for frames in held if frames[0] == peer]
            if not mine:
                return
            self._held = [frames for frames in held if frames[0] != peer]
            held = mine
        for frames in held:
            try:
                self.send(frames)
            except zmq.ZMQError as exc:
                self._send_failed(exc)

    def _send_failed(self, exc: zmq.ZMQError) -> None:
        if self._on_send_error is None:
            raise RuntimeError("send_soon needs on_send_error") from exc
        self._on_send_error(exc)

    async def send_wait(self, frames: Sequence[Any]) -> None:
        """Like `send`, but wait (the caller bounds how long) while the queue is full."""
        while True:
            try:
                self.send(frames)
                return
            except zmq.Again:
                writer = self._loop.create_future()
                self._writers.append(writer)
                self.kick()
                await writer

    def _schedule_kick(self) -> None:
        # One ZMQ_EVENTS check per loop iteration, however many messages went out in it.
        if not self._kick_scheduled:
            self._kick_scheduled = True
            self._loop.call_soon(self._deferred_kick)

    def _deferred_kick(self) -> None:
        self._kick_scheduled = False
        self.kick()

    def kick(self) -> None:
        """Re-read ZMQ_EVENTS after an operation and act on it (the fd may stay quiet)."""
        if self._closed:
            return
        events = _get(self._sock, _EVENTS)
        if events & _POLLIN and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)
        if events & _POLLOUT and self._writers:
            while self._writers:
                writer = self._writers.popleft()
                if not writer.done():
                    writer.set_result(None)

    def drain_now(self) -> None:
        """Handle every message readable now before returning, burst after burst (a client
        whose connection dropped takes in the replies that came on it before it fails the
        calls still unanswered)."""
        while not self._closed and _get(self._sock, _EVENTS) & _POLLIN:
            self._drain()

    def _drain(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        self._held = []
        try:
            if self._fair:
                self._serve_fairly()
            else:
                self._serve_in_arrival_order()
        finally:
            try:
                if self._on_burst_end is not None and not self._closed:
                    self._on_burst_end()
            finally:
                self._flush()
                self._held = None
        if self._turns and not self._scheduled and not self._closed:
            self._scheduled = True  # messages wait for their turn: serve on after the others
            self._loop.call_soon(self._drain)
        # Drained to EAGAIN, or the burst is exhausted and messages may be left, and the
        # burst's sends done: re-read ZMQ_EVENTS now (a drain it finds due runs after the
        # callbacks already waiting; it also wakes writers waiting for room). In this turn,
        # not a later one: a lone request then costs the loop one turn, not three.
        self.kick()

    def _processed_commands(self, size: int) -> None:
        """Count `size` bytes received; every FAIR_QUEUE_BYTES, have zmq process its commands
        (peers that became readable join its fair queue)."""
        self._since_events += size
        if self._since_events >= FAIR_QUEUE_BYTES:
            self._since_events = 0
            _get(self._sock, _EVENTS)

    def _serve_in_arrival_order(self) -> None:
        burst = 0
        for _ in range(RECV_BURST):
            try:
                parts = self._receive()
            except zmq.Again:
                break
            if parts is None:
                continue
            size = self._received
            self._on_message(parts)
            burst += size
            if burst >= RECV_BURST_BYTES:
                break
            self._processed_commands(size)

    def _serve_fairly(self) -> None:
        """Receive ahead (bounded), then serve the peers with messages waiting in turn, each
        up to its deficit, until RECV_BURST messages or RECV_BURST_BYTES are served."""
        served = count = round_left = checked = 0
        # zmq said EAGAIN: it is asked again (ZMQ_EVENTS, cheaper than a raised EAGAIN) once
        # FAIR_QUEUE_BYTES more are served, or a message over FAIR_SMALL (a few microseconds
        # against the hundreds a large message costs its handler), so a peer arriving
        # meanwhile is served after the large message in hand, not after the next one.
        drained = large = False
        waiting, turns, deficit = self._waiting, self._turns, self._deficit
        while served < RECV_BURST_BYTES and count < RECV_BURST and not self._closed:
            if not round_left:  # a round begins: newcomers join its end
                if drained and (large or served - checked >= FAIR_QUEUE_BYTES):
                    checked, large = served, False
                    drained = not _get(self._sock, _EVENTS) & _POLLIN
                if not drained:
                    more_bytes, more, drained = self._receive_ahead(RECV_BURST - count)
                    served += more_bytes
                    count += more
                round_left = len(turns)
                if not round_left:
                    return
            round_left -= 1
            peer = turns.popleft()
            queue = waiting[peer]
            allowance = deficit[peer] + FAIR_QUANTUM
            while queue and queue[0][1] <= allowance and not self._closed:
                parts, size = queue.popleft()
                allowance -= size
                self.waiting_bytes -= size
                served += size
                count += 1
                large = large or size > FAIR_SMALL
                self._on_message(parts)
            if self._closed:
                self.waiting_bytes = 0  # close() forgot what waits
                return
            if queue:
                deficit[peer] = allowance
                turns.append(peer)
            else:
                del waiting[peer], deficit[peer]

    def _receive_ahead(self, limit: int) -> tuple[int, int, bool]:
        """Take what zmq has into the peers' queues, while they hold under FAIR_HOLD_BYTES,
        serving at once a small message of a peer with none waiting (at most `limit` of
        those); the bytes and the count of those served, and whether zmq had no more (an
        EAGAIN costs a raised exception, ~10 us: not one per round)."""
        served = count = 0
        while self.waiting_bytes < FAIR_HOLD_BYTES and count < limit and not self._closed:
            try:
                parts = self._receive()
            except zmq.Again:
                return served, count, True
            if parts is None:
                continue
            size = self._received
            peer = parts[0]
            queue = self._waiting.get(peer)
            if queue is None and size <= FAIR_SMALL:
                served += size
                count += 1
                self._on_message(parts)
                self._processed_commands(size)
                continue
            if queue is None:
                queue = self._waiting[peer] = deque()
                self._deficit[peer] = 0
                self._turns.append(peer)
            queue.append((parts, size))
            self.waiting_bytes += size
            self._processed_commands(size)
        return served, count, False

    def _receive(self) -> list[Any] | None:
        """One whole message, or None when it was over the limits (then reported dropped);
        its size in bytes is left in `_received`."""
        sock = self._sock
        # Frames, not copied bytes, only to read `more` cheaply: ZMQ_RCVMORE through
        # getsockopt costs several times more in pyzmq.
        frame = _recv(sock, _DONTWAIT, False, False)
        parts: list[Any] = [frame.bytes if len(frame) <= _COPY_LIMIT else frame.buffer]
        total = len(parts[0])
        small = self._small
        too_big: str | None = None
        while frame.more:
            frame = _recv(sock, _DONTWAIT, False, False)
            if too_big is not None:
                continue  # keep consuming the message's parts, keep none of them
            part = frame.bytes if len(parts) < small and len(frame) <= _COPY_LIMIT \
                else frame.buffer
            total += len(part)
            if len(parts) >= self._max_parts:
                too_big = "too_many_frames"
            elif total > self._max_bytes:
                too_big = "too_large"
            else:
                parts.append(part)
        if too_big is not None:
            self._on_drop(too_big)
            return None
        self._received = total
        return parts


HANDSHAKE_SUCCEEDED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
HANDSHAKE_FAILED_AUTH = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
HANDSHAKE_FAILED_PROTOCOL = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
_monitor_ids = itertools.count()


class ConnectionWatch:
    """Calls `on_event(event, value)` on the loop, in order, for each handshake outcome of
    `sock`'s connections, HANDSHAKE_SUCCEEDED, HANDSHAKE_FAILED_AUTH (value: the ZAP status
    the server sent, 400 for a refusal) or HANDSHAKE_FAILED_PROTOCOL, and for each end of one
    (DISCONNECTED: the peer closed it or it broke, whether its handshake ended or not).
    Create it before the socket connects, close it before the socket closes. Use from the
    loop's thread only."""

    def __init__(self, sock: zmq.Socket[Any], loop: asyncio.AbstractEventLoop,
                 on_event: Callable[[int, int], None]) -> None:
        self._sock = sock
        self._loop = loop
        self._on_event = on_event
        # An address of our own: zmq releases a closed monitor's inproc address later, and
        # pyzmq's default (named after the socket's fd) may be taken again meanwhile.
        address = f"inproc://tq-handshakes.{os.getpid()}.{next(_monitor_ids)}"
        self._monitor = sock.get_monitor_socket(
            HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED_AUTH | HANDSHAKE_FAILED_PROTOCOL
            | DISCONNECTED, address)
        self._fd = cast(int, self._monitor.getsockopt(zmq.FD))
        self._closed = False
        loop.add_reader(self._fd, self._drain)
        loop.call_soon(self._drain)

    def close(self) -> None:
        """Stop watching. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._sock.disable_monitor()
        self._monitor.close(0)

    def _drain(self) -> None:
        # ZMQ_FD is edge-triggered (see FramePump): read until EAGAIN.
        while not self._closed:
            try:
                frames = self._monitor.recv_multipart(_DONTWAIT)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)
            self._on_event(int(event["event"]), int(event["value"]))
