"""The Kafka apis the endpoint serves, their version ranges, and the kio codec around them.

Request and response schemas come from `kio` (generated from Kafka's JSON message specs): a
request body decodes to kio's dataclass for that api and version, and a handler's response,
written once as a version-free dict using Kafka's field names, is built into the kio
dataclass of the requested version (`build_response`: fields an older version lacks are
dropped) and encoded by kio. Two exceptions, each for a reason:

- Fetch responses are framed by `_fetch` so record batches go from the log file to the socket
  unchanged (sendfile) instead of through a bytes field;
- Produce v0-2 (advertised only because librdkafka probes for v0) are answered with
  UNSUPPORTED_VERSION by `_produce_legacy`, as Kafka 4 does; kio has no schema below v3.

Bounds: every frame is size-limited before it is buffered (`ListenerLimits`); kio decodes
within the frame, and only after the body's every length and count was checked against the
frame (`querylib._kio_shape`; Produce: `check_produce_shape`, which also caps the partition
entries so a frame of many tiny ones cannot become millions of Python objects): kio's native
decoder trusts counts, and a count of 10^10 aborts the process in an allocation.
"""

from __future__ import annotations

import datetime
import enum
import functools
import io
import struct
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, fields
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from catalog.errors import ProtocolError
from querylib._kio import KIO_DECODE_ERRORS
from querylib._kio_shape import check_shape
from querylib.kafka._errors import MalformedRequestError, UnsupportedApiVersionError
from querylib.kafka._framing import read_uvarint, skip_tagged_fields

__all__ = [
    "ApiKey",
    "ListenerLimits",
    "SUPPORTED_VERSIONS",
    "build_response",
    "check_produce_shape",
    "decode_request",
    "decode_response",
    "encode_response",
    "is_flexible",
    "is_supported",
    "millis",
    "response_header_flexible",
]


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60


# What ApiVersions advertises: up to the versions current clients send (librdkafka 2.x,
# kafka-python, aiokafka; Kafka 4's own ranges), flexible ones included (DESIGN §8 "Flexible
# versions"); each version's semantics are served, not only its encoding. Not served: versions
# that name topics by id in place of names (Produce v13, OffsetCommit/OffsetFetch v10), and
# those whose new semantics tq lacks (ListOffsets v9+ tiered offsets, FindCoordinator v5+
# share groups).
SUPPORTED_VERSIONS: Mapping[int, tuple[int, int]] = types.MappingProxyType({
    ApiKey.PRODUCE: (0, 12),  # v0-2 answered with UNSUPPORTED_VERSION, see the module docstring
    ApiKey.FETCH: (4, 17),
    ApiKey.LIST_OFFSETS: (1, 8),
    ApiKey.METADATA: (0, 13),
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 9),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 6),
    ApiKey.LIST_GROUPS: (0, 5),
    # Advertised from v0 because librdkafka 2.0 (Debian's kcat) looks for v0 to call SASL
    # supported; clients then send v1 and SaslAuthenticate. A v0 handshake's raw tokens (no
    # Kafka framing; gone from Kafka 4, KIP-896) are refused: its answer says so.
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 3),
    ApiKey.DELETE_RECORDS: (0, 1),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),  # v2: current_leader_epoch (KIP-320)
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 2),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 2),
    ApiKey.END_TXN: (0, 2),
    ApiKey.TXN_OFFSET_COMMIT: (0, 2),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 1),
    ApiKey.DELETE_GROUPS: (0, 1),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 0),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),  # flexible only; both admin clients use it
})
LEGACY_PRODUCE_VERSIONS = range(0, 3)


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """Bounds on what the listener holds for its clients (DESIGN §8 "Bounded listeners").

    max_frame_bytes             the largest request (Kafka's socket.request.max.bytes)
    max_request_bytes           every api but Produce carries no records
    max_produce_partitions      partition entries in one Produce request
    max_connections             connections this listener holds at once (Kafka's
                                max.connections); None: only the process's budget, which
                                keeps every listener below the open-files limit with a reserve
    max_connections_per_address from one client address (max.connections.per.ip)
    idle_timeout_ms             a connection without a request for this long is closed
                                (connections.max.idle.ms, 10 minutes)
    max_inflight_request_bytes  request bytes read ahead of the one being handled; above it
                                the connection is not read (muted) until requests are answered,
                                so one connection holds at most its current request plus this
                                plus one read (256 KiB)
    """

    max_frame_bytes: int = 100 * 1024 * 1024
    max_request_bytes: int = 1024 * 1024
    max_produce_partitions: int = 10_000
    max_connections: int | None = None
    max_connections_per_address: int | None = None
    idle_timeout_ms: int = 600_000
    max_inflight_request_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_request_bytes", "max_produce_partitions",
                     "idle_timeout_ms", "max_inflight_request_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ListenerLimits.{name} must be at least 1")
        for name in ("max_connections", "max_connections_per_address"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"ListenerLimits.{name} must be at least 1 (or None)")


def is_supported(api_key: int, version: int) -> bool:
    span = SUPPORTED_VERSIONS.get(api_key)
    return span is not None and span[0] <= version <= span[1]


@functools.cache
def _payload_class(api_key: int, version: int, entity_type: EntityType) -> type[Any]:
    module = load_payload_module(api_key, version, entity_type)  # type: ignore[arg-type]  # kio: request or response only
    name = ApiKey(api_key).name.title().replace("_", "")
    suffix = "Request" if entity_type is EntityType.request else "Response"
    return getattr(module, name + suffix)


@functools.cache
def is_flexible(api_key: int, version: int) -> bool:
    """Whether this api version uses request header v2 and compact encodings."""
    if not is_supported(api_key, version):
        # ApiVersions at a version from the future: its header is v2 from v3 on, which only
        # matters for reading past the client_id, which we never need to.
        return api_key == ApiKey.API_VERSIONS and version >= 3
    if api_key == ApiKey.PRODUCE and version in LEGACY_PRODUCE_VERSIONS:
        return False
    return bool(_payload_class(api_key, version, EntityType.request).__flexible__)


def response_header_flexible(api_key: int, version: int) -> bool:
    """Response header v1 goes with flexible versions, except for ApiVersions (always v0)."""
    return api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version)


@functools.cache
def _reader(api_key: int, version: int) -> Callable[[bytes, int], tuple[Any, int]]:
    return entity_reader(_payload_class(api_key, version, EntityType.request))


def decode_request(
    api_key: int, version: int, frame: bytes, offset: int, *, max_produce_partitions: int = 10_000
) -> Any:
    """The request body at `frame[offset:]` as kio's dataclass for this api and version.

    Raises UnsupportedApiVersionError outside the advertised ranges and MalformedRequestError
    for a body that does not decode or leaves bytes over."""
    if not is_supported(api_key, version):
        raise UnsupportedApiVersionError(f"api key {api_key} version {version} is not supported")
    if api_key == ApiKey.PRODUCE and version in LEGACY_PRODUCE_VERSIONS:
        # v0-2 are v3 without the leading transactional_id: read them as v3 with a null one.
        frame, offset, version = b"\xff\xff" + frame[offset:], 0, 3
    if api_key == ApiKey.PRODUCE:
        # The Produce walk is a whole shape guard (Produce has no tagged fields kio reads)
        # that also bounds the partition entries; record bytes stay unread.
        check_produce_shape(frame, offset, max_produce_partitions,
                            flexible=version >= FLEXIBLE_PRODUCE)
    else:
        check_shape(_payload_class(api_key, version, EntityType.request), frame, offset,
                    MalformedRequestError)
    try:
        request, size = _reader(api_key, version)(frame, offset)
    except KIO_DECODE_ERRORS as exc:
        raise MalformedRequestError(
            f"{ApiKey(api_key).name} v{version} body does not decode: {exc}") from exc
    if offset + size != len(frame) and not _librdkafka_all_topics(api_key, version, request,
                                                                  len(frame) - offset - size):
        raise MalformedRequestError(
            f"{ApiKey(api_key).name} v{version}: {len(frame) - offset - size} bytes after "
            "the body")
    return request


def _librdkafka_all_topics(api_key: int, version: int, request: Any, extra: int) -> bool:
    """librdkafka (2.x) asks Metadata v9+ for all topics with the 4-byte placeholder it keeps
    for the topics count left in place: a null compact array (0) then 3 zero bytes, which
    read as the fields after it, and the real fields (3 bytes) are left over. Kafka ignores
    bytes after a body; here only these are (the fields read are false, as librdkafka sends
    them for a full listing)."""
    return (api_key == ApiKey.METADATA and version >= 9 and request.topics is None
            and extra == 3)


@functools.cache
def _response_reader(api_key: int, version: int) -> Callable[[bytes, int], tuple[Any, int]]:
    return entity_reader(_payload_class(api_key, version, EntityType.response))


def decode_response(api_key: int, version: int, frame: bytes, offset: int) -> Any:
    """The response body at `frame[offset:]` as kio's dataclass (tq's own Kafka client).

    Raises ProtocolError for a body that does not decode."""
    check_shape(_payload_class(api_key, version, EntityType.response), frame, offset,
                ProtocolError)
    try:
        response, _size = _response_reader(api_key, version)(frame, offset)
    except KIO_DECODE_ERRORS as exc:
        raise ProtocolError(
            f"{ApiKey(api_key).name} v{version} response does not decode: {exc}") from exc
    return response


def millis(value: datetime.timedelta) -> int:
    """kio decodes *_ms fields to timedeltas; handlers work in integer milliseconds."""
    return round(value.total_seconds() * 1000)


# ---- responses ----------------------------------------------------------------------------


def build_response(api_key: int, version: int, data: Mapping[str, Any]) -> Any:
    """kio's response dataclass for this version from a version-free dict: keys are Kafka's
    field names (kio's spelling); keys the version lacks are dropped, nested lists of dicts
    become nested entities, error codes become ErrorCode, `*_ms` timedeltas come from ints."""
    return _build(_payload_class(api_key, version, EntityType.response), data)


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    kwargs = {}
    for name, convert in _converters(cls):
        if name in data:
            value = data[name]
            kwargs[name] = value if convert is None else convert(value)
    return cls(**kwargs)


@functools.cache
def _converters(cls: type) -> tuple[tuple[str, Callable[[Any], Any] | None], ...]:
    return tuple((f.name, _converter(f)) for f in fields(cls))


def _converter(f: Field) -> Callable[[Any], Any] | None:
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type == "error_code":
        return ErrorCode
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return lambda ms: datetime.timedelta(milliseconds=ms)
    nested, many = _entity_type(f.type)
    if nested is None:
        return None
    if many:
        return lambda items: None if items is None else tuple(_build(nested, i) for i in items)
    return lambda item: None if item is None else _build(nested, item)


def _entity_type(annotation: Any) -> tuple[type | None, bool]:
    """(entity class, is a tuple of them) for a field's annotation, or (None, False)."""
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                return _entity_type(arg)
    if typing.get_origin(annotation) is tuple:
        inner = typing.get_args(annotation)[0]
        return (inner, True) if _is_entity(inner) else (None, False)
    return (annotation, False) if _is_entity(annotation) else (None, False)


def _is_entity(cls: Any) -> bool:
    return isinstance(cls, type) and hasattr(cls, "__dataclass_fields__") and hasattr(
        cls, "__flexible__")


@functools.cache
def _writer(cls: type) -> Callable[[Any, Any], None]:
    return entity_writer(cls)


def encode_response(response: Any) -> bytes:
    buffer = io.BytesIO()
    _writer(response.__class__)(buffer, response)
    return buffer.getvalue()


def required_fields(cls: type) -> list[str]:
    """Fields without defaults (for tests: a handler's dict must provide them)."""
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


# ---- Produce shape ------------------------------------------------------------------------

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
FLEXIBLE_PRODUCE = 9


def check_produce_shape(frame: bytes, offset: int, max_partitions: int = 10_000, *,
                        flexible: bool = False) -> None:
    """Walk a Produce v3+ body (transactional_id, acks, timeout, [name, [index, records]])
    without building objects; raise MalformedRequestError when it holds more than
    `max_partitions` partition entries or does not fit its frame. Record bytes stay unread.
    `flexible` (v9+): compact strings, arrays and records, tagged fields after each entry."""
    end = len(frame)
    string, count = (_skip_compact, _compact_count) if flexible else (_skip_string, _count)
    pos = string(frame, offset, end)  # transactional_id
    pos += 2 + 4  # acks, timeout
    topics, pos = count(frame, pos, end)
    seen = 0
    for _ in range(topics):
        pos = string(frame, pos, end)
        partitions, pos = count(frame, pos, end)
        seen += partitions
        if seen > max_partitions:
            raise MalformedRequestError(
                f"Produce request with more than {max_partitions} partition entries")
        for _ in range(partitions):
            pos += 4  # index
            size, pos = count(frame, pos, end, nullable=True)
            pos += size
            if pos > end:
                raise MalformedRequestError("Produce records run past the end of the request")
            if flexible:
                pos = skip_tagged_fields(frame, pos)
        if flexible:
            pos = skip_tagged_fields(frame, pos)
    if flexible:
        skip_tagged_fields(frame, pos)


def _compact_count(frame: bytes, pos: int, end: int, *,
                   nullable: bool = False) -> tuple[int, int]:
    """A compact array's count or compact bytes' size: uvarint n + 1, 0 for null."""
    value, pos = read_uvarint(frame, pos)
    if value == 0:
        if nullable:
            return 0, pos
        raise MalformedRequestError("null array in a Produce request")
    return value - 1, pos


def _skip_compact(frame: bytes, pos: int, end: int) -> int:
    size, pos = _compact_count(frame, pos, end, nullable=True)
    pos += size
    if pos > end:
        raise MalformedRequestError("Produce string runs past the end of the request")
    return pos


def _skip_string(frame: bytes, pos: int, end: int) -> int:
    if pos + 2 > end:
        raise MalformedRequestError("Produce request cut short")
    (length,) = _I16.unpack_from(frame, pos)
    pos += 2 + max(length, 0)
    if pos > end:
        raise MalformedRequestError("Produce string runs past the end of the request")
    return pos


def _count(frame: bytes, pos: int, end: int, *, nullable: bool = False) -> tuple[int, int]:
    if pos + 4 > end:
        raise MalformedRequestError("Produce request cut short")
    (count,) = _I32.unpack_from(frame, pos)
    if count < 0:
        if nullable and count == -1:
            return 0, pos + 4
        raise MalformedRequestError(f"negative length {count} in a Produce request")
    return count, pos + 4
