"""The released dialect of the connector protocol: what the published connector library speaks.

Wire format (every integer big-endian):

    frame  = length:u32  tag:u8  fields...    length counts the tag byte and the fields
    str    = size:u16  data[size]

    tag               fields
    HELLO       0     version:str (must be "0.0.1")  cookie:str  program_name:str
                      instance_name:str
    OK          1     initial_credits:u32
    ERROR       2     message:str
    NOTIFY      3     stream_id:u64  stream_name:str  point_of_reference:u64
    NOTIFY_ACK  4     success:u8 (0 or 1)  stream_id:u64  point_of_reference:u64
                      (point_of_reference 2^64-1: nothing processed yet)
    MESSAGE     5     stream_id:u64  message_id:u64  event_time:i64 (0: none)
                      key:str (size 0: none)  payload: rest of the frame
    ACK         6     credits:u32  count:u32  count x (stream_id:u64 point_of_reference:u64)
    RESTART     7     address_size:u32  address[address_size] ("host:port", may be empty)
    EOS         8     stream_id:u64

Every NOTIFY and MESSAGE costs one credit; the worker refills credits with ACK. A point of
reference here is the id of the last message processed (ACK and NOTIFY_ACK), which is already
the vocabulary the connection objects expose. The frames keep the wire's sentinels (event_time 0,
empty key, 2^64-1) so decode->encode is exact; the connection objects turn them into None.

This module only declares frames and their layout; it does no I/O and holds no state.
"""

from __future__ import annotations

from typing import ClassVar

from ._state import FrameType
from ._wire import (
    DEFAULT_MAX_FRAME_SIZE,
    U64_MAX,
    Bool,
    Bytes,
    Codec,
    Frame,
    Int,
    Pairs,
    Rest,
)
from ._wire import FrameDecoder as _FrameDecoder

__all__ = [
    "CODEC",
    "NOTHING_PROCESSED",
    "VERSION",
    "Ack",
    "Eos",
    "Error",
    "FrameDecoder",
    "Hello",
    "Message",
    "Notify",
    "NotifyAck",
    "Ok",
    "ReleasedFrame",
    "Restart",
    "encode",
]

VERSION = "0.0.1"
NOTHING_PROCESSED = U64_MAX  # NOTIFY_ACK point_of_reference when the stream has no history

_U32, _U64, _I64 = Int(">I"), Int(">Q"), Int(">q")
_STR = Bytes(">H")


class Hello(Frame, frozen=True):
    """Connector -> worker, first frame of a session."""

    tag: ClassVar[int] = 0
    frame_type: ClassVar[FrameType] = FrameType.HELLO
    version: bytes
    cookie: bytes
    program_name: bytes
    instance_name: bytes
    layout: ClassVar = (
        ("version", _STR),
        ("cookie", _STR),
        ("program_name", _STR),
        ("instance_name", _STR),
    )


class Ok(Frame, frozen=True):
    """Worker -> connector: the handshake succeeded; start with this many credits."""

    tag: ClassVar[int] = 1
    frame_type: ClassVar[FrameType] = FrameType.OK
    initial_credits: int
    layout: ClassVar = (("initial_credits", _U32),)


class Error(Frame, frozen=True):
    """Either side: the session is over; message says why."""

    tag: ClassVar[int] = 2
    frame_type: ClassVar[FrameType] = FrameType.ERROR
    message: bytes
    layout: ClassVar = (("message", _STR),)


class Notify(Frame, frozen=True):
    """Connector -> worker: introduce a stream id and its name. Costs a credit."""

    tag: ClassVar[int] = 3
    frame_type: ClassVar[FrameType] = FrameType.NOTIFY
    stream_id: int
    stream_name: bytes
    point_of_reference: int
    layout: ClassVar = (
        ("stream_id", _U64),
        ("stream_name", _STR),
        ("point_of_reference", _U64),
    )


class NotifyAck(Frame, frozen=True):
    """Worker -> connector: the stream may (success) or may not start; resume after this point."""

    tag: ClassVar[int] = 4
    frame_type: ClassVar[FrameType] = FrameType.NOTIFY_ACK
    success: bool
    stream_id: int
    point_of_reference: int
    layout: ClassVar = (("success", Bool()), ("stream_id", _U64), ("point_of_reference", _U64))


class Message(Frame, frozen=True):
    """Connector -> worker: one message of an accepted stream. Costs a credit."""

    tag: ClassVar[int] = 5
    frame_type: ClassVar[FrameType] = FrameType.MESSAGE
    stream_id: int
    message_id: int
    event_time: int = 0  # 0: none
    key: bytes = b""  # empty: none
    payload: bytes = b""
    layout: ClassVar = (
        ("stream_id", _U64),
        ("message_id", _U64),
        ("event_time", _I64),
        ("key", _STR),
        ("payload", Rest()),
    )


class Ack(Frame, frozen=True):
    """Worker -> connector: more credits, and the last message processed per stream."""

    tag: ClassVar[int] = 6
    frame_type: ClassVar[FrameType] = FrameType.ACK
    credits: int
    acks: tuple[tuple[int, int], ...] = ()  # (stream_id, point_of_reference)
    layout: ClassVar = (("credits", _U32), ("acks", Pairs(">", counted=True)))


class Restart(Frame, frozen=True):
    """Worker -> connector: close this session and reconnect (to address, if not empty)."""

    tag: ClassVar[int] = 7
    frame_type: ClassVar[FrameType] = FrameType.RESTART
    address: bytes = b""
    layout: ClassVar = (("address", Bytes(">I")),)


class Eos(Frame, frozen=True):
    """Connector -> worker: the stream has ended."""

    tag: ClassVar[int] = 8
    frame_type: ClassVar[FrameType] = FrameType.EOS
    stream_id: int
    layout: ClassVar = (("stream_id", _U64),)


ReleasedFrame = Hello | Ok | Error | Notify | NotifyAck | Message | Ack | Restart | Eos

CODEC = Codec(
    "released", ">I", (Hello, Ok, Error, Notify, NotifyAck, Message, Ack, Restart, Eos)
)


def encode(frame: ReleasedFrame) -> bytes:
    """The complete bytes of a released frame (length prefix included)."""
    return CODEC.encode(frame)


class FrameDecoder(_FrameDecoder):
    """Splits a released byte stream into frames; see `querylib.connector._wire.FrameDecoder`."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        super().__init__(CODEC, max_frame_size)
