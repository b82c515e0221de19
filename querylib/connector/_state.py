"""The connector protocol's state machines as tables, one pair per dialect.

The connection table is keyed by (state, who sent the frame, frame type); the stream table by
(stream state, stream input). A pair missing from a table is a protocol error, never a silent
no-op: `connection_transition` and `stream_transition` raise `UnexpectedFrameError` (or its
`UnknownStreamError` / `StreamClosedError` refinements) for it. Both sides of a connection use the
same tables: the worker checks connector frames it receives and worker frames it sends, the source
the reverse.

Deliberate readings of the draft (seed 002) beyond its literal lists:
- Streaming state: frames received after ERROR (or after RESTART, released) are discarded, as the
  seed says; the connection objects do that before consulting the table.
- Draft (OPEN, NOTIFY) -> OPEN: the seed says a notification "always" ends in the open state and
  the connector "may not know" whether it is a re-introduction; without this entry a NOTIFY that
  crosses a NACK in flight would kill the session.
- Draft (RESET, MESSAGE) -> RESET: the seed says message frames of a nack'ed stream are ignored
  until the next NOTIFY (they may have been in flight when the NACK left), not rejected.
- Draft (RESET, NACK) -> RESET: NACKs stack; each needs its own NOTIFY. The connection objects
  keep the count; the table only says the pair is legal.
- Released: NOTIFY moves a stream to PENDING until the worker's NOTIFY_ACK; a MESSAGE before that
  is a protocol error because the connector cannot have seen the NOTIFY_ACK yet.

This module only holds data and two lookups; it keeps no state and does no I/O.
"""

from __future__ import annotations

from enum import Enum

from ._errors import StreamClosedError, UnexpectedFrameError, UnknownStreamError

__all__ = [
    "DRAFT_CONNECTION",
    "DRAFT_STREAMS",
    "RELEASED_CONNECTION",
    "RELEASED_STREAMS",
    "ConnectionState",
    "FrameType",
    "Role",
    "StreamInput",
    "StreamState",
    "connection_transition",
    "stream_transition",
]


class _Enum(Enum):
    # Members are singletons compared by identity, so identity hashing is exact; Enum's own
    # __hash__ is Python code, and these enums key the tables looked up for every frame.
    __hash__ = object.__hash__


class FrameType(_Enum):
    """Frame types of both dialects (each dialect defines a subset and its own tags)."""

    HELLO = "HELLO"
    OK = "OK"
    ERROR = "ERROR"
    NOTIFY = "NOTIFY"
    NOTIFY_ACK = "NOTIFY_ACK"  # released only
    MESSAGE = "MESSAGE"
    ACK = "ACK"
    NACK = "NACK"  # draft only
    RESTART = "RESTART"  # released only
    EOS = "EOS"  # released only; the draft ends a stream with the EOS message flag


class Role(_Enum):
    """Who sends a frame."""

    CONNECTOR = "connector"
    WORKER = "worker"


class ConnectionState(_Enum):
    """The seed's protocol state machine (one per connection)."""

    CONNECTED = "connected"
    HANDSHAKE = "handshake"
    STREAMING = "streaming"
    ERROR = "error"
    CLOSED = "closed"  # the seed's "disconnected": reached by RESTART (released)


class StreamState(_Enum):
    """The seed's stream state machine (one per stream id within a session)."""

    INTRO = "intro"  # not introduced yet (every unknown stream id is here)
    PENDING = "pending"  # released: NOTIFY sent, NOTIFY_ACK not yet
    OPEN = "open"
    CLOSED = "closed"  # ended by EOS
    RESET = "reset"  # draft: nack'ed, waiting for a NOTIFY


class StreamInput(_Enum):
    """What can happen to a stream."""

    NOTIFY = "NOTIFY"
    NOTIFY_ACCEPTED = "NOTIFY_ACK(success)"  # released
    NOTIFY_REJECTED = "NOTIFY_ACK(failure)"  # released
    MESSAGE = "MESSAGE"
    MESSAGE_EOS = "MESSAGE(EOS)"  # draft: a MESSAGE with the EOS flag
    EOS = "EOS"  # released EOS frame
    ACK = "ACK"
    NACK = "NACK"  # draft


_C, _W = Role.CONNECTOR, Role.WORKER
_CONNECTED, _HANDSHAKE, _STREAMING, _ERROR, _CLOSED = (
    ConnectionState.CONNECTED,
    ConnectionState.HANDSHAKE,
    ConnectionState.STREAMING,
    ConnectionState.ERROR,
    ConnectionState.CLOSED,
)


def _error_from_anyone(*states: ConnectionState) -> dict:
    # "ERROR: * -> * (next state = error)" in every live state.
    return {(state, role, FrameType.ERROR): _ERROR for state in states for role in (_C, _W)}


DRAFT_CONNECTION: dict[tuple[ConnectionState, Role, FrameType], ConnectionState] = {
    (_CONNECTED, _C, FrameType.HELLO): _HANDSHAKE,
    (_HANDSHAKE, _W, FrameType.OK): _STREAMING,
    (_STREAMING, _C, FrameType.NOTIFY): _STREAMING,
    (_STREAMING, _C, FrameType.MESSAGE): _STREAMING,
    (_STREAMING, _W, FrameType.ACK): _STREAMING,
    (_STREAMING, _W, FrameType.NACK): _STREAMING,
    **_error_from_anyone(_CONNECTED, _HANDSHAKE, _STREAMING),
}

RELEASED_CONNECTION: dict[tuple[ConnectionState, Role, FrameType], ConnectionState] = {
    (_CONNECTED, _C, FrameType.HELLO): _HANDSHAKE,
    (_HANDSHAKE, _W, FrameType.OK): _STREAMING,
    (_HANDSHAKE, _W, FrameType.RESTART): _CLOSED,
    (_STREAMING, _C, FrameType.NOTIFY): _STREAMING,
    (_STREAMING, _W, FrameType.NOTIFY_ACK): _STREAMING,
    (_STREAMING, _C, FrameType.MESSAGE): _STREAMING,
    (_STREAMING, _C, FrameType.EOS): _STREAMING,
    (_STREAMING, _W, FrameType.ACK): _STREAMING,
    (_STREAMING, _W, FrameType.RESTART): _CLOSED,
    **_error_from_anyone(_CONNECTED, _HANDSHAKE, _STREAMING),
}

_INTRO, _PENDING, _OPEN, _SCLOSED, _RESET = (
    StreamState.INTRO,
    StreamState.PENDING,
    StreamState.OPEN,
    StreamState.CLOSED,
    StreamState.RESET,
)
_I = StreamInput

DRAFT_STREAMS: dict[tuple[StreamState, StreamInput], StreamState] = {
    (_INTRO, _I.NOTIFY): _OPEN,
    (_OPEN, _I.NOTIFY): _OPEN,  # re-introduction (see module docstring)
    (_OPEN, _I.MESSAGE): _OPEN,
    (_OPEN, _I.MESSAGE_EOS): _SCLOSED,
    (_OPEN, _I.ACK): _OPEN,
    (_OPEN, _I.NACK): _RESET,
    (_SCLOSED, _I.NOTIFY): _OPEN,
    (_SCLOSED, _I.ACK): _SCLOSED,  # acks arrive asynchronously
    (_SCLOSED, _I.NACK): _RESET,
    (_RESET, _I.NOTIFY): _OPEN,  # or stays RESET while more NACKs are stacked
    (_RESET, _I.MESSAGE): _RESET,  # ignored until re-introduced
    (_RESET, _I.MESSAGE_EOS): _RESET,
    (_RESET, _I.ACK): _RESET,
    (_RESET, _I.NACK): _RESET,  # stacked
}

RELEASED_STREAMS: dict[tuple[StreamState, StreamInput], StreamState] = {
    (_INTRO, _I.NOTIFY): _PENDING,
    (_PENDING, _I.NOTIFY_ACCEPTED): _OPEN,
    (_PENDING, _I.NOTIFY_REJECTED): _SCLOSED,
    (_PENDING, _I.ACK): _PENDING,
    (_OPEN, _I.MESSAGE): _OPEN,
    (_OPEN, _I.EOS): _SCLOSED,
    (_OPEN, _I.ACK): _OPEN,
    (_SCLOSED, _I.NOTIFY): _PENDING,
    (_SCLOSED, _I.ACK): _SCLOSED,
}

_ENDING_INPUTS = frozenset({_I.MESSAGE, _I.MESSAGE_EOS, _I.EOS})


def connection_transition(
    table: dict[tuple[ConnectionState, Role, FrameType], ConnectionState],
    state: ConnectionState,
    sender: Role,
    frame_type: FrameType,
) -> ConnectionState:
    """The connection state after `sender` sends a `frame_type` frame in `state`."""
    try:
        return table[(state, sender, frame_type)]
    except KeyError:
        raise UnexpectedFrameError(
            f"{frame_type.value} from the {sender.value} is not allowed in the "
            f"{state.value} state"
        ) from None


def stream_transition(
    table: dict[tuple[StreamState, StreamInput], StreamState],
    state: StreamState,
    event: StreamInput,
    stream_id: int,
) -> StreamState:
    """The state of stream `stream_id` after `event` in `state`."""
    try:
        return table[(state, event)]
    except KeyError:
        pass
    if state is StreamState.INTRO:
        raise UnknownStreamError(f"{event.value} for stream {stream_id}, never introduced")
    if state is StreamState.CLOSED and event in _ENDING_INPUTS:
        raise StreamClosedError(f"{event.value} for stream {stream_id}, which has ended")
    raise UnexpectedFrameError(
        f"{event.value} is not allowed for stream {stream_id} in the {state.value} state"
    )
