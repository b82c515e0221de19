"""Request handlers for Kafka's admin apis on topics and the cluster: DeleteTopics,
CreatePartitions, DeleteRecords, DescribeConfigs, IncrementalAlterConfigs, DescribeCluster.
(DeleteGroups and OffsetDelete are group apis: `_group_service`.)

Each takes kio's decoded request and answers with a response built from a version-free dict,
using only the `KafkaBackend`; who may do what is the backend's decision (a topic's writers
and the admin may delete it or its records, DESIGN §12), its refusals are error codes per
topic or partition. Requests are bounded by the listener (`ListenerLimits.max_request_bytes`).
No sockets.
"""

from __future__ import annotations

from typing import Any

from catalog.errors import InvalidConfigError, TqError
from querylib.kafka._apis import ApiKey, build_response
from querylib.kafka._errors import ErrorCode, error_code_of

from ._backend import ConfigEntry, KafkaBackend
from ._handlers import RequestContext

__all__ = ["AdminHandlers"]

_TOPIC, _BROKER = 2, 4  # DescribeConfigs resource types
_SET, _DELETE = 0, 1  # IncrementalAlterConfigs operations (2 APPEND, 3 SUBTRACT)
_BROKERS = 1  # DescribeCluster endpoint type (2: controllers, which no client reaches here)
_NOT_ASKED = -2147483648  # authorized operations not computed (Kafka's INT32_MIN)


class AdminHandlers:
    def __init__(self, backend: KafkaBackend) -> None:
        self.backend = backend

    async def delete_topics(self, ctx: RequestContext, request: Any) -> Any:
        results = []
        for name in request.topic_names:
            code = ErrorCode.none
            try:
                await self.backend.delete_topic(name, ctx.principal)
            except TqError as exc:
                code = error_code_of(exc)
            results.append({"name": name, "error_code": code})
        return build_response(ApiKey.DELETE_TOPICS, ctx.api_version,
                              {"throttle_time": 0, "responses": results})

    async def create_partitions(self, ctx: RequestContext, request: Any) -> Any:
        results = []
        for topic in request.topics:
            code, message = ErrorCode.none, None
            try:
                if topic.assignments:
                    code, message = ErrorCode.invalid_request, "manual assignments unsupported"
                else:
                    await self.backend.create_partitions(
                        topic.name, topic.count, ctx.principal,
                        validate_only=request.validate_only)
            except TqError as exc:
                code, message = error_code_of(exc), str(exc)
            results.append({"name": topic.name, "error_code": code, "error_message": message})
        return build_response(ApiKey.CREATE_PARTITIONS, ctx.api_version,
                              {"throttle_time": 0, "results": results})

    async def incremental_alter_configs(self, ctx: RequestContext, request: Any) -> Any:
        """SET and DELETE of the topic configs tq keeps per topic (TOPIC_CONFIGS, in the
        catalog); a broker's configs are what it was started with."""
        results = []
        for resource in request.resources:
            code, message = ErrorCode.none, None
            try:
                if resource.resource_type != _TOPIC:
                    raise InvalidConfigError(
                        "a broker's configs are its start flags; only topic configs change")
                changes: dict[str, str | None] = {}
                for config in resource.configs:
                    if config.config_operation == _SET:
                        changes[config.name] = config.value or ""
                    elif config.config_operation == _DELETE:
                        changes[config.name] = None
                    else:
                        raise InvalidConfigError(f"{config.name}: APPEND and SUBTRACT are for "
                                                 "list configs; tq sets none per topic")
                await self.backend.alter_topic_configs(
                    resource.resource_name, changes, ctx.principal,
                    validate_only=request.validate_only)
            except TqError as exc:
                code, message = error_code_of(exc), str(exc)
            results.append({"error_code": code, "error_message": message,
                            "resource_type": resource.resource_type,
                            "resource_name": resource.resource_name})
        return build_response(ApiKey.INCREMENTAL_ALTER_CONFIGS, ctx.api_version,
                              {"throttle_time": 0, "responses": results})

    async def delete_records(self, ctx: RequestContext, request: Any) -> Any:
        topics = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                entry = {"partition_index": p.partition_index, "error_code": ErrorCode.none,
                         "low_watermark": -1}
                try:
                    entry["low_watermark"] = await self.backend.delete_records(
                        topic.name, p.partition_index, p.offset, ctx.principal)
                except TqError as exc:
                    entry["error_code"] = error_code_of(exc)
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return build_response(ApiKey.DELETE_RECORDS, ctx.api_version,
                              {"throttle_time": 0, "topics": topics})

    async def describe_configs(self, ctx: RequestContext, request: Any) -> Any:
        """The topic configs tq honours, each from the broker's setting of it, and the
        broker's own (resource name: its node id, or "" for the cluster's defaults)."""
        synonyms = getattr(request, "include_synonyms", False)
        results = []
        for resource in request.resources:
            code, message, entries = ErrorCode.none, None, []
            try:
                if resource.resource_type == _TOPIC:
                    entries = await self.backend.topic_configs(resource.resource_name)
                elif resource.resource_type == _BROKER and resource.resource_name in (
                        "", str(self.backend.controller_id), *(
                            str(b.node_id) for b in self.backend.brokers()[:1])):
                    entries = self.backend.broker_configs()
                else:
                    code = ErrorCode.invalid_request
                    message = (f"resource type {resource.resource_type} "
                               f"{resource.resource_name!r}: ask the broker it names")
            except TqError as exc:
                code, message = error_code_of(exc), str(exc)
            wanted = resource.configuration_keys
            configs = [_config(e, synonyms) for e in entries
                       if wanted is None or e.name in wanted]
            results.append({"error_code": code, "error_message": message,
                            "resource_type": resource.resource_type,
                            "resource_name": resource.resource_name, "configs": configs})
        return build_response(ApiKey.DESCRIBE_CONFIGS, ctx.api_version,
                              {"throttle_time": 0, "results": results})

    async def describe_cluster(self, ctx: RequestContext, request: Any) -> Any:
        backend = self.backend
        if getattr(request, "endpoint_type", _BROKERS) != _BROKERS:  # v1+: controllers
            return build_response(ApiKey.DESCRIBE_CLUSTER, ctx.api_version, {
                "throttle_time": 0, "error_code": ErrorCode.unsupported_endpoint_type,
                "error_message": "tq's listeners are brokers", "endpoint_type":
                request.endpoint_type, "cluster_id": backend.cluster_id, "controller_id": -1,
                "brokers": (), "cluster_authorized_operations": _NOT_ASKED})
        return build_response(ApiKey.DESCRIBE_CLUSTER, ctx.api_version, {
            "throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "endpoint_type": _BROKERS,
            "cluster_id": backend.cluster_id, "controller_id": backend.controller_id,
            "brokers": [{"broker_id": b.node_id, "host": b.host, "port": b.port,
                         "rack": b.rack, "is_fenced": False} for b in backend.brokers()],
            "cluster_authorized_operations": _NOT_ASKED})


def _config(entry: ConfigEntry, synonyms: bool) -> dict[str, Any]:
    listed = []
    if synonyms:
        listed.append({"name": entry.name, "value": entry.value, "source": entry.source})
        if entry.synonym is not None:
            listed.append({"name": entry.synonym, "value": entry.value,
                           "source": entry.source})
    return {"name": entry.name, "value": entry.value, "read_only": entry.read_only,
            "config_source": entry.source, "is_default": entry.source == 5,
            "is_sensitive": False, "synonyms": listed, "config_type": entry.config_type,
            "documentation": None}
