"""The sans-I/O codec: encoding, signing, verification failures and the replay guard."""

from __future__ import annotations

import asyncio
import struct

import blake3
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from querylib.rpc import (
    BROKER,
    COORDINATOR,
    BadSignatureError,
    Codec,
    Credential,
    DeadlineExceededError,
    Entry,
    ErrorBody,
    Header,
    Kind,
    Limits,
    MalformedMessageError,
    MasterKeyring,
    MessageTooLargeError,
    Ping,
    Pong,
    RemoteKeyring,
    ReplayedMessageError,
    ReplayGuard,
    Signer,
    UnknownMessageTypeError,
    UnknownPrincipalKeyError,
    audience_key,
    handshake_token,
    kafka_password,
    principal_key,
)
from querylib.rpc._codec import (
    ENVELOPE_OVERHEAD,
    SIGNATURE_BYTES,
    envelope,
    open_envelope,
    split_batches,
)
from querylib.rpc._signer import MAC_KEY_CONTEXT, payload_digest

from ._support import SECRET, Credit, Delivery, Fetch, FetchReply, ShelfEmptyError

NOW = 1_700_000_000.0


def pair(limits: Limits | None = None) -> tuple[Codec, Codec]:
    return (Codec(SECRET, role="client", limits=limits),
            Codec(SECRET, role="server", limits=limits))


def heard(server: Codec, client: Codec) -> None:
    """The server hears from the client first (a server only sends to a session it knows the
    principal of, as a ROUTER only reaches peers that spoke)."""
    server.decode(client.notify(Credit(1), now=NOW), NOW)


def split(frames: list) -> list:
    """A message's parts as bytes: signature, header, body, then the payload frames."""
    return [*(bytes(part) for part in open_envelope(frames[0])), *frames[1:]]


def join(parts: list) -> list:
    """The wire frames of parts laid out as `split` gives them."""
    return [envelope(parts[0], parts[1], parts[2]), *parts[3:]]


def resign(parts: list, secret: bytes = SECRET) -> list:
    """Wire frames of parts (laid out as `split` gives them) with a fresh, valid signature
    (as an insider could make)."""
    return join([Signer(secret).sign(parts[1:]), *parts[1:]])


def test_request_reply_round_trip_with_payload() -> None:
    client, server = pair()
    payload = [b"", b"x", bytes(range(256)) * 400, memoryview(b"view")]
    frames = client.request(7, Fetch(token=3), ttl=2.5, now=NOW, payload=payload)
    assert len(frames) == 1 + len(payload)  # the envelope, then the payload frames
    incoming = server.decode(frames, NOW)
    assert incoming.body == Fetch(token=3)
    assert incoming.header.kind == Kind.REQUEST and incoming.header.id == 7
    assert incoming.header.ttl == 2.5 and incoming.header.session == client.session
    assert [bytes(p) for p in incoming.payload] == [bytes(p) for p in payload]

    reply = server.reply(7, FetchReply(token=3), to=client.session, now=NOW, payload=[b"r"])
    back = client.decode(reply, NOW)
    assert back.body == FetchReply(token=3) and back.header.id == 7
    assert back.header.kind == Kind.REPLY and [bytes(p) for p in back.payload] == [b"r"]


def test_error_and_notify_round_trip() -> None:
    client, server = pair()
    heard(server, client)
    frames = server.error(9, DeadlineExceededError("late"), to=client.session, now=NOW)
    incoming = client.decode(frames, NOW)
    assert incoming.header.kind == Kind.ERROR
    assert incoming.body == ErrorBody("querylib.rpc._errors.DeadlineExceededError", "late",
                                      True, 7)
    note = client.decode(server.notify(Delivery(4), to=client.session, now=NOW), NOW)
    assert note.header.kind == Kind.NOTIFY and note.body == Delivery(4)
    up = server.decode(client.notify(Credit(10), now=NOW), NOW)
    assert up.header.kind == Kind.NOTIFY and up.body == Credit(10)


def test_a_payload_pushed_to_many_is_hashed_once_and_each_copy_still_verifies() -> None:
    """A server pushing one payload to several clients passes its digest in; each push is
    signed with its own client's key over header, body and that digest, verifies there, and
    is refused once its payload bytes (or the digest a buggy sender passed) do not match."""
    payload = bytes(range(256)) * 300
    digest = payload_digest(payload)
    alice = Codec(Credential("user:alice", principal_key(SECRET, "user:alice")),
                  role="client")
    bob = Codec(Credential("user:bob", principal_key(SECRET, "user:bob")), role="client")
    server = Codec(role="server", keyring=MasterKeyring(SECRET))
    for client in (alice, bob):
        heard(server, client)
        frames = server.notify(Delivery(1), to=client.session, now=NOW, payload=[payload],
                               digests=[digest])
        assert bytes(client.decode(list(frames), NOW).payload[0]) == payload
        # The same push with one payload byte changed: refused.
        tampered = server.notify(Delivery(2), to=client.session, now=NOW, payload=[payload],
                                 digests=[digest])
        altered = bytearray(payload)
        altered[1000] ^= 1
        with pytest.raises(BadSignatureError):
            client.decode([tampered[0], bytes(altered)], NOW)
        # A digest that is not the payload's makes a push no one accepts.
        wrong = server.notify(Delivery(3), to=client.session, now=NOW, payload=[payload],
                              digests=[payload_digest(bytes(altered))])
        with pytest.raises(BadSignatureError):
            client.decode(list(wrong), NOW)
    # Signed with a digest or hashing the payload itself: the same signature.
    signer = Signer(SECRET)
    frames = [b"header", b"body", payload]
    assert signer._sign(frames, [6, 4, len(payload)], [digest]) == signer.sign(frames)


def test_wire_layout_is_the_documented_one() -> None:
    client, _ = pair()
    frames = client.request(1, Ping(b"hi"), ttl=1.0, now=NOW, payload=[b"p"])
    assert len(frames) == 2
    first, payload = frames
    # The envelope: signature, the header's length (2 bytes, little-endian), header, body.
    signature, header_length = first[:SIGNATURE_BYTES], first[SIGNATURE_BYTES:ENVELOPE_OVERHEAD]
    header_end = ENVELOPE_OVERHEAD + int.from_bytes(header_length, "little")
    header, body = first[ENVELOPE_OVERHEAD:header_end], first[header_end:]
    assert msgspec.msgpack.decode(header) == [0, 1, "rpc.ping", 1.0, client.session, 1, NOW,
                                              b"", "admin"]
    assert msgspec.msgpack.decode(body) == {"type": "rpc.ping", "data": b"hi"}
    assert payload == b"p"
    # Keyed BLAKE3 over the frame count and lengths, the header and body, then each payload
    # frame's BLAKE3 digest, with a key derived from the secret.
    mac = blake3.blake3(key=blake3.blake3(SECRET, derive_key_context=MAC_KEY_CONTEXT).digest())
    mac.update(struct.pack("<4Q", 3, len(header), len(body), 1))
    for frame in (header, body, blake3.blake3(payload).digest()):
        mac.update(frame)
    assert signature == mac.digest()


@given(key=st.binary(min_size=16, max_size=200),
       frames=st.lists(st.binary(max_size=300), min_size=1, max_size=5))
def test_signer_is_keyed_blake3(key: bytes, frames: list[bytes]) -> None:
    mac = blake3.blake3(key=blake3.blake3(key, derive_key_context=MAC_KEY_CONTEXT).digest())
    mac.update(struct.pack(f"<{len(frames) + 1}Q", len(frames), *map(len, frames)))
    for frame in frames[:2]:  # header and body as they are
        mac.update(frame)
    for frame in frames[2:]:  # payload frames by their digests
        mac.update(blake3.blake3(frame).digest())
    signer = Signer(key)
    assert signer.sign(frames) == mac.digest()
    assert signer.verify(mac.digest(), frames)


@given(st.data())
def test_any_altered_byte_breaks_the_signature(data: st.DataObject) -> None:
    client, server = pair()
    frames = client.request(1, Fetch(token=1), ttl=1.0, now=NOW, payload=[b"payload"])
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[index])
    position = data.draw(st.integers(0, len(frame) - 1))
    frame[position] ^= data.draw(st.integers(1, 255))
    frames[index] = bytes(frame)
    # Refused as unsigned or as an undecodable header (parsed first, to find the key), and
    # never answered: nothing of it is trusted.
    with pytest.raises((BadSignatureError, MalformedMessageError)) as info:
        server.decode(frames, NOW)
    assert info.value.header is None


def test_bytes_moved_between_frames_break_the_signature() -> None:
    client, server = pair()
    frames = client.request(1, Ping(), ttl=1.0, now=NOW, payload=[b"ab", b"cd"])
    moved = [frames[0], b"abc", b"d"]  # same concatenation, other boundaries
    with pytest.raises(BadSignatureError):
        server.decode(moved, NOW)
    signature, header, body, *_ = split(frames)
    into_body = [envelope(signature, header, body + b"a"), b"b", b"cd"]
    with pytest.raises(BadSignatureError):
        server.decode(into_body, NOW)


def test_wrong_secret_and_unsigned_are_refused() -> None:
    _, server = pair()
    stranger = Codec(b"another secret, 32 bytes long!!!", role="client")
    with pytest.raises(BadSignatureError) as info:
        server.decode(stranger.request(1, Ping(), ttl=1.0, now=NOW), NOW)
    assert info.value.reason == "bad_signature" and info.value.header is None
    frames = Codec(SECRET, role="client").request(1, Ping(), ttl=1.0, now=NOW)
    with pytest.raises(BadSignatureError) as info:
        server.decode([frames[0][:ENVELOPE_OVERHEAD - 1]], NOW)
    assert info.value.reason == "unsigned"
    _, header, body = split(frames)
    with pytest.raises(BadSignatureError) as info:
        server.decode(join([b"\0" * SIGNATURE_BYTES, header, body]), NOW)
    assert info.value.reason == "bad_signature"


def test_frame_count_and_size_limits() -> None:
    limits = Limits(max_frames=5, max_message_bytes=1000, max_body_bytes=100)
    client, server = pair(limits)
    with pytest.raises(MalformedMessageError):
        server.decode([], NOW)
    with pytest.raises(MalformedMessageError) as info:  # a header longer than the frame
        server.decode([b"x" * SIGNATURE_BYTES + b"\x10\x00" + b"h"], NOW)
    assert info.value.reason == "bad_header"
    with pytest.raises(MessageTooLargeError) as info:
        server.decode([b"x"] * 6, NOW)
    assert info.value.reason == "too_many_frames"
    with pytest.raises(MessageTooLargeError) as info:
        server.decode([envelope(b"x" * 32, b"h", b"b"), b"p" * 1000], NOW)
    assert info.value.reason == "too_large"
    # The sender refuses to build what the receiver would refuse.
    with pytest.raises(MessageTooLargeError):
        client.request(1, Ping(), ttl=1.0, now=NOW, payload=[b"p"] * 5)
    with pytest.raises(MessageTooLargeError):
        client.request(1, Ping(b"d" * 200), ttl=1.0, now=NOW)


def test_signed_but_undecodable_header_is_malformed_without_header() -> None:
    _, server = pair()
    with pytest.raises(MalformedMessageError) as info:
        server.decode(resign([b"", b"\xc1not msgpack", b"\x80"]), NOW)
    assert info.value.reason == "bad_header" and info.value.header is None


def test_signed_header_with_invalid_utf8_is_malformed_not_a_crash() -> None:
    # msgspec raises UnicodeDecodeError (not DecodeError) for a str field holding bad UTF-8.
    client, server = pair()
    _, header, body = split(client.request(5, Ping(), ttl=1.0, now=NOW))
    tag = b"rpc.ping"
    assert header.count(tag) == 1
    bad_header = header.replace(tag, b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8")
    with pytest.raises(MalformedMessageError) as info:
        server.decode(resign([b"", bad_header, body]), NOW)
    assert info.value.reason == "bad_header"


def test_unknown_tag_and_bad_body_carry_the_header_so_they_get_an_answer() -> None:
    client, server = pair()
    _, header_bytes, body = split(client.request(5, Ping(), ttl=1.0, now=NOW))
    header = msgspec.msgpack.decode(header_bytes, type=Header)
    unknown = msgspec.structs.replace(header, tag="no.such.tag")
    with pytest.raises(UnknownMessageTypeError) as info:
        server.decode(resign([b"", msgspec.msgpack.encode(unknown), body]), NOW)
    assert info.value.reason == "unknown_type" and info.value.header.id == 5

    bad = msgspec.structs.replace(header, seq=header.seq + 1)
    with pytest.raises(MalformedMessageError) as info:
        server.decode(resign([b"", msgspec.msgpack.encode(bad), b"\x93\x01"]), NOW)
    assert info.value.reason == "bad_body" and info.value.header.id == 5

    # A reply's tag in a request header is a tag of the wrong kind.
    wrong = msgspec.structs.replace(header, seq=header.seq + 2, tag="rpc.pong")
    with pytest.raises(UnknownMessageTypeError):
        server.decode(resign([b"", msgspec.msgpack.encode(wrong),
                              msgspec.msgpack.encode(Pong())]), NOW)


def test_each_side_accepts_only_its_kinds() -> None:
    client, server = pair()
    reply = client.reply(1, Pong(), to=bytes(16), now=NOW)
    with pytest.raises(UnknownMessageTypeError) as info:
        server.decode(reply, NOW)  # a server is sent requests, not replies
    assert info.value.reason == "unexpected_kind"
    with pytest.raises(UnknownMessageTypeError):
        Codec(SECRET, role="client").decode(client.request(1, Ping(), ttl=1.0, now=NOW), NOW)


@pytest.mark.parametrize("ttl", [0.0, -1.0, float("nan"), float("inf"), 1e12])
def test_request_ttl_outside_bounds_is_refused(ttl: float) -> None:
    client, server = pair()
    _, header_bytes, body = split(client.request(1, Ping(), ttl=1.0, now=NOW))
    header = msgspec.structs.replace(msgspec.msgpack.decode(header_bytes, type=Header), ttl=ttl)
    with pytest.raises(MalformedMessageError) as info:
        server.decode(resign([b"", msgspec.msgpack.encode(header), body]), NOW)
    assert info.value.reason == "bad_header" and info.value.header is not None


def test_replayed_message_is_refused() -> None:
    client, server = pair()
    frames = client.request(1, Ping(), ttl=1.0, now=NOW)
    server.decode(frames, NOW)
    with pytest.raises(ReplayedMessageError) as info:
        server.decode(frames, NOW + 1)
    assert info.value.reason == "replayed"


def test_stale_or_future_message_is_refused() -> None:
    client, server = pair(Limits(max_clock_skew=60.0))
    with pytest.raises(ReplayedMessageError) as info:
        server.decode(client.request(1, Ping(), ttl=1.0, now=NOW - 61), NOW)
    assert info.value.reason == "stale"
    with pytest.raises(ReplayedMessageError):
        server.decode(client.request(2, Ping(), ttl=1.0, now=NOW + 61), NOW)
    server.decode(client.request(3, Ping(), ttl=1.0, now=NOW - 59), NOW)


def test_reply_to_another_session_is_refused() -> None:
    client, server = pair()
    other = Codec(SECRET, role="client")
    heard(server, other)
    frames = server.reply(1, Pong(), to=other.session, now=NOW)
    with pytest.raises(ReplayedMessageError) as info:
        client.decode(frames, NOW)
    assert info.value.reason == "misaddressed"
    other.decode(frames, NOW)


def test_untagged_message_cannot_be_sent() -> None:
    from querylib.rpc import Notify

    class Abstract(Notify):
        pass

    client, _ = pair()
    with pytest.raises(TypeError, match="no tag"):
        client.notify(Abstract(), now=NOW)
    with pytest.raises(TypeError):
        client.request(1, Pong(), ttl=1.0, now=NOW)  # type: ignore[arg-type]


def test_short_secret_is_refused() -> None:
    with pytest.raises(Exception, match="16 bytes"):
        Signer(b"short")


# -- replay guard ------------------------------------------------------------------------------


@given(st.lists(st.integers(1, 200), max_size=300))
def test_guard_matches_its_model(seqs: list[int]) -> None:
    """Accepted iff never accepted before and within `window` of the highest accepted."""
    guard = ReplayGuard(window=64, max_clock_skew=10.0, max_sessions=4)
    seen: set[int] = set()
    highest = 0
    for seq in seqs:
        expected = seq not in seen and seq > highest - 64
        try:
            guard.check(b"s" * 16, seq, NOW, NOW)
            accepted = True
        except ReplayedMessageError:
            accepted = False
        assert accepted == expected
        if accepted:
            seen.add(seq)
            highest = max(highest, seq)


@given(st.permutations(list(range(1, 65))))
def test_guard_accepts_any_order_within_the_window(order: list[int]) -> None:
    guard = ReplayGuard(window=64, max_clock_skew=10.0, max_sessions=4)
    for seq in order:
        guard.check(b"s" * 16, seq, NOW, NOW)
    for seq in order:
        with pytest.raises(ReplayedMessageError):
            guard.check(b"s" * 16, seq, NOW, NOW)


def test_guard_bounds_its_sessions() -> None:
    guard = ReplayGuard(window=8, max_clock_skew=10.0, max_sessions=3)
    for n in range(10):
        guard.check(n.to_bytes(16, "big"), 1, NOW, NOW)
    assert len(guard._sessions) == 3


# -- principals (DESIGN §12) ------------------------------------------------------------------


def _alice() -> Credential:
    return Credential("user:alice", principal_key(SECRET, "user:alice"))


def test_a_principal_signs_with_its_own_key_and_is_told_to_the_server() -> None:
    server = Codec(role="server", keyring=MasterKeyring(SECRET))
    alice = Codec(_alice(), role="client")
    incoming = server.decode(alice.request(1, Ping(), ttl=1.0, now=NOW), NOW)
    assert incoming.header.principal == "user:alice"
    assert server.sender(alice.session) == "user:alice"
    # The reply is signed with alice's key: only alice reads it, not the admin.
    reply = server.reply(1, Pong(), to=alice.session, now=NOW)
    assert alice.decode(reply, NOW).body == Pong()
    with pytest.raises(BadSignatureError):
        Codec(SECRET, role="client", session=alice.session).decode(reply, NOW)


def test_claiming_another_principal_does_not_verify() -> None:
    server = Codec(role="server", keyring=MasterKeyring(SECRET))
    # alice's key, but the header says admin (or bob): the server checks admin's key.
    for claimed in ("admin", "user:bob"):
        liar = Codec(Credential(claimed, principal_key(SECRET, "user:alice")), role="client")
        with pytest.raises(BadSignatureError) as info:
            server.decode(liar.request(1, Ping(), ttl=1.0, now=NOW), NOW)
        assert info.value.header is None


def test_unknown_principals_and_sessions_changing_principal_are_refused() -> None:
    exists = {"admin": 0, "user:alice": 0}
    server = Codec(role="server", keyring=MasterKeyring(SECRET, valid=exists.get))
    bob = Codec(Credential("user:bob", principal_key(SECRET, "user:bob")), role="client")
    with pytest.raises(UnknownPrincipalKeyError) as info:
        server.decode(bob.request(1, Ping(), ttl=1.0, now=NOW), NOW)
    assert info.value.principal == "user:bob" and info.value.reason == "unknown_principal"
    alice = Codec(_alice(), role="client")
    server.decode(alice.request(1, Ping(), ttl=1.0, now=NOW), NOW)
    # The admin reusing alice's session id (as a replayer would) is refused.
    admin = Codec(SECRET, role="client", session=alice.session)
    with pytest.raises(BadSignatureError, match="changed its principal"):
        server.decode(admin.request(9, Ping(), ttl=1.0, now=NOW), NOW)


def test_a_rotated_generation_stops_the_old_key() -> None:
    generation = {"user:alice": 1}
    server = Codec(role="server", keyring=MasterKeyring(SECRET, valid=generation.get))
    old = Codec(_alice(), role="client")
    with pytest.raises(BadSignatureError):
        server.decode(old.request(1, Ping(), ttl=1.0, now=NOW), NOW)
    new = Codec(Credential("user:alice", principal_key(SECRET, "user:alice", 1)),
                role="client")
    assert server.decode(new.request(1, Ping(), ttl=1.0, now=NOW), NOW).header.principal == \
        "user:alice"


def test_broker_audience_keys_do_not_open_the_coordinator() -> None:
    """What a broker learns of a principal (its broker-audience key) signs nothing the
    coordinator accepts."""
    coordinator = Codec(role="server", keyring=MasterKeyring(SECRET))
    broker = Codec(role="server", keyring=MasterKeyring(SECRET, audience=BROKER))
    learned = _alice().for_audience(BROKER)
    client = Codec(learned, role="client")
    assert broker.decode(client.request(1, Ping(), ttl=1.0, now=NOW), NOW)
    with pytest.raises(BadSignatureError):
        coordinator.decode(client.request(2, Ping(), ttl=1.0, now=NOW), NOW)
    assert audience_key(SECRET, COORDINATOR) == SECRET
    assert audience_key(SECRET, BROKER) != SECRET


def test_the_handshake_token_is_one_way_and_per_audience() -> None:
    """PLAIN travels in clear: the token shown when connecting is neither the key nor anything
    else derived from it (the Kafka password), and differs per audience."""
    key = _alice().key
    token = handshake_token(audience_key(key, COORDINATOR))
    assert len(token) == 64 and bytes.fromhex(token.decode())
    assert token == handshake_token(audience_key(key, COORDINATOR))
    assert token != handshake_token(audience_key(key, BROKER))
    assert key.hex().encode() not in (token, handshake_token(audience_key(key, BROKER)))
    assert kafka_password(key).encode() not in token


def test_a_remote_keyring_refetches_a_key_at_most_once_per_interval() -> None:
    now = [0.0]
    fetched: list[str] = []

    async def fetch(principal: str) -> bytes | None:
        fetched.append(principal)
        return b"k" * 32 if principal != "user:nobody" else None

    async def test() -> None:
        keyring = RemoteKeyring(fetch, ttl=60.0, negative_ttl=5.0, clock=lambda: now[0])
        keyring.pin("admin", b"a" * 32)
        assert await keyring.key_of("user:alice") == b"k" * 32
        assert not keyring.refetch("user:alice")  # fetched moments ago: that is the key
        now[0] = 5.0
        assert keyring.refetch("user:alice")
        assert await keyring.key_of("user:alice") == b"k" * 32
        assert fetched == ["user:alice", "user:alice"]
        assert await keyring.key_of("user:nobody") is None
        now[0] = 20.0
        assert not keyring.refetch("user:nobody")  # nothing cached to be stale
        assert not keyring.refetch("admin")  # pinned: ours for good
        assert not MasterKeyring(SECRET).refetch("user:alice")

    asyncio.run(test())


# -- BATCH messages: several requests, or replies, under one signature ---------------------


def test_a_batch_carries_several_requests_and_their_replies_under_one_signature() -> None:
    client, server = pair()
    entries = [client.request_entry(i, Fetch(i), ttl=2.0) for i in range(1, 6)]
    frames = client.batch(entries, now=NOW)
    assert len(frames) == 1  # one envelope (signature, header, body) for all five
    header = msgspec.msgpack.decode(split(frames)[1])
    assert header[0] == Kind.BATCH and header[5] == 1  # one sequence number for the batch
    got = server.decode_all(frames, NOW)
    assert [(m.header.kind, m.header.id, m.header.ttl, m.body) for m in got] == \
        [(Kind.REQUEST, i, 2.0, Fetch(i)) for i in range(1, 6)]
    assert all(m.header.session == client.session and m.header.principal == "admin"
               for m in got)
    # Replies and errors come back together, in whatever order the server has them.
    back = server.batch([server.reply_entry(3, FetchReply(3)),
                         server.error_entry(1, ShelfEmptyError("shelf 1 is empty")),
                         server.reply_entry(2, FetchReply(2))], to=client.session, now=NOW)
    replies = client.decode_all(back, NOW)
    assert [(m.header.kind, m.header.id) for m in replies] == \
        [(Kind.REPLY, 3), (Kind.ERROR, 1), (Kind.REPLY, 2)]
    assert replies[1].body.type.endswith("ShelfEmptyError")
    # A lone entry goes as a plain message, which `decode` reads as it always did.
    assert server.decode(client.single(client.request_entry(9, Ping(b"x"), ttl=1.0),
                                       now=NOW), NOW).body == Ping(b"x")


def test_batch_wire_layout_is_the_documented_one() -> None:
    client, _ = pair()
    frames = client.batch([client.request_entry(7, Ping(b"a"), ttl=1.5),
                           client.request_entry(8, Fetch(3), ttl=2.0)], now=NOW)
    _, header, body = split(frames)
    assert msgspec.msgpack.decode(header) == [4, 0, "", 0.0, client.session, 1, NOW, b"",
                                              "admin"]
    # A MessagePack array of entries: [kind, id, tag, ttl, body embedded as it is].
    assert msgspec.msgpack.decode(body) == [
        [0, 7, "rpc.ping", 1.5, {"type": "rpc.ping", "data": b"a"}],
        [0, 8, "test.fetch", 2.0, {"type": "test.fetch", "token": 3, "fail": ""}]]


def test_a_batch_is_refused_where_one_message_is_expected() -> None:
    client, server = pair()
    frames = client.batch([client.request_entry(1, Ping(), ttl=1.0)] * 2, now=NOW)
    with pytest.raises(UnknownMessageTypeError):
        server.decode(frames, NOW)


def test_a_bad_entry_of_a_batch_gets_its_own_error_and_its_siblings_decode() -> None:
    client, server = pair()
    good = client.request_entry(1, Fetch(1), ttl=1.0)
    unknown = Entry(int(Kind.REQUEST), 2, "no.such.tag", 1.0, msgspec.Raw(b"\x80"))
    undecodable = Entry(int(Kind.REQUEST), 3, Fetch.rpc_tag, 1.0, msgspec.Raw(b"\x81\xa1x\x01"))
    no_ttl = Entry(int(Kind.REQUEST), 4, Ping.rpc_tag, 0.0, msgspec.Raw(b"\x80"))
    reply = Entry(int(Kind.REPLY), 5, Pong.rpc_tag, 0.0, msgspec.Raw(b"\x80"))
    got = server.decode_all(client.batch([good, unknown, undecodable, no_ttl, reply],
                                         now=NOW), NOW)
    assert got[0].body == Fetch(1)
    errors = got[1:]
    assert [type(e) for e in errors] == [UnknownMessageTypeError, MalformedMessageError,
                                         MalformedMessageError, UnknownMessageTypeError]
    assert [e.header.id for e in errors] == [2, 3, 4, 5]  # each can be answered
    assert [e.reason for e in errors] == ["unknown_type", "bad_body", "bad_header",
                                          "unexpected_kind"]


def test_an_oversized_or_malformed_batch_is_refused_with_a_clear_error() -> None:
    limits = Limits(max_batch=3)
    client, server = pair(limits)
    with pytest.raises(ValueError, match="1 to 3"):
        client.batch([client.request_entry(i, Ping(), ttl=1.0) for i in range(4)], now=NOW)
    big = Codec(SECRET, role="client", session=client.session)  # a sender with wider bounds
    big._seq = 10
    got = server.decode_all(big.batch([big.request_entry(i, Ping(), ttl=1.0)
                                       for i in range(1, 5)], now=NOW), NOW)
    assert all(isinstance(e, MessageTooLargeError) and e.reason == "batch_too_large"
               and "a batch of 4 messages; at most 3" in str(e) for e in got)
    assert [e.header.id for e in got] == [1, 2, 3, 4]
    # A body that is no list of entries: refused whole, nothing to answer.
    frames = client.batch([client.request_entry(1, Ping(), ttl=1.0)] * 2, now=NOW)
    with pytest.raises(MalformedMessageError) as info:
        server.decode_all(resign([b"", split(frames)[1], b"\x92\x01\x02"]), NOW)
    assert info.value.reason == "bad_batch" and info.value.header is None
    frames = client.batch([client.request_entry(1, Ping(), ttl=1.0)] * 2, now=NOW)
    with pytest.raises(MalformedMessageError, match="payload"):
        server.decode_all(resign([*split(frames), b"payload"]), NOW)


def test_a_replayed_batch_is_refused_whole() -> None:
    client, server = pair()
    frames = client.batch([client.request_entry(i, Ping(), ttl=1.0) for i in (1, 2)],
                          now=NOW)
    assert len(server.decode_all(frames, NOW)) == 2
    with pytest.raises(ReplayedMessageError):
        server.decode_all(list(frames), NOW)
    signature, header, body = split(frames)
    tampered = join([signature, header, body.replace(b"\x01", b"\x02", 1)])
    with pytest.raises(BadSignatureError):
        server.decode_all(tampered, NOW)


def test_split_batches_keeps_order_within_the_bounds() -> None:
    limits = Limits(max_batch=3, max_batch_bytes=10)
    entries = [Entry(0, i, "t", 1.0, msgspec.Raw(b"x" * size))
               for i, size in enumerate([4, 4, 4, 1, 1, 1, 1, 30, 1])]
    runs = [[e.id for e in run] for run in split_batches(entries, limits)]
    assert runs == [[0, 1], [2, 3, 4], [5, 6], [7], [8]]


def test_messages_sends_runs_as_batches_and_a_run_of_one_plainly() -> None:
    client, server = pair(Limits(max_batch=2))
    entries = [client.request_entry(i, Fetch(i), ttl=2.0) for i in range(1, 6)]
    sent = list(client.messages(entries, now=NOW))
    assert [[e.id for e in run] for run, _ in sent] == [[1, 2], [3, 4], [5]]
    kinds = [msgspec.msgpack.decode(split(frames)[1])[0] for _, frames in sent]
    assert kinds == [Kind.BATCH, Kind.BATCH, Kind.REQUEST]
    got = [m for _, frames in sent for m in server.decode_all(frames, NOW)]
    assert [m.body for m in got] == [Fetch(i) for i in range(1, 6)]
