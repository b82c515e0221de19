"""The group coordinator's async shell and the group apis: FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups,
DeleteGroups, OffsetDelete (Kafka's DELETE on a group: whoever may use the group, DESIGN §12).

`GroupService` feeds requests to the pure `GroupMachine` with the time, delivers the replies it
returns (some later: a JoinGroup waits for the rebalance), persists group states through the
backend in order, and runs the one timer task that calls `tick` at the machine's next deadline.
Committed offsets go straight to the backend once the machine allows the commit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from catalog.errors import TqError, printable
from querylib.kafka._apis import ApiKey, build_response, millis
from querylib.kafka._errors import ErrorCode, error_code_of

from ._backend import CommittedOffset, GroupRecord, KafkaBackend
from ._group import (
    CommitCheck,
    CommitReply,
    Event,
    GroupConfig,
    GroupMachine,
    GroupStatus,
    Heartbeat,
    HeartbeatReply,
    Instruction,
    Join,
    JoinReply,
    Leave,
    LeaveReply,
    StoreGroup,
    Sync,
    SyncReply,
)
from ._handlers import RequestContext

__all__ = ["GroupService"]

logger = logging.getLogger("querylib.kafka")

MAX_METADATA_BYTES = 4096  # Kafka's offset.metadata.max.bytes
_COORDINATOR_GROUP = 0  # FindCoordinator key types
_COORDINATOR_TXN = 1
_TIMER_IDLE = 3600.0


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class GroupService:
    """Group coordination for one listener. `start()` before serving, `stop()` after."""

    def __init__(self, backend: KafkaBackend, config: GroupConfig | None = None) -> None:
        self.backend = backend
        self.machine = GroupMachine(config)
        self._tokens = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Instruction]] = {}
        self._stores: asyncio.Queue[GroupRecord] = asyncio.Queue()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        now = _monotonic_ms()
        for record in await self.backend.stored_groups():
            self.machine.restore(record, now)
        self._tasks = [asyncio.create_task(self._run_timer(), name="tq-kafka-group-timer"),
                       asyncio.create_task(self._run_stores(), name="tq-kafka-group-store")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # ---- the shell ----------------------------------------------------------------------------

    async def _ask(self, group_id: str, event: Event) -> Instruction:
        future: asyncio.Future[Instruction] = asyncio.get_running_loop().create_future()
        self._waiting[event.token] = future
        try:
            self._perform(self.machine.handle(group_id, event, _monotonic_ms()))
            self._wakeup.set()
            return await future
        finally:
            self._waiting.pop(event.token, None)

    def _perform(self, instructions: list[Instruction]) -> None:
        for instruction in instructions:
            if isinstance(instruction, StoreGroup):
                self._stores.put_nowait(
                    replace(instruction.record, current_state_timestamp=_wall_ms()))
                continue
            future = self._waiting.get(instruction.token)
            if future is not None and not future.done():
                future.set_result(instruction)
            # else the connection that asked has gone: nobody to tell

    async def _run_timer(self) -> None:
        while True:
            deadline = self.machine.next_deadline()
            delay = _TIMER_IDLE if deadline is None else max(0, deadline - _monotonic_ms()) / 1000
            try:
                await asyncio.wait_for(self._wakeup.wait(), delay)
            except TimeoutError:
                pass
            self._wakeup.clear()
            self._perform(self.machine.tick(_monotonic_ms()))

    async def _run_stores(self) -> None:
        """Group states are persisted in the order the machine produced them."""
        while True:
            record = await self._stores.get()
            try:
                await self.backend.store_group(record)
            except TqError as exc:
                logger.error("group %s: storing its state failed: %s", printable(record.group_id),
                             exc)

    # ---- apis ---------------------------------------------------------------------------------

    async def _elsewhere(self, ctx: RequestContext, group_id: str, *,
                         claim: bool = False) -> ErrorCode | None:
        """NOT_COORDINATOR when another broker coordinates groups (the client asks
        FindCoordinator again), COORDINATOR_NOT_AVAILABLE while none is known,
        GROUP_AUTHORIZATION_FAILED when the group is another principal's (`claim`: a join or
        commit makes a group nobody has yet the client's; DESIGN §12)."""
        try:
            here = await self.backend.coordinates(group_id)
            if here and group_id and not await self.backend.authorize_group(
                    group_id, ctx.principal, claim=claim):
                return ErrorCode.group_authorization_failed
        except TqError as exc:
            return error_code_of(exc)
        return None if here else ErrorCode.not_coordinator

    async def find_coordinator(self, ctx: RequestContext, request: Any) -> Any:
        key_type = getattr(request, "key_type", _COORDINATOR_GROUP)
        if ctx.api_version >= 4:  # v4+: a batch of keys, one answer each
            coordinators = [await self._coordinator(key_type, key)
                            for key in request.coordinator_keys]
            return build_response(ApiKey.FIND_COORDINATOR, ctx.api_version,
                                  {"throttle_time": 0, "coordinators": coordinators})
        data = await self._coordinator(key_type, request.key)
        data["throttle_time"] = 0
        return build_response(ApiKey.FIND_COORDINATOR, ctx.api_version, data)

    async def _coordinator(self, key_type: int, key: str) -> dict[str, Any]:
        data: dict[str, Any] = {"key": key, "error_code": ErrorCode.none,
                                "error_message": None, "node_id": -1, "host": "", "port": -1}
        if key_type not in (_COORDINATOR_GROUP, _COORDINATOR_TXN):
            data["error_code"] = ErrorCode.invalid_request
            data["error_message"] = "tq coordinates groups (0) and transactions (1)"
        else:
            # Transactions are coordinated where groups are (`_txn`): TxnOffsetCommit then
            # meets its transaction on the same broker.
            try:
                broker = await self.backend.coordinator(key)
                data.update(node_id=broker.node_id, host=broker.host, port=broker.port)
            except TqError as exc:
                data["error_code"], data["error_message"] = error_code_of(exc), str(exc)
        return data

    async def join_group(self, ctx: RequestContext, request: Any) -> Any:
        session = millis(request.session_timeout)
        rebalance = getattr(request, "rebalance_timeout", None)
        refused = await self._elsewhere(ctx, request.group_id, claim=True)
        reply: Instruction
        if not request.group_id:
            reply = JoinReply(0, ErrorCode.invalid_group_id, member_id=request.member_id)
        elif refused is not None:
            reply = JoinReply(0, refused, member_id=request.member_id)
        else:
            event = Join(
                token=next(self._tokens), member_id=request.member_id,
                new_member_id=f"{ctx.client_id or 'member'}-{uuid.uuid4()}",
                client_id=ctx.client_id or "", client_host=ctx.client_host,
                protocol_type=request.protocol_type,
                protocols=tuple((p.name, p.metadata) for p in request.protocols),
                session_timeout_ms=session,
                rebalance_timeout_ms=session if rebalance is None else millis(rebalance),
                group_instance_id=getattr(request, "group_instance_id", None),
                require_known_member=ctx.api_version >= 4)
            reply = await self._ask(request.group_id, event)
        assert isinstance(reply, JoinReply)
        return build_response(ApiKey.JOIN_GROUP, ctx.api_version, {
            "throttle_time": 0, "error_code": reply.error, "generation_id": reply.generation,
            "protocol_type": reply.protocol_type, "protocol_name": reply.protocol or "",
            "leader": reply.leader, "skip_assignment": False,
            "member_id": reply.member_id,
            "members": [{"member_id": m, "group_instance_id": i, "metadata": meta}
                        for m, i, meta in reply.members]})

    async def sync_group(self, ctx: RequestContext, request: Any) -> Any:
        refused = await self._elsewhere(ctx, request.group_id)
        group = self.machine.group(request.group_id)
        reply: Instruction
        if not request.group_id:
            reply = SyncReply(0, ErrorCode.invalid_group_id)
        elif refused is not None:
            reply = SyncReply(0, refused)
        elif group is not None and not (
                getattr(request, "protocol_type", None) in (None, group.protocol_type)
                and getattr(request, "protocol_name", None) in (None, group.protocol)):
            # v5+ name the protocol the member joined with: it must be the group's.
            reply = SyncReply(0, ErrorCode.inconsistent_group_protocol)
        else:
            reply = await self._ask(request.group_id, Sync(
                next(self._tokens), request.member_id, request.generation_id,
                tuple((a.member_id, a.assignment) for a in request.assignments)))
        assert isinstance(reply, SyncReply)
        return build_response(ApiKey.SYNC_GROUP, ctx.api_version, {
            "throttle_time": 0, "error_code": reply.error, "assignment": reply.assignment,
            "protocol_type": reply.protocol_type, "protocol_name": reply.protocol})

    async def heartbeat(self, ctx: RequestContext, request: Any) -> Any:
        refused = await self._elsewhere(ctx, request.group_id)
        if not request.group_id:
            error = ErrorCode.invalid_group_id
        elif refused is not None:
            error = refused
        else:
            reply = await self._ask(request.group_id, Heartbeat(
                next(self._tokens), request.member_id, request.generation_id))
            assert isinstance(reply, HeartbeatReply)
            error = reply.error
        return build_response(ApiKey.HEARTBEAT, ctx.api_version,
                              {"throttle_time": 0, "error_code": error})

    async def leave_group(self, ctx: RequestContext, request: Any) -> Any:
        if ctx.api_version < 3:
            leaving = [(request.member_id, None)]
        else:
            leaving = [(m.member_id, m.group_instance_id) for m in request.members]
        members = []
        refused = await self._elsewhere(ctx, request.group_id)
        for member_id, instance_id in leaving:
            if not request.group_id:
                error = ErrorCode.invalid_group_id
            elif refused is not None:
                error = refused
            else:
                reply = await self._ask(request.group_id,
                                        Leave(next(self._tokens), member_id))
                assert isinstance(reply, LeaveReply)
                error = reply.error
            members.append({"member_id": member_id, "group_instance_id": instance_id,
                            "error_code": error})
        top = members[0]["error_code"] if ctx.api_version < 3 and members else (
            refused or ErrorCode.none)
        return build_response(ApiKey.LEAVE_GROUP, ctx.api_version,
                              {"throttle_time": 0, "error_code": top, "members": members})

    async def offset_commit(self, ctx: RequestContext, request: Any) -> Any:
        refused = await self._elsewhere(ctx, request.group_id)
        if not request.group_id:
            error = ErrorCode.invalid_group_id
        elif refused is not None:
            error = refused
        else:
            reply = await self._ask(request.group_id, CommitCheck(
                next(self._tokens), request.member_id,
                getattr(request, "generation_id_or_member_epoch", -1)))
            assert isinstance(reply, CommitReply)
            error = reply.error
        now = _wall_ms()
        known = {t.name for t in await self._existing([t.name for t in request.topics])}
        results, commits = [], []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                code = error
                if code is ErrorCode.none:
                    if topic.name not in known:
                        code = ErrorCode.unknown_topic_or_partition
                    elif len((p.committed_metadata or "").encode()) > MAX_METADATA_BYTES:
                        code = ErrorCode.offset_metadata_too_large
                    else:
                        commits.append(CommittedOffset(
                            topic.name, p.partition_index, p.committed_offset,
                            getattr(p, "committed_leader_epoch", -1),
                            p.committed_metadata or "", now))
                partitions.append({"partition_index": p.partition_index, "error_code": code})
            results.append({"name": topic.name, "partitions": partitions})
        if commits:
            try:
                # A commit that stores something claims a group nobody has yet (DESIGN §12);
                # a refused one leaves it free.
                if await self.backend.authorize_group(request.group_id, ctx.principal,
                                                      claim=True):
                    await self.backend.store_offsets(request.group_id, commits)
                    code = ErrorCode.none
                else:
                    code = ErrorCode.group_authorization_failed
            except TqError as exc:
                code = error_code_of(exc)
            if code is not ErrorCode.none:
                for topic_result in results:
                    for partition in topic_result["partitions"]:
                        if partition["error_code"] is ErrorCode.none:
                            partition["error_code"] = code
        return build_response(ApiKey.OFFSET_COMMIT, ctx.api_version,
                              {"throttle_time": 0, "topics": results})

    async def _existing(self, names: list[str]) -> list[Any]:
        try:
            return await self.backend.topics(names)
        except TqError:
            # an invalid name among them: look them up one by one
            found = []
            for name in names:
                try:
                    found.extend(await self.backend.topics([name]))
                except TqError:
                    pass
            return found

    async def offset_fetch(self, ctx: RequestContext, request: Any) -> Any:
        if ctx.api_version >= 8:  # v8+: several groups in one request, answered each
            groups = []
            for group in request.groups:
                topics, error = await self._group_offsets(ctx, group.group_id, group.topics)
                groups.append({"group_id": group.group_id, "topics": topics,
                               "error_code": error})
            return build_response(ApiKey.OFFSET_FETCH, ctx.api_version,
                                  {"throttle_time": 0, "groups": groups})
        topics, error = await self._group_offsets(ctx, request.group_id, request.topics)
        return build_response(ApiKey.OFFSET_FETCH, ctx.api_version,
                              {"throttle_time": 0, "topics": topics, "error_code": error})

    async def _group_offsets(self, ctx: RequestContext, group_id: str,
                             requested: Any) -> tuple[list[dict[str, Any]], ErrorCode]:
        """One group's committed offsets (every one when `requested` is None) and its error."""
        error = ErrorCode.none
        committed = {}
        refused = await self._elsewhere(ctx, group_id)
        if not group_id:
            error = ErrorCode.invalid_group_id
        elif refused is not None:
            error = refused
        else:
            try:
                committed = dict(await self.backend.committed_offsets(group_id))
            except TqError as exc:
                error = error_code_of(exc)
        if requested is None:  # v2+: every partition the group has committed
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in requested}
        topics = []
        for name, indexes in wanted.items():
            partitions = []
            for index in indexes:
                found = committed.get((name, index))
                partitions.append({
                    "partition_index": index,
                    "committed_offset": -1 if found is None else found.offset,
                    "committed_leader_epoch": -1 if found is None else found.leader_epoch,
                    "metadata": "" if found is None else found.metadata,
                    "error_code": error if ctx.api_version < 2 else ErrorCode.none})
            topics.append({"name": name, "partitions": partitions})
        return topics, error

    async def describe_groups(self, ctx: RequestContext, request: Any) -> Any:
        groups = []
        for group_id in request.groups:
            group = self.machine.group(group_id)
            if not await self.backend.authorize_group(group_id, ctx.principal, claim=False):
                groups.append({"error_code": ErrorCode.group_authorization_failed,
                               "group_id": group_id, "group_state": "", "protocol_type": "",
                               "protocol_data": "", "members": ()})
                continue
            if group is None:
                # v6+ say the group does not exist; before, a Dead group stood for it.
                missing = ctx.api_version >= 6
                groups.append({
                    "error_code": ErrorCode.group_id_not_found if missing else ErrorCode.none,
                    "error_message": f"group {group_id!r} not found" if missing else None,
                    "group_id": group_id, "group_state": "Dead", "protocol_type": "",
                    "protocol_data": "", "members": ()})
                continue
            stable = group.status is GroupStatus.STABLE
            members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id, "client_host": m.client_host,
                        "member_metadata": m.metadata(group.protocol) if stable else b"",
                        "member_assignment": m.assignment if stable else b""}
                       for m in group.members.values()]
            groups.append({"error_code": ErrorCode.none, "group_id": group_id,
                           "group_state": str(group.status),
                           "protocol_type": group.protocol_type or "",
                           "protocol_data": group.protocol or "", "members": members})
        return build_response(ApiKey.DESCRIBE_GROUPS, ctx.api_version,
                              {"throttle_time": 0, "groups": groups})

    async def overview(self) -> list[dict[str, Any]]:
        """Every group as an operator sees it (the console): state, members with what they
        were assigned, and committed offsets. Unauthorized: call it from the process that
        runs the listener (on its loop), never on a client's behalf."""
        from querylib.api._group import decode_assignment

        out = []
        for group in self.machine.groups():
            members = []
            for member in group.members.values():
                try:
                    assigned = decode_assignment(member.assignment) \
                        if group.protocol_type == "consumer" else {}
                except TqError:
                    assigned = {}
                members.append({"member_id": member.member_id, "client_id": member.client_id,
                                "client_host": member.client_host,
                                "assignment": {t: sorted(p) for t, p in assigned.items()}})
            try:
                committed = await self.backend.committed_offsets(group.group_id)
            except TqError:
                committed = {}
            out.append({"group_id": group.group_id, "state": str(group.status),
                        "generation": group.generation, "protocol": group.protocol or "",
                        "members": members,
                        "committed": [{"topic": t, "partition": p, "offset": c.offset}
                                      for (t, p), c in sorted(committed.items())]})
        return out

    async def list_groups(self, ctx: RequestContext, request: Any) -> Any:
        # Only the groups the client may use, as Kafka lists those it may describe.
        # v4+ filter by state, v5+ by type (case-insensitive; every tq group is "classic").
        states = {s.lower() for s in getattr(request, "states_filter", ())}
        types = {t.lower() for t in getattr(request, "types_filter", ())}
        groups = [{"group_id": g.group_id, "protocol_type": g.protocol_type or "",
                   "group_state": str(g.status), "group_type": "classic"}
                  for g in self.machine.groups()
                  if (not states or str(g.status).lower() in states)
                  and (not types or "classic" in types)
                  and await self.backend.authorize_group(g.group_id, ctx.principal,
                                                         claim=False)]
        return build_response(ApiKey.LIST_GROUPS, ctx.api_version,
                              {"throttle_time": 0, "error_code": ErrorCode.none,
                               "groups": groups})

    async def delete_groups(self, ctx: RequestContext, request: Any) -> Any:
        """Delete groups without members: their state and committed offsets (tombstones in
        `__consumer_offsets`). NON_EMPTY_GROUP while members are in one, GROUP_ID_NOT_FOUND
        for a group nobody used."""
        results = []
        for group_id in request.groups_names:
            code = await self._elsewhere(ctx, group_id)
            if code is None:
                try:
                    known = (self.machine.group(group_id) is not None
                             or bool(await self.backend.committed_offsets(group_id))
                             or group_id in {g.group_id
                                             for g in await self.backend.stored_groups()})
                    if not known:
                        code = ErrorCode.group_id_not_found
                    else:
                        code = self.machine.delete(group_id)
                        if code is ErrorCode.none:
                            await self.backend.delete_group(group_id)
                except TqError as exc:
                    code = error_code_of(exc)
            results.append({"group_id": group_id, "error_code": code})
        return build_response(ApiKey.DELETE_GROUPS, ctx.api_version,
                              {"throttle_time": 0, "results": results})

    async def offset_delete(self, ctx: RequestContext, request: Any) -> Any:
        """Delete a group's committed offsets of some partitions; a partition of a topic the
        group's members subscribe to now gets GROUP_SUBSCRIBED_TO_TOPIC, as in Kafka."""
        error = await self._elsewhere(ctx, request.group_id) or ErrorCode.none
        topics: list[dict[str, Any]] = []
        if error is ErrorCode.none:
            try:
                committed = await self.backend.committed_offsets(request.group_id)
                if not committed and self.machine.group(request.group_id) is None:
                    error = ErrorCode.group_id_not_found
            except TqError as exc:
                error = error_code_of(exc)
        if error is ErrorCode.none:
            subscribed = self.machine.subscribed(request.group_id) or set()
            deleting = []
            for topic in request.topics:
                partitions = []
                for p in topic.partitions:
                    code = ErrorCode.none
                    if topic.name in subscribed:
                        code = ErrorCode.group_subscribed_to_topic
                    elif (topic.name, p.partition_index) in committed:
                        deleting.append((topic.name, p.partition_index))
                    partitions.append({"partition_index": p.partition_index, "error_code": code})
                topics.append({"name": topic.name, "partitions": partitions})
            try:
                await self.backend.delete_offsets(request.group_id, deleting)
            except TqError as exc:
                error, topics = error_code_of(exc), []
        return build_response(ApiKey.OFFSET_DELETE, ctx.api_version,
                              {"throttle_time": 0, "error_code": error, "topics": topics})
