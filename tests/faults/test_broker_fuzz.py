"""Hostile input against a real broker process: random and mutated frames, wrong secret,
oversized frames, and well-signed requests with random fields and payloads. Throughout, a
well-behaved producer and subscriber keep working, and at the end they have every record;
no request is ever answered with InternalServerError (a handler bug).

The hostile peers passed the handshake (they hold the admin's token for brokers), so what
they send reaches the codec; a peer with another secret is refused when it connects and
sends nothing.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zmq.utils.monitor import recv_monitor_message

from querylib.broker import Data, EndOfStream, Producer, Subscriber
from querylib.broker import messages as m
from querylib.broker._stream import encode_records
from querylib.rpc import (
    BROKER,
    Codec,
    Credential,
    Kind,
    Ping,
    RpcProtocolError,
    Signer,
    audience_key,
    error_from_body,
)
from querylib.rpc._codec import envelope, open_envelope
from querylib.rpc._errors import InternalServerError
from tests.conftest import Processes, free_port
from tests.integration._broker_helpers import secret_file, start_broker
from tests.querylib.rpc._support import authenticate

RECORDS = 3000


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    path, secret = secret_file(tmp)
    port = free_port()
    procs = Processes()
    try:
        proc = start_broker(procs, tmp / "data", port, path, secret)
        yield proc, f"tcp://127.0.0.1:{port}", secret
    finally:
        procs.stop_all()


class Hostile:
    """A raw DEALER speaking to the broker (through the handshake, with `secret`'s
    credential); remembers every answer it got."""

    def __init__(self, address: str, secret: bytes) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = authenticate(self.ctx.socket(zmq.DEALER), secret, BROKER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.handshakes = self.sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self.sock.connect(address)
        # A broker checks what a principal sends it with the principal's broker key.
        self.codec = Codec(Credential.of(secret).for_audience(BROKER), role="client")
        self.signer = Signer(audience_key(secret, BROKER))
        self.ids = iter(range(1, 10**9))
        self.answers: list[object] = []
        self.misaddressed = 0

    def send(self, frames: list) -> None:
        self.sock.send_multipart(frames, copy=True)

    def offer(self, frames: list) -> bool:
        """Send if the socket has somewhere to send now. A peer the server refused (or cut
        off) may have no connection left, and a blocking send would wait for one forever;
        either way nothing of it reaches the server."""
        try:
            self.sock.send_multipart(frames, copy=True, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def signed(self, frames: list) -> list:
        """Re-sign (possibly mutated) frames: an authenticated peer. The envelope's header and
        body (as its header length splits them) and the payload frames keep their bytes."""
        _, header, body = open_envelope(frames[0] if frames else b"")
        parts = [bytes(header), bytes(body), *frames[1:]]
        return [envelope(self.signer.sign(parts), parts[0], parts[1]), *frames[1:]]

    def request(self, message, payload=()) -> list:
        return self.codec.request(next(self.ids), message, ttl=5.0, now=time.time(),
                                  payload=list(payload))

    def drain(self, wait: float = 0.0) -> None:
        deadline = time.monotonic() + wait
        while True:
            timeout = max(0.0, deadline - time.monotonic())
            if not self.sock.poll(int(timeout * 1000)):
                return
            frames = self.sock.recv_multipart()
            try:
                self.answers.append(self.codec.decode(frames, time.time()))
            except RpcProtocolError:
                # An answer to a request whose header we mutated (another session id): it is
                # addressed to that session, so our codec refuses it, as it should.
                self.misaddressed += 1

    def handshake(self) -> dict:
        """How the connection's handshake ended (zmq's monitor event)."""
        assert self.handshakes.poll(30_000), "no handshake outcome"
        return recv_monitor_message(self.handshakes)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.handshakes.close(0)
        self.sock.close(linger=0)


class GoodTraffic:
    """A producer and a subscriber doing honest work on their own threads while we attack."""

    def __init__(self, address: str, secret: bytes) -> None:
        self.address, self.secret = address, secret
        self.values: list[str] = []
        self.errors: list[BaseException] = []
        self.sent = 0
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        self.stop = threading.Event()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _produce(self) -> None:
        """Records until told to stop (at least RECORDS), so the stream spans the attack."""
        try:
            with Producer(self.address, "good", secret=self.secret, linger=0.001) as producer:
                i = 0
                while i < RECORDS or not self.stop.is_set():
                    producer.send(f"v{i}".encode(), time=i // 100)
                    i += 1
                    self.sent = i
                    if i % 100 == 0:
                        producer.advance(i // 100)
                        self.stop.wait(0.005)  # pace it: a steady stream, not a burst
        except BaseException as exc:
            self.errors.append(exc)

    def _consume(self) -> None:
        try:
            with Subscriber(self.address, "good", 0, secret=self.secret, create=True) as sub:
                for event in sub:
                    if isinstance(event, Data):
                        self.values += [r.value.decode() for r in event.records]
                    elif isinstance(event, EndOfStream):
                        return
        except BaseException as exc:
            self.errors.append(exc)

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, self.errors
        assert self.sent >= RECORDS
        assert self.values == [f"v{i}" for i in range(self.sent)]


@pytest.fixture(scope="module")
def good(broker):
    _, address, secret = broker
    traffic = GoodTraffic(address, secret)
    traffic.start()
    yield traffic


@pytest.fixture(scope="module")
def hostile(broker):
    _, address, secret = broker
    h = Hostile(address, secret)
    yield h
    h.close()


def valid_batch(n: int = 3) -> bytes:
    return encode_records([(None, b"x" * 10, (), 0, None)] * n)


# Never the honest topic: a hostile producer joining it would (rightly) hold its stream open.
names = st.one_of(st.sampled_from(["t", "", ".", "..", "a/b", "x" * 300, "é", "-"]),
                  st.text(max_size=20)).filter(lambda name: name != "good")
ints = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 1, 2**31]))
sessions = st.one_of(st.just("fuzz"), st.text(max_size=200))
requests = st.one_of(
    st.builds(m.OpenSessionRequest, session=sessions,
              lease=st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(m.HeartbeatRequest, session=sessions),
    st.builds(m.EnsurePartition, topic=names, partition=ints, create=st.booleans()),
    st.builds(m.ListPartitions, topic=names),
    st.builds(m.OpenProducerRequest, session=sessions, topic=names, partition=ints,
              create=st.booleans()),
    st.builds(m.AdvanceRequest, session=sessions, topic=names, partition=ints, frontier=ints),
    st.builds(m.EndStreamRequest, session=sessions, topic=names, partition=ints),
    st.builds(m.SubscribeRequest, session=sessions, sub_id=ints, topic=names, partition=ints,
              start=st.one_of(ints, st.sampled_from(["earliest", "latest"])), credit=ints,
              create=st.booleans()),
    st.builds(m.UnsubscribeRequest, session=sessions, sub_id=ints),
    st.builds(m.CloseSessionRequest, session=st.just("someone-else")),
)
payloads = st.one_of(
    st.lists(st.binary(max_size=200), max_size=3),
    st.builds(lambda b, i, x: [b[:i] + bytes([x]) + b[i + 1:]], st.just(valid_batch()),
              st.integers(0, len(valid_batch()) - 1), st.integers(0, 255)),
    st.just([valid_batch()]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(message=requests, payload=payloads)
def test_random_well_signed_requests_get_typed_answers(broker, good, hostile, message, payload):
    # Open the fuzz session sometimes, so requests reach the state machine, not just lookups.
    hostile.send(hostile.request(m.OpenSessionRequest(session="fuzz", lease=30.0)))
    hostile.send(hostile.request(m.OpenProducerRequest(session="fuzz", topic="t", partition=0)))
    produce = m.ProduceRequest(session="fuzz", topic="t", partition=0)
    hostile.send(hostile.request(produce, payload))
    hostile.send(hostile.request(message, payload if payload and len(payload) < 2 else ()))
    hostile.send(hostile.codec.notify(m.CreditNotify(session="fuzz", sub_id=1, nbytes=-5),
                                      now=time.time()))
    hostile.drain()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(st.binary(max_size=300), min_size=0, max_size=8),
       flips=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 400), st.integers(0, 255)),
                      max_size=4),
       resign=st.booleans())
def test_random_and_mutated_frames_are_dropped_or_refused(broker, good, hostile, frames,
                                                          flips, resign):
    hostile.send(frames or [b""])
    valid = hostile.request(m.ProduceRequest(session="fuzz", topic="t", partition=0),
                            [valid_batch()])
    mutated = [bytearray(f) for f in valid]
    for frame, pos, value in flips:
        if frame < len(mutated) and mutated[frame]:
            mutated[frame][pos % len(mutated[frame])] = value
    out = [bytes(f) for f in mutated]
    hostile.send(hostile.signed(out) if resign else out)
    hostile.drain()


def test_wrong_secret_and_oversized_frames_are_dropped(broker, good, hostile):
    proc, address, secret = broker
    stranger = Hostile(address, os.urandom(32))
    try:
        stranger.offer(stranger.request(Ping(b"hello")))
        event = stranger.handshake()  # refused when it connects: not a frame goes through
        assert (event["event"], event["value"]) == (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)
        stranger.drain(wait=0.5)
        assert stranger.answers == []
    finally:
        stranger.close()
    # Too many frames, and a batch over the broker's maximum (authentic, so answered).
    hostile.send(hostile.signed([*hostile.request(Ping(b"x")), *[b"p"] * 100]))
    big = hostile.request(m.ProduceRequest(session="fuzz", topic="t", partition=0),
                          [b"\0" * (9 * 1024 * 1024)])
    hostile.send(big)
    # A frame over zmq's maximum message size: zmq drops that connection, not the server.
    giant = Hostile(address, secret)
    try:
        giant.offer(giant.signed([*giant.request(Ping(b"x")), bytes(97 * 2**20)]))
    finally:
        giant.close()
    hostile.drain(wait=1.0)
    assert proc.poll() is None


def test_the_broker_served_honest_clients_throughout(broker, good, hostile):
    """Runs last in this module: the honest producer and subscriber finished correctly, and no
    hostile request hit a bug."""
    proc, address, secret = broker
    good.stop.set()
    good.join()
    hostile.drain(wait=1.0)
    bugs = [a for a in hostile.answers
            if a.header.kind == Kind.ERROR
            and isinstance(error_from_body(a.body), InternalServerError)]
    assert bugs == []
    errors = [a for a in hostile.answers if a.header.kind == Kind.ERROR]
    assert errors, "hostile requests should have been refused with typed errors"
    with Producer(address, "after", secret=secret) as producer:
        producer.send(b"still here")
    assert proc.poll() is None
