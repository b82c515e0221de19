"""Consumer groups as Kafka's classic group coordinator runs them: a pure state machine.

Sans-I/O with time as input: `GroupMachine.handle(group_id, event, now_ms)` and
`tick(now_ms)` return instructions (replies to deliver, group states to persist); nothing
here sleeps, reads a clock, or knows about sockets, so tq's own consumer groups can drive the
same machine later. Replies may be deferred: a JoinGroup is answered when the rebalance
completes, a follower's SyncGroup when the leader's assignment arrives; requests carry an
opaque `token` the shell uses to route each reply.

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's sync--> Stable --join (leader or new metadata) / leave /
    session timeout--> PreparingRebalance;  no members left --> Empty

Each (state, event) pair has an entry in `TRANSITIONS`; a missing pair is a bug, raised as
`GroupStateError`. Assignors run in the clients: the leader's assignment bytes pass through.
Static membership (group.instance.id) is recorded but not given Kafka's special semantics.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from catalog.errors import TqError
from querylib.kafka._errors import ErrorCode

from ._backend import GroupMemberRecord, GroupRecord

__all__ = [
    "CommitCheck",
    "CommitReply",
    "GroupConfig",
    "GroupMachine",
    "GroupStateError",
    "GroupStatus",
    "Heartbeat",
    "HeartbeatReply",
    "Join",
    "JoinReply",
    "Leave",
    "LeaveReply",
    "StoreGroup",
    "Sync",
    "SyncReply",
    "TRANSITIONS",
]


class GroupStateError(TqError):
    """A (state, event) pair the transition table lacks: a bug in tq, not in the client."""


class GroupStatus(enum.StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Kafka's group.* broker settings (defaults as Kafka's, except the initial delay)."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    # group.initial.rebalance.delay.ms: the first rebalance of an empty group waits this long
    # for more members, again each time one joins meanwhile, up to the rebalance timeout (as
    # Kafka's InitialDelayedJoin), so members started together share the partitions from the
    # start instead of the first taking them all and giving some back (with what it read and
    # did not commit read twice). 0: at once.
    initial_rebalance_delay_ms: int = 3000
    max_members: int = 1000
    max_groups: int = 10_000


# ---- events (in) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Join:
    token: int
    member_id: str  # "" for a new member
    new_member_id: str  # the id to give a new member (the shell makes it unique)
    client_id: str
    client_host: str
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), most preferred first
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str | None = None
    require_known_member: bool = False  # JoinGroup v4+: a new member gets MEMBER_ID_REQUIRED


@dataclass(frozen=True, slots=True)
class Sync:
    token: int
    member_id: str
    generation: int
    assignments: tuple[tuple[str, bytes], ...] = ()  # from the leader only


@dataclass(frozen=True, slots=True)
class Heartbeat:
    token: int
    member_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class Leave:
    token: int
    member_id: str


@dataclass(frozen=True, slots=True)
class CommitCheck:
    """May this member commit offsets for the group now? (OffsetCommit's validation)."""

    token: int
    member_id: str
    generation: int


Event = Join | Sync | Heartbeat | Leave | CommitCheck

# ---- instructions (out) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinReply:
    token: int
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # leader only: (id, instance, meta)


@dataclass(frozen=True, slots=True)
class SyncReply:
    token: int
    error: ErrorCode
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    token: int
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveReply:
    token: int
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class CommitReply:
    token: int
    error: ErrorCode  # none: the shell stores the offsets


@dataclass(frozen=True, slots=True)
class StoreGroup:
    """Persist this state (the shell stamps current_state_timestamp)."""

    record: GroupRecord


Instruction = JoinReply | SyncReply | HeartbeatReply | LeaveReply | CommitReply | StoreGroup


# ---- state ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    heartbeat_deadline: int
    assignment: bytes = b""
    join_token: int | None = None  # awaiting the JoinGroup response
    sync_token: int | None = None  # awaiting the SyncGroup response

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


@dataclass(slots=True)
class Group:
    group_id: str
    status: GroupStatus = GroupStatus.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # join order
    pending: dict[str, int] = field(default_factory=dict)  # MEMBER_ID_REQUIRED: id -> deadline
    rebalance_deadline: int = 0  # PreparingRebalance: complete by then, dropping stragglers
    # PreparingRebalance from Empty: not before the initial delay; -1 once it has passed (so
    # next_deadline stops reporting it).
    join_ready_at: int = -1
    delay_left: int = 0  # of the rebalance timeout, for further delays
    joined_in_delay: bool = False  # a new member joined during the current delay

    def record(self) -> GroupRecord:
        members = tuple(
            GroupMemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                              m.rebalance_timeout_ms, m.session_timeout_ms,
                              m.metadata(self.protocol), m.assignment)
            for m in self.members.values())
        return GroupRecord(self.group_id, self.protocol_type or "", self.generation,
                           self.protocol, self.leader, -1, members)


Out = list[Instruction]
Handler = Callable[["GroupMachine", Group, Event, int, Out], None]


class GroupMachine:
    """Every group this coordinator owns."""

    def __init__(self, config: GroupConfig | None = None) -> None:
        self.config = config or GroupConfig()
        self._groups: dict[str, Group] = {}

    # ---- queries ------------------------------------------------------------------------------

    def group(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def groups(self) -> list[Group]:
        return list(self._groups.values())

    def next_deadline(self) -> int | None:
        """The earliest time `tick` has something to do (None: nothing pending)."""
        deadlines: list[int] = []
        for group in self._groups.values():
            deadlines.extend(group.pending.values())
            deadlines.extend(m.heartbeat_deadline for m in group.members.values()
                             if m.join_token is None and m.sync_token is None)
            if group.status is GroupStatus.PREPARING_REBALANCE:
                deadlines.append(group.rebalance_deadline)
                if group.join_ready_at >= 0:
                    deadlines.append(group.join_ready_at)
        return min(deadlines, default=None)

    def subscribed(self, group_id: str) -> set[str] | None:
        """The topics the members of a consumer group subscribe to now (None: the group has no
        members, or is not a consumer group whose subscriptions tq can read)."""
        group = self._groups.get(group_id)
        if group is None or not group.members or group.protocol_type != "consumer":
            return None
        topics: set[str] = set()
        for member in group.members.values():
            for _, metadata in member.protocols:
                topics.update(_subscription_topics(metadata))
        return topics

    # ---- inputs -------------------------------------------------------------------------------

    def delete(self, group_id: str) -> ErrorCode:
        """Forget a group without members (DeleteGroups): NON_EMPTY_GROUP while it has some."""
        group = self._groups.get(group_id)
        if group is not None and (group.members or group.pending):
            return ErrorCode.non_empty_group
        self._groups.pop(group_id, None)
        return ErrorCode.none

    def restore(self, record: GroupRecord, now: int) -> None:
        """Load a stored group (on start): Stable with its members if it had any, whose
        sessions start now; Empty otherwise."""
        group = Group(record.group_id, generation=record.generation,
                      protocol_type=record.protocol_type or None, protocol=record.protocol,
                      leader=record.leader)
        for m in record.members:
            group.members[m.member_id] = Member(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.session_timeout_ms, m.rebalance_timeout_ms,
                ((record.protocol or "", m.subscription),), now + m.session_timeout_ms,
                assignment=m.assignment)
        group.status = GroupStatus.STABLE if group.members else GroupStatus.EMPTY
        if not group.members:
            group.protocol = group.leader = None
        self._groups[record.group_id] = group

    def handle(self, group_id: str, event: Event, now: int) -> list[Instruction]:
        out: Out = []
        group = self._groups.get(group_id)
        if group is None:
            if not self._make_room():
                out.append(_reply(event, ErrorCode.coordinator_not_available))
                return out
            group = self._groups[group_id] = Group(group_id)
        handler = TRANSITIONS.get((group.status, type(event)))
        if handler is None:
            raise GroupStateError(f"no transition for {type(event).__name__} in {group.status}")
        handler(self, group, event, now, out)
        return out

    def tick(self, now: int) -> list[Instruction]:
        """Expire sessions and pending members, complete rebalances whose time has come."""
        out: Out = []
        for group in list(self._groups.values()):
            for member_id, deadline in list(group.pending.items()):
                if deadline <= now:
                    del group.pending[member_id]
            expired = [m for m in group.members.values()
                       if m.join_token is None and m.sync_token is None
                       and m.heartbeat_deadline <= now]
            for member in expired:
                self._remove(group, member, out)
            if group.status is GroupStatus.PREPARING_REBALANCE:
                if 0 <= group.join_ready_at <= now:
                    self._delay_passed(group, now)
                if now >= group.rebalance_deadline:
                    self._complete_join(group, now, out)
                else:
                    self._try_complete_join(group, now, out)
            elif expired:
                self._prepare_rebalance(group, now, out)
        return out

    def _make_room(self) -> bool:
        if len(self._groups) < self.config.max_groups:
            return True
        for group_id, group in self._groups.items():
            if group.status is GroupStatus.EMPTY:
                del self._groups[group_id]  # its offsets stay in the store
                return True
        return False

    # ---- join ---------------------------------------------------------------------------------

    def _join(self, group: Group, event: Event, now: int, out: Out) -> None:
        assert isinstance(event, Join)
        error = self._check_join(group, event)
        if error is not ErrorCode.none:
            out.append(JoinReply(event.token, error, member_id=event.member_id))
            return
        member_id = event.member_id
        if not member_id:
            member_id = event.new_member_id
            if len(group.members) + len(group.pending) >= self.config.max_members:
                out.append(JoinReply(event.token, ErrorCode.group_max_size_reached))
                return
            if event.require_known_member:
                group.pending[member_id] = now + event.session_timeout_ms
                out.append(JoinReply(event.token, ErrorCode.member_id_required,
                                     member_id=member_id))
                return
        elif member_id in group.pending:
            del group.pending[member_id]
        elif member_id not in group.members:
            out.append(JoinReply(event.token, ErrorCode.unknown_member_id, member_id=member_id))
            return
        member = group.members.get(member_id)
        if member is not None and group.status in (
            GroupStatus.STABLE, GroupStatus.COMPLETING_REBALANCE
        ) and member.protocols == event.protocols and (
            group.status is GroupStatus.COMPLETING_REBALANCE or member_id != group.leader
        ):
            # A rejoin that changes nothing (a lost response, a follower's periodic rejoin):
            # answer with the current generation instead of starting a rebalance.
            member.heartbeat_deadline = now + member.session_timeout_ms
            out.append(self._join_reply(group, member, event.token))
            return
        if member is not None and member.join_token is not None:
            # A second JoinGroup while the first waits: the first gets nothing more to say.
            out.append(JoinReply(member.join_token, ErrorCode.rebalance_in_progress,
                                 member_id=member_id))
        if member is None:
            member = Member(member_id, event.group_instance_id, event.client_id,
                            event.client_host, event.session_timeout_ms,
                            event.rebalance_timeout_ms, event.protocols,
                            now + event.session_timeout_ms)
            group.members[member_id] = member
            group.joined_in_delay = True
        else:
            member.protocols = event.protocols
            member.session_timeout_ms = event.session_timeout_ms
            member.rebalance_timeout_ms = event.rebalance_timeout_ms
        member.join_token = event.token
        if len(group.members) == 1:
            group.protocol_type = event.protocol_type  # the first member sets the type
        if group.status is GroupStatus.PREPARING_REBALANCE:
            self._try_complete_join(group, now, out)
        else:
            self._prepare_rebalance(group, now, out)

    def _check_join(self, group: Group, event: Join) -> ErrorCode:
        config = self.config
        if not (config.min_session_timeout_ms <= event.session_timeout_ms
                <= config.max_session_timeout_ms):
            return ErrorCode.invalid_session_timeout
        if not event.protocol_type or not event.protocols:
            return ErrorCode.inconsistent_group_protocol
        others = [{name for name, _ in m.protocols} for m in group.members.values()
                  if m.member_id != event.member_id]
        if others:
            if event.protocol_type != group.protocol_type:
                return ErrorCode.inconsistent_group_protocol
            if not {name for name, _ in event.protocols}.intersection(*others):
                return ErrorCode.inconsistent_group_protocol
        return ErrorCode.none

    def _prepare_rebalance(self, group: Group, now: int, out: Out) -> None:
        if group.status is GroupStatus.COMPLETING_REBALANCE:
            for member in group.members.values():
                if member.sync_token is not None:
                    out.append(SyncReply(member.sync_token, ErrorCode.rebalance_in_progress))
                    member.sync_token = None
        was_empty = group.status is GroupStatus.EMPTY
        group.status = GroupStatus.PREPARING_REBALANCE
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline = now + timeout
        delay = self.config.initial_rebalance_delay_ms
        if was_empty and delay > 0:
            # Kafka's InitialDelayedJoin: the delay, then again while members keep coming,
            # never past the rebalance timeout (rebalance_deadline completes the join anyway).
            group.join_ready_at = now + delay
            group.delay_left = max(timeout - delay, 0)
            group.joined_in_delay = False
        else:
            group.join_ready_at = -1
        if now >= group.rebalance_deadline:
            # Nobody left to wait for (the last member expired; only ids handed out with
            # MEMBER_ID_REQUIRED remain): complete now, as tick would at the deadline.
            self._complete_join(group, now, out)
        else:
            self._try_complete_join(group, now, out)

    def _delay_passed(self, group: Group, now: int) -> None:
        """The initial delay ran out: wait once more if a member joined meanwhile and the
        rebalance timeout leaves time, else the join may complete."""
        if group.joined_in_delay and group.delay_left > 0:
            delay = min(self.config.initial_rebalance_delay_ms, group.delay_left)
            group.delay_left -= delay
            group.joined_in_delay = False
            group.join_ready_at = now + delay
        else:
            group.join_ready_at = -1

    def _try_complete_join(self, group: Group, now: int, out: Out) -> None:
        if now < group.join_ready_at and group.members:
            return
        if all(m.join_token is not None for m in group.members.values()) and not group.pending:
            self._complete_join(group, now, out)

    def _complete_join(self, group: Group, now: int, out: Out) -> None:
        for member in [m for m in group.members.values() if m.join_token is None]:
            self._remove(group, member, out)  # did not rejoin in time
        group.generation += 1
        if not group.members:
            group.status = GroupStatus.EMPTY
            group.protocol = group.leader = None
            out.append(StoreGroup(group.record()))
            return
        group.protocol = _select_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.status = GroupStatus.COMPLETING_REBALANCE
        for member in group.members.values():
            member.assignment = b""
            member.heartbeat_deadline = now + member.session_timeout_ms
            token, member.join_token = member.join_token, None
            assert token is not None
            out.append(self._join_reply(group, member, token))

    def _join_reply(self, group: Group, member: Member, token: int) -> JoinReply:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == group.leader:
            members = tuple((m.member_id, m.group_instance_id, m.metadata(group.protocol))
                            for m in group.members.values())
        return JoinReply(token, ErrorCode.none, group.generation, group.protocol_type,
                         group.protocol, group.leader or "", member.member_id, members)

    def _remove(self, group: Group, member: Member, out: Out) -> None:
        del group.members[member.member_id]
        if member.join_token is not None:
            out.append(JoinReply(member.join_token, ErrorCode.unknown_member_id,
                                 member_id=member.member_id))
        if member.sync_token is not None:
            out.append(SyncReply(member.sync_token, ErrorCode.unknown_member_id))
        if group.leader == member.member_id:
            group.leader = None

    # ---- sync, heartbeat, leave, commit ---------------------------------------------------------

    def _member_error(self, group: Group, member_id: str, generation: int) -> ErrorCode:
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def _sync(self, group: Group, event: Event, now: int, out: Out) -> None:
        assert isinstance(event, Sync)
        error = self._member_error(group, event.member_id, event.generation)
        if error is ErrorCode.none and group.status is GroupStatus.PREPARING_REBALANCE:
            error = ErrorCode.rebalance_in_progress
        if error is not ErrorCode.none:
            out.append(SyncReply(event.token, error))
            return
        member = group.members[event.member_id]
        member.heartbeat_deadline = now + member.session_timeout_ms
        if group.status is GroupStatus.STABLE:
            out.append(SyncReply(event.token, ErrorCode.none, group.protocol_type,
                                 group.protocol, member.assignment))
            return
        if member.sync_token is not None:
            out.append(SyncReply(member.sync_token, ErrorCode.rebalance_in_progress))
        member.sync_token = event.token
        if event.member_id != group.leader:
            return
        assignments = dict(event.assignments)
        group.status = GroupStatus.STABLE
        for m in group.members.values():
            m.assignment = assignments.get(m.member_id, b"")
        out.append(StoreGroup(group.record()))
        for m in group.members.values():
            if m.sync_token is not None:
                out.append(SyncReply(m.sync_token, ErrorCode.none, group.protocol_type,
                                     group.protocol, m.assignment))
                m.sync_token = None

    def _heartbeat(self, group: Group, event: Event, now: int, out: Out) -> None:
        assert isinstance(event, Heartbeat)
        error = self._member_error(group, event.member_id, event.generation)
        if error is ErrorCode.none:
            member = group.members[event.member_id]
            member.heartbeat_deadline = now + member.session_timeout_ms
            if group.status is GroupStatus.PREPARING_REBALANCE:
                error = ErrorCode.rebalance_in_progress
        out.append(HeartbeatReply(event.token, error))

    def _leave(self, group: Group, event: Event, now: int, out: Out) -> None:
        assert isinstance(event, Leave)
        if event.member_id in group.pending:
            del group.pending[event.member_id]
            out.append(LeaveReply(event.token, ErrorCode.none))
            return
        member = group.members.get(event.member_id)
        if member is None:
            out.append(LeaveReply(event.token, ErrorCode.unknown_member_id))
            return
        self._remove(group, member, out)
        out.append(LeaveReply(event.token, ErrorCode.none))
        if group.status is GroupStatus.PREPARING_REBALANCE:
            if group.members:
                self._try_complete_join(group, now, out)
            else:
                self._complete_join(group, now, out)
        else:
            self._prepare_rebalance(group, now, out)

    def _commit(self, group: Group, event: Event, now: int, out: Out) -> None:
        assert isinstance(event, CommitCheck)
        # Kafka's validateOffsetCommit, in its order.
        if event.generation < 0 and group.status is GroupStatus.EMPTY:
            error = ErrorCode.none  # the group only stores offsets (assign() consumers)
        elif group.status is GroupStatus.COMPLETING_REBALANCE:
            error = ErrorCode.rebalance_in_progress
        else:
            error = self._member_error(group, event.member_id, event.generation)
            if error is ErrorCode.none:
                member = group.members[event.member_id]
                member.heartbeat_deadline = now + member.session_timeout_ms
        out.append(CommitReply(event.token, error))

    def _no_member(self, group: Group, event: Event, now: int, out: Out) -> None:
        """Sync / heartbeat / leave on an empty group: nobody is a member."""
        out.append(_reply(event, ErrorCode.unknown_member_id))


def _reply(event: Event, error: ErrorCode) -> Instruction:
    if isinstance(event, Join):
        return JoinReply(event.token, error, member_id=event.member_id)
    if isinstance(event, Sync):
        return SyncReply(event.token, error)
    if isinstance(event, Heartbeat):
        return HeartbeatReply(event.token, error)
    if isinstance(event, Leave):
        return LeaveReply(event.token, error)
    return CommitReply(event.token, error)


def _select_protocol(group: Group) -> str:
    """Kafka's selectProtocol: among protocols every member supports, the one most members
    list first (ties: the order of the first member's list)."""
    members = list(group.members.values())
    common = set.intersection(*({name for name, _ in m.protocols} for m in members))
    votes: dict[str, int] = {}
    for member in members:
        choice = next(name for name, _ in member.protocols if name in common)
        votes[choice] = votes.get(choice, 0) + 1
    order = [name for name, _ in members[0].protocols if name in common]
    return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))


_S = GroupStatus
TRANSITIONS: dict[tuple[GroupStatus, type], Handler] = {
    (_S.EMPTY, Join): GroupMachine._join,
    (_S.EMPTY, Sync): GroupMachine._no_member,
    (_S.EMPTY, Heartbeat): GroupMachine._no_member,
    (_S.EMPTY, Leave): GroupMachine._leave,
    (_S.EMPTY, CommitCheck): GroupMachine._commit,
    (_S.PREPARING_REBALANCE, Join): GroupMachine._join,
    (_S.PREPARING_REBALANCE, Sync): GroupMachine._sync,
    (_S.PREPARING_REBALANCE, Heartbeat): GroupMachine._heartbeat,
    (_S.PREPARING_REBALANCE, Leave): GroupMachine._leave,
    (_S.PREPARING_REBALANCE, CommitCheck): GroupMachine._commit,
    (_S.COMPLETING_REBALANCE, Join): GroupMachine._join,
    (_S.COMPLETING_REBALANCE, Sync): GroupMachine._sync,
    (_S.COMPLETING_REBALANCE, Heartbeat): GroupMachine._heartbeat,
    (_S.COMPLETING_REBALANCE, Leave): GroupMachine._leave,
    (_S.COMPLETING_REBALANCE, CommitCheck): GroupMachine._commit,
    (_S.STABLE, Join): GroupMachine._join,
    (_S.STABLE, Sync): GroupMachine._sync,
    (_S.STABLE, Heartbeat): GroupMachine._heartbeat,
    (_S.STABLE, Leave): GroupMachine._leave,
    (_S.STABLE, CommitCheck): GroupMachine._commit,
}


def _subscription_topics(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (version int16, [topic string], ...); none
    for bytes that are not one."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos, topics = 6, []
        for _ in range(max(count, 0)):
            (length,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if length < 0 or pos + length > len(metadata):
                return []
            topics.append(metadata[pos:pos + length].decode("utf-8", "replace"))
            pos += length
        return topics
    except struct.error:
        return []
