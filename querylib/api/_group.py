"""A consumer-group member, sans-I/O: Kafka's "consumer" protocol encodings, its two classic
assignors, and the member's state machine (DESIGN §8 "Consumer groups").

    member = MemberMachine()
    member.handle(Start())                      -> [SendJoin()]
    member.handle(Joined(error, generation, member_id, leader, protocol, members))
                                                -> [SendSync(assign=members if leader)]
    member.handle(Synced(error, assignment))    -> [Assign({topic: [partitions]})]
    member.handle(Tick(now))                    -> [Commit()] / [SendHeartbeat()]
    member.handle(Beat(error))                  -> [], or [Revoke(), ..., SendJoin()]
    member.handle(Close())                      -> [Revoke(), Commit(), SendLeave(), Done()]

The machine is a table keyed by (state, event type); a pair missing from it is a bug of the
driver (`ProtocolError`). Eager rebalancing, as Kafka's classic protocol: every member stops
reading all its partitions (committing what it consumed) before it rejoins, so a partition is
never read by two members of one generation.

Subscription metadata and assignments use `kio.schema.consumer_protocol_subscription` /
`_assignment` v0, each after Kafka's int16 version prefix, so confluent-kafka and the Java
client understand querylib members and the other way round.

Must not: do I/O, read clocks, or decide which offset a partition starts from (the driver asks
OffsetFetch).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.consumer_protocol_assignment.v0.data import (
    ConsumerProtocolAssignment,
    TopicPartition,
)
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from catalog.errors import ProtocolError, UserError
from querylib._kio import KIO_DECODE_ERRORS
from querylib._kio_shape import check_shape

__all__ = [
    "ASSIGNORS",
    "Assign",
    "Beat",
    "Close",
    "Commit",
    "Done",
    "GroupRefusedError",
    "Joined",
    "MemberMachine",
    "MemberTiming",
    "Rediscover",
    "Revoke",
    "SendHeartbeat",
    "SendJoin",
    "SendLeave",
    "SendSync",
    "Start",
    "Synced",
    "Tick",
    "assign_range",
    "assign_roundrobin",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

PROTOCOL_TYPE = "consumer"
_VERSION = struct.Struct(">h")
Assignment = dict[str, list[int]]

# Kafka error codes the member reacts to (kio.schema.errors.ErrorCode values)
NONE = 0
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79
_MOVED = (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR)
_FATAL = {23: "INCONSISTENT_GROUP_PROTOCOL: the group's members speak another protocol",
          24: "INVALID_GROUP_ID", 30: "GROUP_AUTHORIZATION_FAILED",
          81: "GROUP_MAX_SIZE_REACHED"}


class GroupRefusedError(UserError):
    """The group coordinator refused this member for good (not a retriable condition)."""

# ---- the consumer protocol's encodings ----------------------------------------------------

_write_subscription = entity_writer(ConsumerProtocolSubscription)
_read_subscription = entity_reader(ConsumerProtocolSubscription)
_write_assignment = entity_writer(ConsumerProtocolAssignment)
_read_assignment = entity_reader(ConsumerProtocolAssignment)


def encode_subscription(topics: Sequence[str]) -> bytes:
    """version:int16 = 0, then ConsumerProtocolSubscription v0 (topics, user_data null)."""
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(0))
    _write_subscription(buffer, ConsumerProtocolSubscription(topics=tuple(topics)))
    return buffer.getvalue()


def decode_subscription(data: bytes) -> list[str]:
    """The topics of a member's subscription (any version: v1+ only append fields)."""
    check_shape(ConsumerProtocolSubscription, data, _VERSION.size, ProtocolError)
    try:
        subscription, _ = _read_subscription(data, _VERSION.size)
    except KIO_DECODE_ERRORS as exc:
        raise ProtocolError(f"undecodable consumer subscription: {exc}") from exc
    return list(subscription.topics)


def encode_assignment(assignment: Mapping[str, Sequence[int]]) -> bytes:
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(0))
    _write_assignment(buffer, ConsumerProtocolAssignment(assigned_partitions=tuple(
        TopicPartition(topic=TopicName(t), partitions=tuple(sorted(map(i32, p))))
        for t, p in sorted(assignment.items()))))
    return buffer.getvalue()


def decode_assignment(data: bytes) -> Assignment:
    if not data:
        return {}  # a member the leader gave nothing
    check_shape(ConsumerProtocolAssignment, data, _VERSION.size, ProtocolError)
    try:
        assignment, _ = _read_assignment(data, _VERSION.size)
    except KIO_DECODE_ERRORS as exc:
        raise ProtocolError(f"undecodable consumer assignment: {exc}") from exc
    return {tp.topic: list(tp.partitions) for tp in assignment.assigned_partitions}


# ---- assignors (Kafka's RangeAssignor and RoundRobinAssignor) -----------------------------


def assign_range(subscriptions: Mapping[str, Sequence[str]],
                 partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Per topic, its subscribers in member-id order get consecutive ranges; the first
    `count % members` get one partition more."""
    out: dict[str, Assignment] = {m: {} for m in subscriptions}
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        count = partitions.get(topic, 0)
        share, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            n = share + (1 if i < extra else 0)
            if n:
                out[member][topic] = list(range(start, start + n))
            start += n
    return out


def assign_roundrobin(subscriptions: Mapping[str, Sequence[str]],
                      partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Every (topic, partition) in order, dealt to the members in member-id order, skipping
    members not subscribed to the topic."""
    out: dict[str, Assignment] = {m: {} for m in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return out
    turn = 0
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        for partition in range(partitions.get(topic, 0)):
            for _ in range(len(members)):
                member = members[turn % len(members)]
                turn += 1
                if topic in subscriptions[member]:
                    out[member].setdefault(topic, []).append(partition)
                    break
    return out


ASSIGNORS = {"range": assign_range, "roundrobin": assign_roundrobin}

# ---- the member's state machine -----------------------------------------------------------


@dataclass(frozen=True)
class MemberTiming:
    """Kafka's consumer settings, in milliseconds (heartbeats faster than Kafka's 3 s so a
    rebalance completes quickly; they are a few bytes each)."""

    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 30_000
    heartbeat_interval_ms: int = 500
    commit_interval_ms: int = 1_000


# events
@dataclass(frozen=True)
class Start:
    pass


@dataclass(frozen=True)
class Joined:
    error: int
    generation: int = -1
    member_id: str = ""
    leader: str = ""
    protocol: str | None = None
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Synced:
    error: int
    assignment: bytes = b""


@dataclass(frozen=True)
class Beat:
    error: int


@dataclass(frozen=True)
class Tick:
    now_ms: int


@dataclass(frozen=True)
class Disconnected:
    pass


@dataclass(frozen=True)
class Close:
    pass


# instructions
@dataclass(frozen=True)
class SendJoin:
    member_id: str
    backoff: bool = False  # after an unexpected error: wait a little first


@dataclass(frozen=True)
class SendSync:
    generation: int
    member_id: str
    protocol: str | None
    members: tuple[tuple[str, bytes], ...]  # the leader assigns them; empty otherwise


@dataclass(frozen=True)
class SendHeartbeat:
    generation: int
    member_id: str


@dataclass(frozen=True)
class SendLeave:
    member_id: str


@dataclass(frozen=True)
class Assign:
    assignment: Assignment


@dataclass(frozen=True)
class Revoke:
    pass


@dataclass(frozen=True)
class Commit:
    generation: int
    member_id: str


@dataclass(frozen=True)
class Rediscover:
    pass


@dataclass(frozen=True)
class Done:
    pass


Event = Start | Joined | Synced | Beat | Tick | Disconnected | Close
Instruction = (SendJoin | SendSync | SendHeartbeat | SendLeave | Assign | Revoke | Commit
               | Rediscover | Done)


@dataclass
class MemberMachine:
    """One member of one group. States: new, joining, syncing, stable, closed."""

    timing: MemberTiming = field(default_factory=MemberTiming)
    state: str = "new"
    member_id: str = ""
    generation: int = -1
    next_heartbeat_ms: int = 0
    next_commit_ms: int = 0
    now_ms: int = 0

    def handle(self, event: Event) -> list[Instruction]:
        method = _TABLE.get((self.state, type(event)))
        if method is None:
            raise ProtocolError(f"group member: {type(event).__name__} in state {self.state}")
        return method(self, event)

    # -- transitions ----------------------------------------------------------------------------

    def _start(self, event: Start) -> list[Instruction]:
        self.state = "joining"
        return [SendJoin(self.member_id)]

    def _joined(self, event: Joined) -> list[Instruction]:
        if event.error == NONE:
            self.state, self.member_id, self.generation = "syncing", event.member_id, \
                event.generation
            members = event.members if event.leader == event.member_id else ()
            return [SendSync(event.generation, event.member_id, event.protocol, members)]
        return self._retry_join(event.error, event.member_id)

    def _synced(self, event: Synced) -> list[Instruction]:
        if event.error == NONE:
            self.state = "stable"
            self.next_heartbeat_ms = self.now_ms + self.timing.heartbeat_interval_ms
            self.next_commit_ms = self.now_ms + self.timing.commit_interval_ms
            return [Assign(decode_assignment(event.assignment))]
        self.state = "joining"
        return self._retry_join(event.error, self.member_id)

    def _retry_join(self, error: int, member_id: str) -> list[Instruction]:
        """Join again: with the id the coordinator gave (MEMBER_ID_REQUIRED), without one
        (UNKNOWN_MEMBER_ID), after finding the coordinator again (it moved)."""
        if error == MEMBER_ID_REQUIRED:
            self.member_id = member_id
        elif error == UNKNOWN_MEMBER_ID:
            self.member_id = ""
        if error in _FATAL:
            raise GroupRefusedError(f"the group coordinator refused this member: Kafka error "
                                    f"{error} ({_FATAL[error]})")
        out: list[Instruction] = [Rediscover()] if error in _MOVED else []
        retry = error not in (MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS,
                              ILLEGAL_GENERATION)
        return [*out, SendJoin(self.member_id, backoff=retry)]

    def _tick_idle(self, event: Tick) -> list[Instruction]:
        self.now_ms = event.now_ms
        return []

    def _tick_stable(self, event: Tick) -> list[Instruction]:
        self.now_ms = now = event.now_ms
        out: list[Instruction] = []
        if now >= self.next_commit_ms:
            self.next_commit_ms = now + self.timing.commit_interval_ms
            out.append(Commit(self.generation, self.member_id))
        if now >= self.next_heartbeat_ms:
            self.next_heartbeat_ms = now + self.timing.heartbeat_interval_ms
            out.append(SendHeartbeat(self.generation, self.member_id))
        return out

    def _beat(self, event: Beat) -> list[Instruction]:
        if event.error == NONE:
            return []
        self.state = "joining"
        if event.error == REBALANCE_IN_PROGRESS:
            # Still a member of this generation: what was consumed may be committed.
            return [Revoke(), Commit(self.generation, self.member_id),
                    SendJoin(self.member_id)]
        return [Revoke(), *self._retry_join(event.error, self.member_id)]

    def _lost(self, event: Disconnected) -> list[Instruction]:
        stopping = [Revoke()] if self.state == "stable" else []
        self.state = "joining"
        return [*stopping, Rediscover(), SendJoin(self.member_id)]

    def _close(self, event: Close) -> list[Instruction]:
        out: list[Instruction] = [Revoke()]
        if self.state == "stable":
            out.append(Commit(self.generation, self.member_id))
        if self.member_id:
            out.append(SendLeave(self.member_id))
        self.state = "closed"
        return [*out, Done()]

    def _closed(self, event: Close) -> list[Instruction]:
        return [Done()]

    def _ignore(self, event: Event) -> list[Instruction]:
        return []


_TABLE: dict[tuple[str, type], Callable[[MemberMachine, Any], list[Instruction]]] = {
    ("new", Start): MemberMachine._start,
    ("new", Close): MemberMachine._close,
    ("new", Tick): MemberMachine._tick_idle,
    ("joining", Joined): MemberMachine._joined,
    ("joining", Tick): MemberMachine._tick_idle,
    ("joining", Disconnected): MemberMachine._lost,
    ("joining", Close): MemberMachine._close,
    ("syncing", Synced): MemberMachine._synced,
    ("syncing", Tick): MemberMachine._tick_idle,
    ("syncing", Disconnected): MemberMachine._lost,
    ("syncing", Close): MemberMachine._close,
    ("stable", Tick): MemberMachine._tick_stable,
    ("stable", Beat): MemberMachine._beat,
    ("stable", Disconnected): MemberMachine._lost,
    ("stable", Close): MemberMachine._close,
    # A heartbeat answered after the member moved on (a commit failing revoked it) is stale.
    ("joining", Beat): MemberMachine._ignore,
    ("closed", Tick): MemberMachine._ignore,
    ("closed", Close): MemberMachine._closed,
    ("closed", Disconnected): MemberMachine._ignore,
}
