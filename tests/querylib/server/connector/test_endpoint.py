"""The connector endpoint on real sockets in front of a real broker (in this process, on a loop
thread): records and their mapping, ACKs after durability, duplicates, resume points from the
checkpoint topic and from the data, NACK / NOTIFY_ACK rewinds, boundaries and EOS, credits,
fencing, and bad peers that get an ERROR while everyone else goes on."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import pytest

from querylib.connector import (
    Accepted,
    Acked,
    BulkSourceConnection,
    Connector,
    Dialect,
    Nacked,
    NoCreditError,
    PeerError,
    RestartRequested,
    StreamAccepted,
    StreamRejected,
    draft,
    released,
)
from querylib.connector._records import source_id
from querylib.errors import LogClosedError
from querylib.log import LogConfig
from querylib.records import ControlType, control_of, decode_int64, iter_batches
from querylib.server.broker import BrokerServer
from querylib.server.connector import ConnectorEndpoint, EndpointConfig
from tests.conftest import wait_for

BOTH = pytest.mark.parametrize("dialect", ["draft", "released"])
SECRET = b"0123456789abcdef0123456789abcdef"
COOKIE = b"cookie"
_Q = struct.Struct(">Q")


class Harness:
    """A BrokerServer and its ConnectorEndpoint on a loop thread, restartable on one port."""

    def __init__(self, data_dir: str, *, log_config: LogConfig | None = None,
                 **config: Any) -> None:
        self.data_dir = data_dir
        self.log_config = log_config
        config.setdefault("cookie", COOKIE)
        config.setdefault("port", 0)
        self.config = EndpointConfig(**config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: BrokerServer | None = None
        self.endpoint: ConnectorEndpoint | None = None
        self.start()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        async def start() -> None:
            self.server = BrokerServer(self.data_dir, SECRET, log_config=self.log_config)
            await self.server.start("tcp://127.0.0.1:0")
            self.endpoint = ConnectorEndpoint(self.server.port, self.config)
            await self.endpoint.start()

        self.call(start())
        assert self.endpoint is not None and self.endpoint.address is not None
        # Restarts come back on the same port.
        self.config = EndpointConfig(**{**self.config.__dict__,
                                        "port": self.endpoint.address[1]})

    def stop(self, *, checkpoint: bool = True) -> None:
        async def stop() -> None:
            assert self.endpoint is not None and self.server is not None
            if not checkpoint:
                # As if the broker died: what was not checkpointed yet is not.
                async def nothing() -> None:
                    pass

                self.endpoint.store.checkpoint = nothing  # type: ignore[method-assign]
            await self.endpoint.close()
            await self.server.close()

        self.call(stop())

    def restart(self, *, checkpoint: bool = True) -> None:
        self.stop(checkpoint=checkpoint)
        self.start()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.config.port}"

    def connector(self, dialect: str = "draft", **kwargs: Any) -> Connector:
        kwargs.setdefault("program", "test")
        kwargs.setdefault("instance", "one")
        return Connector(self.address, cookie=COOKIE, dialect=dialect, timeout=10.0,
                         reconnect_timeout=10.0, **kwargs)

    def batches(self, topic: str, partition: int = 0) -> list:
        assert self.endpoint is not None
        log = self.endpoint.port.log((topic, partition))
        return list(iter_batches(log.read(0, 1 << 30, end_offset=log.log_end_offset)))

    def records(self, topic: str, partition: int = 0) -> list:
        return [r for b in self.batches(topic, partition) if not b.is_control for r in b.records]

    def ids(self, topic: str, partition: int = 0) -> list[int]:
        return [_Q.unpack(dict(r.headers)["tq.msgid"])[0] for r in self.records(topic, partition)]

    def stats(self) -> dict[str, int]:
        assert self.endpoint is not None
        return self.endpoint.statistics()


@pytest.fixture
def harness(tmp_path):
    h = Harness(str(tmp_path / "data"))
    try:
        yield h
    finally:
        h.close()


class Raw:
    """A connector speaking through a real socket, frame by frame, for the protocol's edges."""

    def __init__(self, harness: Harness, dialect: str = "draft", *, cookie: bytes = COOKIE,
                 program: str = "test", instance: str = "raw") -> None:
        self.sock = socket.create_connection(("127.0.0.1", harness.config.port), timeout=10)
        self.conn = BulkSourceConnection(Dialect(dialect), program=program, instance=instance,
                                         cookie=cookie)
        self.events: list = []
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def until(self, condition: Callable[[list], Any], what: str = "events") -> Any:
        def step() -> Any:
            found = condition(self.events)
            if found or self.closed:
                return found or self.closed
            self.sock.settimeout(0.05)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionError:
                data = b""
            if not data:
                self.closed = True
            else:
                self.events += self.conn.receive_data(data)
            return condition(self.events)

        return wait_for(step, timeout=10, what=what)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def handshake(self) -> Accepted:
        self.send(self.conn.hello())
        self.until(lambda ev: any(isinstance(e, Accepted) for e in ev), "OK")
        return self.of(Accepted)[0]

    def close(self) -> None:
        self.sock.close()


def _time(record) -> int:
    return decode_int64(dict(record.headers)["tq.time"])


# -- records ---------------------------------------------------------------------------------


@BOTH
def test_messages_become_records_with_the_documented_mapping(harness, dialect):
    with harness.connector(dialect) as conn:
        sid = conn.open_stream("events")
        for i in range(100):
            key = b"k%d" % i if dialect == "released" else None
            conn.send(sid, b"v%d" % i, message_id=i, event_time=1_700_000_000_000 + i, key=key)
    records = harness.records("events")
    assert [r.value for r in records] == [b"v%d" % i for i in range(100)]
    assert [r.timestamp for r in records] == [1_700_000_000_000 + i for i in range(100)]
    assert harness.ids("events") == list(range(100))
    if dialect == "released":
        assert [r.key for r in records] == [b"k%d" % i for i in range(100)]
    batches = [b for b in harness.batches("events") if not b.is_control]
    assert {b.producer_id for b in batches} == {source_id("test", "one", sid)}


def test_records_without_event_time_get_the_append_time(harness):
    with harness.connector() as conn:
        sid = conn.open_stream("t")
        conn.send(sid, b"x", message_id=0)
    (record,) = harness.records("t")
    assert record.timestamp > 1_600_000_000_000
    assert "tq.flags" not in dict(record.headers)


def test_boundaries_and_eos_become_frontier_and_end_of_stream(harness):
    with harness.connector() as conn:
        sid = conn.open_stream("frontier")
        for i in range(5):
            conn.send(sid, b"a", message_id=i)
        conn.boundary(sid, message_id=10)
        conn.send(sid, b"b", message_id=11)
        conn.end_stream(sid, message_id=20)
    seen = []
    for batch in harness.batches("frontier"):
        if batch.is_control:
            kind, value = control_of(batch.records[0])
            seen.append((kind, decode_int64(value) if kind == ControlType.FRONTIER else None))
        else:
            seen += [("data", _time(r)) for r in batch.records]
    assert seen == [("data", 0)] * 5 + [(ControlType.FRONTIER, 11), ("data", 11),
                                        (ControlType.FRONTIER, 21),
                                        (ControlType.END_OF_STREAM, None)]


# -- acknowledgements, duplicates, credits ---------------------------------------------------


def test_acks_come_only_once_the_records_are_durable(tmp_path):
    h = Harness(str(tmp_path / "d"), log_config=LogConfig(flush="interval",
                                                          flush_interval_ms=200))
    try:
        raw = Raw(h)
        raw.handshake()
        raw.send(raw.conn.notify(1, "durable"))
        raw.send(raw.conn.send_messages(1, [(i, b"x", None, None) for i in range(10)]))
        raw.until(lambda ev: any(isinstance(e, Acked) and e.acks for e in ev), "an ACK")
        # The ACK is out: the log must already have fsynced what it acknowledged.
        assert h.endpoint.port.log(("durable", 0)).flushed_end_offset >= 10
        assert [a for e in raw.of(Acked) for a in e.acks][-1] == (1, 9)
    finally:
        h.close()


def test_duplicate_ids_are_dropped_and_their_credit_returned(harness):
    raw = Raw(harness)
    credits = raw.handshake().initial_credits
    raw.send(raw.conn.notify(1, "dups"))
    raw.send(raw.conn.send_messages(1, [(i, b"x", None, None) for i in range(10)]))
    raw.send(draft.encode(draft.Message(1, 0, 5, None, b"again")))  # below the last id: dropped
    raw.send(raw.conn.send_messages(1, [(10, b"y", None, None)]))
    # The duplicate bypassed our own accounting, so all credits back is one more than we had.
    raw.until(lambda ev: raw.conn.credits == credits + 1 and (1, 10) in
              [a for e in ev if isinstance(e, Acked) for a in e.acks], "every credit back")
    assert harness.ids("dups") == list(range(11))


def test_credits_bound_what_a_connector_may_send(tmp_path):
    h = Harness(str(tmp_path / "d"), initial_credits=4)
    try:
        raw = Raw(h)
        assert raw.handshake().initial_credits == 4
        raw.send(raw.conn.notify(1, "credits"))
        raw.send(raw.conn.send_messages(1, [(i, b"x", None, None) for i in range(3)]))
        with pytest.raises(NoCreditError):
            raw.conn.send_messages(1, [(3, b"x", None, None)])
        # A connector that ignores its credit is cut off with an ERROR.
        raw.send(draft.encode(draft.Message(1, 0, 3, None, b"x")) * 8)
        raw.until(lambda ev: raw.closed, "the endpoint to close the connection")
        assert any("credit" in e.reason for e in raw.of(PeerError))
        assert h.stats()["protocol_errors"] == 1
    finally:
        h.close()


def test_a_fast_connector_is_held_to_its_window_while_appends_are_slow(tmp_path):
    # flush "always": every append waits for an fsync, far slower than the connector sends.
    h = Harness(str(tmp_path / "d"), initial_credits=16, log_config=LogConfig(flush="always"))
    try:
        held = []

        async def holding() -> int:
            return max((p._outstanding for p in h.endpoint._peers), default=0)

        with h.connector() as conn:
            sid = conn.open_stream("slow")
            for i in range(600):
                conn.send(sid, b"x" * 100, message_id=i)
                if i % 50 == 0:
                    held.append(h.call(holding()))
            assert conn.buffered <= conn.max_buffered
        assert max(held) <= 16  # frames the endpoint holds: never more than the window
        assert h.ids("slow") == list(range(600))
    finally:
        h.close()


def test_big_frames_are_held_back_by_the_byte_budget_too(tmp_path):
    budget = 64 * 1024
    h = Harness(str(tmp_path / "d"), initial_credits=1024, max_held_bytes=budget,
                log_config=LogConfig(flush="always"))
    try:
        held = []

        async def holding() -> int:
            return max((p.held_bytes for p in h.endpoint._peers), default=0)

        with h.connector() as conn:
            sid = conn.open_stream("big")
            for i in range(300):  # 1024 credits would allow 4 MiB of these in flight
                conn.send(sid, b"x" * 4096, message_id=i)
                if i % 20 == 0:
                    held.append(h.call(holding()))
            conn.flush()
            assert h.call(holding()) == 0  # everything appended: nothing held
        # At most the budget, plus what one read brought in on top of it.
        assert max(held) <= budget + 256 * 1024 + 4096
        assert h.ids("big") == list(range(300))
    finally:
        h.close()


def test_an_event_time_beyond_int64_gets_an_error(harness):
    raw = Raw(harness)
    raw.handshake()
    raw.send(raw.conn.notify(1, "time"))
    raw.send(raw.conn.send_messages(1, [(1, b"x", 2**63 + 5, None)]))
    raw.until(lambda ev: raw.closed, "the session to end")
    assert "outside int64" in raw.of(PeerError)[0].reason


# -- resume points ----------------------------------------------------------------------------


@BOTH
def test_a_reconnecting_connector_learns_where_its_stream_stands(harness, dialect):
    with harness.connector(dialect, instance="raw") as conn:
        sid = conn.open_stream("resume", stream_id=7)
        for i in range(10):
            conn.send(sid, b"x", message_id=i)
    raw = Raw(harness, dialect)
    accepted = raw.handshake()
    raw.send(raw.conn.notify(7, "resume", 9))
    if dialect == "draft":
        assert dict(accepted.resume_points) == {7: 9}
    else:
        raw.until(lambda ev: raw.of(StreamAccepted), "NOTIFY_ACK")
        assert raw.of(StreamAccepted)[0].processed == 9
    raw.send(raw.conn.send_messages(7, [(i, b"y", None, None) for i in range(5, 15)]))
    raw.until(lambda ev: (7, 14) in [a for e in raw.of(Acked) for a in e.acks], "ACK of 14")
    assert harness.ids("resume") == list(range(15))


@BOTH
def test_nothing_queued_behind_a_failed_append_is_written(tmp_path, dialect):
    # One message per append: the three messages read together wait as three operations.
    h = Harness(str(tmp_path / "d"), max_batch_records=1)
    try:
        raw = Raw(h, dialect)
        raw.handshake()
        raw.send(raw.conn.notify(1, "gap"))
        if dialect == "released":
            raw.until(lambda ev: raw.of(StreamAccepted), "NOTIFY_ACK")
        raw.send(raw.conn.send_messages(1, [(0, b"x", None, None)]))
        raw.until(lambda ev: (1, 0) in [a for e in raw.of(Acked) for a in e.acks], "ACK of 0")
        # The broker forgets the stream's session: the append of 1 fails. Writing 2 and 3
        # after it would leave a gap the connector, rewound to 0, never fills.
        h.call(_end_session(h, f"tq.connector.{source_id('test', 'raw', 1):016x}"))
        raw.send(raw.conn.send_messages(1, [(i, b"x", None, None) for i in (1, 2, 3)]))
        if dialect == "draft":
            raw.until(lambda ev: raw.of(Nacked), "NACK")
            assert raw.of(Nacked)[0].processed == 0
        else:
            raw.until(lambda ev: raw.of(RestartRequested), "RESTART")
            raw.until(lambda ev: raw.closed, "the close after RESTART")  # its sinks stopped
        assert h.ids("gap") == [0]
        assert h.stats()["append_failures"] == 1
    finally:
        h.close()


async def _end_session(harness: Harness, session: str) -> None:
    """Close a broker session from outside, through the broker's door: a link of the same id
    (and principal) renews it, then closes it."""
    link = harness.endpoint.port.link("anonymous", session=session)
    await link.start()
    await link.close()


@BOTH
def test_a_connector_ahead_of_the_broker_is_rewound(harness, dialect):
    raw = Raw(harness, dialect)
    raw.handshake()
    raw.send(raw.conn.notify(3, "ahead", 50))  # claims 0..50 are stored; nothing is
    if dialect == "draft":
        raw.until(lambda ev: raw.of(Nacked), "NACK")
        assert raw.of(Nacked)[0].processed is None
    else:
        raw.until(lambda ev: raw.of(StreamAccepted), "NOTIFY_ACK")
        assert raw.of(StreamAccepted)[0].processed is None
    assert harness.stats()["nacks"] == (1 if dialect == "draft" else 0)


def test_the_checkpoint_topic_survives_a_restart(harness):
    with harness.connector(instance="ck") as conn:
        sid = conn.open_stream("ck")
        for i in range(100):
            conn.send(sid, b"x", message_id=i)
    harness.restart()
    assert harness.stats()["checkpoints"] == 0
    with harness.connector(instance="ck") as conn:
        sid = conn.open_stream("ck")
        assert conn.processed(sid) == 99
        conn.send(sid, b"x", message_id=100)
    assert harness.ids("ck") == list(range(101))


@pytest.fixture
def lagging(tmp_path):
    """A harness that checkpoints only when told to (and at a clean stop)."""
    h = Harness(str(tmp_path / "data"), checkpoint_interval=3600.0)
    try:
        yield h
    finally:
        h.close()


def test_data_appended_after_the_last_checkpoint_is_not_duplicated(lagging):
    harness = lagging
    with harness.connector(instance="lag") as conn:
        sid = conn.open_stream("lag")
        for i in range(50):
            conn.send(sid, b"x", message_id=i)
        conn.flush()
        harness.call(harness.endpoint.store.checkpoint())
        for i in range(50, 120):
            conn.send(sid, b"x", message_id=i)
    harness.restart(checkpoint=False)  # as if the broker died before checkpointing 50..119
    with harness.connector(instance="lag") as conn:
        sid = conn.open_stream("lag")
        assert conn.processed(sid) == 119
        for i in range(130):  # the source replays from its start; the broker keeps one copy
            conn.send(sid, b"x", message_id=i)
    assert harness.ids("lag") == list(range(130))


def test_a_new_stream_is_recorded_before_its_first_append(lagging):
    # Only the record made at the first NOTIFY reaches the checkpoint topic; the data after it
    # is found by scanning from the offset it recorded.
    harness = lagging
    with harness.connector(instance="new") as conn:
        sid = conn.open_stream("fresh")
        for i in range(30):
            conn.send(sid, b"x", message_id=i)
    harness.restart(checkpoint=False)
    with harness.connector(instance="new") as conn:
        sid = conn.open_stream("fresh")
        assert conn.processed(sid) == 29
        for i in range(40):
            conn.send(sid, b"x", message_id=i)
    assert harness.ids("fresh") == list(range(40))


def test_a_draft_connector_that_forgot_its_point_is_told_by_a_nack(harness):
    with harness.connector(instance="forgets") as conn:
        sid = conn.open_stream("forgets", stream_id=5)
        for i in range(20):
            conn.send(sid, b"x", message_id=i)
    raw = Raw(harness, instance="forgets")
    assert dict(raw.handshake().resume_points) == {5: 19}
    raw.send(raw.conn.notify(5, "forgets"))  # "from the start", though OK said 19
    raw.until(lambda ev: raw.of(Nacked), "NACK")
    assert raw.of(Nacked)[0].processed == 19


def test_an_instance_with_more_streams_than_an_ok_frame_holds_still_connects(tmp_path):
    # A draft OK carries the point of every stream the instance has history of, 16 bytes each;
    # the streams that do not fit one frame learn theirs at their NOTIFY, from a NACK.
    h = Harness(str(tmp_path / "d"), max_frame_size=1024)  # room for 63 points
    try:
        with h.connector(instance="many") as conn:
            for sid in range(100):
                conn.open_stream("many", stream_id=sid)
                conn.send(sid, b"x", message_id=sid)
        raw = Raw(h, instance="many")
        told = dict(raw.handshake().resume_points)
        assert 0 < len(told) <= 63 and all(told[sid] == sid for sid in told)
        left_out = next(sid for sid in range(100) if sid not in told)
        raw.send(raw.conn.notify(left_out, "many"))  # "from the start"
        raw.until(lambda ev: raw.of(Nacked), "NACK")
        assert raw.of(Nacked)[0].processed == left_out
        assert h.stats()["bugs"] == 0
    finally:
        h.close()


# -- refusals, fencing, bad peers ---------------------------------------------------------------


def test_refused_streams_keep_a_released_session_going(tmp_path):
    h = Harness(str(tmp_path / "d"), auto_create=False)
    try:
        raw = Raw(h, "released")
        raw.handshake()
        raw.send(raw.conn.notify(1, "__internal") + raw.conn.notify(2, "missing"))
        raw.until(lambda ev: len(raw.of(StreamRejected)) == 2, "two refusals")
        assert not raw.closed and h.stats()["streams_refused"] == 2
    finally:
        h.close()


def test_a_refused_draft_stream_ends_the_session(harness):
    raw = Raw(harness)
    raw.handshake()
    raw.send(raw.conn.notify(1, "__consumer_offsets"))
    raw.until(lambda ev: raw.closed, "the session to end")
    assert "internal" in raw.of(PeerError)[0].reason


def test_a_new_connection_of_the_same_instance_fences_the_old_one(harness):
    old = Raw(harness, instance="same")
    old.handshake()
    new = Raw(harness, instance="same")
    new.handshake()
    old.until(lambda ev: old.closed, "the old connection to be closed")
    assert "superseded" in old.of(PeerError)[0].reason
    assert harness.stats()["fenced"] == 1


def test_bad_peers_get_an_error_and_the_others_go_on(harness):
    good = harness.connector(instance="good")
    sid = good.open_stream("good")
    good.send(sid, b"before", message_id=0)
    good.flush()

    cookie = Raw(harness, cookie=b"wrong", instance="bad-cookie")
    cookie.send(cookie.conn.hello())
    cookie.until(lambda ev: cookie.closed, "a close")
    assert cookie.of(PeerError)[0].reason == "bad cookie"

    garbage = Raw(harness, instance="garbage")
    garbage.send(b"GET / HTTP/1.1\r\n\r\n")
    garbage.until(lambda ev: garbage.closed, "a close")

    huge = Raw(harness, instance="huge")
    huge.handshake()
    huge.send(struct.pack("<I", 64 * 1024 * 1024) + b"M")
    huge.until(lambda ev: huge.closed, "a close")
    assert "exceeds the maximum" in huge.of(PeerError)[0].reason

    version = Raw(harness, "released", instance="version")
    version.send(released.encode(released.Hello(b"9.9.9", COOKIE, b"p", b"i")))
    version.until(lambda ev: version.closed, "a close")
    assert "version" in version.of(PeerError)[0].reason

    good.send(sid, b"after", message_id=1)
    good.flush()
    good.close()
    assert [r.value for r in harness.records("good")] == [b"before", b"after"]
    assert harness.stats()["protocol_errors"] >= 3 and harness.stats()["bugs"] == 0


@BOTH
def test_names_that_could_share_a_stream_id_are_refused_at_hello(harness, dialect):
    """A stream's id (the batches' producerId, and its broker session) hashes program NUL
    instance NUL stream id (`source_id`): with NUL in a name, ("a\0b", "c") and ("a", "b\0c")
    would be one stream, sharing a session, and each would count the other's records as its
    own on resume. Such names get an ERROR at HELLO; valid ones keep their ids."""
    assert source_id("a\0b", "c", 1) == source_id("a", "b\0c", 1)
    for program, instance in (("a\0b", "c"), ("a", "b\0c")):
        raw = Raw(harness, dialect, program=program, instance=instance)
        raw.send(raw.conn.hello())
        raw.until(lambda ev, raw=raw: raw.of(Accepted) or raw.of(PeerError), "OK or ERROR")
        assert not raw.of(Accepted), f"{program!r}/{instance!r} was accepted"
        assert "NUL" in raw.of(PeerError)[0].reason
        raw.until(lambda ev, raw=raw: raw.closed, "a close")
    assert harness.stats()["protocol_errors"] == 2
    with harness.connector(dialect, program="a", instance="b") as conn:
        sid = conn.open_stream("valid")
        conn.send(sid, b"x", message_id=0)
    (batch,) = [b for b in harness.batches("valid") if not b.is_control]
    assert batch.producer_id == source_id("a", "b", sid)


FORGED = "x\nERROR forged \x1b[2J"


def test_a_peers_error_reason_cannot_forge_a_log_line(harness, caplog):
    """A connector's ERROR reason is its own free text, and the endpoint logged it raw when
    the connection ended: "x\\nERROR forged" put a line of the peer's choosing in the
    broker's log. It is logged with its control characters escaped, on its one line."""
    caplog.set_level(logging.DEBUG, logger="querylib.connector")
    raw = Raw(harness, instance="forger")
    raw.handshake()
    raw.send(raw.conn.error(FORGED))
    raw.until(lambda ev: raw.closed, "the session to end")

    def ended() -> list[str]:
        return [r.getMessage() for r in caplog.records if "ended (connector sent" in
                r.getMessage()]

    (message,) = wait_for(ended, timeout=10, what="the end to be logged")
    assert message.endswith("ended (connector sent ERROR: x\\nERROR forged \\x1b[2J)")
    assert len(message.splitlines()) == 1 and "\x1b" not in message


def test_a_program_name_cannot_forge_a_line_of_an_error(harness):
    """A connector whose history cannot be read back is told "cannot resume PROGRAM/INSTANCE:
    why", which connectors log: the program and instance names, any string the connector
    chose, went into it raw. They are escaped; the reason stays one line."""
    with harness.connector(program=FORGED, instance="i") as conn:
        sid = conn.open_stream("forged")
        conn.send(sid, b"x", message_id=0)
    harness.restart()  # its point is then unverified: the next HELLO reads the data
    endpoint = harness.endpoint
    assert endpoint is not None

    async def unreadable(pid: Any) -> Any:
        raise LogClosedError(f"{pid[0]}-{pid[1]} is closed")

    endpoint.partitions.info = unreadable  # type: ignore[method-assign]
    raw = Raw(harness, program=FORGED, instance="i")
    raw.send(raw.conn.hello())
    raw.until(lambda ev: raw.closed, "the session to end")
    (error,) = raw.of(PeerError)
    assert error.reason.startswith("cannot resume x\\nERROR forged \\x1b[2J/i: ")
    assert len(error.reason.splitlines()) == 1 and "\x1b" not in error.reason


def test_closing_the_endpoint_ends_every_connection(tmp_path):
    h = Harness(str(tmp_path / "d"))
    try:
        silent = Raw(h, instance="silent")  # connected, never says a word
        draft_peer = Raw(h, instance="d")
        draft_peer.handshake()
        released_peer = Raw(h, "released", instance="r")
        released_peer.handshake()
        h.stop()
        for peer in (silent, draft_peer, released_peer):
            peer.until(lambda ev, peer=peer: peer.closed, "a close")
        assert "shutting down" in draft_peer.of(PeerError)[0].reason
        assert released_peer.of(RestartRequested)
    finally:
        h.start()
        h.close()


def test_a_silent_peer_is_dropped_after_the_handshake_timeout(tmp_path):
    h = Harness(str(tmp_path / "d"), handshake_timeout=0.2)
    try:
        silent = Raw(h)
        silent.until(lambda ev: silent.closed, "the silent peer to be dropped")
    finally:
        h.close()


def test_big_messages_are_split_into_batches_the_broker_accepts(tmp_path):
    h = Harness(str(tmp_path / "d"), max_batch_bytes=64 * 1024)
    try:
        with h.connector() as conn:
            sid = conn.open_stream("split")
            for i in range(40):
                conn.send(sid, bytes([i]) * (30_000 if i % 7 else 3), message_id=i)
        batches = [b for b in h.batches("split") if not b.is_control]
        assert all(sum(len(r.value) for r in b.records) <= 64 * 1024 + 30_000 for b in batches)
        assert h.ids("split") == list(range(40))
    finally:
        h.close()
