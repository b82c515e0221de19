"""The group coordinator state machine: Kafka's classic rebalance protocol, with time as input.

Scenarios first (join, sync, rebalance on join / leave / session timeout / rebalance timeout,
commit validation, restore), then properties: every (state, event) pair has a transition, and
random event sequences keep the machine's invariants (each request answered at most once,
no waiting member outside a rebalance, deadlines always in the future after a tick)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.kafka import ErrorCode
from querylib.server.kafka import GroupConfig, GroupMachine, GroupStatus
from querylib.server.kafka._backend import GroupMemberRecord, GroupRecord
from querylib.server.kafka._group import (
    TRANSITIONS,
    CommitCheck,
    CommitReply,
    Heartbeat,
    HeartbeatReply,
    Join,
    JoinReply,
    Leave,
    LeaveReply,
    StoreGroup,
    Sync,
    SyncReply,
)

G = "group"
CONFIG = GroupConfig(min_session_timeout_ms=10, max_session_timeout_ms=100_000,
                     initial_rebalance_delay_ms=0)
tokens = itertools.count(1)


def join(member_id: str = "", new_id: str = "m", *, protocols=(("range", b"meta"),),
         session: int = 1000, rebalance: int = 5000, known: bool = False,
         protocol_type: str = "consumer") -> Join:
    return Join(next(tokens), member_id, new_id, "client", "/127.0.0.1", protocol_type,
                tuple(protocols), session, rebalance, require_known_member=known)


def replies(out, kind):
    return [i for i in out if isinstance(i, kind)]


def only(out, kind):
    found = replies(out, kind)
    assert len(found) == 1, out
    return found[0]


def stable_group(machine: GroupMachine, *members: str, now: int = 0) -> int:
    """Members join one after the other and the group ends Stable; returns the generation."""
    leader = members[0]
    only(machine.handle(G, join(new_id=leader), now), JoinReply)
    machine.handle(G, Sync(next(tokens), leader, 1, ((leader, b"a-" + leader.encode()),)), now)
    for member in members[1:]:
        out = machine.handle(G, join(new_id=member), now)
        assert not replies(out, JoinReply)  # waits for the others to rejoin
        for other in list(machine.group(G).members):
            if other != member:
                out += machine.handle(G, join(other, new_id="x"), now)
        assert len(replies(out, JoinReply)) == len(machine.group(G).members)
        generation = machine.group(G).generation
        assignments = tuple((m, b"a-" + m.encode()) for m in machine.group(G).members)
        leader_id = machine.group(G).leader
        for other in machine.group(G).members:
            if other != leader_id:
                machine.handle(G, Sync(next(tokens), other, generation), now)
        out = machine.handle(G, Sync(next(tokens), leader_id, generation, assignments), now)
    assert machine.group(G).status is GroupStatus.STABLE
    return machine.group(G).generation


def test_single_member_joins_syncs_and_is_stable() -> None:
    machine = GroupMachine(CONFIG)
    reply = only(machine.handle(G, join(new_id="m1"), 0), JoinReply)
    assert (reply.error, reply.generation, reply.leader, reply.member_id, reply.protocol) == (
        ErrorCode.none, 1, "m1", "m1", "range")
    assert reply.members == (("m1", None, b"meta"),)
    assert machine.group(G).status is GroupStatus.COMPLETING_REBALANCE
    out = machine.handle(G, Sync(next(tokens), "m1", 1, (("m1", b"assigned"),)), 0)
    assert only(out, SyncReply).assignment == b"assigned"
    stored = only(out, StoreGroup).record
    assert (stored.generation, stored.leader, stored.members[0].assignment) == (
        1, "m1", b"assigned")
    assert machine.group(G).status is GroupStatus.STABLE
    assert only(machine.handle(G, Heartbeat(next(tokens), "m1", 1), 10),
                HeartbeatReply).error is ErrorCode.none


def test_join_v4_requires_a_known_member_id_first() -> None:
    machine = GroupMachine(CONFIG)
    reply = only(machine.handle(G, join(new_id="m1", known=True), 0), JoinReply)
    assert (reply.error, reply.member_id) == (ErrorCode.member_id_required, "m1")
    reply = only(machine.handle(G, join("m1", known=True), 0), JoinReply)
    assert (reply.error, reply.generation) == (ErrorCode.none, 1)


def test_pending_member_that_never_rejoins_expires() -> None:
    machine = GroupMachine(CONFIG)
    machine.handle(G, join(new_id="m1", known=True, session=100), 0)
    assert machine.next_deadline() == 100
    machine.tick(100)
    assert machine.next_deadline() is None
    assert only(machine.handle(G, join("m1", known=True), 101), JoinReply).error is (
        ErrorCode.unknown_member_id)


def test_a_second_member_triggers_a_rebalance_everyone_joins() -> None:
    machine = GroupMachine(CONFIG)
    stable_group(machine, "m1")
    out = machine.handle(G, join(new_id="m2"), 5)
    assert replies(out, JoinReply) == []
    assert machine.group(G).status is GroupStatus.PREPARING_REBALANCE
    assert only(machine.handle(G, Heartbeat(next(tokens), "m1", 1), 6),
                HeartbeatReply).error is ErrorCode.rebalance_in_progress
    out = machine.handle(G, join("m1"), 7)
    joined = {r.member_id: r for r in replies(out, JoinReply)}
    assert set(joined) == {"m1", "m2"} and all(r.generation == 2 for r in joined.values())
    assert joined["m1"].leader == "m1" and len(joined["m1"].members) == 2
    assert joined["m2"].members == ()
    # the follower's sync waits for the leader's assignment
    assert machine.handle(G, Sync(next(tokens), "m2", 2), 8) == []
    out = machine.handle(G, Sync(next(tokens), "m1", 2, (("m1", b"p0"), ("m2", b"p1"))), 9)
    assert {r.assignment for r in replies(out, SyncReply)} == {b"p0", b"p1"}
    assert machine.group(G).status is GroupStatus.STABLE


def test_follower_rejoining_unchanged_in_stable_gets_the_current_generation() -> None:
    machine = GroupMachine(CONFIG)
    generation = stable_group(machine, "m1", "m2")
    reply = only(machine.handle(G, join("m2"), 10), JoinReply)
    assert (reply.error, reply.generation) == (ErrorCode.none, generation)
    assert machine.group(G).status is GroupStatus.STABLE


def test_leave_rebalances_the_rest_and_the_last_leave_empties_the_group() -> None:
    machine = GroupMachine(CONFIG)
    generation = stable_group(machine, "m1", "m2")
    out = machine.handle(G, Leave(next(tokens), "m1"), 10)
    assert only(out, LeaveReply).error is ErrorCode.none
    assert machine.group(G).status is GroupStatus.PREPARING_REBALANCE
    out = machine.handle(G, join("m2"), 11)
    reply = only(out, JoinReply)
    assert (reply.generation, reply.leader) == (generation + 1, "m2")
    machine.handle(G, Sync(next(tokens), "m2", generation + 1, (("m2", b"all"),)), 12)
    out = machine.handle(G, Leave(next(tokens), "m2"), 13)
    assert machine.group(G).status is GroupStatus.EMPTY
    assert only(out, StoreGroup).record.members == ()
    assert only(machine.handle(G, Leave(next(tokens), "m2"), 14),
                LeaveReply).error is ErrorCode.unknown_member_id


def test_member_that_stops_heartbeating_is_removed_after_its_session() -> None:
    machine = GroupMachine(CONFIG)
    stable_group(machine, "m1", "m2")
    machine.handle(G, Heartbeat(next(tokens), "m1", 2), 900)
    assert machine.next_deadline() == 1000  # m2's session, from the sync at 0
    machine.tick(999)
    assert set(machine.group(G).members) == {"m1", "m2"}
    machine.tick(1000)
    assert set(machine.group(G).members) == {"m1"}
    assert machine.group(G).status is GroupStatus.PREPARING_REBALANCE


def test_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout() -> None:
    machine = GroupMachine(CONFIG)
    stable_group(machine, "m1", "m2")
    machine.handle(G, join("m1", protocols=(("range", b"new"),), rebalance=300), 100)
    assert machine.group(G).status is GroupStatus.PREPARING_REBALANCE
    # m2 keeps heartbeating (told to rejoin) but never does
    machine.handle(G, Heartbeat(next(tokens), "m2", 2), 350)
    out = machine.tick(400)
    assert machine.group(G).status is GroupStatus.PREPARING_REBALANCE
    out = machine.tick(5100)  # the group's rebalance timeout: the largest member's (m2: 5000)
    assert set(machine.group(G).members) == {"m1"}
    assert only(out, JoinReply).generation == 3


def test_commit_validation_follows_kafka() -> None:
    machine = GroupMachine(CONFIG)
    assert only(machine.handle(G, CommitCheck(next(tokens), "", -1), 0),
                CommitReply).error is ErrorCode.none  # an assign() consumer's group
    generation = stable_group(machine, "m1")
    check = lambda m, g: only(machine.handle(G, CommitCheck(next(tokens), m, g), 1),  # noqa: E731
                              CommitReply).error
    assert check("m1", generation) is ErrorCode.none
    assert check("m1", generation + 7) is ErrorCode.illegal_generation
    assert check("zz", generation) is ErrorCode.unknown_member_id
    assert check("", -1) is ErrorCode.unknown_member_id  # the group has members now
    machine.handle(G, join(new_id="m2"), 2)
    assert check("m1", generation) is ErrorCode.none  # PreparingRebalance still accepts
    machine.handle(G, join("m1"), 3)
    assert check("m1", generation + 1) is ErrorCode.rebalance_in_progress


@pytest.mark.parametrize(("event", "error"), [
    (join(session=5), ErrorCode.invalid_session_timeout),
    (join(protocols=()), ErrorCode.inconsistent_group_protocol),
    (join(protocols=(("roundrobin", b""),)), ErrorCode.inconsistent_group_protocol),
    (join(protocol_type="connect"), ErrorCode.inconsistent_group_protocol),
    (join("not-a-member"), ErrorCode.unknown_member_id),
])
def test_join_refusals(event: Join, error: ErrorCode) -> None:
    machine = GroupMachine(CONFIG)
    stable_group(machine, "m1")
    assert only(machine.handle(G, event, 1), JoinReply).error is error


def test_protocol_selection_prefers_what_most_members_list_first() -> None:
    machine = GroupMachine(CONFIG)
    machine.handle(G, join(new_id="a", protocols=(("range", b""), ("rr", b""))), 0)
    machine.handle(G, Sync(next(tokens), "a", 1, ()), 0)
    machine.handle(G, join(new_id="b", protocols=(("rr", b""), ("range", b""))), 0)
    machine.handle(G, join(new_id="c", protocols=(("rr", b""), ("sticky", b""))), 0)
    out = machine.handle(G, join("a", protocols=(("range", b""), ("rr", b""))), 0)
    assert {r.protocol for r in replies(out, JoinReply)} == {"rr"}


def test_restore_brings_back_a_stable_group_whose_sessions_start_now() -> None:
    machine = GroupMachine(CONFIG)
    member = GroupMemberRecord("m1", None, "c", "/h", 5000, 1000, b"sub", b"asg")
    machine.restore(GroupRecord(G, "consumer", 4, "range", "m1", 0, (member,)), now=50)
    group = machine.group(G)
    assert (group.status, group.generation, group.leader) == (GroupStatus.STABLE, 4, "m1")
    out = machine.handle(G, Sync(next(tokens), "m1", 4), 60)
    assert only(out, SyncReply).assignment == b"asg"
    machine.restore(GroupRecord("g2", "consumer", 9, None, None, 0, ()), now=50)
    assert machine.group("g2").status is GroupStatus.EMPTY


def test_the_table_has_every_state_event_pair() -> None:
    events = {Join, Sync, Heartbeat, Leave, CommitCheck}
    assert set(TRANSITIONS) == {(s, e) for s in GroupStatus for e in events}


# ---- properties -------------------------------------------------------------------------------

MEMBERS = ["", "m1", "m2", "m3"]


@st.composite
def events(draw: st.DrawFn) -> tuple[str, object] | int:
    """An event for the group, or a number of milliseconds to let pass (then tick)."""
    kind = draw(st.sampled_from(["join", "sync", "heartbeat", "leave", "commit", "time"]))
    member = draw(st.sampled_from(MEMBERS))
    generation = draw(st.integers(-1, 4))
    token = next(tokens)
    if kind == "time":
        return draw(st.integers(0, 3000))
    if kind == "join":
        return kind, Join(token, member, draw(st.sampled_from(MEMBERS[1:])), "c", "/h",
                          "consumer", ((draw(st.sampled_from(["range", "rr"])), b""),),
                          draw(st.sampled_from([100, 1000])), draw(st.sampled_from([200, 2000])),
                          require_known_member=draw(st.booleans()))
    if kind == "sync":
        return kind, Sync(token, member, generation,
                          tuple((m, m.encode()) for m in MEMBERS[1:] if draw(st.booleans())))
    if kind == "heartbeat":
        return kind, Heartbeat(token, member, generation)
    if kind == "leave":
        return kind, Leave(token, member)
    return kind, CommitCheck(token, member, generation)


def check_invariants(machine: GroupMachine, answered: set[int], out: list, now: int) -> None:
    for instruction in out:
        if isinstance(instruction, StoreGroup):
            continue
        assert instruction.token not in answered, "a request answered twice"
        answered.add(instruction.token)
    group = machine.group(G)
    if group is None:
        return
    if group.status is GroupStatus.EMPTY:
        assert not group.members and group.leader is None
    if group.status is not GroupStatus.PREPARING_REBALANCE:
        assert all(m.join_token is None for m in group.members.values())
    if group.status is not GroupStatus.COMPLETING_REBALANCE:
        assert all(m.sync_token is None for m in group.members.values())
    if group.status in (GroupStatus.COMPLETING_REBALANCE, GroupStatus.STABLE):
        assert group.leader in group.members
    waiting = {m.join_token for m in group.members.values()} | {
        m.sync_token for m in group.members.values()}
    assert not (waiting - {None}) & answered, "a waiting request was already answered"


@settings(max_examples=200)
@given(st.lists(events(), max_size=40))
def test_random_event_sequences_keep_the_invariants(sequence: list) -> None:
    machine = GroupMachine(CONFIG)
    answered: set[int] = set()
    asked: set[int] = set()
    now = 0
    generation = 0
    for item in sequence:
        if isinstance(item, int):
            now += item
            out = machine.tick(now)
            deadline = machine.next_deadline()
            assert deadline is None or deadline > now, "tick left a deadline in the past"
        else:
            _, event = item
            asked.add(event.token)
            out = machine.handle(G, event, now)
        check_invariants(machine, answered, out, now)
        assert answered <= asked
        group = machine.group(G)
        if group is not None:
            assert group.generation >= generation
            generation = group.generation


def reach(status: GroupStatus) -> GroupMachine:
    machine = GroupMachine(CONFIG)
    if status is GroupStatus.EMPTY:
        machine.handle(G, CommitCheck(next(tokens), "", -1), 0)  # an offsets-only group
    elif status is GroupStatus.COMPLETING_REBALANCE:
        machine.handle(G, join(new_id="m1"), 0)
    else:
        stable_group(machine, "m1")
        if status is GroupStatus.PREPARING_REBALANCE:
            machine.handle(G, join(new_id="m2"), 0)
    assert machine.group(G).status is status
    return machine


@pytest.mark.parametrize("status", list(GroupStatus))
@settings(max_examples=60)
@given(item=events())
def test_every_state_takes_every_event(status: GroupStatus, item) -> None:
    machine = reach(status)
    answered: set[int] = set()
    if isinstance(item, int):
        out = machine.tick(item)
    else:
        _, event = item
        out = machine.handle(G, event, 1)
        # A Join or a follower's Sync may wait for the rebalance; the rest is answered at once.
        if isinstance(event, (Heartbeat, Leave, CommitCheck)):
            assert event.token in {i.token for i in out if not isinstance(i, StoreGroup)}
    check_invariants(machine, answered, out, 1)


# ---- the initial rebalance delay (group.initial.rebalance.delay.ms) ---------------------------


def test_the_initial_delay_is_kafkas_by_default() -> None:
    assert GroupConfig().initial_rebalance_delay_ms == 3000


def test_a_new_group_waits_the_initial_delay_and_again_while_members_join() -> None:
    """Kafka's InitialDelayedJoin: 3 s, restarted (once per delay) when a member joined
    during it; both members are in the first generation."""
    machine = GroupMachine(GroupConfig(min_session_timeout_ms=10,
                                       initial_rebalance_delay_ms=3000))
    assert not replies(machine.handle(G, join(new_id="a", rebalance=60_000), 0), JoinReply)
    assert machine.next_deadline() == 3000
    assert not replies(machine.handle(G, join(new_id="b", rebalance=60_000), 2000), JoinReply)
    assert not replies(machine.tick(3000), JoinReply)  # b came during the delay: once more
    assert machine.next_deadline() == 6000
    assert not replies(machine.tick(5999), JoinReply)
    out = machine.tick(6000)
    assert sorted(r.member_id for r in replies(out, JoinReply)) == ["a", "b"]
    assert {r.generation for r in replies(out, JoinReply)} == {1}
    assert machine.group(G).status is GroupStatus.COMPLETING_REBALANCE


def test_the_initial_delay_ends_when_nobody_joined_during_it() -> None:
    machine = GroupMachine(GroupConfig(min_session_timeout_ms=10,
                                       initial_rebalance_delay_ms=3000))
    machine.handle(G, join(new_id="a", rebalance=60_000), 0)
    assert not replies(machine.tick(2999), JoinReply)
    assert [r.member_id for r in replies(machine.tick(3000), JoinReply)] == ["a"]


def test_the_initial_delay_never_passes_the_rebalance_timeout() -> None:
    machine = GroupMachine(GroupConfig(min_session_timeout_ms=10,
                                       initial_rebalance_delay_ms=3000))
    machine.handle(G, join(new_id="a", rebalance=4000), 0)
    for now in (1000, 2000, 3000, 3500):
        if now < 3000:
            machine.handle(G, join(new_id=f"m{now}", rebalance=4000), now)
        else:
            assert not replies(machine.tick(now), JoinReply)
    machine.handle(G, join(new_id="late", rebalance=4000), 3500)
    # 3000 + min(3000, 4000 - 3000): done at 4000 although "late" joined at 3500.
    assert machine.next_deadline() == 4000
    out = machine.tick(4000)
    assert sorted(r.member_id for r in replies(out, JoinReply)) == ["a", "late", "m1000",
                                                                      "m2000"]


def test_a_group_that_was_stable_rebalances_without_the_initial_delay() -> None:
    machine = GroupMachine(GroupConfig(min_session_timeout_ms=10,
                                       initial_rebalance_delay_ms=3000))
    machine.handle(G, join(new_id="a", rebalance=60_000), 0)
    (reply,) = replies(machine.tick(3000), JoinReply)
    machine.handle(G, Sync(next(tokens), "a", reply.generation, (("a", b"x"),)), 3000)
    assert machine.group(G).status is GroupStatus.STABLE
    machine.handle(G, join(new_id="b", rebalance=60_000), 4000)
    out = machine.handle(G, join("a", new_id="x", rebalance=60_000), 4000)
    assert sorted(r.member_id for r in replies(out, JoinReply)) == ["a", "b"]
