"""Fuzzing the decoders and the connections with random and mutated bytes in random chunkings:
only connector protocol errors come out, every call returns (no hang), and what stays buffered
never exceeds one partial frame."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.connector import (
    ConnectionState,
    ConnectorProtocolError,
    Dialect,
    Event,
    Hello,
    MessageReceived,
    ProtocolFailed,
    StreamOpened,
    WorkerConnection,
    draft,
    released,
)

from .harness import COOKIE, end, hello_frame, message, module, notify, source
from .strategies import any_frame, chunked

MAX = 256  # a small maximum frame size so fuzzed lengths hit the limit often
HEAVY = 50  # examples for the costlier properties: keeps the suite fast on 2 shared cores
BOTH = pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
CUTS = st.lists(st.integers(0, 2048), max_size=16)


def valid_session(dialect) -> tuple[bytes, bytes]:
    """What a well-behaved connector sends: hello; then (after OK) streams, messages, an end."""
    frames = [
        notify(dialect, 1),
        notify(dialect, 2, b"two"),
        message(dialect, 1, 1, b"a"),
        message(dialect, 2, 1, b"b"),
        message(dialect, 1, 2, b"c" * 40),
        end(dialect, 2),
        module(dialect).Error(b"bye"),
    ]
    hello = module(dialect).encode(hello_frame(dialect))
    return hello, b"".join(module(dialect).encode(f) for f in frames)


@st.composite
def mutated(draw, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[pos] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, ord("H"), ord("M")]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[pos:]
    return bytes(data)


def run_decoder(decoder, chunks) -> None:
    try:
        for chunk in chunks:
            for frame in decoder.receive_data(chunk):
                assert frame.frame_type  # a real frame object
            assert decoder.buffered < 4 + MAX
    except ConnectorProtocolError:
        assert decoder.buffered == 0


@pytest.mark.parametrize("mod", [draft, released], ids=["draft", "released"])
@given(data=st.binary(max_size=1024), cuts=CUTS)
@settings(max_examples=200)  # cheap: plenty of random bytes
def test_decoder_random_bytes(mod, data, cuts):
    run_decoder(mod.FrameDecoder(max_frame_size=MAX), chunked(data, cuts))


@pytest.mark.parametrize("mod", [draft, released], ids=["draft", "released"])
@given(data=st.data(), cuts=CUTS)
@settings(max_examples=HEAVY)
def test_decoder_mutated_frames(mod, data, cuts):
    frames = data.draw(st.lists(any_frame(mod), min_size=1, max_size=5))
    wire = b"".join(mod.encode(f) for f in frames)
    run_decoder(mod.FrameDecoder(max_frame_size=MAX), chunked(data.draw(mutated(wire)), cuts))


class Endpoint:
    """A minimal well-behaved endpoint policy, so fuzzed bytes reach every state."""

    def __init__(self) -> None:
        self.conn = WorkerConnection(cookie=COOKIE, max_frame_size=MAX)
        self.sent = b""

    def feed(self, chunk: bytes) -> list[Event]:
        events = self.conn.receive_data(chunk)
        assert all(isinstance(e, Event) for e in events)
        failed = [e for e in events if isinstance(e, ProtocolFailed)]
        assert len(failed) <= 1 and (not failed or events[-1] is failed[0])
        if failed:
            assert isinstance(failed[0].error, ConnectorProtocolError)
            assert self.conn.state is ConnectionState.ERROR and self.conn.buffered == 0
        for event in events:  # no state checks: commands after the end return b""
            if isinstance(event, Hello):
                self.sent += self.conn.accept(8)
            elif isinstance(event, StreamOpened):
                self.sent += self.conn.accept_stream(event.stream_id)
            elif isinstance(event, MessageReceived):
                self.sent += self.conn.ack(1, [(event.stream_id, event.message_id)])
        assert self.conn.buffered < 4 + MAX
        return events


@BOTH
@given(data=st.data(), cuts=CUTS)
@settings(max_examples=HEAVY)
def test_worker_connection_mutated_sessions(dialect, data, cuts):
    wire = data.draw(mutated(b"".join(valid_session(dialect))))
    endpoint = Endpoint()
    for chunk in chunked(wire, cuts):
        endpoint.feed(chunk)


@given(data=st.binary(max_size=1024), cuts=CUTS)
@settings(max_examples=200)  # cheap: plenty of random bytes
def test_worker_connection_random_bytes(data, cuts):
    endpoint = Endpoint()
    for chunk in chunked(data, cuts):
        endpoint.feed(chunk)


@BOTH
def test_valid_session_passes_unmutated(dialect):
    endpoint = Endpoint()
    hello, rest = valid_session(dialect)
    assert [type(e).__name__ for e in endpoint.feed(hello)] == ["Hello"]
    if dialect is Dialect.DRAFT:
        events = endpoint.feed(rest)
    else:  # each NOTIFY must be answered before messages flow
        notifies = len(module(dialect).encode(notify(dialect, 1)))
        notifies += len(module(dialect).encode(notify(dialect, 2, b"two")))
        events = endpoint.feed(rest[:notifies]) + endpoint.feed(rest[notifies:])
    assert [type(e).__name__ for e in events] == [
        "StreamOpened", "StreamOpened", "MessageReceived", "MessageReceived", "MessageReceived",
        *(["MessageReceived"] if dialect is Dialect.DRAFT else []), "StreamEnded", "PeerError",
    ]


@BOTH
@given(data=st.data(), cuts=CUTS)
@settings(max_examples=HEAVY)
def test_source_connection_mutated_worker_bytes(dialect, data, cuts):
    mod = module(dialect)
    conn = source(dialect, max_frame_size=MAX)
    conn.hello()
    frames = [mod.Ok(3), mod.Ack(2)]
    frames += data.draw(st.lists(any_frame(mod), max_size=4))
    wire = data.draw(mutated(b"".join(mod.encode(f) for f in frames)))
    for chunk in chunked(wire, cuts):
        events = conn.receive_data(chunk)
        assert all(isinstance(e, Event) for e in events)
        for event in events:
            if isinstance(event, ProtocolFailed):
                assert isinstance(event.error, ConnectorProtocolError) and event is events[-1]
        assert conn.buffered < 4 + MAX
