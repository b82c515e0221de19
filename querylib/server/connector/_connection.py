"""One connector's TCP connection to the endpoint: a thin loop around `BulkWorkerConnection`.

Bytes from the socket go to the sans-I/O connection; its events become work for the stream
sinks (`_sink`); what the sinks report becomes ACK, NACK, NOTIFY_ACK, RESTART or ERROR frames.
Decisions made here, and only here:

- Credits. The connector gets `initial_credits` at OK. Every frame that cost a credit hands it
  back exactly once: a MESSAGE's when its record batch is durable (with the stream's new point
  of reference in the same ACK), a NOTIFY's once the stream is open, a dropped or discarded
  frame's at once. So a connector that sends faster than the broker appends runs out of credit
  and waits. Credits count frames, not bytes; so that big frames cannot pile up within the
  credits, the connection also stops reading while it holds more than `max_held_bytes` of
  messages not yet appended (TCP then holds the connector back). It stops reading too while
  more than 256 KiB it was sent wait unread (every frame it sends is answered: a connector
  that never reads would otherwise have us keep the answers without bound). What one
  connection holds is thus at most max_held_bytes + one read (256 KiB) + one frame, and its
  unsent answers at most 256 KiB + those to the frames of its window.
- Where a stream resumes. At OK (draft) the points of every stream this instance has history
  of, as many as one frame holds; at each NOTIFY the true point (checkpoint and data) is
  compared with the connector's: the draft gets a NACK when they differ (so a stream left out
  of OK learns its point there), the released dialect gets it in NOTIFY_ACK.
- Failures. An append that fails rewinds the stream to its last durable point (draft NACK) or
  asks the connector to reconnect (released RESTART). A peer that breaks the protocol gets an
  ERROR frame and is closed; nobody else notices.
- Ending. A connection that ends gets its last frames (an ERROR, ACKs) out within 5 s, or its
  socket is aborted: a connector that never reads holds no descriptor past its connection.

Everything runs on the broker's event loop; blocking work (log scans) happens in the endpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from catalog.errors import TqError, printable
from querylib.broker import StreamEndedError, TopicAuthorizationError
from querylib.connector._bulk import BulkWorkerConnection, MessageRun
from querylib.connector._dialect import Dialect
from querylib.connector._errors import ConnectorProtocolError, LocalProtocolError
from querylib.connector._events import (
    Event,
    Hello,
    MessageDropped,
    MessageFlags,
    MessageReceived,
    PeerError,
    ProtocolFailed,
    StreamEnded,
    StreamOpened,
)
from querylib.connector._records import source_id
from querylib.connector._state import ConnectionState

from ._sink import AdvanceOp, EndOp, OpenOp, StreamSink

if TYPE_CHECKING:
    from ._endpoint import ConnectorEndpoint

__all__ = ["PeerConnection"]

logger = logging.getLogger("querylib.connector")

_READ_BYTES = 256 * 1024
_MAX_UNSENT = 256 * 1024  # bytes written and not yet taken by the connector: reading pauses
_CLOSE_TIMEOUT = 5.0  # seconds an ended connection's last frames get to go out
_BOUNDARY = int(MessageFlags.BOUNDARY)
_EPHEMERAL = int(MessageFlags.EPHEMERAL)
_LIVE = (ConnectionState.CONNECTED, ConnectionState.HANDSHAKE, ConnectionState.STREAMING)


class PeerConnection:
    """Serves one accepted TCP connection until either side ends it."""

    def __init__(self, endpoint: ConnectorEndpoint, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, *,
                 activity: Callable[[], object] = lambda: None) -> None:
        config = endpoint.config
        self.endpoint = endpoint
        self.config = config
        self.conn = BulkWorkerConnection(cookie=endpoint.cookie, dialects=config.dialects,
                                         max_frame_size=config.max_frame_size,
                                         max_streams=config.max_streams)
        self.reader = reader
        self.writer = writer
        self._activity = activity  # told of every read, for the endpoint's idle timeout
        self.peer = str(writer.get_extra_info("peername"))
        self.instance: tuple[str, str] | None = None
        self.sinks: dict[int, StreamSink] = {}
        self._window = 0  # credits granted at OK: the connector's and ours always sum to it
        self._outstanding = 0  # credits of frames received and not yet handed back
        self._owed = 0  # of those, ready to go back with the next ACK
        self._points: dict[int, int] = {}  # stream -> new point of reference for the next ACK
        self._ack_handle: asyncio.Handle | None = None
        self.held_bytes = 0  # of messages received and not yet appended (or dropped)
        self._room = asyncio.Event()  # set while held_bytes is within the budget
        self._room.set()
        self._opened: set[int] = set()  # streams opened at least once on this connection
        self._ending = False
        self._drain = False  # finish the streams' queued work at the end (a clean close)
        self._finishing = False
        self._task: asyncio.Task[Any] | None = None
        self.finished = asyncio.Event()
        self.reason = ""  # why the connection ended, for logs and tests

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        self._task = asyncio.current_task()
        try:
            await self._serve()
        except asyncio.CancelledError:
            if not self._ending:
                raise
        except (ConnectionError, OSError) as exc:
            self.reason = self.reason or f"connection lost: {exc}"
        except Exception:
            # A bug of ours: this connection ends, every other one goes on.
            self.endpoint.counters["bugs"] += 1
            logger.exception("connector %s: bug; closing the connection", self.peer)
        finally:
            await self._finish()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.handshake_timeout
        while not self._ending:
            if self.conn.state is ConnectionState.STREAMING:
                if not self._room.is_set():
                    await self._room.wait()  # TCP holds the connector back meanwhile
                if self.writer.transport.get_write_buffer_size() > _MAX_UNSENT:
                    # It does not read what we answer: read nothing more until it does.
                    self.endpoint.counters["write_waits"] += 1
                    await self.writer.drain()
                data = await self.reader.read(_READ_BYTES)
            else:
                try:
                    data = await asyncio.wait_for(self.reader.read(_READ_BYTES),
                                                  max(0.0, deadline - loop.time()))
                except TimeoutError:
                    self.reason = "no HELLO in time"
                    return
            self._activity()
            if not data:
                self.reason = self.reason or "closed by the connector"
                self._drain = True  # what it sent before closing is still to be done
                return
            for event in self.conn.receive_data(data):
                await self._on_event(event)
                if self._ending:
                    return
            self._reconcile()
            self._schedule_ack()

    async def _on_event(self, event: Event) -> None:
        if isinstance(event, MessageRun):
            self._messages(event.stream_id, event.messages, event.nbytes)
        elif isinstance(event, MessageReceived):
            self._message(event)
        elif isinstance(event, StreamOpened):
            self._stream_opened(event)
        elif isinstance(event, StreamEnded):
            sink = self.sinks.get(event.stream_id)
            if sink is not None and sink.accepting:
                sink.push(EndOp())
        elif isinstance(event, MessageDropped):
            self._outstanding += 1
            self._owed += 1
        elif isinstance(event, Hello):
            await self._hello(event)
        elif isinstance(event, PeerError):
            self.reason = f"connector sent ERROR: {event.reason}"
            self._ending = True
        elif isinstance(event, ProtocolFailed):
            self.endpoint.counters["protocol_errors"] += 1
            self.reason = f"protocol error: {event.error}"
            self._send(event.reply)
            self._ending = True

    # -- events --------------------------------------------------------------------------------

    async def _hello(self, event: Hello) -> None:
        key = (event.program, event.instance)
        try:
            points = await self.endpoint.admit(self, key)
        except TqError as exc:  # e.g. a data partition that cannot be read
            # The names are any string the connector chose, and connectors log this reason.
            self._say(self.conn.error, f"cannot resume {printable(event.program)}/"
                                       f"{printable(event.instance)}: {exc}")
            self.reason = f"admission failed: {exc}"
            self._ending = True
            return
        self.instance = key
        self._window = self.config.initial_credits
        known = {sid: p for sid, p in points.items() if p is not None}
        self._send(self.conn.accept(self._window, known))

    def _stream_opened(self, event: StreamOpened) -> None:
        sid = event.stream_id
        sink = self.sinks.get(sid)
        if sink is None:
            assert self.instance is not None
            key = (*self.instance, sid)
            sink = StreamSink(self, self.endpoint.partitions, key, source_id(*key),
                              self.endpoint.resolve, self.endpoint.save, self.account,
                              lease=self.config.lease,
                              max_batch_records=self.config.max_batch_records,
                              max_batch_bytes=self.config.max_batch_bytes,
                              create=self.config.auto_create)
            self.sinks[sid] = sink
            sink.start()
        sink.accepting = True
        self._outstanding += 1
        sink.push(OpenOp(event.name, event.processed, first=sid not in self._opened))
        self._opened.add(sid)

    def _messages(self, sid: int, messages: list, nbytes: int) -> None:
        self._outstanding += len(messages)
        sink = self.sinks.get(sid)
        if sink is None or not sink.accepting:
            self._owed += len(messages)  # sent before the connector saw our NACK
        else:
            sink.add_messages(messages, nbytes)

    def _message(self, event: MessageReceived) -> None:
        flags = int(event.flags)
        if not flags & _BOUNDARY:
            message = (event.message_id, event.payload, event.event_time, event.key, flags)
            self._messages(event.stream_id, [message], len(event.payload))
            return
        self._outstanding += 1
        sink = self.sinks.get(event.stream_id)
        if sink is None or not sink.accepting or flags & _EPHEMERAL:
            # An ephemeral boundary's id names no point in time: it moves no frontier.
            self._owed += 1
        else:
            sink.push(AdvanceOp(event.message_id))

    # -- what the sinks report (SinkOwner) ----------------------------------------------------

    def account(self, delta: int) -> None:
        """Bytes of messages taken (+) or let go (-) by a sink: above `max_held_bytes` the
        connection stops reading, so big frames cannot pile up even within the credits."""
        self.held_bytes += delta
        if self.held_bytes > self.config.max_held_bytes:
            self._room.clear()
        else:
            self._room.set()

    def opened(self, sink: StreamSink, op: OpenOp) -> None:
        processed = sink.processed
        if self.conn.dialect is Dialect.RELEASED:
            self._send(self.conn.accept_stream(sink.stream_id, processed))
            self.completed(sink, op.credits, None)
            return
        told = -1 if op.belief is None else op.belief
        true = -1 if processed is None else processed
        # First NOTIFY on this connection: any difference is worth a NACK (a connector behind
        # would resend what is stored, one ahead would skip what is not). A NOTIFY that
        # reopens an ended stream only needs one when the connector is ahead.
        if told > true or (op.first and told != true):
            self._nack(sink, processed, op.credits)
        else:
            self.completed(sink, op.credits, None)

    def refused(self, sink: StreamSink, op: OpenOp, reason: str) -> None:
        self.endpoint.counters["streams_refused"] += 1
        self._owed += op.credits + sink.drain()
        self._send(self.conn.reject_stream(sink.stream_id, reason))
        if self.conn.state not in _LIVE:
            self._end(f"stream {sink.stream_id} refused: {reason}")
        else:
            self._schedule_ack()

    def completed(self, sink: StreamSink, credits: int, processed: int | None) -> None:
        self._owed += credits
        if processed is not None:
            self._points[sink.stream_id] = processed
        # At once, not at the next loop turn: with a small window the connector is waiting
        # for exactly these credits, and each turn of the loop is a round trip's worth.
        self._flush_acks()

    def failed(self, sink: StreamSink, credits: int, error: Exception) -> None:
        if not isinstance(error, TqError):
            self.endpoint.counters["bugs"] += 1
            self._say(self.conn.error, "internal error in the connector endpoint")
            self._end(f"bug: {error!r}")
            return
        if isinstance(error, ConnectorProtocolError):
            self._owed += credits
            self._say(self.conn.error, error.reason)
            self._end(f"protocol error: {error}")
            return
        if isinstance(error, StreamEndedError | TopicAuthorizationError):
            # The broker refuses the stream's writes for good: resending cannot help, so the
            # connector hears why instead of a rewind it would repeat forever.
            self.endpoint.counters["streams_refused"] += 1
            self._owed += credits
            self._say(self.conn.error, f"stream {sink.stream_id}: {error}")
            self._end(f"stream {sink.stream_id} refused: {error}")
            return
        self.endpoint.counters["append_failures"] += 1
        logger.warning("connector %s stream %d: %s; rewinding to %s", self.peer,
                       sink.stream_id, error, sink.processed)
        if self.conn.dialect is Dialect.RELEASED:
            self._say(self.conn.restart)
            self._end(f"append failed: {error}")
        else:
            self._nack(sink, sink.processed, credits)

    # -- sending -------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def _say(self, command: Callable[..., bytes], *args: Any) -> None:
        """Send an ERROR or RESTART if the connection can still say anything (before the first
        frame its dialect is unknown: then there is nothing to say, only to close)."""
        try:
            self._send(command(*args))
        except LocalProtocolError:
            pass

    def _nack(self, sink: StreamSink, processed: int | None, credits: int) -> None:
        """Rewind a draft stream: drop what waits, hand back every credit we hold for it."""
        sink.accepting = False
        self.endpoint.counters["nacks"] += 1
        give = credits + sink.drain() + self._owed
        self._owed = 0
        self._send(self.conn.nack(sink.stream_id, processed, give))
        self._outstanding -= give

    def _reconcile(self) -> None:
        # A frame the connection took a credit for without an event (a NOTIFY that answered a
        # stacked NACK) would leak a credit; the connector's and our counts always sum to the
        # window, so whatever is missing goes back.
        if self._window and self.conn.state is ConnectionState.STREAMING:
            missing = self._window - self.conn.credits - self._outstanding
            if missing > 0:
                self._outstanding += missing
                self._owed += missing

    def _schedule_ack(self) -> None:
        if self._ack_handle is None and (self._owed or self._points):
            self._ack_handle = asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_handle = None
        if self.conn.state is not ConnectionState.STREAMING or not (self._owed or self._points):
            return
        credits, points = self._owed, self._points
        self._owed, self._points = 0, {}
        self._send(self.conn.ack(credits, points.items()))
        self._outstanding -= credits

    # -- ending --------------------------------------------------------------------------------

    def busy(self) -> bool:
        """Whether frames it sent are not acknowledged yet (then it is not idle)."""
        return self._outstanding > 0 or self.held_bytes > 0

    def end(self, reason: str) -> None:
        """Close the connection without a word (it was idle: nothing is unacknowledged)."""
        self._end(reason)

    def _end(self, reason: str) -> None:
        """End from a callback (not the loop): stop reading and let `run` finish up."""
        self.reason = self.reason or reason
        self._ending = True
        if self._task is not None and not self._finishing:
            self._task.cancel()

    async def fence(self, reason: str) -> None:
        """Another connection of the same program and instance takes over: end this one and
        wait until everything it had in flight is settled (its points are then final)."""
        self._say(self.conn.error, reason)
        self._end(reason)
        await self.finished.wait()

    async def stop(self, reason: str) -> None:
        """The endpoint is shutting down: ask the connector to reconnect later, and end."""
        if self.conn.dialect is Dialect.RELEASED:
            self._say(self.conn.restart)
        else:
            self._say(self.conn.error, reason)
        self._end(reason)
        await self.finished.wait()

    async def _finish(self) -> None:
        self._finishing = True
        self._ending = True
        if self._ack_handle is not None:
            self._ack_handle.cancel()
            self._ack_handle = None
        try:
            await asyncio.gather(*(sink.stop(drain=self._drain)
                                   for sink in self.sinks.values()), return_exceptions=True)
            self.endpoint.release(self)
        finally:
            self.writer.close()
            try:
                await asyncio.wait_for(self.writer.wait_closed(), _CLOSE_TIMEOUT)
            except TimeoutError:
                # It does not take what is left to send (an ERROR, ACKs): drop that rather
                # than keep the socket open for as long as the connector stays silent.
                self.writer.transport.abort()
            except (ConnectionError, OSError, TqError):
                pass
            self.finished.set()
            # A reason may quote the peer (its ERROR's text): escaped, it stays on its line.
            logger.debug("connector %s: ended (%s)", self.peer, printable(self.reason))
