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

The modules above do no I/O: no sockets, no asyncio, no clocks. Built on them, with I/O
(the endpoint inside a broker is `querylib.server.connector`):

    Connector           (_client)  the blocking client: at-least-once resume, ids deduplicated
                        by the endpoint
    ingest              (_ingest)  lines or JSON lines from a file into a topic (`tq ingest`)

`_bulk` holds the fast MESSAGE paths both sides use (`BulkWorkerConnection`,
`BulkSourceConnection`); `_records` says how messages become records and stream names topics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from . import draft, released
    from ._bulk import BulkSourceConnection, BulkWorkerConnection, MessageRun
    from ._client import Connector, ConnectorError, RewindError, StreamRefusedError
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
    from ._ingest import IngestResult, ingest
    from ._records import FLAGS_HEADER, MSGID_HEADER, parse_stream_name
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

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
