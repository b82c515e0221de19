"""BulkWorkerConnection is WorkerConnection with plain messages batched: for any stream of
frames (valid or not) cut anywhere, it yields the same events (a MessageRun standing for its
MessageReceived events), the same ERROR replies, and ends in the same state with the same
credits and streams."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querylib.connector import (
    BulkWorkerConnection,
    Dialect,
    MessageFlags,
    MessageReceived,
    MessageRun,
    ProtocolFailed,
    WorkerConnection,
    draft,
    released,
)

from .harness import COOKIE, hello_frame, module
from .strategies import chunked

BOTH = pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
SIDS = (1, 2, 7)


def _expand(events):
    out = []
    for event in events:
        if isinstance(event, MessageRun):
            for mid, payload, event_time, key, flags in event.messages:
                out.append(MessageReceived(event.stream_id, mid, payload, event_time, key,
                                           MessageFlags(flags)))
        elif isinstance(event, ProtocolFailed):
            out.append(("failed", type(event.error), event.reply))
        else:
            out.append(event)
    return out


def _setup(cls, dialect: Dialect, credits: int, **kwargs):
    """A connection streaming with streams 1 and 2 open (2 resumes after message 4)."""
    mod = module(dialect)
    conn = cls(cookie=COOKIE, dialects=(dialect,), **kwargs)
    conn.receive_data(mod.encode(hello_frame(dialect)))
    conn.accept(credits + 2, {2: 4})
    point = 0 if dialect is Dialect.DRAFT else 2**64 - 1
    conn.receive_data(b"".join(mod.encode(mod.Notify(sid, b"s", point)) for sid in SIDS[:2]))
    if dialect is Dialect.RELEASED:
        for sid in SIDS[:2]:
            conn.accept_stream(sid, 4 if sid == 2 else None)
    return conn


def _draft_message(draw):
    sid = draw(st.sampled_from((*SIDS, 99)))
    flags = draw(st.sampled_from([0, 0, 0, 1, 8, 16, 16, 17, 2, 4, 6, 32, 0x8000]))
    mid = draw(st.integers(0, 40))
    payload = b"" if flags & 2 else draw(st.binary(max_size=12))
    event_time = draw(st.integers(0, 2**64 - 1)) if flags & 16 else None
    return draft.Message(sid, flags, mid, event_time, payload)


def _released_message(draw):
    sid = draw(st.sampled_from((*SIDS, 99)))
    return released.Message(sid, draw(st.integers(0, 40)), draw(st.sampled_from([0, 0, -5, 9])),
                            draw(st.sampled_from([b"", b"", b"k"])), draw(st.binary(max_size=12)))


@st.composite
def sessions(draw, dialect: Dialect):
    """Encoded frames after the handshake: messages, NOTIFYs, EOS, sometimes junk."""
    mod = module(dialect)
    frames = []
    for _ in range(draw(st.integers(0, 40))):
        choice = draw(st.integers(0, 19))
        if choice < 15:
            frame = (_draft_message if dialect is Dialect.DRAFT else _released_message)(draw)
        elif choice < 17:
            frame = mod.Notify(draw(st.sampled_from(SIDS)), b"s", 0)
        elif choice < 18 and dialect is Dialect.RELEASED:
            frame = released.Eos(draw(st.sampled_from(SIDS)))
        elif choice < 19:
            frames.append(draw(st.sampled_from([b"\x00\x00\x00\x00", b"\xff\xff\xff\x7fM",
                                                b"\x01\x00\x00\x00M", b"\x00\x00\x00\x01M"])))
            continue
        else:
            frame = mod.Notify(draw(st.sampled_from(SIDS)), b"\xff", 0)
        frames.append(mod.encode(frame))
    return b"".join(frames)


@BOTH
@given(data=st.data(), cuts=st.lists(st.integers(0, 2000), max_size=8),
       credits=st.sampled_from([3, 10, 100]), ack_every=st.sampled_from([0, 1, 3]))
def test_bulk_equals_base(dialect, data, cuts, credits, ack_every):
    raw = data.draw(sessions(dialect))
    base = _setup(WorkerConnection, dialect, credits, max_frame_size=64)
    bulk = _setup(BulkWorkerConnection, dialect, credits, max_frame_size=64)
    expected, got = [], []
    for i, chunk in enumerate(chunked(raw, cuts)):
        expected += _expand(base.receive_data(chunk))
        got += _expand(bulk.receive_data(chunk))
        assert got == expected
        if ack_every and i % ack_every == 0:
            for conn in (base, bulk):
                conn.ack(3)
    assert (bulk.state, bulk.credits, bulk.buffered) == (base.state, base.credits, base.buffered)
    for sid in (*SIDS, 99):
        assert bulk.stream(sid) == base.stream(sid)


@BOTH
def test_plain_messages_come_as_one_run(dialect):
    mod = module(dialect)
    conn = _setup(BulkWorkerConnection, dialect, 100)
    if dialect is Dialect.DRAFT:
        frames = [draft.Message(1, 0, i, None, b"v%d" % i) for i in range(5)]
    else:
        frames = [released.Message(1, i, 0, b"", b"v%d" % i) for i in range(5)]
    events = conn.receive_data(b"".join(mod.encode(f) for f in frames))
    assert len(events) == 1 and isinstance(events[0], MessageRun)
    assert [m[0] for m in events[0].messages] == list(range(5))
    assert events[0].nbytes >= sum(len(b"v%d" % i) for i in range(5))
    assert conn.credits == 100 - 5
    assert conn.stream(1).last_message_id == 4


def test_a_partial_frame_waits_and_is_bounded():
    conn = _setup(BulkWorkerConnection, Dialect.DRAFT, 100)
    data = draft.encode(draft.Message(1, 0, 1, None, b"x" * 50))
    assert conn.receive_data(data[:30]) == []
    assert conn.buffered == 30
    (run,) = conn.receive_data(data[30:])
    assert run.messages[0][1] == b"x" * 50 and conn.buffered == 0
