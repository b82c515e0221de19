"""Both state machines, every (state, frame) and every (stream state, input) pair, on both sides
of a connection: a pair in the table does what the table says; a pair not in it is a protocol
error (ProtocolFailed for the peer's frames, LocalProtocolError for our own commands), never any
other exception."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.connector import (
    DRAFT_CONNECTION,
    DRAFT_STREAMS,
    RELEASED_CONNECTION,
    RELEASED_STREAMS,
    ConnectionState,
    ConnectorProtocolError,
    Dialect,
    FrameType,
    LocalProtocolError,
    MessageFlags,
    ProtocolFailed,
    Role,
    StreamInput,
    StreamState,
    UnexpectedFrameError,
    connection_transition,
    draft,
    released,
    stream_transition,
)

from .harness import (
    end,
    feed,
    handshaken,
    hello_frame,
    message,
    module,
    notify,
    open_stream,
    source,
    streaming,
    worker,
)
from .strategies import any_frame

CONNECTION_TABLES = {Dialect.DRAFT: DRAFT_CONNECTION, Dialect.RELEASED: RELEASED_CONNECTION}
STREAM_TABLES = {Dialect.DRAFT: DRAFT_STREAMS, Dialect.RELEASED: RELEASED_STREAMS}
TERMINAL = {ConnectionState.ERROR, ConnectionState.CLOSED}
HEAVY = 50  # examples for the costlier properties: keeps the suite fast on 2 shared cores
SI = StreamInput
INPUTS = {
    Dialect.DRAFT: [SI.NOTIFY, SI.MESSAGE, SI.MESSAGE_EOS, SI.ACK, SI.NACK],
    Dialect.RELEASED: [
        SI.NOTIFY, SI.NOTIFY_ACCEPTED, SI.NOTIFY_REJECTED, SI.MESSAGE, SI.EOS, SI.ACK
    ],
}
STREAM_STATES = {
    Dialect.DRAFT: [StreamState.INTRO, StreamState.OPEN, StreamState.CLOSED, StreamState.RESET],
    Dialect.RELEASED: [
        StreamState.INTRO, StreamState.PENDING, StreamState.OPEN, StreamState.CLOSED
    ],
}


def frame_types(dialect):
    return [cls.frame_type for cls in module(dialect).CODEC.by_tag.values()]


def sample_frame(dialect, frame_type):
    """A frame of `frame_type` whose content is valid for stream 1 open (and 2 pending)."""
    mod = module(dialect)
    return {
        FrameType.HELLO: lambda: hello_frame(dialect),
        FrameType.OK: lambda: mod.Ok(5),
        FrameType.ERROR: lambda: mod.Error(b"stop"),
        FrameType.NOTIFY: lambda: notify(dialect, 77),
        FrameType.NOTIFY_ACK: lambda: released.NotifyAck(True, 2, 0),
        FrameType.MESSAGE: lambda: message(dialect, 1, 1000),
        FrameType.ACK: lambda: mod.Ack(1),
        FrameType.NACK: lambda: draft.Nack(1, 1, 0),
        FrameType.RESTART: lambda: released.Restart(b""),
        FrameType.EOS: lambda: released.Eos(1),
    }[frame_type]()


# -- the pure tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
def test_connection_lookup_covers_every_pair(dialect):
    table = CONNECTION_TABLES[dialect]
    for state, role, frame_type in itertools.product(ConnectionState, Role, FrameType):
        if (state, role, frame_type) in table:
            assert connection_transition(table, state, role, frame_type) is table[
                (state, role, frame_type)
            ]
        else:
            with pytest.raises(UnexpectedFrameError):
                connection_transition(table, state, role, frame_type)


@pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
def test_stream_lookup_covers_every_pair(dialect):
    table = STREAM_TABLES[dialect]
    for state, event in itertools.product(StreamState, StreamInput):
        if (state, event) in table:
            assert stream_transition(table, state, event, 1) is table[(state, event)]
        else:
            with pytest.raises(UnexpectedFrameError):
                stream_transition(table, state, event, 1)


def test_tables_only_use_frames_of_their_dialect():
    for dialect, table in CONNECTION_TABLES.items():
        assert {ft for _, _, ft in table} <= set(frame_types(dialect))


# -- the worker side ---------------------------------------------------------------------------


def worker_in(dialect, state):
    conn = worker(dialect)
    if state is ConnectionState.CONNECTED:
        return conn
    feed(conn, hello_frame(dialect))
    if state is ConnectionState.HANDSHAKE:
        return conn
    conn.accept(100)
    open_stream(conn, 1)
    if dialect is Dialect.RELEASED:
        feed(conn, notify(dialect, 2))  # left pending
    if state is ConnectionState.ERROR:
        conn.error("done")
    elif state is ConnectionState.CLOSED:
        conn.restart()
    assert conn.state is state
    return conn


def worker_states(dialect):
    states = [s for s in ConnectionState if s is not ConnectionState.CLOSED]
    return states + [ConnectionState.CLOSED] if dialect is Dialect.RELEASED else states


WORKER_RECEIVES = [
    pytest.param(d, s, f, id=f"{d.value}-{s.value}-{f.value}")
    for d in Dialect
    for s in worker_states(d)
    for f in frame_types(d)
]


@pytest.mark.parametrize(("dialect", "state", "frame_type"), WORKER_RECEIVES)
def test_worker_receiving_every_frame_in_every_state(dialect, state, frame_type):
    conn = worker_in(dialect, state)
    events = feed(conn, sample_frame(dialect, frame_type))
    key = (state, Role.CONNECTOR, frame_type)
    if state in TERMINAL:
        assert events == []  # "Any data received after the error frame should be discarded."
    elif key in CONNECTION_TABLES[dialect]:
        assert not any(isinstance(e, ProtocolFailed) for e in events), events
        assert conn.state is CONNECTION_TABLES[dialect][key]
    else:
        assert isinstance(events[-1], ProtocolFailed)
        assert isinstance(events[-1].error, UnexpectedFrameError)
        assert events[-1].reply  # answered with an ERROR frame
        assert conn.state is ConnectionState.ERROR


WORKER_COMMANDS = {
    FrameType.OK: lambda c: c.accept(1),
    FrameType.ERROR: lambda c: c.error("x"),
    FrameType.ACK: lambda c: c.ack(1),
    FrameType.NACK: lambda c: c.nack(1),
    FrameType.NOTIFY_ACK: lambda c: c.accept_stream(2),
    FrameType.RESTART: lambda c: c.restart(),
}


@pytest.mark.parametrize(
    ("dialect", "state", "frame_type"),
    [
        pytest.param(d, s, f, id=f"{d.value}-{s.value}-{f.value}")
        for d in Dialect
        for s in worker_states(d)
        for f in frame_types(d)
        if f in WORKER_COMMANDS
    ],
)
def test_worker_sending_every_frame_in_every_state(dialect, state, frame_type):
    conn = worker_in(dialect, state)
    key = (state, Role.WORKER, frame_type)
    if state in TERMINAL:
        assert WORKER_COMMANDS[frame_type](conn) == b""  # the session is over: nothing to send
        assert conn.state is state
    elif key in CONNECTION_TABLES[dialect]:
        assert WORKER_COMMANDS[frame_type](conn)
        assert conn.state is CONNECTION_TABLES[dialect][key]
    else:
        with pytest.raises(LocalProtocolError):
            WORKER_COMMANDS[frame_type](conn)
        assert conn.state is state


def worker_stream_in(dialect, stream_state):
    conn = streaming(dialect)
    if stream_state is StreamState.PENDING:
        feed(conn, notify(dialect, 1))
    elif stream_state is not StreamState.INTRO:
        open_stream(conn, 1)
        if stream_state is StreamState.CLOSED:
            feed(conn, end(dialect, 1))
        elif stream_state is StreamState.RESET:
            conn.nack(1)
    assert conn.stream_state(1) is stream_state
    return conn


PEER_INPUTS_AT_WORKER = {
    SI.NOTIFY: lambda d: notify(d, 1),
    SI.MESSAGE: lambda d: message(d, 1, 10**6),
    SI.MESSAGE_EOS: lambda d: message(d, 1, 10**6, eos=True),
    SI.EOS: lambda d: released.Eos(1),
}
LOCAL_INPUTS_AT_WORKER = {
    SI.ACK: lambda c: c.ack(0, [(1, 0)]),
    SI.NACK: lambda c: c.nack(1),
    SI.NOTIFY_ACCEPTED: lambda c: c.accept_stream(1),
    SI.NOTIFY_REJECTED: lambda c: c.reject_stream(1),
}


@pytest.mark.parametrize(
    ("dialect", "stream_state", "event"),
    [
        pytest.param(d, s, i, id=f"{d.value}-{s.value}-{i.value}")
        for d in Dialect
        for s in STREAM_STATES[d]
        for i in INPUTS[d]
    ],
)
def test_worker_stream_every_state_and_input(dialect, stream_state, event):
    conn = worker_stream_in(dialect, stream_state)
    expected = STREAM_TABLES[dialect].get((stream_state, event))
    if event in PEER_INPUTS_AT_WORKER:
        events = feed(conn, PEER_INPUTS_AT_WORKER[event](dialect))
        if expected is None:
            assert isinstance(events[-1], ProtocolFailed)
            assert isinstance(events[-1].error, UnexpectedFrameError)
            return
        assert not any(isinstance(e, ProtocolFailed) for e in events), events
    elif expected is None:
        with pytest.raises(LocalProtocolError):
            LOCAL_INPUTS_AT_WORKER[event](conn)
        assert conn.stream_state(1) is stream_state
        return
    else:
        LOCAL_INPUTS_AT_WORKER[event](conn)
    assert conn.stream_state(1) is expected


# -- the source side ---------------------------------------------------------------------------


def source_in(dialect, state):
    conn = source(dialect)
    if state is ConnectionState.CONNECTED:
        return conn
    conn.hello()
    if state is ConnectionState.HANDSHAKE:
        return conn
    conn.receive_data(module(dialect).encode(module(dialect).Ok(100)))
    source_open(conn, 1)
    if dialect is Dialect.RELEASED:
        conn.notify(2, "two")
    if state is ConnectionState.ERROR:
        conn.error("done")
    elif state is ConnectionState.CLOSED:
        conn.receive_data(released.encode(released.Restart(b"")))
    assert conn.state is state
    return conn


def source_open(conn, stream_id):
    conn.notify(stream_id, "s")
    if conn.dialect is Dialect.RELEASED:
        conn.receive_data(released.encode(released.NotifyAck(True, stream_id, 0)))
    assert conn.stream_state(stream_id) is StreamState.OPEN


@pytest.mark.parametrize(("dialect", "state", "frame_type"), WORKER_RECEIVES)
def test_source_receiving_every_frame_in_every_state(dialect, state, frame_type):
    conn = source_in(dialect, state)
    events = conn.receive_data(module(dialect).encode(sample_frame(dialect, frame_type)))
    key = (state, Role.WORKER, frame_type)
    if state in TERMINAL:
        assert events == []
    elif key in CONNECTION_TABLES[dialect]:
        assert not any(isinstance(e, ProtocolFailed) for e in events), events
        assert conn.state is CONNECTION_TABLES[dialect][key]
    else:
        assert isinstance(events[-1], ProtocolFailed)
        assert isinstance(events[-1].error, UnexpectedFrameError)
        assert conn.state is ConnectionState.ERROR


SOURCE_COMMANDS = {
    FrameType.HELLO: lambda c: c.hello(),
    FrameType.ERROR: lambda c: c.error("x"),
    FrameType.NOTIFY: lambda c: c.notify(9, "nine"),
    FrameType.MESSAGE: lambda c: c.send_message(1, 5, b"m"),
    FrameType.EOS: lambda c: c.end_stream(1),
}


@pytest.mark.parametrize(
    ("dialect", "state", "frame_type"),
    [
        pytest.param(d, s, f, id=f"{d.value}-{s.value}-{f.value}")
        for d in Dialect
        for s in worker_states(d)
        for f in frame_types(d)
        if f in SOURCE_COMMANDS
    ],
)
def test_source_sending_every_frame_in_every_state(dialect, state, frame_type):
    conn = source_in(dialect, state)
    key = (state, Role.CONNECTOR, frame_type)
    if state in TERMINAL:
        assert SOURCE_COMMANDS[frame_type](conn) == b""
        assert conn.state is state
    elif key in CONNECTION_TABLES[dialect]:
        assert SOURCE_COMMANDS[frame_type](conn)
        assert conn.state is CONNECTION_TABLES[dialect][key]
    else:
        with pytest.raises(LocalProtocolError):
            SOURCE_COMMANDS[frame_type](conn)
        assert conn.state is state


def source_stream_in(dialect, stream_state):
    conn = source_in(dialect, ConnectionState.STREAMING)
    sid = 3
    if stream_state is StreamState.PENDING:
        conn.notify(sid, "s")
    elif stream_state is not StreamState.INTRO:
        source_open(conn, sid)
        if stream_state is StreamState.CLOSED:
            conn.end_stream(sid)
        elif stream_state is StreamState.RESET:
            conn.receive_data(draft.encode(draft.Nack(0, sid, 0)))
    assert conn.stream_state(sid) is stream_state
    return conn, sid


PEER_INPUTS_AT_SOURCE = {
    SI.ACK: lambda d, sid: module(d).Ack(0, ((sid, 0),)),
    SI.NACK: lambda d, sid: draft.Nack(0, sid, 0),
    SI.NOTIFY_ACCEPTED: lambda d, sid: released.NotifyAck(True, sid, 0),
    SI.NOTIFY_REJECTED: lambda d, sid: released.NotifyAck(False, sid, 0),
}
LOCAL_INPUTS_AT_SOURCE = {
    SI.NOTIFY: lambda c, sid: c.notify(sid, "s"),
    SI.MESSAGE: lambda c, sid: c.send_message(sid, 10**6),
    SI.MESSAGE_EOS: lambda c, sid: c.send_message(sid, 10**6, flags=MessageFlags.EOS),
    SI.EOS: lambda c, sid: c.end_stream(sid),
}
SENDS_DATA = {SI.MESSAGE, SI.MESSAGE_EOS, SI.EOS}


@pytest.mark.parametrize(
    ("dialect", "stream_state", "event"),
    [
        pytest.param(d, s, i, id=f"{d.value}-{s.value}-{i.value}")
        for d in Dialect
        for s in STREAM_STATES[d]
        for i in INPUTS[d]
    ],
)
def test_source_stream_every_state_and_input(dialect, stream_state, event):
    conn, sid = source_stream_in(dialect, stream_state)
    expected = STREAM_TABLES[dialect].get((stream_state, event))
    if event in SENDS_DATA and stream_state is not StreamState.OPEN:
        expected = None  # the table tolerates these in flight; a source never sends them
    if event in PEER_INPUTS_AT_SOURCE:
        frame = PEER_INPUTS_AT_SOURCE[event](dialect, sid)
        events = conn.receive_data(module(dialect).encode(frame))
        if expected is None:
            assert isinstance(events[-1], ProtocolFailed)
            assert isinstance(events[-1].error, UnexpectedFrameError)
            return
        assert not any(isinstance(e, ProtocolFailed) for e in events), events
    elif expected is None:
        with pytest.raises(LocalProtocolError):
            LOCAL_INPUTS_AT_SOURCE[event](conn, sid)
        assert conn.stream_state(sid) is stream_state
        return
    else:
        LOCAL_INPUTS_AT_SOURCE[event](conn, sid)
    assert conn.stream_state(sid) is expected


# -- random frame sequences --------------------------------------------------------------------


@pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
@given(data=st.data())
@settings(max_examples=HEAVY)
def test_random_frame_sequences_follow_the_connection_table(dialect, data):
    mod = module(dialect)
    table = CONNECTION_TABLES[dialect]
    conn = worker(dialect)
    frames = data.draw(
        st.lists(st.one_of(any_frame(mod), st.just(hello_frame(dialect))), max_size=12)
    )
    for frame in frames:
        before = conn.state
        events = conn.receive_data(mod.encode(frame))
        for event in events:
            if event.__class__.__name__ == "Hello" and conn.state is ConnectionState.HANDSHAKE:
                conn.accept(3)
        key = (before, Role.CONNECTOR, frame.frame_type)
        failed = [e for e in events if isinstance(e, ProtocolFailed)]
        assert len(failed) <= 1 and (not failed or events[-1] is failed[0])
        if before in TERMINAL:
            assert events == []
        elif key not in table:
            assert failed and isinstance(failed[0].error, UnexpectedFrameError)
        elif failed:
            assert isinstance(failed[0].error, ConnectorProtocolError)
            assert conn.state is ConnectionState.ERROR
        else:
            assert conn.state in (table[key], ConnectionState.STREAMING)


def test_hello_in_streaming_state_is_rejected():
    conn = streaming(Dialect.DRAFT)
    events = feed(conn, hello_frame(Dialect.DRAFT))
    assert isinstance(events[-1].error, UnexpectedFrameError)


def test_handshake_has_no_streams():
    conn = handshaken(Dialect.RELEASED)
    events = feed(conn, notify(Dialect.RELEASED, 1))
    assert isinstance(events[-1].error, UnexpectedFrameError)
