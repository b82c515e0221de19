"""The Connector client against a real endpoint: ids and resume points, reconnects through
endpoint restarts and append failures (nothing lost, nothing doubled), and the errors it gives
up with."""

from __future__ import annotations

import pytest

from querylib.connector import (
    Connector,
    ConnectorError,
    RewindError,
    StreamRefusedError,
)
from querylib.connector._client import _Stream
from querylib.connector._records import source_id
from tests.conftest import free_port
from tests.querylib.server.connector.test_endpoint import COOKIE, Harness, _end_session

BOTH = pytest.mark.parametrize("dialect", ["draft", "released"])


@pytest.fixture
def harness(tmp_path):
    h = Harness(str(tmp_path / "data"), initial_credits=32)
    try:
        yield h
    finally:
        h.close()


@BOTH
def test_ids_continue_after_the_resume_point_and_old_ones_are_skipped(harness, dialect):
    with harness.connector(dialect) as conn:
        sid = conn.open_stream("ids")
        for _ in range(10):
            assert conn.send(sid, b"a")  # ids 0..9
    with harness.connector(dialect) as conn:
        sid = conn.open_stream("ids")
        assert conn.processed(sid) == 9
        assert not conn.send(sid, b"old", message_id=4)
        assert conn.send(sid, b"b")  # id 10
    assert harness.ids("ids") == list(range(11))


@BOTH
def test_a_restarting_endpoint_loses_and_doubles_nothing(harness, dialect):
    with harness.connector(dialect) as conn:
        sid = conn.open_stream("restart")
        for i in range(3000):
            conn.send(sid, b"%d" % i, message_id=i)
            if i in (700, 1900):
                harness.restart(checkpoint=i == 700)
        conn.end_stream(sid)
        assert conn.counters["reconnects"] >= 2
    assert harness.ids("restart") == list(range(3000))


@BOTH
def test_a_failed_append_rewinds_the_stream(harness, dialect):
    with harness.connector(dialect, instance="fail") as conn:
        sid = conn.open_stream("fail")
        session = f"tq.connector.{source_id('test', 'fail', sid):016x}"
        for i in range(2000):
            conn.send(sid, b"x", message_id=i)
            if i == 1000:
                conn.flush()
                # The broker forgets the stream's session: the next append fails.
                harness.call(_end_session(harness, session))
    assert harness.ids("fail") == list(range(2000))
    assert harness.stats()["append_failures"] >= 1


def test_a_released_stream_can_be_refused(harness):
    with harness.connector("released") as conn, pytest.raises(StreamRefusedError):
        conn.open_stream("__internal")


def test_a_wrong_cookie_is_final(harness):
    with pytest.raises(ConnectorError, match="bad cookie"):
        Connector(harness.address, cookie=b"nope", reconnect_timeout=300.0)
    assert harness.stats()["connections"] == 1  # refused once, never tried again


def test_an_unreachable_endpoint_is_reported():
    with pytest.raises(ConnectorError, match="cannot reach"):
        Connector(f"127.0.0.1:{free_port()}", cookie=COOKIE, reconnect_timeout=0.3)


def test_a_rewind_below_what_was_acknowledged_is_an_error():
    stream = _Stream(1, "s")
    stream.acked(10)
    with pytest.raises(RewindError) as info:
        stream.skip_to(5)
    assert info.value.processed == 5
    assert stream.skip_to(12) == 0 and stream.floor == 12


def test_message_ids_must_increase(harness):
    from catalog.errors import UserError

    with harness.connector() as conn:
        sid = conn.open_stream("inc")
        conn.send(sid, b"a", message_id=5)
        with pytest.raises(UserError):
            conn.send(sid, b"b", message_id=5)
        with pytest.raises(UserError):
            conn.send(sid, b"c", key=b"draft has no keys")
