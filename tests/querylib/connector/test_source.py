"""SourceConnection behaviours, and whole conversations between a source and a worker over
in-memory byte pipes (random operations, random chunking) in both dialects."""

from __future__ import annotations

import pytest
from hypothesis import event as note_event
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.connector import (
    Accepted,
    Acked,
    ConnectionState,
    Dialect,
    LocalProtocolError,
    MessageFlags,
    MessageReceived,
    Nacked,
    NoCreditError,
    ProtocolFailed,
    RestartRequested,
    StreamAccepted,
    StreamEnded,
    StreamRejected,
    StreamState,
    UnknownStreamError,
    draft,
)

from .harness import kinds, module, pair, source
from .strategies import chunked

HEAVY = 50  # examples for the costlier properties: keeps the suite fast on 2 shared cores
BOTH = pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)


@BOTH
def test_hello_carries_the_configured_fields(dialect):
    conn = source(dialect, cookie="c")
    (frame,) = module(dialect).FrameDecoder().receive_data(conn.hello())
    assert frame == module(dialect).Hello(module(dialect).VERSION.encode(), b"c", b"prog", b"inst")
    assert conn.state is ConnectionState.HANDSHAKE


def test_draft_ok_resume_points_are_translated_to_processed():
    conn = source(Dialect.DRAFT)
    conn.hello()
    events = conn.receive_data(draft.encode(draft.Ok(3, ((1, 0), (2, 8)))))
    assert events == [Accepted(3, ((1, None), (2, 7)))]
    assert conn.credits == 3


@BOTH
def test_no_credit_means_nothing_is_sent(dialect):
    w, s = pair(dialect, credits=1)
    s.notify(1, "one")
    with pytest.raises(NoCreditError):
        s.notify(2, "two")
    assert s.stream_state(2) is StreamState.INTRO and s.credits == 0


def test_released_source_waits_for_notify_ack():
    w, s = pair(Dialect.RELEASED)
    w.receive_data(s.notify(1, "one"))
    assert not s.can_send(1)
    with pytest.raises(LocalProtocolError):
        s.send_message(1, 0, b"x")
    events = s.receive_data(w.accept_stream(1, 4))
    assert events == [StreamAccepted(1, 4)] and s.can_send(1)


def test_released_rejected_stream():
    w, s = pair(Dialect.RELEASED)
    w.receive_data(s.notify(1, "one"))
    assert s.receive_data(w.reject_stream(1)) == [StreamRejected(1, None)]
    assert s.stream_state(1) is StreamState.CLOSED


def test_draft_nack_asks_for_a_notify_and_a_resend():
    w, s = pair(Dialect.DRAFT)
    w.receive_data(s.notify(1, "one") + s.send_message(1, 0) + s.send_message(1, 1))
    events = s.receive_data(w.nack(1, processed=0, credits=2))
    assert events == [Nacked(1, 0, 2)]
    assert s.stream_state(1) is StreamState.RESET and not s.can_send(1)
    events = w.receive_data(s.notify(1, "one", processed=0) + s.send_message(1, 1, b"again"))
    assert kinds(events) == ["StreamOpened", "MessageReceived"]


def test_released_restart_request():
    w, s = pair(Dialect.RELEASED)
    assert s.receive_data(w.restart("h:7000")) == [RestartRequested("h:7000")]
    assert s.state is ConnectionState.CLOSED


@BOTH
def test_ack_for_an_unknown_stream_is_the_workers_protocol_error(dialect):
    w, s = pair(dialect)
    events = s.receive_data(module(dialect).encode(module(dialect).Ack(1, ((5, 1),))))
    assert isinstance(events[-1], ProtocolFailed)
    assert isinstance(events[-1].error, UnknownStreamError)
    assert b"5" in events[-1].reply


@pytest.mark.parametrize(
    ("dialect", "kwargs"),
    [
        (Dialect.DRAFT, {"key": b"k"}),
        (Dialect.DRAFT, {"flags": 64}),
        (Dialect.DRAFT, {"flags": 2, "payload": b"boundary with payload"}),
        (Dialect.DRAFT, {"event_time": -1}),
        (Dialect.RELEASED, {"event_time": 0}),
        (Dialect.RELEASED, {"key": b""}),
        (Dialect.RELEASED, {"flags": 4}),
        (Dialect.RELEASED, {"payload": b"x" * 200}),  # over the maximum frame size
    ],
)
def test_source_refuses_what_its_dialect_cannot_say(dialect, kwargs):
    w, s = pair(dialect)
    w.receive_data(s.notify(1, "one"))
    if dialect is Dialect.RELEASED:
        s.receive_data(w.accept_stream(1))
    s._max_frame_size = 128
    payload = kwargs.pop("payload", b"p")
    with pytest.raises(LocalProtocolError):
        s.send_message(1, 0, payload, **kwargs)
    assert s.credits == 99


@BOTH
def test_message_details_survive_the_trip(dialect):
    w, s = pair(dialect)
    w.receive_data(s.notify(1, "one"))
    s.receive_data(w.accept_stream(1))
    key = b"k" if dialect is Dialect.RELEASED else None
    events = w.receive_data(s.send_message(1, 3, b"body", event_time=99, key=key))
    assert events == [MessageReceived(1, 3, b"body", 99, key, events[0].flags)]
    assert s.stream(1).last_message_id == 3 == w.stream(1).last_message_id


@BOTH
def test_end_stream(dialect):
    w, s = pair(dialect)
    w.receive_data(s.notify(1, "one"))
    s.receive_data(w.accept_stream(1))
    events = w.receive_data(s.send_message(1, 0) + s.end_stream(1))
    assert isinstance(events[-1], StreamEnded)
    assert s.stream_state(1) is w.stream_state(1) is StreamState.CLOSED
    assert s.credits == w.credits


# -- whole conversations -----------------------------------------------------------------------

STREAM_IDS = st.integers(0, 1)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("notify"), STREAM_IDS),
        st.tuples(st.just("send"), STREAM_IDS, st.binary(max_size=8)),
        st.tuples(st.just("send"), STREAM_IDS, st.binary(max_size=8)),
        st.tuples(st.just("end"), STREAM_IDS),
        st.tuples(st.just("to_worker"), st.lists(st.integers(0, 200), max_size=3)),
        st.tuples(st.just("to_source"), st.lists(st.integers(0, 200), max_size=3)),
        st.tuples(st.just("pump"), st.just([])),
        st.tuples(st.just("ack"), STREAM_IDS),
    ),
    min_size=15,
    max_size=60,
)


@BOTH
@given(ops=OPS, initial=st.integers(1, 8))
@settings(max_examples=HEAVY)
def test_random_conversations_agree_on_credits_streams_and_messages(dialect, ops, initial):
    w, s = pair(dialect, credits=initial)
    to_worker, to_source = bytearray(), bytearray()
    sent: dict[int, list[bytes]] = {}
    received: dict[int, list[bytes]] = {}
    last: dict[int, int] = {}
    spent_since_ack = 0

    def deliver_to_worker(cuts):
        nonlocal spent_since_ack
        data = bytes(to_worker)
        to_worker.clear()
        for chunk in chunked(data, cuts):
            for event in w.receive_data(chunk):
                assert not isinstance(event, ProtocolFailed), event
                name = type(event).__name__
                if name == "StreamOpened":
                    spent_since_ack += 1
                    to_source.extend(w.accept_stream(event.stream_id, last.get(event.stream_id)))
                elif name == "MessageReceived":
                    spent_since_ack += 1
                    last[event.stream_id] = event.message_id
                    if not event.flags & MessageFlags.BOUNDARY:
                        received.setdefault(event.stream_id, []).append(event.payload)
                else:
                    assert name == "StreamEnded", event  # no duplicates in a clean conversation

    def deliver_to_source(cuts):
        data = bytes(to_source)
        to_source.clear()
        for chunk in chunked(data, cuts):
            for event in s.receive_data(chunk):
                assert not isinstance(event, ProtocolFailed), event
                assert isinstance(event, (Acked, StreamAccepted)), event

    next_id: dict[int, int] = {}
    for op in ops:
        kind, arg = op[0], op[1]
        if kind == "send" and not s.can_send(arg):
            kind = "notify"  # make progress towards sending instead of skipping
        if kind == "notify" and s.credits and s.stream_state(arg) in (
            StreamState.INTRO, StreamState.CLOSED
        ):
            to_worker.extend(s.notify(arg, f"stream-{arg}", processed=last.get(arg)))
        elif kind == "send" and s.can_send(arg):
            mid = next_id.get(arg, 0)
            next_id[arg] = mid + 1
            to_worker.extend(s.send_message(arg, mid, op[2]))
            sent.setdefault(arg, []).append(op[2])
        elif kind == "end" and s.stream_state(arg) is StreamState.OPEN and (
            s.credits or dialect is Dialect.RELEASED
        ):
            data = s.end_stream(arg)
            if dialect is Dialect.DRAFT:
                next_id[arg] = s.stream(arg).last_message_id + 1
            to_worker.extend(data)
        elif kind == "to_worker":
            deliver_to_worker(arg)
        elif kind == "to_source":
            deliver_to_source(arg)
        elif kind == "pump":
            deliver_to_worker(arg)
            deliver_to_source(arg)
        elif kind == "ack" and w.state is ConnectionState.STREAMING:
            acks = [(sid, mid) for sid, mid in sorted(last.items()) if sid <= arg]
            to_source.extend(w.ack(spent_since_ack + 1, acks))  # a slowly growing window
            spent_since_ack = 0
    for _ in range(3):  # drain: NOTIFY -> NOTIFY_ACK -> ...
        deliver_to_worker([])
        deliver_to_source([])
    assert s.credits == w.credits
    note_event(f"messages delivered: {min(sum(map(len, received.values())), 5)}+")
    assert received == {sid: p for sid, p in sent.items() if p}
    for sid in set(sent) | set(received):
        assert s.stream_state(sid) is w.stream_state(sid)
