"""Sans-I/O core of the RPC layer: frames in, typed messages out, and back; signing; replays.

A message on the wire (the ROUTER side also sees the peer's identity frame in front, which the
shell strips before calling `decode`) is one envelope frame, then its payload frames:

    [signature | header length | header | body][payload...]

    signature  32 bytes, keyed BLAKE3 (`Signer`, with the key of the principal the header
               names, for the audience of the server: `_credentials`) over the count and
               lengths (8-byte little-endian each) of header, body and payload frames, the
               header and body, and the BLAKE3-256 digest of each payload frame; the lengths
               bind the boundaries, so bytes cannot be moved between header, body and payload
    header length  2 bytes, little-endian
    header     `Header`, MessagePack array, naming the sender's principal
    body       the message struct (or `ErrorBody`), MessagePack: the rest of the frame
    payload    raw bytes (record batches), never copied into the body

One frame rather than three for what every message has: zmq sends, queues and receives per
frame, and a small request is all envelope. The body is copied once into the envelope; big
data belongs in payload frames, which are never copied.

A BATCH message (header kind 4) carries several requests (client->server) or several replies
and errors (server->client) without payload: its body is a MessagePack array of `Entry`
(kind, id, tag, ttl, body), so one signature, one header, one replay check and one zmq send
serve them all. A client coalesces the requests it issues in one loop turn into one batch; a
server answers the replies ready together in one batch per client. Each entry is decoded on
its own: a bad one is answered with its own error and its siblings are served. The batch is
one message to the replay guard, so a replayed batch is refused whole.

Replay guard. The secret authenticates, but a captured message re-sent as-is would verify.
Each endpoint picks a random 16-byte session id when it starts and numbers its messages 1, 2,
3, ...; a receiver keeps, per sender session, the highest number seen and a window bitmap of
the `replay_window` numbers below it (IPsec's anti-replay window), and drops a number seen
before or older than the window. Why a window and not "strictly increasing": replies of a
server come back in any order relative to each other's creation, and the window costs one int
per session. The session table is bounded (`max_sessions`, oldest evicted); to make an evicted
or restarted table useless to a replayer, the header also carries the sender's wall clock and
messages older or newer than `max_clock_skew` are dropped as stale. Server->client messages
name the recipient session in `to`, so one client's reply cannot be replayed to another.
Principals. A client signs everything it sends with its principal's key, and the server signs
what it sends that client with the same key, so a client accepts only messages of someone
holding its key. A server looks the key up by the principal the header names (parsing the
bounded header before the signature, and trusting nothing else in it until the signature
verifies), binds the sender session to that principal for good, and hands the principal to
the handler (DESIGN §12). An unknown principal raises UnknownPrincipalKeyError before any MAC, so
a server whose keyring resolves keys elsewhere may fetch the key and decode again.
Peers were authenticated once already, when they connected (the ZMQ PLAIN handshake, see
`_server`), so what reaches a codec comes from a peer holding a key the server knows; the MAC
still decides every message. A message may name another principal than the handshake did:
that is not checked, since signing as P takes P's key, which passes P's handshake as well.
What stays open, knowingly: within the skew window, a message replayed to a *different* server
of the same cluster, or to a server that restarted, is accepted once. Closing that needs a
handshake per connection; the broker and coordinator requests are idempotent enough by
design (ids, offsets) that this is not worth a round trip on every connect.

Everything here is pure: the caller passes `now` (wall clock seconds) in; nothing reads a
clock, touches a socket or logs.
"""

from __future__ import annotations

import hmac
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from catalog.errors import TqError

from ._credentials import Credential, Keyring, MasterKeyring
from ._errors import (
    BadSignatureError,
    MalformedMessageError,
    MessageTooLargeError,
    PeerUnreachableError,
    ReplayedMessageError,
    RpcProtocolError,
    UnknownMessageTypeError,
    UnknownPrincipalKeyError,
    error_body,
)
from ._messages import (
    Entry,
    ErrorBody,
    Header,
    Kind,
    Message,
    Notify,
    Reply,
    Request,
    message_type,
)
from ._signer import Signer, _nbytes

__all__ = ["ENVELOPE_OVERHEAD", "MAX_TTL", "SESSION_BYTES", "SIGNATURE_BYTES", "Codec",
           "Incoming", "Limits", "ReplayGuard", "Signer", "envelope", "open_envelope"]

# What a BATCH message's body decodes to.
_ENTRIES = msgspec.msgpack.Decoder(list[Entry])

_MAX_PRINCIPAL = 80  # catalog's bound on a principal's length

SIGNATURE_BYTES = 32
_HEADER_LENGTH = 2  # bytes of the envelope's header length
ENVELOPE_OVERHEAD = SIGNATURE_BYTES + _HEADER_LENGTH
SESSION_BYTES = 16
MAX_TTL = 7 * 24 * 3600.0  # a week: longer "deadlines" are bugs, and NaN/inf are hostile
_MiB = 1024 * 1024

Buffer = Any  # bytes, bytearray, memoryview: anything with the buffer protocol, C-contiguous


@dataclass(frozen=True)
class Limits:
    """Bounds on what an endpoint accepts and keeps. Defaults suit the broker and coordinator.

    max_message_bytes   sum of all frames sent, and received unless max_receive_bytes
    max_receive_bytes   sum of all frames received; also set as ZMQ_MAXMSGSIZE, which zmq
                        applies to each frame as its size arrives, before buffering it, and
                        drops the connection of a peer exceeding it. Servers set it from what
                        they legitimately receive (a broker: its largest batch; the
                        coordinator: one upload chunk), so oversized unsigned input is never
                        buffered whole
    max_frames          envelope + payload frames
    max_header_bytes    the header (below 64 KiB: its length takes 2 bytes)
    max_body_bytes      the MessagePack body; big data belongs in payload frames
    max_batch           messages in one BATCH message, sent and received (a received batch
                        of more gets each of its requests refused with MessageTooLargeError)
    max_batch_bytes     bodies a sender coalesces into one BATCH message; a body this large
                        or larger travels in a batch of its own
    max_in_flight       client: requests awaiting replies (more callers wait for a slot)
    max_handlers        server: handler tasks running at once (more get ServerBusyError)
    hwm                 ZMQ send high-water mark, in messages (and receive, unless recv_hwm)
    recv_hwm            ZMQ receive high-water mark, in messages, per peer: with
                        max_message_bytes it bounds what zmq queues for one connection
    replay_window       per-session window of sequence numbers remembered
    max_clock_skew      seconds a message's sent_at may differ from the receiver's clock
    max_sessions        sender sessions remembered by the replay guard and the peer table
    notify_queue        client: notifies buffered for the application (no callback set)
    keepalive_idle      seconds a connection may carry nothing before TCP keepalive probes
                        its peer (whole seconds, at least 1)
    keepalive_interval  seconds between those probes (whole seconds, at least 1)
    keepalive_count     probes unanswered before the connection is dropped. So a peer that
                        vanishes without closing (its host gone, a partition) while nothing
                        is on the way to it is dropped a minute later, and with it its
                        descriptor and zmq's queues for it
    unacked_timeout     seconds what was sent may stay unacknowledged before the connection
                        is dropped (zmq sets it as Linux's TCP_USER_TIMEOUT); 0 leaves it to
                        the kernel, which retransmits to a vanished peer for about 15 minutes
                        (tcp_retries2). Not set by default: it also drops a live peer whose
                        process stalled that long with its receive window full (the kernel
                        answers the window probes, but the timeout counts from the first),
                        while keepalive never drops a live peer, however stalled
    """

    max_message_bytes: int = 96 * _MiB  # a 64 MiB record batch plus room
    max_receive_bytes: int | None = None
    max_frames: int = 64
    max_header_bytes: int = 512
    max_body_bytes: int = 16 * _MiB
    max_batch: int = 256
    max_batch_bytes: int = 256 * 1024
    max_in_flight: int = 1024
    max_handlers: int = 4096
    hwm: int = 1000
    recv_hwm: int | None = None
    replay_window: int = 4096
    max_clock_skew: float = 300.0
    max_sessions: int = 65536
    notify_queue: int = 1024
    keepalive_idle: int = 30
    keepalive_interval: int = 10
    keepalive_count: int = 3
    unacked_timeout: float = 0.0

    @property
    def receive_bytes(self) -> int:
        """The most bytes one received message may have (all frames)."""
        return self.max_message_bytes if self.max_receive_bytes is None \
            else self.max_receive_bytes


class ReplayGuard:
    """Per-session sliding windows of sequence numbers seen, plus a timestamp window.

    O(1) per message; memory O(max_sessions). Call `check` only for authentic messages:
    sessions are created on first sight, so unsigned input must never reach here.
    """

    def __init__(self, window: int, max_clock_skew: float, max_sessions: int) -> None:
        self.window = window
        self.max_clock_skew = max_clock_skew
        self.max_sessions = max_sessions
        self._full = (1 << window) - 1
        # session -> [highest seq, bitmap: bit i set = (highest - i) seen]
        self._sessions: OrderedDict[bytes, list[int]] = OrderedDict()

    def check(self, session: bytes, seq: int, sent_at: float, now: float) -> None:
        """Accept (and remember) `seq` of `session`, or raise ReplayedMessageError."""
        if not abs(now - sent_at) <= self.max_clock_skew:  # also catches NaN
            raise ReplayedMessageError(
                f"message sent at {sent_at!r}, now {now:.3f}: outside the "
                f"{self.max_clock_skew:g}s window (replayed, or clocks out of sync)",
                reason="stale")
        if seq < 1:
            raise ReplayedMessageError(f"sequence number {seq} below 1")
        state = self._sessions.get(session)
        if state is None:
            self._sessions[session] = [seq, 1]
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return
        self._sessions.move_to_end(session)
        highest, seen = state
        if seq > highest:
            shift = seq - highest
            state[0] = seq
            state[1] = ((seen << shift) | 1) & self._full if shift < self.window else 1
            return
        age = highest - seq
        if age >= self.window:
            raise ReplayedMessageError(f"sequence number {seq} is older than the window")
        bit = 1 << age
        if seen & bit:
            raise ReplayedMessageError(f"sequence number {seq} was already received")
        state[1] = seen | bit


class Incoming:
    """A decoded, verified message: its header, body and payload frames (zero-copy views)."""

    __slots__ = ("body", "header", "payload")

    def __init__(self, header: Header, body: Message | ErrorBody, payload: list[Buffer]) -> None:
        self.header = header
        self.body = body
        self.payload = payload

    def __repr__(self) -> str:
        return f"Incoming({self.header!r}, {self.body!r}, {len(self.payload)} payload frames)"


_ACCEPTED = {
    "server": frozenset({Kind.REQUEST, Kind.NOTIFY, Kind.BATCH}),
    "client": frozenset({Kind.REPLY, Kind.ERROR, Kind.NOTIFY, Kind.BATCH}),
}
# What a BATCH message may hold, by the role receiving it.
_ENTRY_KINDS = {
    "server": frozenset({Kind.REQUEST}),
    "client": frozenset({Kind.REPLY, Kind.ERROR}),
}
_BODY_BASE: dict[int, type[Message]] = {Kind.REQUEST: Request, Kind.REPLY: Reply,
                                         Kind.NOTIFY: Notify}


class Codec:
    """One endpoint's encoder/decoder: signs what it sends, verifies and guards what it gets.

    `role` is "server" (accepts requests and notifies) or "client" (accepts replies, errors
    and notifies). A client signs as one principal (`credential`; a bare cluster secret is the
    admin's) and accepts only messages signed with its own key. A server asks its `keyring`
    for the signer of the principal a message names, remembers which principal each sender
    session is (a session never changes principal), and signs what it sends a session with
    that session's key. Not thread-safe: one codec per socket, used from that socket's loop.
    """

    def __init__(self, credential: Credential | bytes | None = None, *, role: str,
                 limits: Limits | None = None, session: bytes | None = None,
                 keyring: Keyring | None = None) -> None:
        if role not in _ACCEPTED:
            raise ValueError(f"role must be 'server' or 'client', not {role!r}")
        self.role = role
        self.limits = limits = limits or Limits()
        self._receive_bytes = limits.receive_bytes  # asked once per message
        self.session = session if session is not None else os.urandom(SESSION_BYTES)
        if len(self.session) != SESSION_BYTES:
            raise ValueError(f"a session id is {SESSION_BYTES} bytes")
        self._seq = 0
        if role == "client":
            if credential is None:
                raise ValueError("a client codec signs with a credential")
            own = Credential.of(credential)
            self.principal = own.principal
            self._signer = Signer(own.key)
            self.keyring = None
        else:
            if keyring is None:
                if credential is None:
                    raise ValueError("a server codec needs a keyring or the cluster secret")
                keyring = MasterKeyring(Credential.of(credential).key)
            self.principal = ""
            self.keyring = keyring
        # Server: sender session -> (its principal, the signer of that principal's key),
        # learned from its first authentic message; bounded like the replay guard.
        self._senders: OrderedDict[bytes, tuple[str, Signer]] = OrderedDict()
        self._guard = ReplayGuard(limits.replay_window, limits.max_clock_skew,
                                  limits.max_sessions)
        self._accepted = _ACCEPTED[role]
        self._entry_kinds = _ENTRY_KINDS[role]
        self._encoder = msgspec.msgpack.Encoder()
        self._header_decoder = msgspec.msgpack.Decoder(Header)
        self._error_decoder = msgspec.msgpack.Decoder(ErrorBody)

    def sender(self, session: bytes) -> str | None:
        """The principal of a sender session this server has heard from (None: never)."""
        found = self._senders.get(session)
        return None if found is None else found[0]

    # -- encoding --------------------------------------------------------------------------

    def request(self, request_id: int, message: Request, *, ttl: float, now: float,
                payload: Iterable[Buffer] = ()) -> list[Buffer]:
        """Frames of a request that expires `ttl` seconds after it is sent."""
        if not isinstance(message, Request):
            raise TypeError(f"{type(message).__name__} is not a Request")
        return self._encode(Kind.REQUEST, request_id, message, ttl, b"", now, payload)

    def reply(self, request_id: int, message: Reply, *, to: bytes, now: float,
              payload: Iterable[Buffer] = (),
              digests: Sequence[bytes] | None = None) -> list[Buffer]:
        """Frames of the reply to request `request_id` of session `to` (`digests`: as for
        `notify`)."""
        if not isinstance(message, Reply):
            raise TypeError(f"{type(message).__name__} is not a Reply")
        return self._encode(Kind.REPLY, request_id, message, 0.0, to, now, payload, digests)

    def error(self, request_id: int, exc: TqError | ErrorBody, *, to: bytes,
              now: float) -> list[Buffer]:
        """Frames of an error reply to request `request_id` of session `to`."""
        body = exc if isinstance(exc, ErrorBody) else error_body(exc)
        return self._encode(Kind.ERROR, request_id, body, 0.0, to, now, ())

    def notify(self, message: Notify, *, to: bytes = b"", now: float,
               payload: Iterable[Buffer] = (),
               digests: Sequence[bytes] | None = None) -> list[Buffer]:
        """Frames of a one-way message (`to`: the recipient session, server side only).
        `digests`: `payload_digest` of each payload frame, when the caller has them (one
        payload pushed to many peers is hashed once, not once a copy)."""
        if not isinstance(message, Notify):
            raise TypeError(f"{type(message).__name__} is not a Notify")
        return self._encode(Kind.NOTIFY, 0, message, 0.0, to, now, payload, digests)

    def request_entry(self, request_id: int, message: Request, *, ttl: float) -> Entry:
        """`message` as an entry of a BATCH message (`batch`), its body encoded now (so a
        request over the limits fails its caller, not its batch)."""
        if not isinstance(message, Request):
            raise TypeError(f"{type(message).__name__} is not a Request")
        return self._entry(Kind.REQUEST, request_id, message, ttl)

    def reply_entry(self, request_id: int, message: Reply) -> Entry:
        """The reply to request `request_id` as an entry of a BATCH message."""
        if not isinstance(message, Reply):
            raise TypeError(f"{type(message).__name__} is not a Reply")
        return self._entry(Kind.REPLY, request_id, message, 0.0)

    def error_entry(self, request_id: int, exc: TqError | ErrorBody) -> Entry:
        """An error reply to request `request_id` as an entry of a BATCH message."""
        body = exc if isinstance(exc, ErrorBody) else error_body(exc)
        return self._entry(Kind.ERROR, request_id, body, 0.0)

    def _entry(self, kind: Kind, request_id: int, body: Message | ErrorBody,
               ttl: float) -> Entry:
        tag = _tag_of(body)
        encoded = self._encoder.encode(body)
        if len(encoded) > self.limits.max_body_bytes:
            raise MessageTooLargeError(f"{type(body).__name__} of {len(encoded)} bytes is over "
                                       f"the body limit ({self.limits.max_body_bytes})")
        return Entry(int(kind), request_id, tag, ttl, msgspec.Raw(encoded))

    def batch(self, entries: Sequence[Entry], *, to: bytes = b"", now: float) -> list[Buffer]:
        """Frames of one BATCH message carrying `entries` (`to`: the recipient session,
        server side only). At most `Limits.max_batch` entries."""
        if not 0 < len(entries) <= self.limits.max_batch:
            raise ValueError(f"a batch holds 1 to {self.limits.max_batch} messages, "
                             f"not {len(entries)}")
        return self._frame(Kind.BATCH, 0, "", 0.0, to, now,
                           self._encoder.encode(entries), (), None, "batch")

    def messages(self, entries: Sequence[Entry], *, to: bytes = b"",
                 now: float) -> Iterator[tuple[list[Entry], list[Buffer]]]:
        """`entries` in order as few messages as the batch bounds allow: each run of entries
        with its frames, a BATCH message or, for a run of one, a plain one."""
        for run in split_batches(entries, self.limits):
            yield run, (self.single(run[0], to=to, now=now) if len(run) == 1
                        else self.batch(run, to=to, now=now))

    def single(self, entry: Entry, *, to: bytes = b"", now: float) -> list[Buffer]:
        """Frames of `entry` sent alone, as a plain message of its kind (a batch of one
        would cost the same and say less)."""
        return self._frame(Kind(entry.kind), entry.id, entry.tag, entry.ttl, to, now,
                           bytes(entry.body), (), None, entry.tag or "error")

    def _encode(self, kind: Kind, request_id: int, body: Message | ErrorBody, ttl: float,
                to: bytes, now: float, payload: Iterable[Buffer],
                digests: Sequence[bytes] | None = None) -> list[Buffer]:
        return self._frame(kind, request_id, _tag_of(body), ttl, to, now,
                           self._encoder.encode(body), payload, digests, type(body).__name__)

    def _frame(self, kind: Kind, request_id: int, tag: str, ttl: float, to: bytes, now: float,
               body: bytes, payload: Iterable[Buffer], digests: Sequence[bytes] | None,
               what: str) -> list[Buffer]:
        """Header, sign and bound one message whose body is encoded already."""
        if self.role == "client":
            signer = self._signer
        else:
            sender = self._senders.get(to)
            if sender is None:
                raise PeerUnreachableError("no key known for that session: it never sent an "
                                           "authentic message, or it was forgotten")
            signer = sender[1]
        self._seq += 1
        header = self._encoder.encode(Header(int(kind), request_id, tag, ttl, self.session,
                                             self._seq, now, to, self.principal))
        signed = [header, body, *payload]
        lengths = [f.nbytes if type(f) is memoryview else len(f) for f in signed]  # _nbytes
        limits = self.limits
        if len(signed) - 1 > limits.max_frames or sum(lengths) + ENVELOPE_OVERHEAD > \
                limits.max_message_bytes or lengths[1] > limits.max_body_bytes:
            raise MessageTooLargeError(
                f"{what} with {len(signed) - 1} frames and {sum(lengths)} bytes is "
                f"over the limits ({limits.max_frames} frames, {limits.max_message_bytes} "
                f"bytes, body {limits.max_body_bytes})")
        signed[1] = envelope(signer._sign(signed, lengths, digests), header, body)
        return signed[1:]

    # -- decoding --------------------------------------------------------------------------

    def decode(self, frames: Sequence[Buffer], now: float) -> Incoming:
        """Verify and decode `frames`, or raise an RpcProtocolError saying why not.

        Checks run cheapest first and the signature before anything is parsed, so unsigned
        input costs one MAC at most. When the error carries `.header`, the message was
        authentic and the caller may answer it. A BATCH message is refused here: receivers
        that take batches call `decode_all`.
        """
        header, rest = self._verify(frames, now)
        if header.kind == Kind.BATCH:
            raise UnknownMessageTypeError("a batch where one message was expected",
                                          reason="unexpected_kind")
        return self._body(header, rest)

    def decode_all(self, frames: Sequence[Buffer], now: float
                   ) -> list[Incoming | RpcProtocolError]:
        """Verify `frames` and decode every message they carry: one, or each entry of a
        BATCH message. A fault of the whole message raises, as `decode`; an entry that does
        not decode comes back as its error, carrying the entry's `.header` so that it can be
        answered while its siblings are served."""
        header, rest = self._verify(frames, now)
        if header.kind != Kind.BATCH:
            return [self._body(header, rest)]
        try:
            entries = _ENTRIES.decode(rest[1])
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise MalformedMessageError(f"undecodable batch: {exc}", reason="bad_batch") \
                from exc
        if len(rest) > 2:
            raise MalformedMessageError("a batch with payload frames", reason="bad_batch")
        too_many = len(entries) > self.limits.max_batch
        out: list[Incoming | RpcProtocolError] = []
        for entry in entries:
            entry_header = Header(entry.kind, entry.id, entry.tag, entry.ttl, header.session,
                                  header.seq, header.sent_at, header.to, header.principal)
            try:
                if too_many:
                    raise MessageTooLargeError(
                        f"a batch of {len(entries)} messages; at most {self.limits.max_batch}",
                        reason="batch_too_large", header=entry_header)
                if entry.kind not in self._entry_kinds:
                    raise UnknownMessageTypeError(
                        f"a {self.role} does not accept kind {entry.kind} in a batch",
                        reason="unexpected_kind", header=entry_header)
                if entry.kind == Kind.REQUEST and not 0.0 < entry.ttl <= MAX_TTL:
                    raise MalformedMessageError(
                        f"request ttl {entry.ttl!r} outside (0, {MAX_TTL:g}]",
                        reason="bad_header", header=entry_header)
                out.append(Incoming(entry_header,
                                    self._decode_body(entry_header, entry.body), []))
            except RpcProtocolError as exc:
                out.append(exc)
        return out

    def _verify(self, frames: Sequence[Buffer], now: float) -> tuple[Header, Sequence[Buffer]]:
        """Check `frames` whole (limits, signature, replay, kind): the header and the frames
        after the signature."""
        limits = self.limits
        count = len(frames)
        if count < 1:
            raise MalformedMessageError("no frames", reason="malformed")
        if count > limits.max_frames:
            raise MessageTooLargeError(f"{count} frames; at most {limits.max_frames}",
                                       reason="too_many_frames")
        lengths = [f.nbytes if type(f) is memoryview else len(f) for f in frames]  # _nbytes
        total = sum(lengths)
        if total > self._receive_bytes:
            raise MessageTooLargeError(f"{total} bytes; at most {self._receive_bytes}")
        first = lengths[0]
        if first < ENVELOPE_OVERHEAD:
            raise BadSignatureError("no envelope (signature and header length)",
                                    reason="unsigned")
        whole = memoryview(frames[0])
        signature = whole[:SIGNATURE_BYTES]
        header_bytes = int.from_bytes(whole[SIGNATURE_BYTES:ENVELOPE_OVERHEAD], "little")
        # The header names whose key signs the message, so it is parsed before the signature
        # is checked: bounded in size, decoded into a fixed struct, trusted for nothing else.
        if header_bytes > limits.max_header_bytes or \
                ENVELOPE_OVERHEAD + header_bytes > first:
            raise MalformedMessageError(f"header of {header_bytes} bytes", reason="bad_header")
        body_at = ENVELOPE_OVERHEAD + header_bytes
        rest = [whole[ENVELOPE_OVERHEAD:body_at], whole[body_at:], *frames[1:]]
        lengths[0:1] = [header_bytes, first - body_at]
        try:
            header = self._header_decoder.decode(rest[0])
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise MalformedMessageError(f"undecodable header: {exc}", reason="bad_header") \
                from exc
        if len(header.session) != SESSION_BYTES:
            raise MalformedMessageError("session id of the wrong length", reason="bad_header")
        known = None
        if self.role == "client":
            signer = self._signer
        else:
            known = self._senders.get(header.session)
            signer = self._server_signer(header, known)
        if not hmac.compare_digest(signature, signer._sign(rest, lengths)):
            raise BadSignatureError("signature does not verify (wrong key or altered)")
        self._guard.check(header.session, header.seq, header.sent_at, now)
        if self.role == "server":
            if known is not None and known[1] is signer:
                self._senders.move_to_end(header.session)  # `_remember` of a known sender
            else:
                self._remember(header.session, header.principal, signer)
        # Authentic and fresh from here on: errors carry the header so requests get answered.
        kind = header.kind
        if kind not in self._accepted:
            raise UnknownMessageTypeError(f"a {self.role} does not accept kind {kind}",
                                          reason="unexpected_kind", header=header)
        if kind == Kind.REQUEST and not 0.0 < header.ttl <= MAX_TTL:
            raise MalformedMessageError(f"request ttl {header.ttl!r} outside (0, {MAX_TTL:g}]",
                                        reason="bad_header", header=header)
        if self.role == "client" and header.to != self.session:
            raise ReplayedMessageError("message addressed to another session",
                                       reason="misaddressed")
        if lengths[1] > limits.max_body_bytes:
            raise MessageTooLargeError(f"body of {lengths[1]} bytes; at most "
                                       f"{limits.max_body_bytes}", header=header)
        return header, rest

    def _body(self, header: Header, rest: Sequence[Buffer]) -> Incoming:
        return Incoming(header, self._decode_body(header, rest[1]), list(rest[2:]))

    def _decode_body(self, header: Header, body: Buffer) -> Message | ErrorBody:
        """The body `header` announces, decoded from `body`."""
        kind = header.kind
        if kind == Kind.ERROR:
            decoder = self._error_decoder
        else:
            cls = message_type(header.tag)
            if cls is None or not issubclass(cls, _BODY_BASE[kind]):
                raise UnknownMessageTypeError(f"no {Kind(kind).name.lower()} type tagged "
                                              f"{header.tag[:64]!r}", header=header)
            decoder = cls.rpc_decoder
        try:
            decoded: Message | ErrorBody = decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise MalformedMessageError(f"undecodable {header.tag[:64]!r} body: {exc}",
                                        reason="bad_body", header=header) from exc
        return decoded

    def _server_signer(self, header: Header, known: tuple[str, Signer] | None) -> Signer:
        """The signer of the principal `header` names (`known`: what its session is known as,
        if anything)."""
        principal = header.principal
        if not principal or len(principal) > _MAX_PRINCIPAL:
            raise BadSignatureError("no principal named", reason="unsigned")
        if known is not None and known[0] != principal:
            raise BadSignatureError("a session changed its principal")
        assert self.keyring is not None
        signer = self.keyring.signer(principal)
        if signer is None:
            raise UnknownPrincipalKeyError(f"no key known for principal {principal[:80]!r}",
                                        principal=principal)
        return signer

    def _remember(self, session: bytes, principal: str, signer: Signer) -> None:
        senders = self._senders
        known = senders.get(session)
        if known is not None:
            senders.move_to_end(session)
            if known[1] is not signer:
                senders[session] = (principal, signer)  # a rotated key is the newest signer
            return
        senders[session] = (principal, signer)
        if len(senders) > self.limits.max_sessions:
            senders.popitem(last=False)


def _tag_of(body: Message | ErrorBody) -> str:
    tag = body.rpc_tag if isinstance(body, Message) else ""  # "": an ErrorBody
    if tag is None:
        raise TypeError(f"{type(body).__name__} has no tag: declare it with "
                        f"class {type(body).__name__}(..., tag='...') to send it")
    return tag


def split_batches(entries: Sequence[Entry], limits: Limits) -> Iterator[list[Entry]]:
    """`entries` in order, in runs that fit one BATCH message: at most `limits.max_batch`
    entries and, unless one alone is larger, `limits.max_batch_bytes` bytes of bodies."""
    chunk: list[Entry] = []
    held = 0
    for entry in entries:
        length = len(entry.body)
        if chunk and (len(chunk) >= limits.max_batch or held + length > limits.max_batch_bytes):
            yield chunk
            chunk, held = [], 0
        chunk.append(entry)
        held += length
    if chunk:
        yield chunk


def envelope(signature: Buffer, header: Buffer, body: Buffer) -> bytes:
    """The first frame of a message: its signature, its header's length, header and body."""
    return b"".join((signature, _nbytes(header).to_bytes(_HEADER_LENGTH, "little"), header,
                     body))


def open_envelope(frame: Buffer) -> tuple[Buffer, Buffer, Buffer]:
    """(signature, header, body) of an envelope frame, as views; for tools and tests that
    take messages apart (`Codec.decode` checks what this trusts)."""
    whole = memoryview(frame)
    header_at = SIGNATURE_BYTES + _HEADER_LENGTH
    body_at = header_at + int.from_bytes(whole[SIGNATURE_BYTES:header_at], "little")
    return whole[:SIGNATURE_BYTES], whole[header_at:body_at], whole[body_at:]
