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

The modules above do no I/O: no sockets, no asyncio, no clocks. Built on them, with I/O:

    ConnectorEndpoint   (_endpoint, _peer, _sink, _offsets)  the TCP listener inside a broker
                        process: streams become appends to its partitions, ACKs follow
                        durability, points of reference live in `__connector_offsets`
    Connector           (_client)  the blocking client: at-least-once resume, ids deduplicated
                        by the endpoint
    ingest              (_ingest)  lines or JSON lines from a file into a topic (`tq ingest`)

`_bulk` holds the fast MESSAGE paths both sides use (`BulkWorkerConnection`,
`BulkSourceConnection`); `_records` says how messages become records and stream names topics.
"""

from __future__ import annotations

from . import draft, released
from ._bulk import BulkSourceConnection, BulkWorkerConnection, MessageRun
from ._client import Connector, ConnectorError, RewindError, StreamRefusedError
from ._credit import Credits
from ._dialect import Dialect, detect_dialect
from ._endpoint import (
    DEFAULT_CONNECTOR_PORT,
    ConnectorEndpoint,
    EndpointConfig,
    derive_cookie,
)
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
from ._ingest import IngestResult, ingest
from ._records import FLAGS_HEADER, MSGID_HEADER, parse_stream_name
from ._serve import run_connector_broker, serve_connector_broker
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
    "DEFAULT_CONNECTOR_PORT",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_STREAMS",
    "DRAFT_CONNECTION",
    "DRAFT_STREAMS",
    "FLAGS_HEADER",
    "HEADER_SIZE",
    "MSGID_HEADER",
    "RELEASED_CONNECTION",
    "RELEASED_STREAMS",
    "Accepted",
    "Acked",
    "BadCookieError",
    "BulkSourceConnection",
    "BulkWorkerConnection",
    "ConnectionState",
    "Connector",
    "ConnectorEndpoint",
    "ConnectorError",
    "ConnectorProtocolError",
    "CreditExhaustedError",
    "Credits",
    "Dialect",
    "DialectError",
    "DropReason",
    "EndpointConfig",
    "Event",
    "Frame",
    "FrameDecoder",
    "FrameTooLargeError",
    "FrameType",
    "HandshakeError",
    "Hello",
    "IngestResult",
    "LocalProtocolError",
    "MalformedFrameError",
    "MessageDropped",
    "MessageFlags",
    "MessageRun",
    "MessageReceived",
    "Nacked",
    "NoCreditError",
    "PeerError",
    "ProtocolFailed",
    "RestartRequested",
    "RewindError",
    "Role",
    "SourceConnection",
    "StreamAccepted",
    "StreamClosedError",
    "StreamEnded",
    "StreamInfo",
    "StreamInput",
    "StreamOpened",
    "StreamRefusedError",
    "StreamRejected",
    "StreamState",
    "TooManyStreamsError",
    "UnexpectedFrameError",
    "UnknownStreamError",
    "UnknownTagError",
    "VersionMismatchError",
    "WorkerConnection",
    "connection_transition",
    "derive_cookie",
    "detect_dialect",
    "draft",
    "ingest",
    "parse_stream_name",
    "released",
    "run_connector_broker",
    "serve_connector_broker",
    "stream_transition",
]
