"""WorkerConnection behaviours: handshake checks, credits, streams, duplicates, and the answer
to every violation (one ProtocolFailed event carrying an ERROR frame that names the problem)."""

from __future__ import annotations

import pytest

from querylib.connector import (
    BadCookieError,
    ConnectionState,
    ConnectorProtocolError,
    CreditExhaustedError,
    Dialect,
    DialectError,
    DropReason,
    HandshakeError,
    Hello,
    LocalProtocolError,
    MalformedFrameError,
    MessageFlags,
    MessageReceived,
    PeerError,
    ProtocolFailed,
    StreamClosedError,
    StreamState,
    TooManyStreamsError,
    UnexpectedFrameError,
    UnknownStreamError,
    VersionMismatchError,
    WorkerConnection,
    draft,
    released,
)

from .harness import (
    COOKIE,
    end,
    feed,
    handshaken,
    hello_frame,
    kinds,
    message,
    module,
    notify,
    open_stream,
    streaming,
    worker,
)

BOTH = pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
U64_MAX = 2**64 - 1


def error_reason(dialect, reply: bytes) -> str:
    (frame,) = module(dialect).FrameDecoder().receive_data(reply)
    data = frame.reason if dialect is Dialect.DRAFT else frame.message
    return data.decode()


def failure(events) -> ProtocolFailed:
    assert events and isinstance(events[-1], ProtocolFailed), events
    assert not any(isinstance(e, ProtocolFailed) for e in events[:-1])
    return events[-1]


@BOTH
def test_hello_is_detected_byte_by_byte_and_reported(dialect):
    conn = WorkerConnection(cookie=COOKIE)
    wire = module(dialect).encode(hello_frame(dialect))
    events = []
    for i in range(len(wire)):
        events += conn.receive_data(wire[i : i + 1])
    assert events == [Hello(dialect, module(dialect).VERSION, "prog", "inst")]
    assert conn.dialect is dialect and conn.state is ConnectionState.HANDSHAKE


@BOTH
def test_accept_sends_ok_and_grants_credits(dialect):
    conn = handshaken(dialect)
    data = conn.accept(7, {3: 41, 4: None})
    if dialect is Dialect.DRAFT:  # draft points are "resend from here": processed + 1, 0
        assert data == draft.encode(draft.Ok(7, ((3, 42), (4, 0))))
    else:
        assert data == released.encode(released.Ok(7))
    assert conn.state is ConnectionState.STREAMING and conn.credits == 7


@BOTH
def test_version_mismatch_is_answered_with_an_error_naming_it(dialect):
    conn = worker()
    failed = failure(feed(conn, hello_frame(dialect, version="9.9.9")))
    assert isinstance(failed.error, VersionMismatchError)
    reason = error_reason(dialect, failed.reply)
    assert "version" in reason and "9.9.9" in reason and module(dialect).VERSION in reason
    assert conn.state is ConnectionState.ERROR
    assert conn.receive_data(module(dialect).encode(hello_frame(dialect))) == []


@BOTH
def test_version_is_checked_before_the_rest_of_hello_is_decoded(dialect):
    mod = module(dialect)
    order = "little" if dialect is Dialect.DRAFT else "big"
    body = bytes([mod.Hello.tag]) + (3).to_bytes(2, order) + b"9.9" + b"\xff"  # junk follows
    wire = len(body).to_bytes(4, order) + body
    failed = failure(worker().receive_data(wire))
    assert isinstance(failed.error, VersionMismatchError)


@BOTH
def test_bad_cookie_is_refused_without_echoing_cookies(dialect):
    failed = failure(feed(worker(), hello_frame(dialect, cookie=b"guess")))
    assert isinstance(failed.error, BadCookieError)
    reason = error_reason(dialect, failed.reply)
    assert "cookie" in reason and "guess" not in reason and COOKIE.decode() not in reason


@BOTH
@pytest.mark.parametrize("names", [(b"a\0b", b"c"), (b"a", b"b\0c"), (b"\0", b"")])
def test_names_holding_nul_are_refused_at_hello(dialect, names):
    # tq's stream ids join program and instance with NUL (`source_id`): ambiguous with one.
    mod = module(dialect)
    frame = mod.Hello(mod.VERSION.encode(), COOKIE, *names)
    failed = failure(feed(worker(), frame))
    assert isinstance(failed.error, HandshakeError)
    assert "NUL" in error_reason(dialect, failed.reply)


def test_a_worker_limited_to_one_dialect_refuses_the_other():
    conn = WorkerConnection(cookie=COOKIE, dialects=(Dialect.RELEASED,))
    failed = failure(conn.receive_data(draft.encode(hello_frame(Dialect.DRAFT))))
    assert isinstance(failed.error, ConnectorProtocolError)  # a LE length read as BE: too large
    assert conn.state is ConnectionState.ERROR


def test_repeated_dialects_count_once():
    conn = WorkerConnection(cookie=COOKIE, dialects=(Dialect.RELEASED, Dialect.RELEASED))
    assert conn.dialect is Dialect.RELEASED  # one dialect: pinned, no sniffing
    assert kinds(feed(conn, hello_frame(Dialect.RELEASED))) == ["Hello"]


def test_unknown_first_tag_is_a_dialect_error_with_no_reply():
    failed = failure(WorkerConnection().receive_data(b"\x01\x00\x00\x00Z"))
    assert isinstance(failed.error, DialectError) and failed.reply == b""


@BOTH
def test_credits_are_spent_by_notify_and_message_and_refilled_by_ack(dialect):
    conn = streaming(dialect, credits=2)
    open_stream(conn, 1)
    assert conn.credits == 1
    assert kinds(feed(conn, message(dialect, 1, 1))) == ["MessageReceived"]
    assert conn.credits == 0
    failed = failure(feed(conn, message(dialect, 1, 2)))
    assert isinstance(failed.error, CreditExhaustedError)
    assert "credit" in error_reason(dialect, failed.reply)


@BOTH
def test_ack_refills_credits(dialect):
    conn = streaming(dialect, credits=1)
    open_stream(conn, 1)
    data = conn.ack(3, [(1, 0)])
    assert conn.credits == 3
    assert data == module(dialect).encode(module(dialect).Ack(3, ((1, 0),)))
    assert kinds(feed(conn, *(message(dialect, 1, i) for i in range(3)))) == [
        "MessageReceived"
    ] * 3


@BOTH
def test_message_on_unknown_stream_is_an_error(dialect):
    failed = failure(feed(streaming(dialect), message(dialect, 99, 1)))
    assert isinstance(failed.error, UnknownStreamError)
    assert "99" in error_reason(dialect, failed.reply)


@BOTH
def test_message_on_ended_stream_is_an_error(dialect):
    conn = streaming(dialect)
    open_stream(conn, 5)
    assert kinds(feed(conn, message(dialect, 5, 1), end(dialect, 5))) in (
        ["MessageReceived", "StreamEnded"],
        ["MessageReceived", "MessageReceived", "StreamEnded"],
    )
    failed = failure(feed(conn, message(dialect, 5, 10**7)))
    assert isinstance(failed.error, StreamClosedError)


@BOTH
def test_duplicates_by_message_id_are_dropped_per_stream(dialect):
    conn = streaming(dialect)
    open_stream(conn, 1)
    open_stream(conn, 2)
    events = feed(
        conn,
        message(dialect, 1, 5),
        message(dialect, 1, 5),
        message(dialect, 1, 3),
        message(dialect, 2, 3),  # other stream: not a duplicate
        message(dialect, 1, 6),
    )
    assert [(type(e).__name__, e.stream_id, e.message_id) for e in events] == [
        ("MessageReceived", 1, 5),
        ("MessageDropped", 1, 5),
        ("MessageDropped", 1, 3),
        ("MessageReceived", 2, 3),
        ("MessageReceived", 1, 6),
    ]
    assert all(e.reason is DropReason.DUPLICATE for e in events if hasattr(e, "reason"))
    assert conn.credits == 100 - 2 - 5  # duplicates still cost credit


@BOTH
def test_resume_point_seeds_duplicate_detection(dialect):
    conn = streaming(dialect, resume={7: 10})
    opened = feed(conn, notify(dialect, 7, point=conn_point(dialect, 10)))
    assert opened[0].processed == 10
    conn.accept_stream(7, 10)
    events = feed(conn, message(dialect, 7, 10), message(dialect, 7, 11))
    assert kinds(events) == ["MessageDropped", "MessageReceived"]


def test_draft_ok_carries_the_points_one_frame_holds_and_drops_duplicates_of_all():
    conn = handshaken(Dialect.DRAFT, max_frame_size=5 + 16 * 3)  # room for three points
    data = conn.accept(100, {sid: 10 for sid in range(5)})
    (ok,) = draft.FrameDecoder().receive_data(data)
    assert ok.points_of_reference == ((0, 11), (1, 11), (2, 11))
    feed(conn, notify(Dialect.DRAFT, 4, point=11))  # told nothing, it knew its point
    events = feed(conn, message(Dialect.DRAFT, 4, 10), message(Dialect.DRAFT, 4, 11))
    assert kinds(events) == ["MessageDropped", "MessageReceived"]


def conn_point(dialect, processed):
    return processed + 1 if dialect is Dialect.DRAFT else processed


def test_draft_ephemeral_messages_skip_duplicate_detection():
    conn = streaming(Dialect.DRAFT)
    open_stream(conn, 1)
    events = feed(conn, *(message(Dialect.DRAFT, 1, 4, flags=1) for _ in range(2)))
    assert kinds(events) == ["MessageReceived", "MessageReceived"]
    assert events[0].flags == MessageFlags.EPHEMERAL


def test_draft_message_fields_reach_the_event():
    conn = streaming(Dialect.DRAFT)
    open_stream(conn, 1)
    (event,) = feed(conn, draft.Message(1, 16 | 8, 3, 1234, b"pay"))
    assert event == MessageReceived(
        1, 3, b"pay", 1234, None, MessageFlags.EVENT_TIME | MessageFlags.UNSTABLE_REFERENCE
    )


def test_released_message_sentinels_become_none():
    conn = streaming(Dialect.RELEASED)
    open_stream(conn, 1)
    events = feed(conn, released.Message(1, 1, 0, b"", b"a"), released.Message(1, 2, -5, b"k", b""))
    assert events == [
        MessageReceived(1, 1, b"a", None, None, MessageFlags(0)),
        MessageReceived(1, 2, b"", -5, b"k", MessageFlags.EVENT_TIME),
    ]


@pytest.mark.parametrize(
    "frame",
    [
        draft.Message(1, 32, 1),  # reserved bit
        draft.Message(1, 0x8000, 1),
        draft.Message(1, 2, 1, None, b"payload"),  # boundary with payload
    ],
)
def test_draft_bad_flags_are_malformed(frame):
    conn = streaming(Dialect.DRAFT)
    open_stream(conn, 1)
    assert isinstance(failure(feed(conn, frame)).error, MalformedFrameError)


@BOTH
def test_non_utf8_names_are_malformed(dialect):
    conn = streaming(dialect)
    assert isinstance(failure(feed(conn, notify(dialect, 1, b"\xff"))).error, MalformedFrameError)


@BOTH
def test_stream_count_is_bounded(dialect):
    conn = streaming(dialect, max_streams=2)
    open_stream(conn, 1)
    open_stream(conn, 2)
    assert isinstance(failure(feed(conn, notify(dialect, 3))).error, TooManyStreamsError)


@BOTH
def test_events_before_a_violation_are_delivered(dialect):
    conn = streaming(dialect)
    open_stream(conn, 1)
    wire = b"".join(
        module(dialect).encode(f) for f in (message(dialect, 1, 1), message(dialect, 9, 1))
    )
    events = conn.receive_data(wire + module(dialect).encode(message(dialect, 1, 2)))
    assert kinds(events) == ["MessageReceived", "ProtocolFailed"]


@BOTH
def test_peer_error_ends_the_session_and_later_bytes_are_discarded(dialect):
    conn = streaming(dialect)
    mod = module(dialect)
    events = feed(conn, mod.Error(b"bye"), notify(dialect, 1))
    assert events == [PeerError("bye")]
    assert conn.state is ConnectionState.ERROR and conn.buffered == 0


@BOTH
def test_frame_over_the_maximum_is_refused_with_an_error_frame(dialect):
    conn = streaming(dialect, max_frame_size=64)
    open_stream(conn, 1)
    failed = failure(feed(conn, message(dialect, 1, 1, b"x" * 100)))
    assert "maximum" in error_reason(dialect, failed.reply)


def test_draft_nack_resets_the_stream_and_drops_in_flight_messages():
    d = Dialect.DRAFT
    conn = streaming(d)
    open_stream(conn, 1)
    feed(conn, message(d, 1, 1), message(d, 1, 2), message(d, 1, 3))
    assert conn.nack(1, processed=1, credits=2) == draft.encode(draft.Nack(2, 1, 2))
    assert conn.stream_state(1) is StreamState.RESET
    events = feed(conn, message(d, 1, 4))  # was in flight when the NACK left
    assert kinds(events) == ["MessageDropped"] and events[0].reason is DropReason.RESET
    events = feed(conn, notify(d, 1, point=2), message(d, 1, 1), message(d, 1, 2))
    assert kinds(events) == ["StreamOpened", "MessageDropped", "MessageReceived"]
    assert events[0].processed == 1


def test_draft_nacks_stack_and_each_needs_a_notify():
    d = Dialect.DRAFT
    conn = streaming(d)
    open_stream(conn, 1)
    conn.nack(1)
    conn.nack(1)
    assert kinds(feed(conn, notify(d, 1))) == []  # answers the first NACK only
    assert conn.stream_state(1) is StreamState.RESET
    assert kinds(feed(conn, notify(d, 1), message(d, 1, 0))) == ["StreamOpened", "MessageReceived"]


def test_draft_answers_and_emulations():
    conn = streaming(Dialect.DRAFT)
    open_stream(conn, 1)
    assert conn.accept_stream(1, 5) == b""  # the draft has no NOTIFY_ACK
    data = conn.restart("10.0.0.1:7000")  # the draft has no RESTART
    (frame,) = draft.FrameDecoder().receive_data(data)
    assert isinstance(frame, draft.Error) and b"10.0.0.1:7000" in frame.reason
    assert conn.state is ConnectionState.ERROR


def test_draft_reject_stream_ends_the_session():
    conn = streaming(Dialect.DRAFT)
    feed(conn, notify(Dialect.DRAFT, 1))
    data = conn.reject_stream(1, "no such topic")
    assert data == draft.encode(draft.Error(b"no such topic"))
    assert conn.state is ConnectionState.ERROR


def test_released_stream_is_pending_until_accepted():
    d = Dialect.RELEASED
    conn = streaming(d)
    feed(conn, notify(d, 1))
    assert conn.stream_state(1) is StreamState.PENDING
    failed = failure(feed(conn, message(d, 1, 1)))
    assert isinstance(failed.error, UnexpectedFrameError)
    assert "pending" in error_reason(d, failed.reply)


def test_released_accept_and_reject_send_notify_ack():
    d = Dialect.RELEASED
    conn = streaming(d)
    feed(conn, notify(d, 1), notify(d, 2))
    assert conn.accept_stream(1, 41) == released.encode(released.NotifyAck(True, 1, 41))
    assert conn.stream(1).last_message_id == 41
    assert conn.reject_stream(2) == released.encode(
        released.NotifyAck(False, 2, released.NOTHING_PROCESSED)
    )
    assert conn.stream_state(2) is StreamState.CLOSED
    assert kinds(feed(conn, notify(d, 2))) == ["StreamOpened"]  # may try again


def test_released_restart_closes_and_nack_is_refused():
    conn = streaming(Dialect.RELEASED)
    open_stream(conn, 1)
    with pytest.raises(LocalProtocolError):
        conn.nack(1)
    assert conn.restart("h:1") == released.encode(released.Restart(b"h:1"))
    assert conn.state is ConnectionState.CLOSED
    assert conn.receive_data(released.encode(notify(Dialect.RELEASED, 2))) == []


@BOTH
def test_local_mistakes_raise_and_change_nothing(dialect):
    conn = handshaken(dialect)
    with pytest.raises(LocalProtocolError):
        conn.ack(1)  # not streaming yet
    conn.accept(1)
    with pytest.raises(LocalProtocolError):
        conn.accept(1)  # twice
    with pytest.raises(LocalProtocolError):
        conn.ack(1, [(42, 1)])  # unknown stream
    with pytest.raises(LocalProtocolError):
        conn.accept_stream(42)
    open_stream(conn, 1)
    with pytest.raises(LocalProtocolError):
        conn.ack(2**32, [(1, 1)])  # credits beyond u32
    with pytest.raises(LocalProtocolError):
        conn.accept_stream(1, U64_MAX)  # not representable as a checkpoint
    assert conn.state is ConnectionState.STREAMING and conn.credits == 0
    with pytest.raises(LocalProtocolError):
        WorkerConnection().error("no dialect yet")
