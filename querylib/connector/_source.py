"""The connector (source) side of a connector connection, sans-I/O.

The client library owns the socket and one `SourceConnection`; it sends `hello()`, then feeds
received bytes to `receive_data` and writes the bytes each command returns:

    conn = SourceConnection(Dialect.RELEASED, program="ingest", instance="host-1", cookie=b"c")
    send(conn.hello())
    ... Accepted(initial_credits) -> send(conn.notify(7, "logs/host-1"))
    ... StreamAccepted(7, processed) (released; a draft stream is open at once)
    ... while conn.credits: send(conn.send_message(7, next_id, payload))
    ... Acked(credits, acks) refills credits; Nacked (draft) asks for a NOTIFY and a resend;
        RestartRequested (released) asks for a reconnect.

It checks what the worker sends against the same state tables the worker uses, and refuses
(LocalProtocolError, nothing sent) what its own side may not send: a NOTIFY or MESSAGE without
credit (`NoCreditError`), a MESSAGE on a stream that is not open, a frame over the maximum size.
"""

from __future__ import annotations

from typing import Any

from ._adapters import ADAPTERS
from ._dialect import Dialect
from ._errors import LocalProtocolError, NoCreditError
from ._events import (
    Accepted,
    Acked,
    Event,
    MessageFlags,
    Nacked,
    PeerError,
    RestartRequested,
    StreamAccepted,
    StreamRejected,
)
from ._session import Session, Stream, command, require_id, text
from ._state import ConnectionState, FrameType, Role, StreamInput, StreamState
from ._wire import DEFAULT_MAX_FRAME_SIZE

__all__ = ["SourceConnection"]

_NO_FLAGS = MessageFlags(0)
_EOS = int(MessageFlags.EOS)  # int arithmetic: IntFlag's is slow on the per-message path


class SourceConnection(Session):
    """The connector's side of one connection: commands -> bytes, bytes in -> events out."""

    role = Role.CONNECTOR
    peer = Role.WORKER

    def __init__(
        self,
        dialect: Dialect,
        *,
        program: str,
        instance: str,
        cookie: bytes | str = b"",
        version: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        super().__init__(max_frame_size=max_frame_size)
        self._use(ADAPTERS[Dialect(dialect)])
        self._program = program
        self._instance = instance
        self._cookie = cookie.encode("utf-8") if isinstance(cookie, str) else bytes(cookie)
        self._version = ADAPTERS[dialect].version if version is None else version
        self._handlers = {
            FrameType.OK: self._on_ok,
            FrameType.ERROR: self._on_error,
            FrameType.ACK: self._on_ack,
            FrameType.NACK: self._on_nack,
            FrameType.NOTIFY_ACK: self._on_notify_ack,
            FrameType.RESTART: self._on_restart,
        }

    def can_send(self, stream_id: int) -> bool:
        """Whether `send_message(stream_id, ...)` would be accepted right now."""
        return (
            self._state is ConnectionState.STREAMING
            and self.stream_state(stream_id) is StreamState.OPEN
            and self._credits.available > 0
        )

    # -- receiving ------------------------------------------------------------------------------

    def _on_ok(self, frame: Any, events: list[Event]) -> None:
        assert self._adapter is not None
        self._credits.grant(frame.initial_credits)
        events.append(Accepted(frame.initial_credits, self._adapter.resume_points(frame)))

    def _on_error(self, frame: Any, events: list[Event]) -> None:
        assert self._adapter is not None
        events.append(PeerError(self._adapter.error_reason(frame)))

    def _on_ack(self, frame: Any, events: list[Event]) -> None:
        for sid, _ in frame.acks:
            stream = self._streams.get(sid)
            next_state = self._stream_next(stream, sid, StreamInput.ACK)
            assert stream is not None
            stream.state = next_state
        self._credits.grant(frame.credits)
        events.append(Acked(frame.credits, frame.acks))

    def _on_nack(self, frame: Any, events: list[Event]) -> None:
        sid = frame.stream_id
        stream = self._streams.get(sid)
        next_state = self._stream_next(stream, sid, StreamInput.NACK)
        assert stream is not None and self._adapter is not None
        self._apply_nack(stream, next_state)
        self._credits.grant(frame.credits)
        processed = self._adapter.from_point(frame.point_of_reference)
        events.append(Nacked(sid, processed, frame.credits))

    def _on_notify_ack(self, frame: Any, events: list[Event]) -> None:
        sid = frame.stream_id
        stream = self._streams.get(sid)
        event = StreamInput.NOTIFY_ACCEPTED if frame.success else StreamInput.NOTIFY_REJECTED
        next_state = self._stream_next(stream, sid, event)
        assert stream is not None and self._adapter is not None
        stream.state = next_state
        processed = self._adapter.from_point(frame.point_of_reference)
        if frame.success:
            stream.last_message_id = processed
            events.append(StreamAccepted(sid, processed))
        else:
            events.append(StreamRejected(sid, processed))

    def _on_restart(self, frame: Any, events: list[Event]) -> None:
        events.append(RestartRequested(text(frame.address, "RESTART address")))

    # -- commands -------------------------------------------------------------------------------

    @command
    def hello(self) -> bytes:
        """The HELLO that opens the session."""
        assert self._adapter is not None
        return self._send(
            self._adapter.hello(self._version, self._cookie, self._program, self._instance)
        )

    def _require_credit(self, what: str) -> None:
        if self._credits.available <= 0:
            raise NoCreditError(f"no credit left to send {what}; wait for an ACK")

    @command
    def notify(self, stream_id: int, name: str, processed: int | None = None) -> bytes:
        """NOTIFY: introduce (or re-introduce) `stream_id` as `name`, resuming after message id
        `processed` (None: from the start). Costs a credit."""
        assert self._adapter is not None
        require_id(stream_id, "stream id")
        stream = self._streams.get(stream_id)
        next_state = self._local_stream_next(stream, stream_id, StreamInput.NOTIFY)
        frame = self._adapter.notify(stream_id, name, processed)
        self._require_credit("NOTIFY")
        data = self._send(frame)
        self._credits.try_spend()
        if stream is None:
            stream = self._streams[stream_id] = Stream(stream_id, name)
        if self._apply_notify(stream, next_state):
            stream.name = name
        return data

    def _open_stream(self, stream_id: int) -> Stream:
        stream = self._known_stream(stream_id)
        if stream.state is not StreamState.OPEN:
            raise LocalProtocolError(f"stream {stream_id} is {stream.state.value}, not open")
        return stream

    @command
    def send_message(
        self,
        stream_id: int,
        message_id: int,
        payload: bytes = b"",
        *,
        event_time: int | None = None,
        key: bytes | None = None,
        flags: MessageFlags = _NO_FLAGS,
    ) -> bytes:
        """MESSAGE on an open stream. Costs a credit. `flags` are the draft's (EVENT_TIME is
        set from `event_time`; EOS ends the stream); the released dialect takes none, but has
        `key`."""
        assert self._adapter is not None
        require_id(message_id, "message id")
        stream = self._open_stream(stream_id)
        frame = self._adapter.message(stream_id, message_id, payload, flags, event_time, key)
        ending = bool(int(flags) & _EOS)
        event = StreamInput.MESSAGE_EOS if ending else StreamInput.MESSAGE
        next_state = self._local_stream_next(stream, stream_id, event)
        self._require_credit("MESSAGE")
        data = self._send(frame)
        self._credits.try_spend()
        stream.state = next_state
        stream.last_message_id = message_id
        return data

    @command
    def end_stream(self, stream_id: int, message_id: int | None = None) -> bytes:
        """End an open stream: released EOS (free), or a draft BOUNDARY|EOS message with id
        `message_id` (default: one past the last id sent), which costs a credit."""
        assert self._adapter is not None
        stream = self._open_stream(stream_id)
        if message_id is None:
            last = stream.last_message_id
            message_id = 0 if last is None else last + 1
        frame = self._adapter.end_stream(stream_id, require_id(message_id, "message id"))
        event = StreamInput.EOS if frame.frame_type is FrameType.EOS else StreamInput.MESSAGE_EOS
        next_state = self._local_stream_next(stream, stream_id, event)
        if self._adapter.end_costs_credit:
            self._require_credit("the end of the stream")
        data = self._send(frame)
        if self._adapter.end_costs_credit:
            self._credits.try_spend()
        if event is StreamInput.MESSAGE_EOS:
            stream.last_message_id = message_id  # the draft's closing boundary has an id
        stream.state = next_state
        return data

    @command
    def error(self, reason: str) -> bytes:
        """Send ERROR with `reason`; this session ends."""
        assert self._adapter is not None
        return self._send(self._adapter.error(reason))
