"""Whole records between querylib and Kafka clients, against a real `tq up` (issue 15): a
querylib publisher's keys, headers and event times (its `querylib.Record`s, and the call's
`headers=` and `event_time=`) read back unchanged by a confluent-kafka consumer, and records a
confluent-kafka producer wrote with keys, headers and timestamps read back whole by a querylib
subscriber that asks for records (`subscribe(..., records=True)`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest

import querylib
from catalog.errors import UserError
from querylib import Data, Record
from tests.conftest import free_port
from tests.integration._up_endpoints import UpWithEndpoints
from tests.interop._kafka import T0

pytestmark = pytest.mark.timeout(180)

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-records"),
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def _consume(up: UpWithEndpoints, topic: str, count: int) -> list:
    """The first `count` data records of partition 0 of `topic`, read by confluent-kafka."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": up.info["kafka"],
                                         "group.id": f"check-{topic}",
                                         "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0,
                                                        confluent_kafka.OFFSET_BEGINNING)])
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
        assert len(got) == count, f"read {len(got)} of {count}"
        return got
    finally:
        consumer.close()


def _user_headers(message) -> list[tuple[str, bytes]]:
    """A message's headers without tq.time, the logical time tq adds to what it publishes."""
    return [(n, v) for n, v in message.headers() or [] if n != "tq.time"]


def test_querylib_keys_headers_and_event_times_read_by_confluent(up: UpWithEndpoints) -> None:
    sent = [Record(b"value-%d" % i, key=None if i % 4 == 0 else b"key-%d" % i,
                   headers=[] if i % 3 == 0 else [("origin", b"tq"), ("i", b"%d" % i)],
                   timestamp=T0 + 7 * i) for i in range(20)]
    with up.connect() as ctx, ctx.publish("records-out", serde="bytes") as out:
        out.send(0, sent)
        # The call's own headers and event time, for plain values (the run path).
        out.send(1, [b"plain-0", b"plain-1"], headers=[("batch", b"b1")], event_time=T0 - 5)
        out.advance_to(2)
    got = _consume(up, "records-out", len(sent) + 2)
    assert [(m.key(), m.value(), _user_headers(m), m.timestamp()) for m in got[:len(sent)]] == \
        [(r.key, r.value, list(r.headers), (confluent_kafka.TIMESTAMP_CREATE_TIME, r.timestamp))
         for r in sent]
    assert [(m.key(), m.value(), _user_headers(m), m.timestamp()) for m in got[len(sent):]] == \
        [(None, b"plain-%d" % i, [("batch", b"b1")],
          (confluent_kafka.TIMESTAMP_CREATE_TIME, T0 - 5)) for i in range(2)]


def test_keys_go_through_the_topics_serde(up: UpWithEndpoints) -> None:
    with up.connect() as ctx, ctx.publish("records-msgpack") as out:
        out.send(0, [Record({"n": 1}, key="sensor-a", timestamp=T0),
                     {"n": 2}])  # a plain value among records: no key, the call's time
        out.advance_to(1)
        out.flush()
        with ctx.subscribe("records-msgpack", records=True) as sub:
            event = sub.next_event(timeout=30)
    assert isinstance(event, Data)
    first, second = event.records
    assert (first.key, first.value, first.timestamp, first.headers) == \
        ("sensor-a", {"n": 1}, T0, ())
    assert (second.key, second.value) == (None, {"n": 2})
    assert (first.topic, first.partition, first.offset, second.offset) == \
        ("records-msgpack", 0, 0, 1)
    got = _consume(up, "records-msgpack", 2)
    assert [m.key() for m in got] == [msgspec.msgpack.encode("sensor-a"), None]
    assert [msgspec.msgpack.decode(m.value()) for m in got] == [{"n": 1}, {"n": 2}]


def test_confluent_records_read_whole_by_a_querylib_subscriber(up: UpWithEndpoints) -> None:
    created = up.tq("topic", "create", "records-in", "--partitions", "1")
    assert created.returncode == 0, created.stderr
    producer = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"], "acks": "all",
                                         "enable.idempotence": True})
    sent = [(None if i % 5 == 0 else b"k%d" % i, b"v%d" % i,
             [] if i % 2 else [("origin", b"confluent"), ("i", b"%d" % i)], T0 + i)
            for i in range(30)]
    for key, value, headers, timestamp in sent:
        producer.produce("records-in", value=value, key=key, partition=0, timestamp=timestamp,
                         headers=headers or None)
    assert producer.flush(30) == 0
    got: list[Record] = []
    with up.connect() as ctx, ctx.subscribe("records-in", records=True) as sub:
        while len(got) < len(sent):
            event = sub.next_event(timeout=30)
            assert event is not None, f"read {len(got)} of {len(sent)}"
            if isinstance(event, Data):
                assert event.time is None  # Kafka clients write no logical time
                got.extend(event.records)
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in got] == \
        [(k, v, h, ts) for k, v, h, ts in sent]
    assert [(r.topic, r.partition, r.offset) for r in got] == \
        [("records-in", 0, i) for i in range(len(sent))]
    # Values-only subscribers are as before.
    with up.connect() as ctx, ctx.subscribe("records-in") as sub:
        event = sub.next_event(timeout=30)
    assert isinstance(event, Data) and event.records[0] == b"v0"


def test_what_a_publisher_refuses(up: UpWithEndpoints) -> None:
    with up.connect() as ctx:
        with ctx.publish("records-refused") as out:
            with pytest.raises(UserError, match="tq's own"):
                out.send(0, [1], headers=[("tq.time", b"x")])
            with pytest.raises(UserError, match="tq's own"):
                out.send(0, [Record(1, headers=[("tq.diff", b"x")])])
            with pytest.raises(UserError, match="event_time"):
                out.send(0, [1], event_time=-1)
            with pytest.raises(UserError, match="header"):
                out.send(0, [Record(1, headers=[("h", "not bytes")])])
        with ctx.publish("records-collection", kind="collection") as out:
            with pytest.raises(UserError, match="collection"):
                out.send(0, [(Record("a", key="k"), 1)])
        with pytest.raises(UserError, match="collection"):
            ctx.subscribe("records-collection", records=True)


def test_records_in_a_hash_publication(up: UpWithEndpoints) -> None:
    with up.connect() as ctx:
        with ctx.publish("records-hash", partition=querylib.Hash(2, key=len)) as out:
            out.send(0, [Record("ab", key="mine", headers=[("h", b"1")], timestamp=T0), "abc"])
            out.advance_to(1)
        with ctx.subscribe("records-hash", records=True) as sub:
            records = [r for e in sub if isinstance(e, Data) for r in e.records]
    by_value = {r.value: r for r in records}
    assert (by_value["ab"].key, by_value["ab"].headers, by_value["ab"].timestamp) == \
        ("mine", (("h", b"1"),), T0)
    assert by_value["abc"].key == 3  # no key of its own: the Hash key, as before


def test_a_group_member_reads_whole_records(up: UpWithEndpoints) -> None:
    with up.connect() as ctx:
        with ctx.publish("records-group", serde="bytes") as out:
            out.send(0, [Record(b"v%d" % i, key=b"k%d" % i, timestamp=T0 + i)
                         for i in range(5)])
            out.advance_to(1)
        with ctx.subscribe("records-group", group="whole", records=True) as sub:
            got = [r for e in sub if isinstance(e, Data) for r in e.records]
    assert [(r.key, r.value, r.timestamp, r.offset) for r in got] == \
        [(b"k%d" % i, b"v%d" % i, T0 + i, i) for i in range(5)]
