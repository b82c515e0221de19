"""Fast paths for the one frame that dominates a connector session: MESSAGE.

`WorkerConnection` and `SourceConnection` build a frame struct, look up two state tables and make
an event object per message: about 20 us each, which caps an endpoint near 40,000 messages/s.
Almost every frame of a busy session is a plain MESSAGE on an open stream, so the two classes here
handle exactly that case with one precompiled struct per frame and fall back to the base class
for everything else, which keeps every check and every error message in one place:

- `BulkWorkerConnection.receive_data` returns consecutive plain messages of one stream as one
  `MessageRun` event instead of one `MessageReceived` each. A frame the fast path does not fully
  understand (a flag other than EVENT_TIME/EPHEMERAL/UNSTABLE_REFERENCE, a duplicate id, a stream
  that is not open, no credit, a short body) goes through `WorkerConnection` unchanged, so its
  events and errors are exactly the base class's.
- `BulkSourceConnection.send_messages` encodes a run of messages of one open stream in one call,
  byte for byte what `send_message` would produce for each.

Both update the same counters the base class keeps (credits, the stream's last message id), so
base-class frames and fast frames interleave freely. The equivalence is property-tested
(tests/querylib/connector/test_endpoint_bulk.py). Sans-I/O like the rest of the package.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from ._dialect import Dialect
from ._errors import ConnectorProtocolError, LocalProtocolError, NoCreditError
from ._events import Event, MessageFlags
from ._session import require_id
from ._source import SourceConnection
from ._state import ConnectionState, StreamState
from ._wire import U64_MAX
from ._worker import WorkerConnection

__all__ = ["BulkSourceConnection", "BulkWorkerConnection", "MessageRun", "OutgoingMessage"]

_STREAMING = ConnectionState.STREAMING
_OPEN = StreamState.OPEN
_TERMINAL = (ConnectionState.ERROR, ConnectionState.CLOSED)

_EVENT_TIME = int(MessageFlags.EVENT_TIME)
_EPHEMERAL = int(MessageFlags.EPHEMERAL)
# Flags the fast path delivers itself; BOUNDARY and EOS change stream state (and reserved bits are
# errors), so frames carrying them take the base class's path.
_FAST_FLAGS = int(MessageFlags.EVENT_TIME | MessageFlags.EPHEMERAL
                  | MessageFlags.UNSTABLE_REFERENCE)

# draft MESSAGE: length:u32 tag:u8 | stream_id:u64 flags:u16 message_id:u64 [event_time:u64] payload
_DRAFT_TAG = ord("M")
_DRAFT_TIME = struct.Struct("<Q")
_DRAFT_FRAME = struct.Struct("<IBQHQ")
_DRAFT_FRAME_TIME = struct.Struct("<IBQHQQ")
_LE_LENGTH, _BE_LENGTH = struct.Struct("<I"), struct.Struct(">I")
# released MESSAGE: length:u32 tag:u8 | stream_id:u64 message_id:u64 event_time:i64 key:str payload
_RELEASED_TAG = 5
_RELEASED_FRAME = struct.Struct(">IBQQqH")

OutgoingMessage = tuple[int, bytes, "int | None", "bytes | None"]  # (id, payload, time, key)


class MessageRun(Event, frozen=True):
    """Consecutive new messages of one open stream, in order (what `MessageReceived` events
    would say, one tuple each): (message_id, payload, event_time, key, flags)."""

    stream_id: int
    messages: list[tuple[int, bytes, int | None, bytes | None, int]]
    nbytes: int = 0  # the frames' size on the wire, an upper bound of the payloads'


class BulkWorkerConnection(WorkerConnection):
    """A `WorkerConnection` whose `receive_data` delivers plain messages as `MessageRun`s.

    While streaming it splits frames itself (complete frames only; a partial one waits in
    `_partial`, never more than one frame) and hands every frame it does not take to the base
    class one at a time, so the base decoder never holds bytes between calls. A length prefix
    of 0 or beyond the maximum goes to the base decoder too, which reports it.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._partial = b""

    @property
    def buffered(self) -> int:
        return super().buffered + len(self._partial)

    def receive_data(self, data: bytes) -> list[Event]:
        decoder = self._decoder
        if (self._state is not _STREAMING or decoder is None or decoder.buffered
                or self._adapter is None):
            return super().receive_data(data)
        events: list[Event] = []
        buf = self._partial + data if self._partial else bytes(data)
        self._partial = b""
        try:
            pos = self._scan(buf, events, self._adapter.dialect is Dialect.RELEASED)
            if self._state is _STREAMING and pos < len(buf):
                self._partial = buf[pos:]
        except ConnectorProtocolError as exc:
            events.append(self._fail(exc))
        if self._state in _TERMINAL:
            self._decoder = None
            self._partial = b""
        return events

    def _scan(self, buf: bytes, events: list[Event], released: bool) -> int:
        """Handle every complete frame of `buf`; return where the incomplete rest starts.

        The hot loop reads a MESSAGE's length, tag and fixed fields with one struct call and
        keeps the connection's counters in locals (credits, the current run's stream and last
        id); they are written back before any frame goes to the base class and at the end, so
        the base class always sees them exact."""
        if released:
            frame_of, message_tag, head_size = _RELEASED_FRAME.unpack_from, _RELEASED_TAG, 26
            length_of = _BE_LENGTH.unpack_from
        else:
            frame_of, message_tag, head_size = _DRAFT_FRAME.unpack_from, _DRAFT_TAG, 18
            length_of = _LE_LENGTH.unpack_from
        full = 5 + head_size
        time_of = _DRAFT_TIME.unpack_from
        limit = self._max_frame_size
        streams = self._streams
        credits = self._credits
        avail = credits.available
        size = len(buf)
        pos = 0
        # The messages of the run being filled: the (message_id, payload, event_time, key,
        # flags) of MessageRun.messages.
        run: list[tuple[int, bytes, int | None, bytes | None, int]] | None = None
        run_sid = -1
        run_stream: Any = None
        run_last: int | None = None
        run_start = 0

        def finish(end: int) -> None:
            run_stream.last_message_id = run_last
            events.append(MessageRun(run_sid, run, end - run_start))  # type: ignore[arg-type]  # a run is open

        while True:
            if size - pos >= full:
                if released:
                    length, tag, sid, mid, event_time, key_size = frame_of(buf, pos)
                    flags = _EVENT_TIME if event_time else 0
                    start = pos + full + key_size
                else:
                    length, tag, sid, flags, mid = frame_of(buf, pos)
                    event_time = None
                    start = pos + full
                end = pos + 4 + length
                if (tag == message_tag and head_size < length <= limit and end <= size
                        and avail > 0 and start <= end and not flags & ~_FAST_FLAGS):
                    ok = True
                    if flags & _EVENT_TIME and not released:
                        ok = start + 8 <= end
                        if ok:
                            (event_time,) = time_of(buf, start)
                            start += 8
                    if ok and sid != run_sid:
                        if run is not None:
                            finish(pos)
                            run, run_sid = None, -1
                        stream = streams.get(sid)
                        if stream is not None and stream.state is _OPEN:
                            run, run_sid, run_stream = [], sid, stream
                            run_last, run_start = stream.last_message_id, pos
                        else:
                            ok = False
                    if ok and (flags & _EPHEMERAL or run_last is None or mid > run_last):
                        if not flags & _EPHEMERAL:
                            run_last = mid
                        avail -= 1
                        if released:
                            key = buf[start - key_size:start] if key_size else None
                            run.append((mid, buf[start:end], event_time or None,  # type: ignore[union-attr]  # ok: a run is open
                                        key, flags))
                        else:
                            run.append((mid, buf[start:end], event_time, None,  # type: ignore[union-attr]  # ok: a run is open
                                        flags))
                        pos = end
                        continue
            # Anything else goes through the base class, one frame at a time, with exact
            # counters; a bad length prefix too (the base decoder reports it).
            if size - pos < 4:
                break
            (length,) = length_of(buf, pos)
            end = pos + 4 + length
            bad = length == 0 or length > limit
            if end > size and not bad:
                break
            if run is not None:
                finish(pos)
                run, run_sid = None, -1
            credits.spent += credits.available - avail
            credits.available = avail
            self._slow(buf[pos:] if bad else buf[pos:end], events)
            avail = credits.available
            pos = size if bad else end
            if self._state is not _STREAMING:
                return size
        if run is not None:
            finish(pos)
        credits.spent += credits.available - avail
        credits.available = avail
        return pos

    def _slow(self, frame: bytes, events: list[Event]) -> None:
        """One frame (or a bad length prefix and what follows) through the base class."""
        decoder = self._decoder
        assert decoder is not None
        decoder.feed(frame)
        raw = decoder.next_raw()
        if raw is not None:
            self._receive(*raw, events)


class BulkSourceConnection(SourceConnection):
    """A `SourceConnection` that can encode a run of plain messages of one stream at once."""

    def send_messages(self, stream_id: int, messages: Sequence[OutgoingMessage]) -> bytes:
        """MESSAGE frames for `messages` (message_id, payload, event_time, key) on an open
        stream, each costing a credit: the bytes `send_message` would return for each, joined.
        Raises (and sends nothing) when the run would break a rule `send_message` checks."""
        if self._state in _TERMINAL:
            return b""
        if not messages:
            return b""
        self._require_streaming()
        stream = self._open_stream(stream_id)
        if len(messages) > self._credits.available:
            raise NoCreditError(f"{len(messages)} messages need as many credits; "
                                f"{self._credits.available} left")
        assert self._adapter is not None
        released = self._adapter.dialect is Dialect.RELEASED
        limit = self._max_frame_size
        parts: list[bytes] = []
        add = parts.append
        last = stream.last_message_id
        try:
            for mid, payload, event_time, key in messages:
                if type(mid) is not int:
                    raise struct.error("message id is not an int")
                if released:
                    if event_time == 0 or key == b"":
                        raise LocalProtocolError("event_time 0 and an empty key mean 'none' in "
                                                 "the released dialect")
                    key = key or b""
                    size = 1 + _RELEASED_FRAME.size - 5 + len(key) + len(payload)
                    if size > limit:
                        raise LocalProtocolError(f"MESSAGE of {size} bytes exceeds the maximum "
                                                 f"frame size {limit}")
                    add(_RELEASED_FRAME.pack(size, _RELEASED_TAG, stream_id, mid,
                                             event_time or 0, len(key)))
                    if key:
                        add(key)
                elif key is not None:
                    raise LocalProtocolError("the draft dialect has no message key")
                elif event_time is None:
                    size = 1 + _DRAFT_FRAME.size - 5 + len(payload)
                    if size > limit:
                        raise LocalProtocolError(f"MESSAGE of {size} bytes exceeds the maximum "
                                                 f"frame size {limit}")
                    add(_DRAFT_FRAME.pack(size, _DRAFT_TAG, stream_id, 0, mid))
                else:
                    size = 1 + _DRAFT_FRAME_TIME.size - 5 + len(payload)
                    if size > limit:
                        raise LocalProtocolError(f"MESSAGE of {size} bytes exceeds the maximum "
                                                 f"frame size {limit}")
                    add(_DRAFT_FRAME_TIME.pack(size, _DRAFT_TAG, stream_id, _EVENT_TIME, mid,
                                               event_time))
                add(payload)
                last = mid
        except struct.error as exc:
            bad = next(m for m in messages if not _valid(m, released))
            raise LocalProtocolError(f"message {bad[0]!r} has a field out of range: "
                                     f"{exc}") from None
        data = b"".join(parts)
        self._credits.available -= len(messages)
        self._credits.spent += len(messages)
        stream.last_message_id = last
        return data


def _valid(message: OutgoingMessage, released: bool) -> bool:
    mid, _payload, event_time, _key = message
    try:
        require_id(mid, "message id")
    except LocalProtocolError:
        return False
    if event_time is None:
        return True
    if released:
        return -(2**63) <= event_time < 2**63
    return 0 <= event_time <= U64_MAX
