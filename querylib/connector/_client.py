"""`Connector`: the blocking client library that pushes streams into a tq connector endpoint.

    with Connector("127.0.0.1:7600", program="logs", instance="host-1", cookie=c) as conn:
        sid = conn.open_stream("events")           # topic events, partition 0
        start = conn.processed(sid)                # last message id the broker has, or None
        for i, line in enumerate(lines):
            conn.send(sid, line, message_id=i)     # ids at or below `processed` are skipped
        conn.end_stream(sid)
    # leaving the block waits until every message is acknowledged (durable)

At-least-once, with duplicates removed by the endpoint: every message is kept until an ACK says
it is durable; after a reconnect (lost connection, endpoint restart, RESTART) or a NACK the
client re-introduces its streams and resends what was not acknowledged, after the point the
endpoint names. Message ids given by the caller make this exactly-once across restarts of the
caller too; ids left to the client continue after the stream's point of reference.

Flow control is the endpoint's credits: `send` queues, and blocks (reading ACKs) only when the
queue and the unacknowledged messages together exceed `max_buffered`. Single-threaded, plain
blocking sockets; the sans-I/O `BulkSourceConnection` does the protocol. Not thread-safe.
"""

from __future__ import annotations

import hashlib
import os
import select
import socket
import ssl
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable

from catalog.errors import TqError, UserError

from ._bulk import BulkSourceConnection
from ._dialect import Dialect
from ._events import (
    Accepted,
    Acked,
    Event,
    MessageFlags,
    Nacked,
    PeerError,
    ProtocolFailed,
    RestartRequested,
    StreamAccepted,
    StreamRejected,
)
from ._records import parse_stream_name
from ._state import ConnectionState, StreamState
from ._wire import DEFAULT_MAX_FRAME_SIZE

__all__ = ["Connector", "ConnectorError", "RewindError", "StreamRefusedError", "parse_address"]

_BOUNDARY, _END = 1, 2
_READ_BYTES = 256 * 1024
_RUN = 1024  # messages encoded per call
_LINGER = 0.005  # seconds a message may wait in `pending` while more arrive
_MAX_ERRORS = 3


class ConnectorError(TqError):
    """The client gave up: the endpoint refused the session or stayed unreachable."""

    retriable = True


class RewindError(ConnectorError):
    """The endpoint asked to resume a stream before messages this client no longer holds (they
    were acknowledged, then lost by the broker). The caller must resend from `processed` + 1."""

    retriable = False

    def __init__(self, stream_id: int, processed: int | None, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.processed = processed


class StreamRefusedError(ConnectorError, UserError):
    """The endpoint refused a stream (released dialect NOTIFY_ACK failure)."""

    retriable = False


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' (or tcp://host:port) -> (host, port)."""
    text = address.removeprefix("tcp://")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"connector address {address!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def stream_id_of(name: str) -> int:
    """The default stream id: a 63-bit hash of the name (the seed's recommendation)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") >> 1


class _Stream:
    """One stream's messages from `send` until acknowledged, oldest first: `unacked` (sent on
    this connection), `queue` (sealed, waiting for credit), `pending` (being filled). Messages
    travel in segments (a list of (id, payload, event_time, key)), so sending and acknowledging
    cost one step per segment, not per message; markers are (kind, id) tuples."""

    __slots__ = ("accepted", "ended", "floor", "last_id", "name", "notified", "pending",
                 "queue", "sid", "unacked")

    def __init__(self, sid: int, name: str) -> None:
        self.sid = sid
        self.name = name
        self.floor: int | None = None  # the endpoint has everything up to here
        self.last_id: int | None = None  # the last id queued
        self.pending: list[tuple] = []
        self.queue: deque[list | tuple] = deque()
        self.unacked: deque[list | tuple] = deque()
        self.notified = False  # NOTIFY sent on this connection
        self.accepted = False  # may send messages (draft: at NOTIFY; released: NOTIFY_ACK)
        self.ended = False  # end_stream was called

    @property
    def done(self) -> bool:
        return not self.pending and not self.queue and not self.unacked

    def seal(self) -> None:
        if self.pending:
            self.queue.append(self.pending)
            self.pending = []

    def acked(self, processed: int) -> int:
        """Forget what an ACK covers; returns how many messages and markers that was."""
        self.floor = processed if self.floor is None else max(self.floor, processed)
        return _drop_upto(self.unacked, processed) + self.release_end()

    def release_end(self) -> int:
        """The released EOS has no id: it counts as done once everything before it is."""
        if self.unacked and type(self.unacked[0]) is tuple and self.unacked[0][1] is None:
            self.unacked.popleft()
            return 1
        return 0

    def skip_to(self, processed: int | None) -> int:
        """The endpoint has everything up to `processed` (and nothing after): forget what it
        covers, return how much that was; RewindError if it asks for what was forgotten."""
        if processed is None and self.floor is None:
            return 0
        if processed is None or (self.floor is not None and processed < self.floor):
            raise RewindError(self.sid, processed,
                              f"the endpoint asks to resend stream {self.sid} ({self.name!r}) "
                              f"after message {processed}, but messages up to {self.floor} were "
                              "acknowledged and are no longer held; resend them from the source")
        self.floor = processed
        self.seal()
        return _drop_upto(self.unacked, processed) + _drop_upto(self.queue, processed)

    def requeue(self) -> None:
        """The connection is gone: what was sent and not acknowledged goes out again."""
        self.queue.extendleft(reversed(self.unacked))
        self.unacked.clear()
        self.notified = self.accepted = False


def _drop_upto(segments: deque, processed: int) -> int:
    """Remove the leading messages and markers with ids <= `processed`; return the count."""
    n = 0
    while segments:
        head = segments[0]
        if type(head) is tuple:
            if head[1] is None or head[1] > processed:
                return n
            segments.popleft()
            n += 1
        elif head[-1][0] <= processed:
            segments.popleft()
            n += len(head)
        else:
            cut = bisect_right(head, processed, key=_id_of)
            del head[:cut]
            return n + cut
    return n


def _id_of(message: tuple) -> int:
    return message[0]


class Connector:
    """Pushes messages into topics through a connector endpoint (see the module docstring)."""

    def __init__(self, address: str = "127.0.0.1:7600", *, program: str = "tq",
                 instance: str | None = None, cookie: bytes | str = b"",
                 dialect: Dialect | str = Dialect.DRAFT, timeout: float = 30.0,
                 reconnect_timeout: float = 60.0, max_buffered: int = 16384,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.address = parse_address(address)
        self.program = program
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}"
        self.cookie = cookie.encode() if isinstance(cookie, str) else bytes(cookie)
        self.dialect = Dialect(dialect)
        self.timeout = timeout
        self.reconnect_timeout = reconnect_timeout
        self.max_buffered = max_buffered
        self.max_frame_size = max_frame_size
        self.ssl_context = ssl_context  # TLS to the endpoint (it checks the endpoint's name)
        self.streams: dict[int, _Stream] = {}
        self.counters = {"sent": 0, "acked": 0, "resent": 0, "reconnects": 0, "nacks": 0,
                         "restarts": 0}
        self._sock: socket.socket | None = None
        self._conn: BulkSourceConnection | None = None
        self._out = bytearray()
        self._buffered = 0  # messages queued or unacknowledged, all streams
        self._driven = 0.0  # when _drive last ran
        self._batch = _RUN  # messages between looks at the socket: half the credit window
        self._ok_points: dict[int, int | None] = {}
        self._progress = False  # an ACK acknowledged messages on the current connection
        self._errors = 0  # sessions in a row that ended with ERROR before any ACK
        self._accepted = False  # the current connection got its OK
        self._restart_to: tuple[str, int] | None = None
        self._closed = False
        self._connect_until(time.monotonic() + self.reconnect_timeout)

    # -- public API ----------------------------------------------------------------------------

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()

    def open_stream(self, name: str, stream_id: int | None = None) -> int:
        """Introduce a stream named `name` (`topic`, `topic:N`, ...; see querylib.connector);
        returns its id. With the released dialect this waits for the endpoint's answer, so
        `processed` is then exact; the draft's comes with OK (or a later NACK)."""
        parse_stream_name(name)  # a bad name is the caller's error, found before any I/O
        sid = stream_id_of(name) if stream_id is None else stream_id
        if sid in self.streams:
            raise UserError(f"stream {sid} is already open")
        stream = self.streams[sid] = _Stream(sid, name)
        if sid in self._ok_points:
            stream.floor = self._ok_points[sid]
        self._send_what_we_can()
        if self.dialect is Dialect.RELEASED:
            self._wait(lambda: stream.accepted, f"the endpoint to accept stream {name!r}")
        return sid

    def processed(self, stream_id: int) -> int | None:
        """The last message id of the stream the endpoint has durably, as last heard."""
        return self._stream(stream_id).floor

    def send(self, stream_id: int, payload: bytes, *, message_id: int | None = None,
             event_time: int | None = None, key: bytes | None = None) -> bool:
        """Queue a message; False if its id is at or below `processed` (already stored)."""
        stream = self._stream(stream_id)
        if stream.ended:
            raise UserError(f"stream {stream_id} has ended")
        if message_id is None:
            last = stream.last_id if stream.last_id is not None else stream.floor
            message_id = 0 if last is None else last + 1
        if stream.floor is not None and message_id <= stream.floor:
            return False
        if stream.last_id is not None and message_id <= stream.last_id:
            raise UserError(f"message id {message_id} does not follow {stream.last_id}: ids "
                            "must increase on a stream")
        if key is not None and self.dialect is Dialect.DRAFT:
            raise UserError("the draft dialect has no message keys; use the released dialect")
        stream.last_id = message_id
        pending = stream.pending
        pending.append((message_id, payload, event_time, key))
        self._buffered += 1
        if len(pending) >= self._batch or self._buffered >= self.max_buffered:
            self._drive()
        elif len(pending) == 1 and time.monotonic() - self._driven > _LINGER:
            self._drive()  # a slow source: do not sit on its messages
        return True

    def boundary(self, stream_id: int, message_id: int | None = None) -> None:
        """Draft only: a BOUNDARY, which advances the topic partition's frontier to its id + 1."""
        if self.dialect is not Dialect.DRAFT:
            raise UserError("boundaries exist only in the draft dialect")
        self._marker(stream_id, message_id, _BOUNDARY)

    def end_stream(self, stream_id: int, message_id: int | None = None) -> None:
        """End the stream (end-of-stream in the topic once its last producer ended)."""
        self._marker(stream_id, message_id, _END)
        self._stream(stream_id).ended = True
        self._drive()

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait until all of it is acknowledged."""
        self._drive()
        self._wait(lambda: all(s.done for s in self.streams.values()),
                   "every message to be acknowledged", timeout)

    def close(self) -> None:
        """Close the connection (unacknowledged messages are not waited for). Idempotent."""
        self._closed = True
        self._drop_socket()

    @property
    def buffered(self) -> int:
        """Messages queued or sent and not yet acknowledged."""
        return self._buffered

    # -- internals: queueing -------------------------------------------------------------------

    def _stream(self, stream_id: int) -> _Stream:
        try:
            return self.streams[stream_id]
        except KeyError:
            raise UserError(f"stream {stream_id} was not opened") from None

    def _marker(self, stream_id: int, message_id: int | None, kind: int) -> None:
        stream = self._stream(stream_id)
        if stream.ended:
            raise UserError(f"stream {stream_id} has ended")
        stream.seal()
        if self.dialect is Dialect.RELEASED and kind == _END:
            stream.queue.append((kind, None))  # the released EOS carries no id
        else:
            last = stream.last_id if stream.last_id is not None else stream.floor
            if message_id is None:
                message_id = 0 if last is None else last + 1
            if stream.floor is not None and message_id <= stream.floor:
                return  # stored already
            if stream.last_id is not None and message_id <= stream.last_id:
                raise UserError(f"message id {message_id} does not follow {stream.last_id}")
            stream.last_id = message_id
            stream.queue.append((kind, message_id))
        self._buffered += 1

    def _drive(self) -> None:
        """Send what credits allow; block (reading ACKs) while too much is buffered."""
        self._driven = time.monotonic()
        self._poll()
        self._send_what_we_can()
        if self._buffered >= self.max_buffered:
            self._wait(lambda: self._buffered < self.max_buffered // 2,
                       "acknowledgements to free the buffer")

    def _send_what_we_can(self) -> None:
        try:
            self._pump()
            self._write()
        except (OSError, ConnectionError):
            self._reconnect()  # which sends again what was lost

    def _pump(self) -> None:
        conn = self._conn
        if conn is None or conn.state is not ConnectionState.STREAMING:
            return
        for stream in self.streams.values():
            stream.seal()
            if not stream.notified:
                if stream.done and stream.ended:
                    continue  # finished: nothing to introduce again
                if conn.credits <= 0:
                    return
                self._out += conn.notify(stream.sid, stream.name, stream.floor)
                stream.notified = True
                stream.accepted = self.dialect is Dialect.DRAFT
            if not stream.accepted or conn.stream_state(stream.sid) is not StreamState.OPEN:
                continue
            self._send_queue(conn, stream)

    def _send_queue(self, conn: BulkSourceConnection, stream: _Stream) -> None:
        queue, unacked = stream.queue, stream.unacked
        while queue:
            head = queue[0]
            if type(head) is list:
                credits = conn.credits
                if credits <= 0:
                    return
                if len(head) <= credits:
                    part = queue.popleft()
                else:
                    part = head[:credits]
                    del head[:credits]
                self._out += conn.send_messages(stream.sid, part)
                unacked.append(part)
                self.counters["sent"] += len(part)
                continue
            kind, mid = head
            if kind == _BOUNDARY:
                if conn.credits <= 0:
                    return
                self._out += conn.send_message(stream.sid, mid, flags=MessageFlags.BOUNDARY)
                unacked.append(queue.popleft())
            else:
                if self.dialect is Dialect.DRAFT and conn.credits <= 0:
                    return
                self._out += conn.end_stream(stream.sid, mid)
                unacked.append(queue.popleft())
                if mid is None:
                    self._buffered -= stream.release_end()
                return

    # -- internals: events ---------------------------------------------------------------------

    def _handle(self, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, Acked):
                for sid, processed in event.acks:
                    stream = self.streams.get(sid)
                    if stream is not None and self._acked(stream, processed):
                        self._progress = True
            elif isinstance(event, Nacked):
                self.counters["nacks"] += 1
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    self._rewind(stream, event.processed)
            elif isinstance(event, StreamAccepted):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    self._rewind(stream, event.processed)
                    stream.notified = stream.accepted = True
            elif isinstance(event, StreamRejected):
                stream = self.streams.get(event.stream_id)
                name = stream.name if stream else event.stream_id
                raise StreamRefusedError(f"the endpoint refused stream {name!r}")
            elif isinstance(event, RestartRequested):
                self.counters["restarts"] += 1
                address = event.address
                self._restart_to = parse_address(address) if address else None
                raise ConnectionResetError("the endpoint asked for a reconnect")
            elif isinstance(event, PeerError | ProtocolFailed):
                reason = getattr(event, "reason", None) or str(getattr(event, "error", ""))
                if isinstance(event, ProtocolFailed):
                    self._send_now(event.reply)
                # Refused at HELLO (cookie, version), or ended again and again before any
                # message was acknowledged (a refused draft stream, a stream whose topic
                # refuses its writes): trying again cannot help.
                self._errors = 0 if self._progress else self._errors + 1
                if not self._accepted or self._errors >= _MAX_ERRORS:
                    raise ConnectorError(f"the connector endpoint ended the session: {reason}")
                raise ConnectionResetError(reason)

    def _acked(self, stream: _Stream, processed: int) -> int:
        """Messages of `stream` acknowledged up to `processed`; returns how many were new."""
        n = stream.acked(processed)
        self._buffered -= n
        self.counters["acked"] += n
        return n

    def _rewind(self, stream: _Stream, processed: int | None) -> None:
        """NACK or NOTIFY_ACK: resend what follows `processed`, forget what it covers."""
        stream.requeue()
        self._buffered -= stream.skip_to(processed)

    # -- internals: the connection -------------------------------------------------------------

    def _connect_until(self, deadline: float) -> None:
        delay = 0.05
        while True:
            try:
                self._connect()
                return
            except (OSError, ConnectionError) as exc:
                self._drop_socket()
                if time.monotonic() + delay > deadline:
                    raise ConnectorError(f"cannot reach the connector endpoint at "
                                         f"{self.address[0]}:{self.address[1]}: {exc}") from None
            time.sleep(delay)  # backoff between attempts, as the seed recommends
            delay = min(delay * 2, 1.0)

    def _connect(self) -> None:
        address = self._restart_to or self.address
        self._restart_to = None
        sock = socket.create_connection(address, timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=address[0])
            except BaseException:
                sock.close()
                raise
        self._sock = sock
        conn = self._conn = BulkSourceConnection(
            self.dialect, program=self.program, instance=self.instance, cookie=self.cookie,
            max_frame_size=self.max_frame_size)
        self._progress = self._accepted = False
        self._out = bytearray(conn.hello())
        self._write()
        deadline = time.monotonic() + self.timeout
        while conn.state is not ConnectionState.STREAMING:
            if time.monotonic() > deadline:
                raise ConnectionError("no answer to HELLO in time")
            events = self._read(deadline - time.monotonic()) or []
            for event in events:
                if isinstance(event, Accepted):
                    self._ok_points = dict(event.resume_points)
                    self._accepted = True
                    # With a small window, credits come back in small ACKs: look for them
                    # often enough that the window never sits idle while we queue.
                    self._batch = max(8, min(_RUN, event.initial_credits // 2))
            self._handle(e for e in events if not isinstance(e, Accepted))
        for stream in self.streams.values():
            stream.requeue()
            if stream.sid in self._ok_points:
                self._buffered -= stream.skip_to(self._ok_points[stream.sid])
        self._pump()
        self._write()

    def _reconnect(self) -> None:
        if self._closed:
            raise ConnectorError("the connector is closed")
        self._drop_socket()
        self.counters["reconnects"] += 1
        self._connect_until(time.monotonic() + self.reconnect_timeout)

    def _drop_socket(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _write(self) -> None:
        if not self._out or self._sock is None:
            return
        data, self._out = bytes(self._out), bytearray()
        self._send_now(data)

    def _send_now(self, data: bytes) -> None:
        if data and self._sock is not None:
            self._sock.sendall(data)

    def _read(self, timeout: float) -> list[Event] | None:
        """Events from what arrives within `timeout` seconds; None if nothing arrived."""
        if self._sock is None or self._conn is None:
            raise ConnectionResetError("not connected")
        self._sock.settimeout(max(timeout, 0.001))
        try:
            data = self._sock.recv(_READ_BYTES)
        except (TimeoutError, BlockingIOError):
            return None
        if not data:
            raise ConnectionResetError("the endpoint closed the connection")
        return self._conn.receive_data(data)

    def _poll(self) -> None:
        """Handle whatever the endpoint already sent, without waiting."""
        try:
            while self._sock is not None and (_tls_pending(self._sock) or
                                              select.select([self._sock], [], [], 0)[0]):
                self._handle(self._read(0.0) or ())
        except (OSError, ConnectionError):
            self._reconnect()

    def _wait(self, condition: Callable[[], bool], what: str,
              timeout: float | None = None) -> None:
        """Read and resend until `condition()`; reconnect on a lost connection. Raises
        ConnectorError when `timeout` (default: self.timeout without any byte) passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not condition():
            try:
                self._pump()
                self._write()
                if condition():
                    return
                wait = self.timeout
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise ConnectorError(f"timed out waiting for {what}")
                events = self._read(wait)
                if events is None:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise ConnectorError(f"timed out waiting for {what}")
                    raise ConnectionError(f"no word from the endpoint in {wait:.1f}s")
                self._handle(events)
            except (OSError, ConnectionError):
                self._reconnect()


def _tls_pending(sock: socket.socket) -> bool:
    """Bytes TLS has decrypted already: select() cannot see them."""
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
