"""Translation between the one event/command vocabulary and each dialect's frames.

Everything a connection needs to know about a dialect lives in its adapter: the codec, the
expected version, the state tables, how a point of reference is written on the wire, which frame
answers a NOTIFY, what stands in for a frame the dialect lacks. The connection objects hold one
adapter and contain no dialect branches.

Points of reference: the vocabulary is `processed` (id of the last message processed, None for
nothing). The draft writes the inclusive start of what to resend (processed + 1, 0 for nothing);
the released dialect writes the processed id itself (2^64-1 for nothing). Either way the id
2^64-1 cannot be a checkpoint: converting it raises LocalProtocolError.

Pure functions of their arguments; no I/O, no state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from . import draft, released
from ._dialect import Dialect
from ._errors import LocalProtocolError, MalformedFrameError
from ._events import KNOWN_FLAGS, MessageFlags
from ._state import (
    DRAFT_CONNECTION,
    DRAFT_STREAMS,
    RELEASED_CONNECTION,
    RELEASED_STREAMS,
)
from ._wire import U16_MAX, U64_MAX, Codec, Frame

__all__ = ["ADAPTERS", "Adapter", "IncomingMessage", "reason_bytes"]

_EVENT_TIME = int(MessageFlags.EVENT_TIME)  # plain ints: IntFlag arithmetic is slow
_BOUNDARY = int(MessageFlags.BOUNDARY)


class IncomingMessage(NamedTuple):
    stream_id: int
    message_id: int
    flags: int  # MessageFlags bits; a plain int because IntFlag arithmetic is slow
    event_time: int | None
    key: bytes | None
    payload: bytes


def reason_bytes(reason: str) -> bytes:
    """`reason` as UTF-8, cut at a character boundary to fit a 16-bit length."""
    data = reason.encode("utf-8", "replace")
    if len(data) > U16_MAX:
        data = data[:U16_MAX].decode("utf-8", "ignore").encode("utf-8")
    return data


def _checkpoint(processed: int | None) -> int | None:
    if processed is None:
        return None
    if not isinstance(processed, int) or isinstance(processed, bool):
        raise LocalProtocolError(f"processed must be an int or None, not {processed!r}")
    if not 0 <= processed < U64_MAX:
        raise LocalProtocolError(f"processed={processed} is not a message id in [0, 2^64-2]")
    return processed


class Adapter:
    """What the connections need from a dialect (the draft and released subclasses fill it in)."""

    dialect: Dialect
    codec: Codec
    version: str
    connection_table: dict
    stream_table: dict
    end_costs_credit: bool  # does ending a stream spend a credit (a draft EOS is a MESSAGE)?

    def encode(self, frame: Frame) -> bytes:
        return self.codec.encode(frame)

    # points of reference
    def to_point(self, processed: int | None) -> int:
        raise NotImplementedError

    def from_point(self, point: int) -> int | None:
        raise NotImplementedError

    # frames either side may send
    def error(self, reason: str) -> Frame:
        raise NotImplementedError

    def error_reason(self, frame: Any) -> str:
        raise NotImplementedError

    # connector -> worker
    def hello(self, version: str, cookie: bytes, program: str, instance: str) -> Frame:
        cls = self.codec.by_type[draft.Hello.frame_type]
        return cls(version.encode(), cookie, program.encode(), instance.encode())

    def notify(self, stream_id: int, name: str, processed: int | None) -> Frame:
        cls = self.codec.by_type[draft.Notify.frame_type]
        return cls(stream_id, name.encode(), self.to_point(processed))

    def message(
        self,
        stream_id: int,
        message_id: int,
        payload: bytes,
        flags: MessageFlags,
        event_time: int | None,
        key: bytes | None,
    ) -> Frame:
        raise NotImplementedError

    def end_stream(self, stream_id: int, message_id: int) -> Frame:
        raise NotImplementedError

    def incoming_message(self, frame: Any) -> IncomingMessage:
        raise NotImplementedError

    # worker -> connector
    def ok(self, initial_credits: int, resume_points: Mapping[int, int | None],
           max_frame_size: int) -> Frame:
        """OK granting `initial_credits`, with as many of `resume_points` as one frame of
        `max_frame_size` holds (the others are the NOTIFYs' business)."""
        raise NotImplementedError

    def resume_points(self, frame: Any) -> tuple[tuple[int, int | None], ...]:
        return ()

    def answer_notify(self, stream_id: int, success: bool, processed: int | None) -> Frame | None:
        raise NotImplementedError

    def ack(self, credits: int, acks: Iterable[tuple[int, int]]) -> Frame:
        cls = self.codec.by_type[draft.Ack.frame_type]
        return cls(credits, tuple(acks))

    def nack(self, stream_id: int, processed: int | None, credits: int) -> Frame:
        raise NotImplementedError

    def restart(self, address: str) -> Frame:
        raise NotImplementedError


class DraftAdapter(Adapter):
    dialect = Dialect.DRAFT
    codec = draft.CODEC
    version = draft.VERSION
    connection_table = DRAFT_CONNECTION
    stream_table = DRAFT_STREAMS
    end_costs_credit = True

    def to_point(self, processed: int | None) -> int:
        processed = _checkpoint(processed)
        return 0 if processed is None else processed + 1

    def from_point(self, point: int) -> int | None:
        return None if point == 0 else point - 1

    def error(self, reason: str) -> Frame:
        return draft.Error(reason_bytes(reason))

    def error_reason(self, frame: Any) -> str:
        return frame.reason.decode("utf-8", "replace")

    def message(self, stream_id, message_id, payload, flags, event_time, key) -> Frame:
        if key is not None:
            raise LocalProtocolError("the draft dialect has no message key")
        flags = int(flags) & ~_EVENT_TIME  # set from event_time below
        if flags & ~KNOWN_FLAGS:
            raise LocalProtocolError(f"unknown message flags {flags & ~KNOWN_FLAGS:#x}")
        if flags & _BOUNDARY and payload:
            raise LocalProtocolError("a BOUNDARY message carries no payload")
        if event_time is not None:
            flags |= _EVENT_TIME
        return draft.Message(stream_id, flags, message_id, event_time, payload)

    def end_stream(self, stream_id: int, message_id: int) -> Frame:
        # "Boundaries may also denote the end of the stream if there is no message to apply
        # that notation to" (seed [D0]).
        flags = MessageFlags.BOUNDARY | MessageFlags.EOS
        return draft.Message(stream_id, int(flags), message_id)

    def incoming_message(self, frame: Any) -> IncomingMessage:
        flags = frame.flags
        if flags & ~KNOWN_FLAGS:
            # Reserved bits may one day change the layout (the seed mentions variable-size ids),
            # so a frame that sets them cannot be trusted to mean what we would decode.
            raise MalformedFrameError(f"MESSAGE sets reserved flag bits {flags & ~KNOWN_FLAGS:#x}")
        if flags & _BOUNDARY and frame.payload:
            raise MalformedFrameError("a BOUNDARY MESSAGE carries a payload")
        return IncomingMessage(
            frame.stream_id, frame.message_id, flags, frame.event_time, None, frame.payload
        )

    def ok(self, initial_credits: int, resume_points: Mapping[int, int | None],
           max_frame_size: int) -> Frame:
        points = tuple((sid, self.to_point(p)) for sid, p in resume_points.items())
        # tag:u8 initial_credits:u32, then 16 bytes a point
        return draft.Ok(initial_credits, points[:max(0, (max_frame_size - 5) // 16)])

    def resume_points(self, frame: Any) -> tuple[tuple[int, int | None], ...]:
        return tuple((sid, self.from_point(p)) for sid, p in frame.points_of_reference)

    def answer_notify(self, stream_id: int, success: bool, processed: int | None) -> Frame | None:
        return None  # the draft opens a stream on NOTIFY; it has no per-stream answer

    def nack(self, stream_id: int, processed: int | None, credits: int) -> Frame:
        return draft.Nack(credits, stream_id, self.to_point(processed))

    def restart(self, address: str) -> Frame:
        # The draft has no RESTART; an ERROR also makes the connector reopen a connection.
        where = f"; reconnect to {address}" if address else ""
        return draft.Error(reason_bytes(f"restart requested{where}"))


class ReleasedAdapter(Adapter):
    dialect = Dialect.RELEASED
    codec = released.CODEC
    version = released.VERSION
    connection_table = RELEASED_CONNECTION
    stream_table = RELEASED_STREAMS
    end_costs_credit = False

    def to_point(self, processed: int | None) -> int:
        processed = _checkpoint(processed)
        return released.NOTHING_PROCESSED if processed is None else processed

    def from_point(self, point: int) -> int | None:
        return None if point == released.NOTHING_PROCESSED else point

    def error(self, reason: str) -> Frame:
        return released.Error(reason_bytes(reason))

    def error_reason(self, frame: Any) -> str:
        return frame.message.decode("utf-8", "replace")

    def message(self, stream_id, message_id, payload, flags, event_time, key) -> Frame:
        if int(flags) & ~_EVENT_TIME:
            raise LocalProtocolError("the released dialect has no message flags; use end_stream")
        if event_time == 0:
            raise LocalProtocolError("event_time 0 means 'none' in the released dialect")
        if key == b"":
            raise LocalProtocolError("an empty key means 'no key' in the released dialect")
        return released.Message(stream_id, message_id, event_time or 0, key or b"", payload)

    def end_stream(self, stream_id: int, message_id: int) -> Frame:
        return released.Eos(stream_id)

    def incoming_message(self, frame: Any) -> IncomingMessage:
        event_time = frame.event_time or None
        flags = 0 if event_time is None else _EVENT_TIME
        return IncomingMessage(
            frame.stream_id, frame.message_id, flags, event_time, frame.key or None, frame.payload
        )

    def ok(self, initial_credits: int, resume_points: Mapping[int, int | None],
           max_frame_size: int) -> Frame:
        for processed in resume_points.values():
            _checkpoint(processed)  # validated alike in both dialects; sent with NOTIFY_ACK
        return released.Ok(initial_credits)

    def answer_notify(self, stream_id: int, success: bool, processed: int | None) -> Frame | None:
        return released.NotifyAck(success, stream_id, self.to_point(processed))

    def nack(self, stream_id: int, processed: int | None, credits: int) -> Frame:
        raise LocalProtocolError("the released dialect has no NACK; use restart()")

    def restart(self, address: str) -> Frame:
        return released.Restart(address.encode())


ADAPTERS: dict[Dialect, Adapter] = {
    Dialect.DRAFT: DraftAdapter(),
    Dialect.RELEASED: ReleasedAdapter(),
}
