"""The thread that keeps a querylib subscriber in its Kafka consumer group: it speaks the group
protocol to the group coordinator's Kafka listener (`querylib.kafka.KafkaClient`) and performs
what `MemberMachine` decides (DESIGN §8 "Consumer groups").

    member = GroupMember(group, topics, locate=..., partition_counts=..., partitions=owner)
    member.start()                 # joins in the background; heartbeats, commits
    member.wait_assigned(timeout)  # the first assignment arrived
    member.close()                 # stop reading, commit, LeaveGroup

`partitions` is the subscription: `assign(assignment, starts)` starts reading (from the
committed offsets OffsetFetch found, None where the group has none), `revoke()` stops reading
everything, `consumed()` says the next offset to read of each partition it handed out.

Must not: touch the subscription's readers or queue itself, or block the consumer's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from catalog.errors import TqError
from querylib.kafka import ApiKey, ErrorCode
from querylib.kafka._client import KafkaClient

from ._group import (
    ASSIGNORS,
    PROTOCOL_TYPE,
    Assign,
    Assignment,
    Beat,
    Close,
    Commit,
    Disconnected,
    Done,
    Event,
    Instruction,
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
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

__all__ = ["GroupMember", "GroupPartitions"]

logger = logging.getLogger("querylib.api")

_RETRY = 0.5  # seconds between attempts to reach a coordinator that is away
TopicPartition = tuple[str, int]


class GroupPartitions(Protocol):
    """What the member drives: the subscription's readers."""

    def assign(self, assignment: Assignment, starts: Mapping[TopicPartition, int | None]
               ) -> None: ...

    def revoke(self) -> None: ...

    def consumed(self) -> dict[TopicPartition, int]: ...


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class GroupMember:
    """One member of Kafka consumer group `group`, subscribed to `topics` (short names)."""

    def __init__(self, group: str, topics: Sequence[str], *, locate: Callable[[], str],
                 partition_counts: Callable[[Sequence[str]], dict[str, int]],
                 partitions: GroupPartitions, timing: MemberTiming | None = None,
                 client_id: str = "tq-querylib") -> None:
        self.group = group
        self.topics = list(topics)
        self.timing = timing or MemberTiming()
        self.machine = MemberMachine(self.timing)
        self.client_id = client_id
        self._locate = locate
        self._counts = partition_counts
        self._partitions = partitions
        self._client: KafkaClient | None = None
        self._closing = threading.Event()
        self._assigned = threading.Event()
        self._committed: dict[TopicPartition, int] = {}
        self._owned: set[TopicPartition] = set()
        self._thread = threading.Thread(target=self._run, name=f"tq-group {group}",
                                        daemon=True)
        self.generation = -1
        self.assignment: Assignment = {}
        self.error: BaseException | None = None

    def start(self) -> GroupMember:
        self._thread.start()
        return self

    def wait_assigned(self, timeout: float) -> bool:
        return self._assigned.wait(timeout)

    def close(self) -> None:
        """Stop reading, commit what was consumed, leave the group. Idempotent."""
        self._closing.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.timing.rebalance_timeout_ms / 1000 + 10)

    # ---- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            pending: list[Event] = [Start()]
            while True:
                if self._closing.is_set():
                    pending.append(Close())
                while pending:
                    for instruction in self.machine.handle(pending.pop(0)):
                        if isinstance(instruction, Done):
                            return
                        event = self._perform(instruction)
                        if event is not None:
                            pending.append(event)
                            break  # the rest followed from a state the event changed
                self._closing.wait(self.timing.heartbeat_interval_ms / 4000)
                pending.append(Tick(_now_ms()))
        except BaseException as exc:  # a bug or a fatal refusal: the subscription says so
            self.error = exc
            logger.exception("group %s: member stopped", self.group)
        finally:
            self._disconnect()

    def _perform(self, instruction: Instruction) -> Event | None:
        try:
            return self._do(instruction)
        except TqError as exc:
            logger.warning("group %s: %s", self.group, exc)
            self._disconnect()
            if isinstance(instruction, SendLeave):
                return None  # leaving anyway: the session timeout removes us
            return Disconnected()

    def _do(self, instruction: Instruction) -> Event | None:
        if isinstance(instruction, Revoke):
            self._partitions.revoke()
        elif isinstance(instruction, Commit):
            self._commit(instruction)
        elif isinstance(instruction, Assign):
            self._assign(instruction.assignment)
        elif isinstance(instruction, Rediscover):
            self._disconnect()
        elif isinstance(instruction, SendJoin):
            return self._join(instruction)
        elif isinstance(instruction, SendSync):
            return self._sync(instruction)
        elif isinstance(instruction, SendHeartbeat):
            response = self._call(ApiKey.HEARTBEAT, 3, group_id=self.group,
                                  generation_id=instruction.generation,
                                  member_id=instruction.member_id, group_instance_id=None)
            return Beat(response.error_code.value)
        elif isinstance(instruction, SendLeave):
            self._call(ApiKey.LEAVE_GROUP, 3, group_id=self.group, members=[
                {"member_id": instruction.member_id, "group_instance_id": None}])
        return None

    def _call(self, api_key: int, version: int, **fields: object) -> Any:  # kio's response
        if self._client is None:
            self._client = self._connect()
        return self._client.call(api_key, version, **fields)

    def _connect(self) -> KafkaClient:
        """The group coordinator's listener, as the catalog names it; retried while it is
        away (a restarting coordinator), until the member closes."""
        timeout = self.timing.rebalance_timeout_ms / 1000 + 5
        while True:
            try:
                return KafkaClient(self._locate(), client_id=self.client_id, timeout=timeout)
            except TqError as exc:
                if self._closing.is_set():
                    raise
                logger.info("group %s: coordinator not reachable (%s); retrying",
                            self.group, exc)
                self._closing.wait(_RETRY)

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # ---- the group apis -----------------------------------------------------------------------

    def _join(self, send: SendJoin) -> Event:
        if send.backoff:
            self._closing.wait(_RETRY)
        metadata = encode_subscription(self.topics)
        response = self._call(
            ApiKey.JOIN_GROUP, 5, group_id=self.group,
            session_timeout=self.timing.session_timeout_ms,
            rebalance_timeout=self.timing.rebalance_timeout_ms, member_id=send.member_id,
            group_instance_id=None, protocol_type=PROTOCOL_TYPE,
            protocols=[{"name": name, "metadata": metadata} for name in ASSIGNORS])
        return Joined(response.error_code.value, response.generation_id,
                      response.member_id, response.leader,
                      response.protocol_name,
                      tuple((m.member_id, m.metadata)
                            for m in response.members))

    def _sync(self, send: SendSync) -> Event:
        assignments = []
        if send.members:  # we lead: assign with the protocol the group chose
            subscriptions = {member: decode_subscription(meta) for member, meta in send.members}
            wanted = sorted({t for ts in subscriptions.values() for t in ts})
            assignor = ASSIGNORS.get(send.protocol or "range", ASSIGNORS["range"])
            plan = assignor(subscriptions, self._counts(wanted))
            assignments = [{"member_id": m, "assignment": encode_assignment(a)}
                           for m, a in plan.items()]
        response = self._call(ApiKey.SYNC_GROUP, 3, group_id=self.group,
                              generation_id=send.generation, member_id=send.member_id,
                              group_instance_id=None, assignments=assignments)
        if response.error_code.value == 0:
            self.generation = send.generation
        return Synced(response.error_code.value,
                      response.assignment)

    def _assign(self, assignment: Assignment) -> None:
        mine = {t: p for t, p in assignment.items() if t in self.topics and p}
        starts: dict[TopicPartition, int | None] = {}
        if mine:
            response = self._call(ApiKey.OFFSET_FETCH, 5, group_id=self.group, topics=[
                {"name": t, "partition_indexes": p} for t, p in sorted(mine.items())])
            for topic in response.topics:
                for p in topic.partitions:
                    offset = p.committed_offset
                    starts[(topic.name, p.partition_index)] = None if offset < 0 else offset
                    if offset >= 0:
                        self._committed[(topic.name, p.partition_index)] = offset
        self.assignment = mine
        self._owned = {(t, p) for t, ps in mine.items() for p in ps}
        self._partitions.assign(mine, starts)
        self._assigned.set()

    def _commit(self, commit: Commit) -> None:
        consumed = self._partitions.consumed()
        due = {tp: offset for tp, offset in consumed.items()
               if tp in self._owned and self._committed.get(tp) != offset}
        if not due:
            return
        topics: dict[str, list[dict[str, object]]] = {}
        for (topic, partition), offset in sorted(due.items()):
            topics.setdefault(topic, []).append({
                "partition_index": partition, "committed_offset": offset,
                "committed_leader_epoch": -1, "committed_metadata": ""})
        response = self._call(
            ApiKey.OFFSET_COMMIT, 7, group_id=self.group,
            generation_id_or_member_epoch=commit.generation, member_id=commit.member_id,
            group_instance_id=None,
            topics=[{"name": t, "partitions": ps} for t, ps in topics.items()])
        for topic in response.topics:
            for p in topic.partitions:
                if p.error_code is ErrorCode.none:
                    tp = (topic.name, p.partition_index)
                    self._committed[tp] = due[tp]
                else:  # the heartbeat will tell why (a rebalance): those are read again
                    logger.info("group %s: commit of %s-%d refused: %s", self.group,
                                topic.name, p.partition_index, p.error_code.name)
