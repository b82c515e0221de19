"""The draft dialect of the connector protocol (seed 002), frame by frame.

Wire format (every integer little-endian, as the seed's u16/u32/u64 constructors and its [B0]
note say):

    frame        = length:u32  tag:u8  fields...
                   length counts the tag and the fields, not its own 4 bytes (the seed's
                   frame/1 measures the whole message iolist, which starts with the tag)
    short_bytes  = size:u16  data[size]       (short_bytes(undefined) is size 0: same bytes as b"")

    tag            fields
    HELLO   'H'    version:short_bytes  cookie:short_bytes  program_name:short_bytes
                   instance_name:short_bytes
    OK      'O'    initial_credits:u32  then (stream_id:u64 point_of_reference:u64) pairs to the end
    ERROR   'E'    reason:short_bytes
    NOTIFY  'N'    stream_id:u64  stream_name:short_bytes  point_of_reference:u64
    MESSAGE 'M'    stream_id:u64  flags:u16  message_id:u64
                   [event_time:u64, present iff flags & EVENT_TIME]  payload: rest of the frame
    ACK     'A'    credits:u32  then (stream_id:u64 message_id:u64) pairs to the end
    NACK    '!'    credits:u32  stream_id:u64  point_of_reference:u64

Where the seed is silent or contradicts itself, tq chose (and the codec is consistent with):
- version: the seed calls an undefined `version(Revision)` on an integer yet speaks of a "version
  GUID". tq sends a short_bytes ASCII version string, matched exactly; tq's is `VERSION`.
- MESSAGE stream id: the seed's message/3 encodes no stream id, but its prose says NOTIFY maps a
  name "to the id which message frames will use" and that a message "with a stream id that has
  not been properly described using a notification is an error". tq puts stream_id:u64 right
  after the tag, where NOTIFY and the released dialect have it.
- point_of_reference is a u64 (the seed's point_of_reference/1 rejects anything else) and is the
  inclusive start of what the connector (re)sends: "the starting bound is inclusive", a fresh
  stream sends 0, nack(undefined) sends 0. The connection objects convert it to and from "id of
  the last message processed" (`processed - 1`), the one vocabulary the endpoint sees.
- flags: the codec carries any u16 so decode->encode is exact; reserved bits and a BOUNDARY with
  a payload are rejected by the connection objects, which know what the bits mean.

This module only declares frames and their layout; it does no I/O and holds no state.
"""

from __future__ import annotations

from typing import ClassVar

from ._state import FrameType
from ._wire import (
    DEFAULT_MAX_FRAME_SIZE,
    Bytes,
    Codec,
    Frame,
    IfFlag,
    Int,
    Pairs,
    Rest,
)
from ._wire import FrameDecoder as _FrameDecoder

__all__ = [
    "CODEC",
    "EVENT_TIME",
    "VERSION",
    "Ack",
    "DraftFrame",
    "Error",
    "FrameDecoder",
    "Hello",
    "Message",
    "Nack",
    "Notify",
    "Ok",
    "encode",
]

VERSION = "tq-connector-draft-1"

# Message bit-flags (seed constants); querylib.connector.MessageFlags names them all.
EVENT_TIME = 16

_U16, _U32, _U64 = Int("<H"), Int("<I"), Int("<Q")
_SHORT_BYTES = Bytes("<H")


class Hello(Frame, frozen=True):
    """Connector -> worker, first frame of a session."""

    tag: ClassVar[int] = ord("H")
    frame_type: ClassVar[FrameType] = FrameType.HELLO
    version: bytes
    cookie: bytes
    program_name: bytes
    instance_name: bytes
    layout: ClassVar = (
        ("version", _SHORT_BYTES),
        ("cookie", _SHORT_BYTES),
        ("program_name", _SHORT_BYTES),
        ("instance_name", _SHORT_BYTES),
    )


class Ok(Frame, frozen=True):
    """Worker -> connector: the handshake succeeded; credits and where to resume each stream."""

    tag: ClassVar[int] = ord("O")
    frame_type: ClassVar[FrameType] = FrameType.OK
    initial_credits: int
    points_of_reference: tuple[tuple[int, int], ...] = ()  # (stream_id, point_of_reference)
    layout: ClassVar = (
        ("initial_credits", _U32),
        ("points_of_reference", Pairs("<", counted=False)),
    )


class Error(Frame, frozen=True):
    """Either side: the session is over; reason says why."""

    tag: ClassVar[int] = ord("E")
    frame_type: ClassVar[FrameType] = FrameType.ERROR
    reason: bytes
    layout: ClassVar = (("reason", _SHORT_BYTES),)


class Notify(Frame, frozen=True):
    """Connector -> worker: introduce (or re-introduce) a stream id and its name. Costs a credit."""

    tag: ClassVar[int] = ord("N")
    frame_type: ClassVar[FrameType] = FrameType.NOTIFY
    stream_id: int
    stream_name: bytes
    point_of_reference: int
    layout: ClassVar = (
        ("stream_id", _U64),
        ("stream_name", _SHORT_BYTES),
        ("point_of_reference", _U64),
    )


class Message(Frame, frozen=True):
    """Connector -> worker: one message (or boundary) of an open stream. Costs a credit."""

    tag: ClassVar[int] = ord("M")
    frame_type: ClassVar[FrameType] = FrameType.MESSAGE
    stream_id: int
    flags: int
    message_id: int
    event_time: int | None = None  # present iff flags & EVENT_TIME
    payload: bytes = b""
    layout: ClassVar = (
        ("stream_id", _U64),
        ("flags", _U16),
        ("message_id", _U64),
        ("event_time", IfFlag(_U64, "flags", EVENT_TIME)),
        ("payload", Rest()),
    )


class Ack(Frame, frozen=True):
    """Worker -> connector: more credits, and the last message processed per stream."""

    tag: ClassVar[int] = ord("A")
    frame_type: ClassVar[FrameType] = FrameType.ACK
    credits: int
    acks: tuple[tuple[int, int], ...] = ()  # (stream_id, message_id)
    layout: ClassVar = (("credits", _U32), ("acks", Pairs("<", counted=False)))


class Nack(Frame, frozen=True):
    """Worker -> connector: more credits; rewind one stream to a point and re-introduce it."""

    tag: ClassVar[int] = ord("!")
    frame_type: ClassVar[FrameType] = FrameType.NACK
    credits: int
    stream_id: int
    point_of_reference: int
    layout: ClassVar = (("credits", _U32), ("stream_id", _U64), ("point_of_reference", _U64))


DraftFrame = Hello | Ok | Error | Notify | Message | Ack | Nack

CODEC = Codec("draft", "<I", (Hello, Ok, Error, Notify, Message, Ack, Nack))


def encode(frame: DraftFrame) -> bytes:
    """The complete bytes of a draft frame (length prefix included)."""
    return CODEC.encode(frame)


class FrameDecoder(_FrameDecoder):
    """Splits a draft byte stream into frames; see `querylib.connector._wire.FrameDecoder`."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        super().__init__(CODEC, max_frame_size)
