"""Hostile input against a real server: garbage, tampering, wrong secrets, replays, oversize.

A raw DEALER sends what hypothesis draws while a well-behaved client keeps being answered. It
passed the handshake (it holds the admin's token: a buggy or hostile cluster member; a peer
without a credential sends nothing at all, tests/integration/test_rpc_handshake.py), so
everything it sends reaches the codec. Every hostile message must be counted exactly once
under some drop reason, answered only when it was authentic (signed with the cluster secret),
and never stop the server's loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
import pytest
import zmq
import zmq.auth.thread
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from querylib.rpc import (
    BlockingClient,
    Codec,
    ErrorBody,
    Header,
    Kind,
    Limits,
    Ping,
    Pong,
    Signer,
    audience_key,
    handshake_token,
    message_type,
)
from querylib.rpc._codec import envelope, open_envelope
from tests.conftest import wait_for
from tests.querylib.rpc._support import SECRET, Fetch, FetchReply, ServerThread, authenticate

LIMITS = Limits(max_message_bytes=64 * 1024, max_frames=8, max_body_bytes=16 * 1024)
OTHER_SECRET = b"some other cluster's secret key!"
REPLY_TIMEOUT_MS = 10_000


@dataclass
class Env:
    server: ServerThread
    good: BlockingClient
    raw: zmq.Socket
    insider: Codec  # knows the secret: what a buggy or hostile cluster member can send
    outsider: Codec  # signs with another secret
    sent: int = 0  # hostile messages sent, each to be counted once
    reasons: set[str] = field(default_factory=set)

    def drops(self) -> int:
        return sum(self.server.counters().values())

    def send(self, frames: list[bytes]) -> None:
        self.raw.send_multipart(frames)
        self.sent += 1

    def reply(self) -> tuple[Header, object]:
        assert self.raw.poll(REPLY_TIMEOUT_MS), "no answer from the server"
        incoming = self.insider.decode(self.raw.recv_multipart(), time.time())
        return incoming.header, incoming.body


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    server = ServerThread(limits=LIMITS)
    good = BlockingClient(server.endpoint, SECRET, limits=LIMITS, timeout=20.0)
    raw = authenticate(zmq.Context.instance().socket(zmq.DEALER), SECRET)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.SNDTIMEO, 10_000)
    raw.connect(server.endpoint)
    try:
        yield Env(server, good, raw, Codec(SECRET, role="client", limits=LIMITS),
                  Codec(OTHER_SECRET, role="client", limits=LIMITS))
    finally:
        raw.close(0)
        good.close()
        server.stop()


def signed(header: Header, body: bytes) -> list[bytes]:
    encoded = msgspec.msgpack.encode(header)
    return [envelope(Signer(SECRET).sign([encoded, body]), encoded, body)]


def fresh_header(env: Env, **changes: object) -> Header:
    """A valid request header from the insider's session, with `changes` applied."""
    frames = env.insider.request(1, Ping(), ttl=5.0, now=time.time())
    return msgspec.structs.replace(msgspec.msgpack.decode(open_envelope(frames[0])[1],
                                                          type=Header), **changes)


frames_st = st.lists(st.binary(max_size=64), min_size=1, max_size=12)

attack_st = st.one_of(
    st.tuples(st.just("random"), frames_st),
    st.tuples(st.just("flip"), st.integers(0, 10), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10), st.integers(0, 10_000)),
    st.tuples(st.just("drop_frame"), st.integers(0, 10)),
    st.tuples(st.just("extra_frame"), st.binary(max_size=32)),
    st.tuples(st.just("wrong_secret"), st.binary(max_size=32)),
    st.tuples(st.just("unknown_tag"), st.text(max_size=40)),
    st.tuples(st.just("bad_body"), st.binary(max_size=64)),
    st.tuples(st.just("bad_header"), st.binary(max_size=64)),
    st.tuples(st.just("replay"), st.binary(max_size=16)),
    st.tuples(st.just("stale"), st.floats(400, 1e9)),
    st.tuples(st.just("oversized"), st.integers(3, 6)),
    st.tuples(st.just("too_many_frames"), st.integers(9, 30)),
)


def attack(env: Env, kind: str, *args: object) -> None:
    """Send one attack; check the answers it deserves (only authentic requests get one)."""
    valid = env.insider.request(7, Fetch(1), ttl=5.0, now=time.time(), payload=[b"batch"])
    if kind == "random":
        env.send(list(args[0]))  # type: ignore[arg-type]
    elif kind == "flip":
        index, position, xor = (int(a) for a in args)  # type: ignore[call-overload]
        frame = bytearray(valid[index % len(valid)])
        frame[position % len(frame)] ^= xor
        valid[index % len(valid)] = bytes(frame)
        env.send(valid)
    elif kind == "truncate":
        index, keep = (int(a) for a in args)  # type: ignore[call-overload]
        frame = valid[index % len(valid)]
        valid[index % len(valid)] = frame[: keep % len(frame)]
        env.send(valid)
    elif kind == "drop_frame":
        del valid[int(args[0]) % len(valid)]  # type: ignore[call-overload]
        env.send(valid)
    elif kind == "extra_frame":
        env.send([*valid, args[0]])  # type: ignore[list-item]
    elif kind == "wrong_secret":
        env.send(env.outsider.request(1, Ping(args[0]), ttl=5.0, now=time.time()))  # type: ignore[arg-type]
    elif kind == "unknown_tag":
        tag = str(args[0])
        assume(message_type(tag) is None)
        env.send(signed(fresh_header(env, tag=tag, id=11), b"\x80"))
        header, body = env.reply()
        assert header.kind == Kind.ERROR and header.id == 11
        assert isinstance(body, ErrorBody) and body.type.endswith("UnknownMessageTypeError")
    elif kind == "bad_body":
        body = bytes(args[0])  # type: ignore[arg-type]
        try:
            Fetch.rpc_decoder.decode(body)
            assume(False)  # hypothesis built a valid Fetch: not an attack
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        env.send(signed(fresh_header(env, tag="test.fetch", id=12), body))
        header, answer = env.reply()
        assert header.kind == Kind.ERROR and header.id == 12
        assert isinstance(answer, ErrorBody) and answer.type.endswith("MalformedMessageError")
    elif kind == "bad_header":
        raw_header = bytes(args[0])  # type: ignore[arg-type]
        try:
            msgspec.msgpack.decode(raw_header, type=Header)
            assume(False)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        env.send([envelope(Signer(SECRET).sign([raw_header, b"\x80"]), raw_header, b"\x80")])
    elif kind == "replay":
        ping = env.insider.request(13, Ping(args[0]), ttl=5.0, now=time.time())  # type: ignore[arg-type]
        env.raw.send_multipart(ping)  # the genuine one is answered, not dropped
        header, pong = env.reply()
        assert header.kind == Kind.REPLY and pong == Pong(args[0])  # type: ignore[arg-type]
        env.send(ping)
    elif kind == "stale":
        env.send(env.insider.request(14, Ping(), ttl=5.0, now=time.time() - float(args[0])))  # type: ignore[arg-type]
    elif kind == "oversized":
        env.send([*valid, *([b"p" * (30 * 1024)] * int(args[0]))])  # type: ignore[call-overload]
    elif kind == "too_many_frames":
        env.send([b"f"] * int(args[0]))  # type: ignore[call-overload]
    else:
        raise AssertionError(kind)
    env.reasons.add(kind)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(attacks=st.lists(attack_st, min_size=1, max_size=4))
def test_server_counts_hostile_input_and_keeps_answering(env: Env, attacks: list) -> None:
    for item in attacks:
        attack(env, *item)
    # Every hostile message is dropped exactly once, and the loop is still serving.
    wait_for(lambda: env.drops() >= env.sent, what=f"{env.sent} drops counted")
    assert env.drops() == env.sent
    token = env.sent
    assert env.good.request(Fetch(token)) == FetchReply(token)


def test_counters_name_every_reason(env: Env) -> None:
    """Runs after the fuzz test in this module: the drops were sorted by reason."""
    if not env.reasons:
        pytest.skip("needs test_server_counts_hostile_input_and_keeps_answering first")
    counters = env.server.counters()
    assert "internal_error" not in counters
    assert set(counters) <= {"malformed", "too_many_frames", "too_large", "unsigned",
                             "bad_signature", "bad_header", "replayed", "stale",
                             "unknown_type", "bad_body", "unexpected_kind"}
    for reason in ("bad_signature", "unknown_type", "bad_body", "replayed", "stale",
                   "too_large", "too_many_frames"):
        assert counters.get(reason, 0) > 0, reason
    assert env.good.counters == {}


def test_frame_over_zmq_maxmsgsize_only_costs_that_peer_its_connection(env: Env) -> None:
    """zmq drops a peer sending a frame over ZMQ_MAXMSGSIZE before we see a byte of it (a
    peer that passed the handshake: a stranger's frames are not read at all)."""
    before = env.server.counters()
    rogue = authenticate(zmq.Context.instance().socket(zmq.DEALER), SECRET)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(env.server.endpoint)
    try:
        rogue.send_multipart([b"x" * (LIMITS.max_message_bytes + 1)])
        for n in range(20):
            assert env.good.request(Ping(b"%d" % n)) == Pong(b"%d" % n)
    finally:
        rogue.close(0)
    assert env.server.counters() == before


def test_flood_of_garbage_while_a_client_is_served(env: Env) -> None:
    before = env.drops()
    flood = 3000
    answered = 0
    for n in range(flood):
        env.raw.send_multipart([b"%d" % n, b"garbage", b"frames"])
        if n % 100 == 0:
            assert env.good.request(Fetch(n)) == FetchReply(n)
            answered += 1
    wait_for(lambda: env.drops() - before == flood, what="every flood message counted")
    assert answered == flood // 100


@dataclass
class RogueServer:
    """A raw ROUTER posing as a server, and a real client connected to it."""

    router: zmq.Socket
    client: BlockingClient
    codec: Codec  # the genuine server-side codec, for the answers that must get through
    peer: bytes = b""
    garbage: int = 0


@pytest.fixture(scope="module")
def rogue() -> Iterator[RogueServer]:
    # A context of its own, whose ZAP handler (pyzmq's) admits the client's credential: our
    # client speaks standard ZMQ PLAIN.
    context = zmq.Context()
    auth = zmq.auth.thread.ThreadAuthenticator(context)
    auth.start()
    auth.configure_plain(passwords={
        "admin": handshake_token(audience_key(SECRET, "coordinator")).decode()})
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.PLAIN_SERVER, 1)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = BlockingClient(f"tcp://127.0.0.1:{port}", SECRET, limits=LIMITS, timeout=20.0)
    try:
        server = RogueServer(router, client, Codec(SECRET, role="server", limits=LIMITS))
        first = threading.Thread(target=answer_one_ping, args=(server, []))
        first.start()
        assert client.request(Ping(b"?")) == Pong(b"ok")
        first.join(30)
        yield server
    finally:
        client.close()
        router.close(0)
        auth.stop()
        context.term()


def answer_one_ping(rogue: RogueServer, garbage: list[list[bytes]]) -> None:
    """Receive the client's Ping, send it `garbage` first, then the genuine Pong."""
    assert rogue.router.poll(REPLY_TIMEOUT_MS)
    peer, *frames = rogue.router.recv_multipart()
    request = rogue.codec.decode(frames, time.time())
    for junk in garbage:
        rogue.router.send_multipart([peer, *junk])
        rogue.garbage += 1
    pong = rogue.codec.reply(request.header.id, Pong(b"ok"), to=request.header.session,
                             now=time.time())
    rogue.router.send_multipart([peer, *pong])
    rogue.router.send_multipart([peer, *pong])  # a replay: dropped, not a second answer
    rogue.garbage += 1


def _ping_among(rogue: RogueServer, garbage: list[list[bytes]]) -> None:
    """A ping the rogue answers after sending `garbage`: the reply arrives and the client
    counts every hostile message."""
    server = threading.Thread(target=answer_one_ping, args=(rogue, garbage))
    server.start()
    try:
        assert rogue.client.request(Ping(b"?")) == Pong(b"ok")
    finally:
        server.join(30)
    wait_for(lambda: sum(rogue.client.counters.values()) == rogue.garbage,
             what="every hostile message counted by the client")


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(garbage=st.lists(frames_st, max_size=4))
def test_client_counts_hostile_replies_and_keeps_working(rogue: RogueServer,
                                                         garbage: list[list[bytes]]) -> None:
    _ping_among(rogue, garbage)
