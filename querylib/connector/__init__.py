"""The connector protocol, sans-I/O: codecs and state machines for both dialects.

External source connectors push streams of messages into tq with credit-based flow control.
Two dialects exist and are told apart by the first frame (`detect_dialect`): the draft of seed
002 (`draft`: little-endian, ASCII tags) and the one the published connector library speaks
(`released`: big-endian, numeric tags). Each dialect module declares its frames with byte
layouts, `encode(frame) -> bytes` and a bounded `FrameDecoder`.

`WorkerConnection` (the endpoint's side) and `SourceConnection` (the client library's side) run
the seed's connection and stream state machines (tables in `_state`), check versions, cookies,
credits and streams, and translate both dialects into one event vocabulary (`Hello`,
`StreamOpened`, `MessageReceived`, ...). Points of reference are always `processed`: the id of
the last message the worker processed on a stream, or None.

This package must not do I/O: no sockets, no asyncio, no clocks. The TCP endpoint and the client
are thin loops built on it elsewhere.
"""

from __future__ import annotations

from . import draft, released
from ._credit import Credits
from ._dialect import Dialect, detect_dialect
from ._errors import (
    BadCookieError,
    ConnectorProtocolError,
    CreditExhaustedError,
    DialectError,
    FrameTooLargeError,
    HandshakeError,
    LocalProtocolError,
    MalformedFrameError,
    NoCreditError,
    StreamClosedError,
    TooManyStreamsError,
    UnexpectedFrameError,
    UnknownStreamError,
    UnknownTagError,
    VersionMismatchError,
)
from ._events import (
    Accepted,
    Acked,
    DropReason,
    Event,
    Hello,
    MessageDropped,
    MessageFlags,
    MessageReceived,
    Nacked,
    PeerError,
    ProtocolFailed,
    RestartRequested,
    StreamAccepted,
    StreamEnded,
    StreamInfo,
    StreamOpened,
    StreamRejected,
)
from ._source import SourceConnection
from ._state import (
    DRAFT_CONNECTION,
    DRAFT_STREAMS,
    RELEASED_CONNECTION,
    RELEASED_STREAMS,
    ConnectionState,
    FrameType,
    Role,
    StreamInput,
    StreamState,
    connection_transition,
    stream_transition,
)
from ._wire import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, Frame, FrameDecoder
from ._worker import DEFAULT_MAX_STREAMS, WorkerConnection

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_STREAMS",
    "DRAFT_CONNECTION",
    "DRAFT_STREAMS",
    "HEADER_SIZE",
    "RELEASED_CONNECTION",
    "RELEASED_STREAMS",
    "Accepted",
    "Acked",
    "BadCookieError",
    "ConnectionState",
    "ConnectorProtocolError",
    "CreditExhaustedError",
    "Credits",
    "Dialect",
    "DialectError",
    "DropReason",
    "Event",
    "Frame",
    "FrameDecoder",
    "FrameTooLargeError",
    "FrameType",
    "HandshakeError",
    "Hello",
    "LocalProtocolError",
    "MalformedFrameError",
    "MessageDropped",
    "MessageFlags",
    "MessageReceived",
    "Nacked",
    "NoCreditError",
    "PeerError",
    "ProtocolFailed",
    "RestartRequested",
    "Role",
    "SourceConnection",
    "StreamAccepted",
    "StreamClosedError",
    "StreamEnded",
    "StreamInfo",
    "StreamInput",
    "StreamOpened",
    "StreamRejected",
    "StreamState",
    "TooManyStreamsError",
    "UnexpectedFrameError",
    "UnknownStreamError",
    "UnknownTagError",
    "VersionMismatchError",
    "WorkerConnection",
    "connection_transition",
    "detect_dialect",
    "draft",
    "released",
    "stream_transition",
]
