"""BulkSourceConnection.send_messages: the exact bytes send_message gives for each message, the
same credit and stream bookkeeping, and the same refusals (nothing sent, nothing changed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querylib.connector import (
    BulkSourceConnection,
    Dialect,
    LocalProtocolError,
    NoCreditError,
    SourceConnection,
    WorkerConnection,
)

from .harness import COOKIE

BOTH = pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)


def _streaming(cls, dialect: Dialect, credits: int = 1000, **kwargs):
    source = cls(dialect, program="p", instance="i", cookie=COOKIE, **kwargs)
    worker = WorkerConnection(cookie=COOKIE)
    worker.receive_data(source.hello())
    source.receive_data(worker.accept(credits))
    worker.receive_data(source.notify(5, "s"))
    source.receive_data(worker.accept_stream(5, None))
    return source


def _messages(dialect: Dialect):
    event_time = (st.none() | st.integers(1, 2**63 - 1) if dialect is Dialect.RELEASED
                  else st.none() | st.integers(0, 2**64 - 1))
    key = st.none() | st.binary(min_size=1, max_size=5) if dialect is Dialect.RELEASED \
        else st.none()
    one = st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=20), event_time, key)
    return st.lists(one, max_size=30)


@BOTH
@given(data=st.data())
def test_send_messages_equals_send_message(dialect, data):
    messages = data.draw(_messages(dialect))
    base = _streaming(SourceConnection, dialect)
    bulk = _streaming(BulkSourceConnection, dialect)
    expected = b"".join(base.send_message(5, mid, payload, event_time=t, key=k)
                        for mid, payload, t, k in messages)
    assert bulk.send_messages(5, messages) == expected
    assert bulk.credits == base.credits
    assert bulk.stream(5) == base.stream(5)


@BOTH
def test_refusals_send_nothing_and_change_nothing(dialect):
    bulk = _streaming(BulkSourceConnection, dialect, credits=3)
    with pytest.raises(NoCreditError):
        bulk.send_messages(5, [(i, b"x", None, None) for i in range(3)])  # NOTIFY spent one
    with pytest.raises(LocalProtocolError):
        bulk.send_messages(9, [(1, b"x", None, None)])  # never introduced
    with pytest.raises(LocalProtocolError):
        bulk.send_messages(5, [(1, b"x", None, None), (-1, b"y", None, None)])
    with pytest.raises(LocalProtocolError):
        bulk.send_messages(5, [(True, b"x", None, None)])
    small = _streaming(BulkSourceConnection, dialect, max_frame_size=50)
    with pytest.raises(LocalProtocolError):
        small.send_messages(5, [(1, b"x" * 100, None, None)])
    assert bulk.credits == 2 and bulk.stream(5).last_message_id is None


def test_draft_has_no_keys_and_released_no_zero_times():
    with pytest.raises(LocalProtocolError):
        _streaming(BulkSourceConnection, Dialect.DRAFT).send_messages(5, [(1, b"", None, b"k")])
    released = _streaming(BulkSourceConnection, Dialect.RELEASED)
    with pytest.raises(LocalProtocolError):
        released.send_messages(5, [(1, b"", 0, None)])
    with pytest.raises(LocalProtocolError):
        released.send_messages(5, [(1, b"", None, b"")])
