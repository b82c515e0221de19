"""What both ends of a connector connection share: the connection state machine, the per-stream
state machine, credits, the receive loop and the send guard.

`WorkerConnection` and `SourceConnection` subclass `Session` and add the handlers for the frames
their peer sends and the commands their own side issues. Peer mistakes raise
`ConnectorProtocolError` inside the receive loop, which turns them into one `ProtocolFailed`
event carrying the ERROR frame to send; our own mistakes raise `LocalProtocolError` to the
caller and change nothing. Sans-I/O: bytes in, events and bytes out, no sockets, no clocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ._adapters import Adapter
from ._credit import Credits
from ._dialect import Dialect
from ._errors import ConnectorProtocolError, LocalProtocolError, MalformedFrameError
from ._events import Event, ProtocolFailed, StreamInfo
from ._state import (
    ConnectionState,
    FrameType,
    Role,
    StreamInput,
    StreamState,
    connection_transition,
    stream_transition,
)
from ._wire import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, U64_MAX, Frame, FrameDecoder

__all__ = ["Session", "Stream", "command", "text"]

_TERMINAL = frozenset({ConnectionState.ERROR, ConnectionState.CLOSED})
_F = TypeVar("_F", bound=Callable[..., bytes])


def command(method: _F) -> _F:
    """Mark a public command: once the session has ended it returns b"" and changes nothing.

    `receive_data` returns a batch of events; a later frame of the same batch may end the
    session (ProtocolFailed, PeerError) before the caller has acted on the earlier events. There
    is nothing left to send then, so acting on them must not raise.
    """

    @functools.wraps(method)
    def guarded(self: Session, *args: Any, **kwargs: Any) -> bytes:
        if self._state in _TERMINAL:
            return b""
        return method(self, *args, **kwargs)

    return cast(_F, guarded)  # wraps(method): the same signature


def text(data: bytes, what: str) -> str:
    """`data` decoded as UTF-8, or MalformedFrameError naming the field."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedFrameError(f"{what} is not valid UTF-8") from None


class Stream:
    """Mutable per-stream record (a connection hands out `StreamInfo` snapshots of it)."""

    __slots__ = ("last_message_id", "nacks", "name", "state", "stream_id")

    def __init__(self, stream_id: int, name: str) -> None:
        self.stream_id = stream_id
        self.name = name
        self.state = StreamState.INTRO
        self.nacks = 0  # draft: NACKs still waiting for their NOTIFY
        self.last_message_id: int | None = None

    def info(self) -> StreamInfo:
        return StreamInfo(self.stream_id, self.name, self.state, self.last_message_id)


class Session:
    """Base of both connection roles. Subclasses set `role` and fill `_handlers`."""

    role: Role
    peer: Role

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if not 1 <= max_frame_size <= 0xFFFF_FFFF:
            raise LocalProtocolError("max_frame_size must be in [1, 2^32-1]")
        self._max_frame_size = max_frame_size
        self._adapter: Adapter | None = None
        self._decoder: FrameDecoder | None = None
        self._state = ConnectionState.CONNECTED
        self._credits = Credits()
        self._streams: dict[int, Stream] = {}
        self._handlers: dict[FrameType, Callable[[Any, list[Event]], None]] = {}

    def _use(self, adapter: Adapter) -> None:
        self._adapter = adapter
        self._decoder = FrameDecoder(adapter.codec, self._max_frame_size)

    # -- read-only views ------------------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def dialect(self) -> Dialect | None:
        """The peer's dialect; None until a worker has seen the first frame."""
        return None if self._adapter is None else self._adapter.dialect

    @property
    def credits(self) -> int:
        """Credits the connector holds right now (both ends agree on this number)."""
        return self._credits.available

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def buffered(self) -> int:
        """Received bytes held while waiting for the rest of a frame."""
        return 0 if self._decoder is None else self._decoder.buffered

    def stream(self, stream_id: int) -> StreamInfo | None:
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.info()

    def stream_state(self, stream_id: int) -> StreamState:
        stream = self._streams.get(stream_id)
        return StreamState.INTRO if stream is None else stream.state

    # -- receiving ------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; return the events they complete, in order.

        A protocol violation ends the list with `ProtocolFailed` (send its `reply`, then close);
        after that, and after an ERROR or RESTART, received bytes are discarded.
        """
        if self._state in _TERMINAL:
            return []
        events: list[Event] = []
        try:
            sniffed = self._before_decoder(data)
            if sniffed is None:
                return events
            decoder = self._decoder
            assert decoder is not None
            decoder.feed(sniffed)
            while self._state not in _TERMINAL:
                raw = decoder.next_raw()
                if raw is None:
                    break
                self._receive(*raw, events)
        except ConnectorProtocolError as exc:
            events.append(self._fail(exc))
        if self._state in _TERMINAL:
            self._decoder = None  # "Any data received after the error frame should be discarded."
        return events

    def _before_decoder(self, data: bytes) -> bytes | None:
        """Hook: the worker sniffs the dialect here. Returns the bytes to decode, or None."""
        return data

    def _check_before_decode(self, cls: type[Frame], body: bytes) -> None:
        """Hook: the worker checks a HELLO's version here, before decoding the rest."""

    def _receive(self, tag: int, body: bytes, events: list[Event]) -> None:
        adapter = self._adapter
        assert adapter is not None
        cls = adapter.codec.frame_class(tag)
        next_state = connection_transition(
            adapter.connection_table, self._state, self.peer, cls.frame_type
        )
        self._check_before_decode(cls, body)
        frame = adapter.codec.decode_body(tag, body)
        self._handlers[cls.frame_type](frame, events)
        self._state = next_state

    def _fail(self, error: ConnectorProtocolError) -> ProtocolFailed:
        reply = b""
        adapter = self._adapter
        if adapter is not None and (self._state, self.role, FrameType.ERROR) in (
            adapter.connection_table
        ):
            reply = adapter.encode(adapter.error(error.reason))
        self._state = ConnectionState.ERROR
        self._decoder = None
        return ProtocolFailed(error, reply)

    # -- sending --------------------------------------------------------------------------------

    def _require_adapter(self) -> Adapter:
        if self._adapter is None:
            raise LocalProtocolError("the peer's dialect is not known yet (no HELLO received)")
        return self._adapter

    def _send(self, frame: Frame) -> bytes:
        """Encode one of our frames after checking the connection table; then apply it."""
        adapter = self._require_adapter()
        next_state = local(
            connection_transition,
            adapter.connection_table,
            self._state,
            self.role,
            frame.frame_type,
        )
        data = adapter.encode(frame)
        if len(data) - HEADER_SIZE > self._max_frame_size:
            raise LocalProtocolError(
                f"{frame.frame_type.value} of {len(data) - HEADER_SIZE} bytes exceeds the "
                f"maximum frame size {self._max_frame_size}"
            )
        self._state = next_state
        if next_state in _TERMINAL:
            self._decoder = None
        return data

    def _require_streaming(self) -> None:
        if self._state is not ConnectionState.STREAMING:
            raise LocalProtocolError(f"the connection is {self._state.value}, not streaming")

    # -- streams --------------------------------------------------------------------------------

    def _known_stream(self, stream_id: int) -> Stream:
        """Our side names a stream: it must have been introduced."""
        stream = self._streams.get(stream_id)
        if stream is None:
            raise LocalProtocolError(f"stream {stream_id} was never introduced")
        return stream

    def _stream_next(
        self, stream: Stream | None, stream_id: int, event: StreamInput
    ) -> StreamState:
        """The peer's frame moves a stream: a missing pair is the peer's protocol error."""
        state = StreamState.INTRO if stream is None else stream.state
        assert self._adapter is not None
        return stream_transition(self._adapter.stream_table, state, event, stream_id)

    def _local_stream_next(self, stream: Stream | None, stream_id: int, event: StreamInput):
        """Our command moves a stream: a missing pair is our bug."""
        return local(self._stream_next, stream, stream_id, event)

    @staticmethod
    def _apply_notify(stream: Stream, next_state: StreamState) -> bool:
        """Apply a NOTIFY to `stream`; False if it only answered one of several stacked NACKs."""
        if stream.state is StreamState.RESET and stream.nacks > 1:
            stream.nacks -= 1  # "Each NACK will require a NOTIFY."
            return False
        stream.nacks = 0
        stream.state = next_state
        return True

    @staticmethod
    def _apply_nack(stream: Stream, next_state: StreamState) -> None:
        stream.nacks = stream.nacks + 1 if stream.state is StreamState.RESET else 1
        stream.state = next_state


def local(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn`; a protocol error it raises is our side's mistake, so re-raise it as local."""
    try:
        return fn(*args)
    except ConnectorProtocolError as exc:
        raise LocalProtocolError(str(exc)) from None


def require_id(value: object, what: str) -> int:
    """A stream or message id our side passed: an int in the u64 range."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64_MAX:
        raise LocalProtocolError(f"{what} must be an int in [0, 2^64-1], not {value!r}")
    return value
