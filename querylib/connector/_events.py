"""The one event vocabulary both dialects are translated into.

The endpoint (worker side) and the client library (connector side) see these, never dialect
frames, so neither cares which dialect the peer speaks. Points of reference are always given as
`processed`: the id of the last message the worker has processed on that stream, or None when
nothing was processed yet; the connections convert to each dialect's wire meaning.

Plain immutable records; nothing here does I/O.
"""

from __future__ import annotations

from enum import Enum, IntFlag

import msgspec

from ._dialect import Dialect
from ._errors import ConnectorProtocolError
from ._state import StreamState

__all__ = [
    "Accepted",
    "Acked",
    "DropReason",
    "Event",
    "Hello",
    "MessageDropped",
    "MessageFlags",
    "MessageReceived",
    "Nacked",
    "PeerError",
    "ProtocolFailed",
    "RestartRequested",
    "StreamAccepted",
    "StreamEnded",
    "StreamInfo",
    "StreamOpened",
    "StreamRejected",
]


class MessageFlags(IntFlag):
    """The draft's message bit-flags; released messages only ever carry EVENT_TIME."""

    EPHEMERAL = 1  # the id correlates but does not identify across sessions: no duplicate check
    BOUNDARY = 2  # a marker with no payload
    EOS = 4  # the last message of the stream
    UNSTABLE_REFERENCE = 8  # the id is not a point of reference to resume from
    EVENT_TIME = 16  # event_time is set


# A plain int: `~` on an IntFlag only complements the defined bits, hiding reserved ones.
KNOWN_FLAGS = int(
    MessageFlags.EPHEMERAL
    | MessageFlags.BOUNDARY
    | MessageFlags.EOS
    | MessageFlags.UNSTABLE_REFERENCE
    | MessageFlags.EVENT_TIME
)


class DropReason(Enum):
    DUPLICATE = "duplicate"  # id <= the last id seen on the stream
    RESET = "reset"  # draft: the stream was nack'ed and not re-introduced yet


class Event(msgspec.Struct, frozen=True):
    """Base of every event."""


# -- seen by the worker (from the connector) ----------------------------------------------------


class Hello(Event, frozen=True):
    """A connector passed the version and cookie checks. Answer with `accept` or `error`."""

    dialect: Dialect
    version: str
    program: str
    instance: str


class StreamOpened(Event, frozen=True):
    """NOTIFY: the connector introduces a stream. Answer with `accept_stream`/`reject_stream`.

    `processed` is where the connector believes the worker is (None: from the start).
    """

    stream_id: int
    name: str
    processed: int | None


class MessageReceived(Event, frozen=True):
    """A new message on an open stream (duplicates never come out as this event)."""

    stream_id: int
    message_id: int
    payload: bytes
    event_time: int | None = None
    key: bytes | None = None
    flags: MessageFlags = MessageFlags(0)


class MessageDropped(Event, frozen=True):
    """A MESSAGE that was valid but not delivered. It still spent the connector's credit."""

    stream_id: int
    message_id: int
    reason: DropReason


class StreamEnded(Event, frozen=True):
    """The stream ended (released EOS, or a draft MESSAGE with the EOS flag)."""

    stream_id: int


# -- seen by the connector (from the worker) ----------------------------------------------------


class Accepted(Event, frozen=True):
    """OK: the session is streaming. Draft workers also say where each known stream resumes."""

    initial_credits: int
    resume_points: tuple[tuple[int, int | None], ...] = ()  # (stream_id, processed)


class StreamAccepted(Event, frozen=True):
    """Released NOTIFY_ACK(success): send messages after `processed`."""

    stream_id: int
    processed: int | None


class StreamRejected(Event, frozen=True):
    """Released NOTIFY_ACK(failure): the stream may not be sent now."""

    stream_id: int
    processed: int | None


class Acked(Event, frozen=True):
    """ACK: `credits` more credits; (stream_id, processed) progress per stream."""

    credits: int
    acks: tuple[tuple[int, int], ...]


class Nacked(Event, frozen=True):
    """Draft NACK: re-introduce the stream with NOTIFY and resend after `processed`."""

    stream_id: int
    processed: int | None
    credits: int


class RestartRequested(Event, frozen=True):
    """Released RESTART: close and reconnect (to `address` if it is not empty)."""

    address: str


# -- seen by both --------------------------------------------------------------------------------


class PeerError(Event, frozen=True):
    """The peer sent ERROR; the session is over (close the transport)."""

    reason: str


class ProtocolFailed(Event, frozen=True):
    """The peer broke the protocol. Send `reply` (an ERROR frame, may be empty), then close."""

    error: ConnectorProtocolError
    reply: bytes


class StreamInfo(msgspec.Struct, frozen=True):
    """A snapshot of what a connection knows about one stream."""

    stream_id: int
    name: str
    state: StreamState
    last_message_id: int | None
