"""The worker (server) side of a connector connection, sans-I/O.

The endpoint owns a socket and a `WorkerConnection` per connection. It passes received bytes to
`receive_data`, acts on the events that come back, and writes the bytes every command returns:

    conn = WorkerConnection(cookie=b"secret")
    for event in conn.receive_data(chunk):
        match event:
            case Hello():           send(conn.accept(initial_credits=64, resume_points=known))
            case StreamOpened():    send(conn.accept_stream(event.stream_id, processed=...))
            case MessageReceived(): append it; later send(conn.ack(credits=n, acks=[(sid, mid)]))
            case MessageDropped():  it still spent a credit: grant it back with the next ack
            case StreamEnded():     ...
            case PeerError():       close
            case ProtocolFailed():  send(event.reply); close

Events come in batches: a later frame of a batch may end the session (ProtocolFailed, PeerError
are always last) before the endpoint acts on earlier events. Once the session has ended every
command returns b"" and changes nothing, so the loop above needs no state checks. Frames that
must wait for an answer (NOTIFY after HELLO before OK; released MESSAGE before NOTIFY_ACK) are
protocol errors even within one batch: the connector cannot have seen the answer yet.

The dialect is detected from the first frame (or fixed by `dialects=(Dialect.X,)`); events and
commands are the same for both. What a dialect lacks is emulated where the meaning survives:
the draft has no NOTIFY_ACK (`accept_stream` sends nothing, `reject_stream` ends the session with
ERROR) and no RESTART (`restart` sends ERROR, which also makes a connector reconnect); the
released dialect has no NACK (`nack` raises LocalProtocolError: use `restart`).

Checks done here, each answered with an ERROR frame naming the problem: exact version and
cookie, program and instance names without NUL (tq's stream ids join them with it), the
connection and stream state tables, credit (a NOTIFY or MESSAGE without credit), streams never
introduced or already ended, the maximum frame size, reserved draft flag bits, and a bound on
the number of streams. (A first frame of neither dialect gets no reply: its framing
is unknown.) Duplicates (message id <= the last id seen on the stream,
except draft EPHEMERAL messages) are dropped and reported as `MessageDropped`.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from typing import Any

from ._adapters import ADAPTERS
from ._dialect import Dialect, detect_dialect
from ._errors import (
    BadCookieError,
    CreditExhaustedError,
    DialectError,
    HandshakeError,
    LocalProtocolError,
    TooManyStreamsError,
    VersionMismatchError,
)
from ._events import (
    DropReason,
    Event,
    Hello,
    MessageDropped,
    MessageFlags,
    MessageReceived,
    PeerError,
    StreamEnded,
    StreamOpened,
)
from ._session import Session, Stream, command, require_id, text
from ._state import FrameType, Role, StreamInput, StreamState
from ._wire import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, Frame

__all__ = ["DEFAULT_MAX_STREAMS", "WorkerConnection"]

# Every MessageFlags value a delivered message can carry (reserved bits are refused), built once:
# constructing IntFlag members per message is slow.
_FLAGS = tuple(MessageFlags(bits) for bits in range(32))
_EOS, _EPHEMERAL = int(MessageFlags.EOS), int(MessageFlags.EPHEMERAL)

DEFAULT_MAX_STREAMS = 65536  # per connection; each stream costs the connector a credit anyway


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _source_name(data: bytes, what: str) -> str:
    """A HELLO's program or instance name. NUL separates them in the id of each stream of the
    instance (`_records.source_id`, the producerId of its batches), so a name holding one could
    give two instances the same ids: refused (every id of a valid name stays what it was)."""
    name = text(data, what)
    if "\0" in name:
        raise HandshakeError(f"{what} {name[:80]!r} contains a NUL character; choose one "
                             "without")
    return name


class WorkerConnection(Session):
    """The worker's side of one connector connection: bytes in, events out, commands -> bytes."""

    role = Role.WORKER
    peer = Role.CONNECTOR

    def __init__(
        self,
        *,
        cookie: bytes | str = b"",
        dialects: Iterable[Dialect] = (Dialect.DRAFT, Dialect.RELEASED),
        versions: Mapping[Dialect, str] | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_streams: int = DEFAULT_MAX_STREAMS,
    ) -> None:
        super().__init__(max_frame_size=max_frame_size)
        self._cookie = _as_bytes(cookie)
        self._dialects = tuple(dict.fromkeys(dialects))
        if not self._dialects:
            raise LocalProtocolError("a worker must accept at least one dialect")
        versions = dict(versions or {})
        self._versions = {d: versions.get(d, ADAPTERS[d].version).encode() for d in self._dialects}
        self._max_streams = max_streams
        self._sniffed = b""
        # Draft: where each stream resumes (from accept() and nack()), applied at its NOTIFY.
        self._rewind: dict[int, int | None] = {}
        self._handlers = {
            FrameType.HELLO: self._on_hello,
            FrameType.ERROR: self._on_error,
            FrameType.NOTIFY: self._on_notify,
            FrameType.MESSAGE: self._on_message,
            FrameType.EOS: self._on_eos,
        }
        if len(self._dialects) == 1:
            # One dialect: no sniffing, so the state table alone judges the first frame.
            self._use(ADAPTERS[self._dialects[0]])

    # -- receiving ------------------------------------------------------------------------------

    def _before_decoder(self, data: bytes) -> bytes | None:
        if self._decoder is not None:
            return data
        # Keep at most HEADER_SIZE + 1 bytes while the dialect is unknown.
        need = HEADER_SIZE + 1 - len(self._sniffed)
        self._sniffed += bytes(data[:need])
        dialect = detect_dialect(self._sniffed)
        if dialect is None:
            return None
        if dialect not in self._dialects:
            raise DialectError(f"this worker does not accept the {dialect.value} dialect")
        self._use(ADAPTERS[dialect])
        data, self._sniffed = self._sniffed + bytes(data[need:]), b""
        return data

    def _check_before_decode(self, cls: type[Frame], body: bytes) -> None:
        # The seed: check the version "placed in fixed locations at the start before continuing
        # the decoding", so a HELLO of another version is reported as such whatever follows.
        if cls.frame_type is FrameType.HELLO:
            assert self._adapter is not None
            version = self._adapter.codec.peek_first_field(cls.tag, body)
            expected = self._versions[self._adapter.dialect]
            if version is not None and version != expected:
                raise VersionMismatchError(
                    f"protocol version mismatch: this worker speaks {expected.decode()!r}, "
                    f"the connector sent {version[:64].decode('utf-8', 'replace')!r}"
                )

    def _on_hello(self, frame: Any, events: list[Event]) -> None:
        if not hmac.compare_digest(frame.cookie, self._cookie):
            raise BadCookieError("bad cookie")  # never echo either cookie
        program = _source_name(frame.program_name, "program name")
        instance = _source_name(frame.instance_name, "instance name")
        assert self._adapter is not None
        events.append(Hello(self._adapter.dialect, frame.version.decode(), program, instance))

    def _on_error(self, frame: Any, events: list[Event]) -> None:
        assert self._adapter is not None
        events.append(PeerError(self._adapter.error_reason(frame)))

    def _spend(self, what: str) -> None:
        if not self._credits.try_spend():
            raise CreditExhaustedError(f"{what} sent without credit")

    def _on_notify(self, frame: Any, events: list[Event]) -> None:
        self._spend("NOTIFY")
        sid = frame.stream_id
        stream = self._streams.get(sid)
        next_state = self._stream_next(stream, sid, StreamInput.NOTIFY)
        name = text(frame.stream_name, "stream name")
        if stream is None:
            if len(self._streams) >= self._max_streams:
                raise TooManyStreamsError(f"more than {self._max_streams} streams")
            stream = self._streams[sid] = Stream(sid, name)
        if not self._apply_notify(stream, next_state):
            return
        stream.name = name
        if sid in self._rewind:
            stream.last_message_id = self._rewind.pop(sid)
        assert self._adapter is not None
        events.append(StreamOpened(sid, name, self._adapter.from_point(frame.point_of_reference)))

    def _on_message(self, frame: Any, events: list[Event]) -> None:
        assert self._adapter is not None
        msg = self._adapter.incoming_message(frame)
        self._spend("MESSAGE")
        sid, mid, flags = msg.stream_id, msg.message_id, msg.flags
        stream = self._streams.get(sid)
        ending = bool(flags & _EOS)
        event = StreamInput.MESSAGE_EOS if ending else StreamInput.MESSAGE
        next_state = self._stream_next(stream, sid, event)
        assert stream is not None  # INTRO has no MESSAGE entry in any table
        if stream.state is StreamState.RESET:
            # Nack'ed: "all message frames [are] ignored for that stream until a new notify".
            events.append(MessageDropped(sid, mid, DropReason.RESET))
            return
        stream.state = next_state
        last = stream.last_message_id
        if not flags & _EPHEMERAL and last is not None and mid <= last:
            events.append(MessageDropped(sid, mid, DropReason.DUPLICATE))
        else:
            if not flags & _EPHEMERAL:
                stream.last_message_id = mid
            events.append(
                MessageReceived(sid, mid, msg.payload, msg.event_time, msg.key, _FLAGS[flags])
            )
        if ending:
            events.append(StreamEnded(sid))

    def _on_eos(self, frame: Any, events: list[Event]) -> None:
        sid = frame.stream_id
        stream = self._streams.get(sid)
        next_state = self._stream_next(stream, sid, StreamInput.EOS)
        assert stream is not None
        stream.state = next_state
        events.append(StreamEnded(sid))

    # -- commands -------------------------------------------------------------------------------

    @command
    def accept(
        self, initial_credits: int, resume_points: Mapping[int, int | None] | None = None
    ) -> bytes:
        """Answer `Hello` with OK: grant `initial_credits`; `resume_points` maps stream id ->
        last processed message id (None: nothing) for streams this worker has history of.

        The draft sends the points in OK (as many as one frame holds, in the mapping's order:
        a connector that was not told a stream's point learns it from the NACK a NOTIFY with
        another point gets) and drops duplicates from all of them; the released dialect sends
        them per stream in `accept_stream`, so pass the same number there too.
        """
        adapter = self._require_adapter()
        resume = dict(resume_points or {})
        for sid in resume:
            require_id(sid, "stream id")
        data = self._send(adapter.ok(initial_credits, resume, self._max_frame_size))
        self._credits.grant(initial_credits)
        self._rewind.update(resume)
        return data

    @command
    def accept_stream(self, stream_id: int, processed: int | None = None) -> bytes:
        """Answer `StreamOpened`: the stream may go on after message id `processed`.

        Released: sends NOTIFY_ACK(success) and drops ids <= `processed` as duplicates. Draft:
        the stream is already open and its resume point went out in OK, so this sends nothing.
        """
        adapter = self._require_adapter()
        self._require_streaming()
        stream = self._known_stream(stream_id)
        adapter.to_point(processed)  # validated alike in both dialects
        frame = adapter.answer_notify(stream_id, True, processed)
        if frame is None:
            return b""
        next_state = self._local_stream_next(stream, stream_id, StreamInput.NOTIFY_ACCEPTED)
        data = self._send(frame)
        stream.state = next_state
        stream.last_message_id = processed
        return data

    @command
    def reject_stream(
        self, stream_id: int, reason: str = "", processed: int | None = None
    ) -> bytes:
        """Refuse `StreamOpened`. Released: NOTIFY_ACK(failure), the session goes on. Draft: the
        dialect cannot refuse one stream, so this sends ERROR and the session ends."""
        adapter = self._require_adapter()
        self._require_streaming()
        stream = self._known_stream(stream_id)
        adapter.to_point(processed)
        frame = adapter.answer_notify(stream_id, False, processed)
        if frame is None:
            return self.error(reason or f"stream {stream_id} refused")
        next_state = self._local_stream_next(stream, stream_id, StreamInput.NOTIFY_REJECTED)
        data = self._send(frame)
        stream.state = next_state
        return data

    @command
    def ack(self, credits: int = 0, acks: Iterable[tuple[int, int]] = ()) -> bytes:
        """ACK: grant `credits` more credits and report (stream id, last processed message id)
        pairs. `ack(n)` with no pairs is a pure credit refill."""
        adapter = self._require_adapter()
        acks = tuple(acks)
        for sid, mid in acks:
            require_id(mid, "message id")
            self._local_stream_next(self._known_stream(sid), sid, StreamInput.ACK)
        data = self._send(adapter.ack(credits, acks))
        self._credits.grant(credits)
        return data

    @command
    def nack(self, stream_id: int, processed: int | None = None, credits: int = 0) -> bytes:
        """Draft NACK: grant `credits`, put the stream in reset until the connector re-introduces
        it, and have it resend after `processed`. The released dialect has none: use `restart`."""
        adapter = self._require_adapter()
        stream = self._known_stream(stream_id)
        next_state = self._local_stream_next(stream, stream_id, StreamInput.NACK)
        data = self._send(adapter.nack(stream_id, processed, credits))
        self._apply_nack(stream, next_state)
        self._rewind[stream_id] = processed
        self._credits.grant(credits)
        return data

    @command
    def restart(self, address: str = "") -> bytes:
        """Ask the connector to reconnect (to `address` if given); this session ends."""
        return self._send(self._require_adapter().restart(address))

    @command
    def error(self, reason: str) -> bytes:
        """Send ERROR with `reason`; this session ends."""
        return self._send(self._require_adapter().error(reason))
