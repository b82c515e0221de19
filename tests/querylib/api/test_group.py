"""The consumer-group member, sans-I/O (`querylib/api/_group.py`): the member state machine's
table and transitions, Kafka's range and roundrobin assignors (properties, and the examples
Kafka's own javadoc gives), and the consumer protocol's bytes against kio and golden layouts."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.consumer_protocol_assignment.v0.data import (
    ConsumerProtocolAssignment,
)
from kio.schema.consumer_protocol_assignment.v0.data import (
    TopicPartition as AssignedPartitions,
)
from kio.schema.consumer_protocol_subscription.v0.data import (
    ConsumerProtocolSubscription as SubscriptionV0,
)
from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription as SubscriptionV1,
)
from kio.schema.consumer_protocol_subscription.v1.data import (
    TopicPartition as OwnedPartitions,
)
from kio.serial import entity_reader, entity_writer

from catalog.errors import ProtocolError
from querylib.api._group import (
    ASSIGNORS,
    Assign,
    Beat,
    Close,
    Commit,
    Disconnected,
    Done,
    GroupRefusedError,
    Joined,
    MemberMachine,
    MemberTiming,
    Rediscover,
    Revoke,
    SendHeartbeat,
    SendJoin,
    SendLeave,
    SendSync,
    Start,
    Synced,
    Tick,
    assign_range,
    assign_roundrobin,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

NONE, NOT_COORDINATOR, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = \
    0, 16, 25, 27, 79
ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL = 22, 23
TIMING = MemberTiming(heartbeat_interval_ms=500, commit_interval_ms=1_000)

# ---- the member state machine ---------------------------------------------------------------


def _stable(member_id: str = "m-1", generation: int = 3,
            assignment: dict[str, list[int]] | None = None) -> MemberMachine:
    machine = MemberMachine(TIMING)
    machine.handle(Start())
    machine.handle(Joined(NONE, generation, member_id, "other", "range", ()))
    machine.handle(Synced(NONE, encode_assignment(assignment or {"t": [0, 1]})))
    assert machine.state == "stable"
    return machine


def test_a_leader_joins_syncs_with_the_members_and_gets_its_assignment() -> None:
    machine = MemberMachine(TIMING)
    assert machine.handle(Start()) == [SendJoin("")]
    members = (("m-1", encode_subscription(["t"])), ("m-2", encode_subscription(["t"])))
    assert machine.handle(Joined(NONE, 1, "m-1", "m-1", "range", members)) == [
        SendSync(1, "m-1", "range", members)]
    assert machine.state == "syncing"
    assert machine.handle(Synced(NONE, encode_assignment({"t": [1, 0]}))) == [
        Assign({"t": [0, 1]})]
    assert (machine.state, machine.member_id, machine.generation) == ("stable", "m-1", 1)


def test_a_follower_syncs_with_no_assignments_and_may_get_nothing() -> None:
    machine = MemberMachine(TIMING)
    machine.handle(Start())
    members = (("m-1", b"x"),)  # a follower never reads them
    assert machine.handle(Joined(NONE, 1, "m-2", "m-1", "range", members)) == [
        SendSync(1, "m-2", "range", ())]
    assert machine.handle(Synced(NONE, b"")) == [Assign({})]


def test_member_id_required_rejoins_at_once_with_the_given_id() -> None:
    machine = MemberMachine(TIMING)
    machine.handle(Start())
    assert machine.handle(Joined(MEMBER_ID_REQUIRED, member_id="m-9")) == [SendJoin("m-9")]
    assert machine.state == "joining"


def test_a_moved_coordinator_is_found_again_before_joining_after_a_pause() -> None:
    machine = MemberMachine(TIMING)
    machine.handle(Start())
    assert machine.handle(Joined(NOT_COORDINATOR)) == [Rediscover(),
                                                       SendJoin("", backoff=True)]


def test_a_fatal_refusal_is_a_user_error() -> None:
    machine = MemberMachine(TIMING)
    machine.handle(Start())
    with pytest.raises(GroupRefusedError, match="INCONSISTENT_GROUP_PROTOCOL"):
        machine.handle(Joined(INCONSISTENT_GROUP_PROTOCOL))


def test_a_failed_sync_rejoins() -> None:
    machine = MemberMachine(TIMING)
    machine.handle(Start())
    machine.handle(Joined(NONE, 2, "m-1", "m-1", "range", ()))
    assert machine.handle(Synced(REBALANCE_IN_PROGRESS)) == [SendJoin("m-1")]
    assert machine.state == "joining"


def test_ticks_bring_heartbeats_and_commits_on_their_intervals() -> None:
    machine = MemberMachine(TIMING)
    machine.handle(Tick(10_000))
    machine.handle(Start())
    machine.handle(Joined(NONE, 4, "m-1", "m-1", "range", ()))
    machine.handle(Synced(NONE, b""))
    assert machine.handle(Tick(10_499)) == []
    assert machine.handle(Tick(10_500)) == [SendHeartbeat(4, "m-1")]
    assert machine.handle(Tick(10_999)) == []
    assert machine.handle(Tick(11_000)) == [Commit(4, "m-1"), SendHeartbeat(4, "m-1")]
    assert machine.handle(Tick(11_499)) == []
    assert machine.handle(Tick(11_500)) == [SendHeartbeat(4, "m-1")]


def test_a_rebalance_stops_reading_commits_then_rejoins() -> None:
    machine = _stable()
    assert machine.handle(Beat(NONE)) == []
    assert machine.handle(Beat(REBALANCE_IN_PROGRESS)) == [Revoke(), Commit(3, "m-1"),
                                                           SendJoin("m-1")]
    assert machine.state == "joining"
    assert machine.handle(Beat(NONE)) == []  # a stale answer after moving on


@pytest.mark.parametrize(("error", "rejoin_as"), [(UNKNOWN_MEMBER_ID, ""),
                                                  (ILLEGAL_GENERATION, "m-1")])
def test_a_member_the_group_dropped_stops_reading_without_committing(error: int,
                                                                     rejoin_as: str) -> None:
    machine = _stable()
    assert machine.handle(Beat(error)) == [Revoke(), SendJoin(rejoin_as)]


def test_a_lost_connection_stops_reading_and_finds_the_coordinator_again() -> None:
    machine = _stable()
    assert machine.handle(Disconnected()) == [Revoke(), Rediscover(), SendJoin("m-1")]
    assert machine.handle(Disconnected()) == [Rediscover(), SendJoin("m-1")]


def test_close_commits_and_leaves_when_stable() -> None:
    machine = _stable()
    assert machine.handle(Close()) == [Revoke(), Commit(3, "m-1"), SendLeave("m-1"), Done()]
    assert machine.handle(Close()) == [Done()]
    assert machine.handle(Tick(99_999)) == []


def test_close_before_joining_has_nothing_to_leave() -> None:
    assert MemberMachine(TIMING).handle(Close()) == [Revoke(), Done()]


STATES = ["new", "joining", "syncing", "stable", "closed"]
EVENTS = st.one_of(
    st.just(Start()), st.just(Close()), st.just(Disconnected()),
    st.builds(Tick, st.integers(0, 10**9)),
    st.builds(Beat, st.sampled_from([NONE, REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID])),
    st.builds(Joined, st.sampled_from([NONE, MEMBER_ID_REQUIRED, NOT_COORDINATOR]),
              st.integers(0, 9), st.just("m-1"), st.sampled_from(["m-1", "m-2"]),
              st.just("range")),
    st.builds(Synced, st.sampled_from([NONE, REBALANCE_IN_PROGRESS]),
              st.just(encode_assignment({"t": [0]}))))
ALLOWED = {
    "new": {Start, Close, Tick},
    "joining": {Joined, Tick, Disconnected, Close, Beat},
    "syncing": {Synced, Tick, Disconnected, Close},
    "stable": {Tick, Beat, Disconnected, Close},
    "closed": {Tick, Close, Disconnected},
}


@settings(max_examples=300, deadline=None)
@given(state=st.sampled_from(STATES), event=EVENTS)
def test_every_state_and_event_pair_is_handled_or_a_protocol_error(state: str,
                                                                   event: object) -> None:
    machine = MemberMachine(TIMING, state=state, member_id="m-1", generation=1)
    if type(event) not in ALLOWED[state]:
        with pytest.raises(ProtocolError):
            machine.handle(event)  # type: ignore[arg-type]
        return
    out = machine.handle(event)  # type: ignore[arg-type]
    assert machine.state in STATES
    if any(isinstance(i, Done) for i in out):
        assert out[-1] == Done() and machine.state == "closed"
    if machine.state != "stable":  # only a stable member reads: the rest stop first
        assert not any(isinstance(i, (Assign, SendHeartbeat)) for i in out)


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENTS, max_size=30))
def test_random_sequences_never_read_outside_the_stable_state(events: list) -> None:
    """Whatever arrives, a member reads (Assign) only as it becomes stable, and stops reading
    (Revoke) before anything that leaves the stable state."""
    machine = MemberMachine(TIMING)
    reading = False
    for event in events:
        before = machine.state
        try:
            out = machine.handle(event)
        except (ProtocolError, GroupRefusedError):
            continue
        for instruction in out:
            if isinstance(instruction, Assign):
                reading = True
            elif isinstance(instruction, Revoke):
                reading = False
        if before == "stable" and machine.state != "stable":
            assert not reading
        assert reading == (machine.state == "stable")


# ---- the assignors -------------------------------------------------------------------------

MEMBERS = st.lists(st.text("abcdef", min_size=1, max_size=4), min_size=1, max_size=6,
                   unique=True)
TOPICS = st.dictionaries(st.sampled_from(["t0", "t1", "t2", "t3"]), st.integers(0, 12),
                         min_size=1)


@st.composite
def groups(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, int]]:
    members = draw(MEMBERS)
    counts = draw(TOPICS)
    subscriptions = {m: draw(st.lists(st.sampled_from(sorted(counts)), min_size=1,
                                      unique=True)) for m in members}
    return subscriptions, counts


def _owners(plan: dict[str, dict[str, list[int]]]) -> dict[tuple[str, int], list[str]]:
    owners: dict[tuple[str, int], list[str]] = {}
    for member, assignment in plan.items():
        for topic, partitions in assignment.items():
            for partition in partitions:
                owners.setdefault((topic, partition), []).append(member)
    return owners


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@settings(max_examples=300, deadline=None)
@given(group=groups())
def test_every_subscribed_partition_goes_to_exactly_one_subscriber(name: str, group) -> None:
    subscriptions, counts = group
    plan = ASSIGNORS[name](subscriptions, counts)
    assert set(plan) == set(subscriptions)
    owners = _owners(plan)
    wanted = {(t, p) for ts in subscriptions.values() for t in ts for p in range(counts[t])}
    assert set(owners) == wanted
    for (topic, _), members in owners.items():
        assert len(members) == 1 and topic in subscriptions[members[0]]


@settings(max_examples=300, deadline=None)
@given(group=groups())
def test_range_balances_each_topic_among_its_subscribers_within_one(group) -> None:
    subscriptions, counts = group
    plan = assign_range(subscriptions, counts)
    for topic in {t for ts in subscriptions.values() for t in ts}:
        shares = [len(plan[m].get(topic, [])) for m, ts in subscriptions.items() if topic in ts]
        assert max(shares) - min(shares) <= 1
        for partitions in (plan[m].get(topic, []) for m in subscriptions):
            assert partitions == list(range(partitions[0], partitions[0] + len(partitions))) \
                if partitions else True  # ranges are consecutive


@settings(max_examples=300, deadline=None)
@given(members=MEMBERS, counts=TOPICS)
def test_roundrobin_balances_identical_subscriptions_within_one(members: list[str],
                                                                counts: dict[str, int]) -> None:
    plan = assign_roundrobin({m: sorted(counts) for m in members}, counts)
    totals = [sum(len(p) for p in plan[m].values()) for m in members]
    assert max(totals) - min(totals) <= 1


def test_kafka_javadoc_range_example() -> None:
    """RangeAssignor's javadoc: C0 and C1 subscribed to t0 and t1, three partitions each."""
    plan = assign_range({"C1": ["t0", "t1"], "C0": ["t0", "t1"]}, {"t0": 3, "t1": 3})
    assert plan == {"C0": {"t0": [0, 1], "t1": [0, 1]}, "C1": {"t0": [2], "t1": [2]}}


def test_kafka_javadoc_roundrobin_examples() -> None:
    """RoundRobinAssignor's javadoc: the same group, then C0 on t0, C1 on t0 and t1, C2 on
    t0, t1 and t2, with 1, 2 and 3 partitions."""
    assert assign_roundrobin({"C0": ["t0", "t1"], "C1": ["t0", "t1"]},
                             {"t0": 3, "t1": 3}) == {"C0": {"t0": [0, 2], "t1": [1]},
                                                     "C1": {"t0": [1], "t1": [0, 2]}}
    assert assign_roundrobin({"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]},
                             {"t0": 1, "t1": 2, "t2": 3}) == {
        "C0": {"t0": [0]}, "C1": {"t1": [0]}, "C2": {"t1": [1], "t2": [0, 1, 2]}}


def test_a_topic_without_partitions_assigns_nothing() -> None:
    for assignor in ASSIGNORS.values():
        assert assignor({"a": ["gone"]}, {}) == {"a": {}}


# ---- the consumer protocol's bytes ---------------------------------------------------------


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_subscription_golden_bytes() -> None:
    # version:int16, topics:[string] (int32 count), user_data:bytes (int32 -1 = null)
    assert encode_subscription(["a", "bc"]) == (
        struct.pack(">hi", 0, 2) + _string("a") + _string("bc") + struct.pack(">i", -1))


def test_assignment_golden_bytes() -> None:
    # version:int16, assigned_partitions:[topic:string, partitions:[int32]], user_data:bytes
    assert encode_assignment({"b": [2, 0], "a": [1]}) == (
        struct.pack(">hi", 0, 2)
        + _string("a") + struct.pack(">ii", 1, 1)
        + _string("b") + struct.pack(">iii", 2, 0, 2)
        + struct.pack(">i", -1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=20), max_size=8, unique=True))
def test_subscription_round_trips_and_matches_kio(topics: list[str]) -> None:
    data = encode_subscription(topics)
    assert decode_subscription(data) == topics
    decoded, used = entity_reader(SubscriptionV0)(data, 2)
    assert (list(decoded.topics), decoded.user_data, 2 + used) == (topics, None, len(data))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=20),
                       st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=8,
                                unique=True), max_size=6))
def test_assignment_round_trips_and_kio_reads_it(assignment: dict[str, list[int]]) -> None:
    data = encode_assignment(assignment)
    assert decode_assignment(data) == {t: sorted(p) for t, p in assignment.items()}
    decoded, used = entity_reader(ConsumerProtocolAssignment)(data, 2)
    assert 2 + used == len(data)
    assert {tp.topic: list(tp.partitions) for tp in decoded.assigned_partitions} == \
        {t: sorted(p) for t, p in assignment.items()}


def test_a_v1_subscription_as_newer_clients_send_decodes() -> None:
    """v1 appends owned_partitions: the v0 reader takes the topics and ignores the rest."""
    buffer = io.BytesIO()
    buffer.write(struct.pack(">h", 1))
    entity_writer(SubscriptionV1)(buffer, SubscriptionV1(
        topics=("t0", "t1"), user_data=None,
        owned_partitions=(OwnedPartitions(topic="t0", partitions=(0, 2)),)))
    assert decode_subscription(buffer.getvalue()) == ["t0", "t1"]


def test_an_assignment_kio_wrote_decodes() -> None:
    buffer = io.BytesIO()
    buffer.write(struct.pack(">h", 0))
    entity_writer(ConsumerProtocolAssignment)(buffer, ConsumerProtocolAssignment(
        assigned_partitions=(AssignedPartitions(topic="t", partitions=(3, 4)),),
        user_data=b"opaque"))
    assert decode_assignment(buffer.getvalue()) == {"t": [3, 4]}


@pytest.mark.parametrize("garbage", [b"\x00", b"\x00\x00\x7f\xff\xff\xff",
                                     b"\x00\x00\x00\x00\x00\x01\x7f\xff"])
def test_undecodable_bytes_are_protocol_errors(garbage: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_subscription(garbage)
    with pytest.raises(ProtocolError):
        decode_assignment(garbage)
