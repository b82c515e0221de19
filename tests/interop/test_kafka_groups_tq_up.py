"""Kafka consumer groups on a real `tq up`: confluent-kafka consumers and querylib group
members are members of the same groups, coordinated by the coordinator's broker (which
FindCoordinator names; Metadata lists it as a broker that leads no data topic).

(a) a confluent consumer (range assignor) and a querylib member split a 4-partition topic and
    read every record exactly once while the group is stable;
(b) two confluent consumers: one closes, the other gets every partition, and the offsets it
    committed read back through OffsetFetch (`Consumer.committed`);
(c) Metadata, from either listener, lists the coordinator's broker (librdkafka drops a group
    coordinator that Metadata does not list) and leads no data topic from it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from catalog import Broker
from querylib.api import Hash
from querylib.api._events import Data
from tests.conftest import free_port, wait_for
from tests.integration._up_endpoints import UpWithEndpoints

confluent_kafka = pytest.importorskip("confluent_kafka")
Consumer, TopicPartition = confluent_kafka.Consumer, confluent_kafka.TopicPartition

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-kafka-groups"),
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def _consumer(up: UpWithEndpoints, group: str, assigned: dict[str, set[int]], name: str,
              **extra: object):
    """A subscribe() consumer whose current assignment is tracked in assigned[name]."""
    c = Consumer({"bootstrap.servers": up.info["kafka"], "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 100,
                  "max.poll.interval.ms": 20000, "topic.metadata.refresh.interval.ms": 1000,
                  **extra})
    assigned[name] = set()

    def on_assign(_c, partitions) -> None:
        assigned[name] = {p.partition for p in partitions}

    def on_revoke(_c, partitions) -> None:
        assigned[name] = set()

    return c, {"on_assign": on_assign, "on_revoke": on_revoke}


def _poll(c, into: list) -> None:
    message = c.poll(0.05)
    if message is not None:
        assert message.error() is None, message.error()
        into.append(message)


def test_a_confluent_consumer_and_a_querylib_member_split_a_topic(up) -> None:
    owner = up.connect()
    pub = owner.publish("kg-split", partition=Hash(PARTITIONS), serde="json")
    assigned: dict[str, set[int]] = {}
    kafka, callbacks = _consumer(up, "kg-mixed", assigned, "kafka",
                                 **{"partition.assignment.strategy": "range"})
    member_ctx = up.connect()
    member = None
    from_kafka: list = []
    from_tq: list[int] = []
    try:
        kafka.subscribe(["kg-split"], **callbacks)
        member = member_ctx.subscribe("kg-split", group="kg-mixed", serde="json")

        def split() -> bool:
            _poll(kafka, from_kafka)
            _drain(member, from_tq)
            mine = set(member.member.assignment.get("kg-split", []))
            return len(assigned["kafka"]) == len(mine) == 2 and \
                assigned["kafka"] | mine == set(range(PARTITIONS))

        wait_for(split, timeout=60, what="the two members holding two partitions each")
        assert from_kafka == from_tq == []  # nothing published yet
        held = (set(assigned["kafka"]), set(member.member.assignment["kg-split"]))
        pub.send(0, list(range(400)))

        def all_read() -> bool:
            _poll(kafka, from_kafka)
            _drain(member, from_tq)
            return len(from_kafka) + len(from_tq) >= 400

        wait_for(all_read, timeout=60, what="all 400 records read across both members")
        _drain(member, from_tq, 0.3)
        for _ in range(10):
            _poll(kafka, from_kafka)
        # No rebalance happened meanwhile, so each record was read by exactly one member.
        assert (set(assigned["kafka"]), set(member.member.assignment["kg-split"])) == held
        read_by_kafka = [json.loads(m.value()) for m in from_kafka]
        assert sorted(read_by_kafka + from_tq) == list(range(400))
        assert {m.partition() for m in from_kafka} <= held[0]
        assert read_by_kafka and from_tq
    finally:
        kafka.close()
        if member is not None:
            member.close()
        member_ctx.close()
        pub.close()
        owner.close()


def _drain(sub, into: list[int], quiet: float = 0.02) -> None:
    while (event := sub.next_event(timeout=quiet)) is not None:
        if isinstance(event, Data):
            into.extend(event.records)


def test_two_confluent_consumers_one_leaves_and_commits_read_back(up) -> None:
    owner = up.connect()
    pub = owner.publish("kg-jobs", partition=Hash(PARTITIONS), serde="json")
    pub.send(0, list(range(200)))
    assigned: dict[str, set[int]] = {}
    c1, cb1 = _consumer(up, "kg-two", assigned, "c1")
    c2, cb2 = _consumer(up, "kg-two", assigned, "c2")
    seen: list = []
    try:
        c1.subscribe(["kg-jobs"], **cb1)
        wait_for(lambda: _poll(c1, seen) or assigned["c1"] == set(range(PARTITIONS)),
                 timeout=60, what="c1 holding every partition")
        c2.subscribe(["kg-jobs"], **cb2)

        def split() -> bool:
            _poll(c1, seen)
            _poll(c2, seen)
            return len(assigned["c1"]) == len(assigned["c2"]) == 2

        wait_for(split, timeout=60, what="the group splitting the partitions")
        assert assigned["c1"] | assigned["c2"] == set(range(PARTITIONS))

        def everything() -> bool:
            _poll(c1, seen)
            _poll(c2, seen)
            return {json.loads(m.value()) for m in seen} == set(range(200))

        wait_for(everything, timeout=60, what="all 200 records across the group")
        # Commit what c2 read of its partitions, then read the commits back (OffsetFetch).
        last: dict[int, int] = {}
        for m in seen:
            if m.partition() in assigned["c2"]:
                last[m.partition()] = max(last.get(m.partition(), -1), m.offset())
        commits = [TopicPartition("kg-jobs", p, o + 1) for p, o in sorted(last.items())]
        assert commits, "c2 read nothing of its partitions"
        c2.commit(offsets=commits, asynchronous=False)
        c1.close()
        c1 = None
        wait_for(lambda: _poll(c2, seen) or assigned["c2"] == set(range(PARTITIONS)),
                 timeout=60, what="c2 taking over every partition")
        committed = c2.committed([TopicPartition("kg-jobs", p) for p, _ in sorted(last.items())],
                                 timeout=10)
        assert [(tp.partition, tp.offset) for tp in committed] == \
            [(tp.partition, tp.offset) for tp in commits]
    finally:
        for c in (c1, c2):
            if c is not None:
                c.close()
        pub.close()
        owner.close()
    # A new consumer of the group starts at the commits: only c1's partitions are read again.
    again, cb = _consumer(up, "kg-two", assigned, "again")
    try:
        again.subscribe(["kg-jobs"], **cb)
        resumed: list = []
        uncommitted = {(m.partition(), m.offset()) for m in seen if m.partition() not in last}
        wait_for(lambda: _poll(again, resumed) or len(resumed) >= len(uncommitted),
                 timeout=60, what="the new consumer reading the uncommitted partitions")
        for _ in range(10):
            _poll(again, resumed)
        assert {(m.partition(), m.offset()) for m in resumed} == uncommitted
    finally:
        again.close()


def test_metadata_lists_the_group_coordinator_leading_no_data_topic(up) -> None:
    with up.cluster() as cluster:
        brokers = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                   if isinstance(b, Broker)]
    (coordinator,) = [b for b in brokers if b.session_id is None]
    owner = up.connect()
    pub = owner.publish("kg-meta", partition=Hash(PARTITIONS), serde="json")
    try:
        for bootstrap in (up.info["kafka"], coordinator.kafka_address):
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kg-meta"})
            try:
                metadata = c.list_topics(timeout=20)
            finally:
                c.close()
            listed = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
            assert listed[coordinator.broker_id] == coordinator.kafka_address
            # The coordinator's listener, the executor's, and its broker shards' (one each).
            executors = [b.kafka_address for b in brokers if b.session_id is not None]
            assert up.info["kafka"] in executors
            assert sorted(listed.values()) == sorted([coordinator.kafka_address, *executors])
            assert "kg-meta" in metadata.topics
            leaders = {p.leader for t in metadata.topics.values() for p in t.partitions.values()}
            assert coordinator.broker_id not in leaders
    finally:
        pub.close()
        owner.close()



def test_a_group_id_cannot_forge_a_line_of_tq_status(up) -> None:
    """Kafka allows any string as a group id, and `tq status` printed it raw: a client that
    committed an offset as group "g\\nERROR forged \\x1b[2J" made the operator's `tq status`
    show a line "ERROR forged" of its choosing and send the terminal an escape sequence. The
    group id is shown with its control characters escaped, on its own line."""
    group = "g\nERROR forged \x1b[2J"
    owner = up.connect()
    pub = owner.publish("kg-forged", serde="json")
    pub.send(0, [1, 2, 3])
    consumer = Consumer({"bootstrap.servers": up.info["kafka"], "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("kg-forged", 0, 2)], asynchronous=False)

        def status() -> list[str] | None:
            lines = up.tq("status").stdout.splitlines()
            return lines if any(line.startswith("  group g") for line in lines) else None

        lines = wait_for(status, timeout=60, what="tq status to show the group")
        assert not [line for line in lines if line.startswith("ERROR") or "\x1b" in line]
        assert any(line.startswith("  group g\\nERROR forged \\x1b[2J [") for line in lines), \
            lines
    finally:
        consumer.close()
        pub.close()
        owner.close()
