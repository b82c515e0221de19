"""Request handlers for the cluster and data apis: ApiVersions, Metadata, Produce, Fetch,
ListOffsets, InitProducerId, CreateTopics. (Group apis: `_group_service`; admin apis: `_admin`.)

Each handler takes kio's decoded request and returns a response (a kio entity built from a
version-free dict, a `RawResponse` for Fetch, or None when the client wants none) using only the
`KafkaBackend`. Refusals are Kafka error codes in the response, per partition where the
protocol allows; a `TqError` from the backend becomes its `kafka_error_code` here. No sockets.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from catalog.errors import TopicExistsError, TqError
from querylib.broker import BatchTooLargeError
from querylib.broker._errors import NotLeaderOrFollowerError
from querylib.errors import InvalidRecordError
from querylib.kafka._apis import SUPPORTED_VERSIONS, ApiKey, build_response, is_flexible, millis
from querylib.kafka._errors import ErrorCode, InvalidRequiredAcksError, error_code_of
from querylib.kafka._framing import read_uvarint, skip_tagged_fields
from querylib.records import MAX_BATCH_SIZE, read_header

from ._backend import KafkaBackend, PartitionRead, TopicInfo
from ._fetch import TOPIC_IDS_FROM, FetchedPartition, FetchedTopic, encode_fetch_response

__all__ = ["DataHandlers", "RawResponse", "RequestContext", "api_versions_error",
           "oversized_produce_response"]

_CONTROL = 0x20
# ListOffsets timestamps: latest, earliest, the record with the largest timestamp (v7+), the
# earliest in local storage (v8+: tq keeps every segment locally, so the log start).
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -1, -2, -3, -4
_NO_TOPIC_ID = uuid.UUID(int=0)
READ_COMMITTED = 1  # isolation_level of Fetch and ListOffsets


@dataclass(frozen=True, slots=True)
class RequestContext:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    principal: str = "anonymous"  # who SASL authenticated, else anonymous (DESIGN §12)


@dataclass(slots=True)
class RawResponse:
    """An already framed body (Fetch): chunks of bytes and file slices, and what to close
    once sent."""

    chunks: list[Any]
    size: int
    reads: list[PartitionRead] = field(default_factory=list)

    def close(self) -> None:
        for read in self.reads:
            read.close()
        self.reads = []


def _api_keys() -> list[dict[str, int]]:
    return [{"api_key": int(key), "min_version": lo, "max_version": hi}
            for key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())]


def api_versions_error() -> Any:
    """The v0 ApiVersions response Kafka sends for a version it does not know: error 35 and
    the supported ranges, so the client retries with one of them."""
    return build_response(ApiKey.API_VERSIONS, 0, {
        "error_code": ErrorCode.unsupported_version, "api_keys": _api_keys(),
        "throttle_time": 0})


class DataHandlers:
    def __init__(self, backend: KafkaBackend) -> None:
        self.backend = backend
        self._names_by_id: dict[uuid.UUID, str] = {}  # Kafka topic ids seen, to their names

    async def topic_named(self, topic_id: uuid.UUID) -> TopicInfo | None:
        """The topic with this Kafka id (Metadata v10+, Fetch v13+), None when there is none:
        checked against the topic now under the name, so a recreated topic's old id finds
        nothing. Unknown ids make one pass over every topic."""
        name = self._names_by_id.get(topic_id)
        if name is not None:
            found = await self.backend.topics([name])
            if found and found[0].kafka_id == topic_id:
                return found[0]
            del self._names_by_id[topic_id]
        if topic_id == _NO_TOPIC_ID:
            return None
        every = await self.backend.topics(None)
        self._names_by_id = {t.kafka_id: t.name for t in every}
        return next((t for t in every if t.kafka_id == topic_id), None)

    # ---- ApiVersions, Metadata ----------------------------------------------------------------

    async def api_versions(self, ctx: RequestContext, request: Any) -> Any:
        return build_response(ApiKey.API_VERSIONS, ctx.api_version, {
            "error_code": ErrorCode.none, "api_keys": _api_keys(), "throttle_time": 0})

    async def metadata(self, ctx: RequestContext, request: Any) -> Any:
        backend = self.backend
        version = ctx.api_version
        requested = request.topics
        if requested is None or (version == 0 and not requested):
            found = await backend.topics(None)
            topics = [self._topic_metadata(t) for t in found]
        else:
            allow_create = backend.auto_create_topics and (
                version < 4 or getattr(request, "allow_auto_topic_creation", True))
            topics = []
            for t in requested:
                if t.name is None:  # v10+: asked by topic id
                    topics.append(await self._lookup_topic_id(t.topic_id, version))
                else:
                    topics.append(await self._lookup_topic(t.name, allow_create))
        brokers = [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                   for b in backend.brokers()]
        return build_response(ApiKey.METADATA, version, {
            "throttle_time": 0, "brokers": brokers, "cluster_id": backend.cluster_id,
            "controller_id": backend.controller_id, "topics": topics,
            "error_code": ErrorCode.none})

    async def _lookup_topic_id(self, topic_id: uuid.UUID | None, version: int) -> dict[str, Any]:
        try:
            found = await self.topic_named(topic_id or _NO_TOPIC_ID)
        except TqError as exc:
            found, code = None, error_code_of(exc)
        else:
            code = ErrorCode.unknown_topic_id
        if found is None:
            # The name is nullable from v12; before, an empty one stands for "unknown".
            return {"error_code": code, "name": None if version >= 12 else "",
                    "topic_id": topic_id, "is_internal": False, "partitions": ()}
        return self._topic_metadata(found)

    async def _lookup_topic(self, name: str, allow_create: bool) -> dict[str, Any]:
        try:
            found = await self.backend.topics([name])
            if not found and allow_create:
                try:
                    created = await self.backend.create_topic(name)
                    found = [] if created is None else [created]
                except TopicExistsError:
                    found = await self.backend.topics([name])
        except TqError as exc:
            return _topic_error(name, error_code_of(exc))
        if not found:
            return _topic_error(name, ErrorCode.unknown_topic_or_partition)
        return self._topic_metadata(found[0])

    @staticmethod
    def _topic_metadata(topic: TopicInfo) -> dict[str, Any]:
        partitions = [
            # A partition of one replica has leader epoch -1: clients then skip epoch
            # validation (OffsetForLeaderEpoch); a replicated one has its catalog epoch.
            {"error_code": ErrorCode.none, "partition_index": p.index, "leader_id": p.leader,
             "leader_epoch": p.leader_epoch, "replica_nodes": p.replicas or (p.leader,),
             "isr_nodes": p.isr or (p.leader,), "offline_replicas": p.offline}
            for p in topic.partitions]
        return {"error_code": ErrorCode.none, "name": topic.name, "topic_id": topic.kafka_id,
                "is_internal": topic.internal, "partitions": partitions}

    # ---- Produce ------------------------------------------------------------------------------

    async def produce(self, ctx: RequestContext, request: Any) -> Any:
        acks = request.acks
        refusal: ErrorCode | None = None  # for every partition of the request
        if ctx.api_version < 3:
            refusal = ErrorCode.unsupported_version  # as Kafka 4 answers Produce v0-2
        elif acks not in (0, 1, -1):
            refusal = error_code_of(InvalidRequiredAcksError(f"acks {acks}"))
        responses = []
        for topic in request.topic_data:
            partitions = []
            for data in topic.partition_data:
                if refusal is not None:
                    partitions.append(_produce_error(data.index, refusal))
                else:
                    partitions.append(await self._produce_partition(topic.name, data, acks,
                                                                    ctx.principal))
            responses.append({"name": topic.name, "partition_responses": partitions})
        if acks == 0:
            return None  # acks=0: the client reads no response
        if ctx.api_version < 3:
            body = legacy_produce_response(ctx.api_version, responses)
            return RawResponse([body], len(body))
        return build_response(ApiKey.PRODUCE, ctx.api_version,
                              {"responses": responses, "throttle_time": 0})

    async def _produce_partition(self, topic: str, data: Any, acks: int,
                                 principal: str) -> dict[str, Any]:
        records = data.records
        try:
            batch = _single_batch(records)
            result = await self.backend.append(topic, data.index, [batch], acks=acks,
                                               principal=principal)
        except TqError as exc:
            return _produce_error(data.index, error_code_of(exc))
        return {"index": data.index, "error_code": ErrorCode.none,
                "base_offset": result.base_offset, "log_start_offset": result.log_start_offset,
                "record_errors": (), "error_message": None}

    # ---- Fetch --------------------------------------------------------------------------------

    async def fetch(self, ctx: RequestContext, request: Any) -> RawResponse:
        loop = asyncio.get_running_loop()
        max_wait = max(millis(request.max_wait), 0) / 1000
        deadline = loop.time() + max_wait
        wanted = await self._fetch_topics(ctx.api_version, request)
        while True:
            reads: list[PartitionRead] = []
            try:
                topics, total, failed = await self._fetch_once(request, wanted, reads)
                remaining = deadline - loop.time()
                if total >= request.min_bytes or failed or remaining <= 0:
                    chunks, size = encode_fetch_response(ctx.api_version, topics)
                    return RawResponse(chunks, size, reads)
            except BaseException:
                for read in reads:
                    read.close()
                raise
            for read in reads:
                read.close()
            # Wait for appends past what this pass saw (not past the fetch offsets: data that
            # is there but below min_bytes must not make the wait return at once, forever).
            seen = [(t.topic, p.partition_index, p.high_watermark)
                    for t in topics for p in t.partitions if p.high_watermark >= 0]
            await self.backend.wait_for_data(seen, remaining)

    async def _fetch_topics(self, version: int, request: Any) -> list[tuple[str | None, bytes]]:
        """(name, topic id bytes) of each requested topic; from v13 topics come by id, and an
        id no topic has now gets None (its partitions answer UNKNOWN_TOPIC_ID)."""
        if version < TOPIC_IDS_FROM:
            return [(t.topic, _NO_TOPIC_ID.bytes) for t in request.topics]
        wanted: list[tuple[str | None, bytes]] = []
        for t in request.topics:
            try:
                found = await self.topic_named(t.topic_id or _NO_TOPIC_ID)
            except TqError:
                found = None
            wanted.append((None if found is None else found.name,
                           (t.topic_id or _NO_TOPIC_ID).bytes))
        return wanted

    async def _fetch_once(
        self, request: Any, wanted: list[tuple[str | None, bytes]], reads: list[PartitionRead]
    ) -> tuple[list[FetchedTopic], int, bool]:
        """One pass over the requested partitions: (topics, bytes, errors?); the reads whose
        slices the response will send are added to `reads` (the caller closes them)."""
        budget = getattr(request, "max_bytes", 0x7FFFFFFF)
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        topics: list[FetchedTopic] = []
        total = 0
        failed = False
        for topic, (name, topic_id) in zip(request.topics, wanted, strict=True):
            fetched = FetchedTopic(name or "", [], topic_id)
            topics.append(fetched)
            for p in topic.partitions:
                entry = FetchedPartition(p.partition)
                fetched.partitions.append(entry)
                if name is None:
                    entry.error_code = ErrorCode.unknown_topic_id
                    failed = True
                    continue
                epoch = getattr(p, "current_leader_epoch", -1)  # v9+
                try:
                    if total and total >= budget:
                        offsets = await self.backend.offsets(name, p.partition,
                                                             leader_epoch=epoch)
                    else:
                        limit = min(p.partition_max_bytes, budget - total)
                        read = await self.backend.read(name, p.partition, p.fetch_offset,
                                                       max(limit, 0), committed=committed,
                                                       leader_epoch=epoch)
                        offsets = read.offsets
                        entry.aborted = read.aborted
                        if total and read.size > budget - total:
                            read.close()  # only the first partition may exceed the limits
                        else:
                            reads.append(read)
                            entry.records = read.chunks
                            total += read.size
                except TqError as exc:
                    entry.error_code = error_code_of(exc)
                    failed = True
                    try:
                        offsets = await self.backend.offsets(name, p.partition)
                    except TqError:
                        continue
                entry.high_watermark = offsets.high_watermark
                entry.last_stable_offset = offsets.last_stable_offset
                entry.log_start_offset = offsets.log_start_offset
        return topics, total, failed

    # ---- ListOffsets, InitProducerId ------------------------------------------------------------

    async def list_offsets(self, ctx: RequestContext, request: Any) -> Any:
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        topics = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                entry: dict[str, Any] = {"partition_index": p.partition_index,
                                         "error_code": ErrorCode.none, "timestamp": -1,
                                         "offset": -1, "leader_epoch": -1}
                epoch = getattr(p, "current_leader_epoch", -1)  # v4+
                try:
                    if p.timestamp in (LATEST, EARLIEST, EARLIEST_LOCAL):
                        offsets = await self.backend.offsets(topic.name, p.partition_index,
                                                             leader_epoch=epoch)
                        latest = (offsets.last_stable_offset if committed
                                  else offsets.high_watermark)
                        entry["offset"] = (latest if p.timestamp == LATEST
                                           else offsets.log_start_offset)
                    elif p.timestamp == MAX_TIMESTAMP:
                        found = await self.backend.offset_of_max_timestamp(
                            topic.name, p.partition_index, leader_epoch=epoch)
                        if found is not None:
                            entry["offset"], entry["timestamp"] = found
                    else:
                        found = await self.backend.offset_for_timestamp(
                            topic.name, p.partition_index, p.timestamp, leader_epoch=epoch)
                        if found is not None:
                            entry["offset"], entry["timestamp"] = found
                except TqError as exc:
                    entry["error_code"] = error_code_of(exc)
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return build_response(ApiKey.LIST_OFFSETS, ctx.api_version,
                              {"throttle_time": 0, "topics": topics})

    # ---- OffsetForLeaderEpoch ------------------------------------------------------------------

    async def offset_for_leader_epoch(self, ctx: RequestContext, request: Any) -> Any:
        """Where each asked leader epoch ended on the partition's leader: a consumer validates
        its position after the leader changed (KIP-320) and truncates what the new leader
        never had. A replica_id other than a consumer's (-1) is refused: followers fetch over
        broker RPC, never this way."""
        topics = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                entry: dict[str, Any] = {"error_code": ErrorCode.none,
                                         "partition": p.partition, "leader_epoch": -1,
                                         "end_offset": -1}
                try:
                    if getattr(request, "replica_id", -1) != -1:
                        raise NotLeaderOrFollowerError("replicas fetch over broker RPC")
                    entry["leader_epoch"], entry["end_offset"] = await self.backend.epoch_end(
                        topic.topic, p.partition, p.leader_epoch,
                        leader_epoch=p.current_leader_epoch)
                except TqError as exc:
                    entry["error_code"] = error_code_of(exc)
                partitions.append(entry)
            topics.append({"topic": topic.topic, "partitions": partitions})
        return build_response(ApiKey.OFFSET_FOR_LEADER_EPOCH, ctx.api_version,
                              {"throttle_time": 0, "topics": topics})

    async def init_producer_id(self, ctx: RequestContext, request: Any) -> Any:
        code, pid, epoch = ErrorCode.none, -1, -1
        try:
            if request.transactional_id is not None:
                if not await self.backend.coordinates(request.transactional_id):
                    code = ErrorCode.not_coordinator
                else:
                    pid, epoch = await self.backend.transactions.init_producer_id(
                        request.transactional_id, millis(request.transaction_timeout),
                        ctx.principal)
            else:
                pid, epoch = await self.backend.allocate_producer_id(), 0
        except TqError as exc:
            code, pid, epoch = error_code_of(exc), -1, -1
        return build_response(ApiKey.INIT_PRODUCER_ID, ctx.api_version, {
            "throttle_time": 0, "error_code": code, "producer_id": pid,
            "producer_epoch": epoch})

    # ---- CreateTopics ----------------------------------------------------------------------------

    async def create_topics(self, ctx: RequestContext, request: Any) -> Any:
        results = []
        for topic in request.topics:
            code, message = ErrorCode.none, None
            created: TopicInfo | None = None
            try:
                if topic.assignments:
                    code = ErrorCode.invalid_replica_assignment
                    message = ("tq places replicas itself: give a replication factor, not "
                               "replica assignments")
                else:
                    # validate_only checks all that creating would (name, partitions,
                    # existence) and creates nothing, as Kafka's. Replication factor -1: the
                    # cluster's default (DESIGN §5 "Replication").
                    partitions = None if topic.num_partitions == -1 else topic.num_partitions
                    factor = None if topic.replication_factor == -1 \
                        else topic.replication_factor
                    created = await self.backend.create_topic(
                        topic.name, partitions, validate_only=request.validate_only,
                        replication_factor=factor)
            except TqError as exc:
                code, message = error_code_of(exc), str(exc)
            # v5+ describe the topic created (-1 and no configs when none was; the configs
            # are left to DescribeConfigs: null, as Kafka sends them when it does not show
            # them); v7+ its topic id.
            results.append({
                "name": topic.name, "error_code": code, "error_message": message,
                "num_partitions": -1 if created is None else len(created.partitions),
                "replication_factor": -1 if created is None else max(
                    1, *(len(p.replicas) for p in created.partitions)),
                "configs": None,
                "topic_id": _NO_TOPIC_ID if created is None else created.kafka_id})
        return build_response(ApiKey.CREATE_TOPICS, ctx.api_version,
                              {"throttle_time": 0, "topics": results})


def _topic_error(name: str, code: ErrorCode) -> dict[str, Any]:
    return {"error_code": code, "name": name, "topic_id": _NO_TOPIC_ID, "is_internal": False,
            "partitions": ()}


def _produce_error(index: int, code: ErrorCode) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1, "log_start_offset": -1,
            "record_errors": (), "error_message": None}


def _single_batch(records: bytes | None) -> bytes:
    """Produce v3+ carries exactly one RecordBatch v2 per partition (as Kafka requires);
    transactional and control batches are refused."""
    if not records:
        raise InvalidRecordError("produce request without records")
    if len(records) > MAX_BATCH_SIZE:
        raise BatchTooLargeError(f"a batch of {len(records)} bytes is larger than any broker "
                                 f"accepts ({MAX_BATCH_SIZE})")
    header = read_header(records)
    if header.size != len(records):
        raise InvalidRecordError("produce request must hold exactly one record batch")
    if header.attributes & _CONTROL:
        raise InvalidRecordError("clients may not produce control batches")
    return records


def oversized_produce_response(version: int, prefix: bytes, offset: int) -> Any:
    """The response to a Produce request over the frame limit, of which only `prefix` was kept
    (the body from `offset`): MESSAGE_TOO_LARGE for every partition named before the prefix
    ends (librdkafka sends one partition per request: all of them), as Kafka answers a batch
    over its maximum. None for acks=0 (the client reads no response)."""
    flexible = is_flexible(ApiKey.PRODUCE, version)
    pos = offset
    found: list[tuple[str, list[int]]] = []

    def length(nullable_int16: bool) -> int:
        nonlocal pos
        if flexible:
            size, pos = read_uvarint(prefix, pos)
            return size - 1
        fmt = _I16 if nullable_int16 else _I32
        (size,) = fmt.unpack_from(prefix, pos)
        pos += fmt.size
        return size

    try:
        skip = max(length(True), 0)  # transactional_id (`length` moves pos: not +=)
        pos += skip
        (acks,) = _I16.unpack_from(prefix, pos)
        if acks == 0:
            return None
        pos += _I16.size + _I32.size  # acks, timeout
        for _ in range(length(False)):
            name_size = length(True)
            if not 0 <= name_size <= len(prefix) - pos:
                break
            name = prefix[pos:pos + name_size].decode()
            pos += name_size
            found.append((name, []))
            for _ in range(length(False)):
                (index,) = _I32.unpack_from(prefix, pos)
                pos += _I32.size
                found[-1][1].append(index)
                skip = max(length(False), 0)  # the records
                pos += skip
                if flexible:
                    pos = skip_tagged_fields(prefix, pos)
            if flexible:
                pos = skip_tagged_fields(prefix, pos)
    except (struct.error, UnicodeDecodeError, TqError):
        pass  # the prefix ended (or is garbage): answer for what it named
    responses = [{"name": name, "partition_responses": [
        _produce_error(index, ErrorCode.message_too_large) for index in indices]}
        for name, indices in found]
    return build_response(ApiKey.PRODUCE, version, {"responses": responses,
                                                    "throttle_time": 0})


_LEGACY_PARTITION_V0 = struct.Struct(">ihq")  # partition, error_code, base_offset
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def legacy_produce_response(version: int, responses: Sequence[dict[str, Any]]) -> bytes:
    """ProduceResponse v0-2 (kio has no schema for them):
    [topic:string [partition:int32 error_code:int16 base_offset:int64
    log_append_time:int64 (v2)]] throttle_time_ms:int32 (v1+)."""
    out = bytearray(_I32.pack(len(responses)))
    for topic in responses:
        name = topic["name"].encode()
        out += _I16.pack(len(name)) + name + _I32.pack(len(topic["partition_responses"]))
        for p in topic["partition_responses"]:
            out += _LEGACY_PARTITION_V0.pack(p["index"], p["error_code"], p["base_offset"])
            if version >= 2:
                out += _I64.pack(-1)
    if version >= 1:
        out += _I32.pack(0)
    return bytes(out)
