"""The record formats of `__consumer_offsets`, as Kafka's group coordinator writes them, so
Kafka's tools (and ours) can read a tq offsets topic.

Each record's key and value start with an int16 version; a null value (tombstone) deletes.

    OffsetCommitKey v1      group:string topic:string partition:int32
    OffsetCommitValue v3    offset:int64 leader_epoch:int32 metadata:string commit_timestamp:int64
    GroupMetadataKey v2     group:string
    GroupMetadataValue v3   protocol_type:string generation:int32 protocol:nullable string
                            leader:nullable string current_state_timestamp:int64
                            members:[member_id:string group_instance_id:nullable string
                                     client_id:string client_host:string
                                     rebalance_timeout:int32 session_timeout:int32
                                     subscription:bytes assignment:bytes]

    GroupOwnerKey v29761    group:string             tq's own (0x7441, "tA"), not Kafka's:
    GroupOwnerValue v0      principal:string         who may use the group (DESIGN §12)

OffsetCommitKey v0 (same fields as v1) and OffsetCommitValue v1 (with an expire timestamp) are
read too. Kafka's tools do not read the group-owner records (a key version they do not know);
tq writes them only where groups are authorized. The schemas are declarations that kio's
serializer reads, as it reads its own generated ones. Pure: bytes in, values out.
"""

# No `from __future__ import annotations`: kio reads the field types of the schema classes
# below at runtime, so they must be real types, not strings.
import io
import struct
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16
from kio.static.protocol import Entity

from catalog.errors import StorageError
from querylib._kio import KIO_DECODE_ERRORS
from querylib._kio_shape import check_shape

from ._backend import CommittedOffset, GroupMemberRecord, GroupRecord

E = TypeVar("E", bound=Entity)

__all__ = [
    "GroupOwner",
    "GroupTombstone",
    "OwnerTombstone",
    "OffsetTombstone",
    "decode_offsets_record",
    "encode_group",
    "encode_group_owner",
    "encode_offset",
]

GROUP_OWNER_KEY_VERSION = 0x7441

_VERSION = struct.Struct(">h")
_INT32 = {"kafka_type": "int32"}
_INT64 = {"kafka_type": "int64"}
_STRING = {"kafka_type": "string"}
_BYTES = {"kafka_type": "bytes"}


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitKey:
    __type__: ClassVar[EntityType] = EntityType.data
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    group: str = field(metadata=_STRING)
    topic: str = field(metadata=_STRING)
    partition: int = field(metadata=_INT32)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitValueV1:
    __type__: ClassVar[EntityType] = EntityType.data
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    offset: int = field(metadata=_INT64)
    metadata: str = field(metadata=_STRING)
    commit_timestamp: int = field(metadata=_INT64)
    expire_timestamp: int = field(metadata=_INT64)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitValueV3:
    __type__: ClassVar[EntityType] = EntityType.data
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = False
    offset: int = field(metadata=_INT64)
    leader_epoch: int = field(metadata=_INT32)
    metadata: str = field(metadata=_STRING)
    commit_timestamp: int = field(metadata=_INT64)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataKey:
    __type__: ClassVar[EntityType] = EntityType.data
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    group: str = field(metadata=_STRING)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberMetadataV3:
    __type__: ClassVar[EntityType] = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = False
    member_id: str = field(metadata=_STRING)
    group_instance_id: str | None = field(metadata=_STRING)
    client_id: str = field(metadata=_STRING)
    client_host: str = field(metadata=_STRING)
    rebalance_timeout: int = field(metadata=_INT32)
    session_timeout: int = field(metadata=_INT32)
    subscription: bytes = field(metadata=_BYTES)
    assignment: bytes = field(metadata=_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataValueV3:
    __type__: ClassVar[EntityType] = EntityType.data
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = False
    protocol_type: str = field(metadata=_STRING)
    generation: int = field(metadata=_INT32)
    protocol: str | None = field(metadata=_STRING)
    leader: str | None = field(metadata=_STRING)
    current_state_timestamp: int = field(metadata=_INT64)
    members: tuple[MemberMetadataV3, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupOwnerValue:
    __type__: ClassVar[EntityType] = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    principal: str = field(metadata=_STRING)


@dataclass(frozen=True, slots=True)
class GroupOwner:
    """The principal a group belongs to: the first to join or commit it."""

    group_id: str
    principal: str


@dataclass(frozen=True, slots=True)
class OffsetTombstone:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupTombstone:
    group_id: str


@dataclass(frozen=True, slots=True)
class OwnerTombstone:
    """Takes back a group's owner record: only where a replica of the group state says it
    was never written (a claim whose replication failed, DESIGN §3 "Coordinator failover")."""

    group_id: str


def _write(entity: Entity, version: int) -> bytes:
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(version))
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def encode_offset(group_id: str, committed: CommittedOffset) -> tuple[bytes, bytes]:
    """(key, value) of one committed offset."""
    key = OffsetCommitKey(group=group_id, topic=committed.topic, partition=committed.partition)
    value = OffsetCommitValueV3(offset=committed.offset, leader_epoch=committed.leader_epoch,
                                metadata=committed.metadata,
                                commit_timestamp=committed.commit_timestamp)
    return _write(key, 1), _write(value, 3)


def encode_group(record: GroupRecord) -> tuple[bytes, bytes]:
    """(key, value) of a group's state after a rebalance."""
    members = tuple(
        MemberMetadataV3(member_id=m.member_id, group_instance_id=m.group_instance_id,
                         client_id=m.client_id, client_host=m.client_host,
                         rebalance_timeout=m.rebalance_timeout_ms,
                         session_timeout=m.session_timeout_ms, subscription=m.subscription,
                         assignment=m.assignment)
        for m in record.members)
    value = GroupMetadataValueV3(
        protocol_type=record.protocol_type, generation=record.generation,
        protocol=record.protocol, leader=record.leader,
        current_state_timestamp=record.current_state_timestamp, members=members)
    return _write(GroupMetadataKey(group=record.group_id), 2), _write(value, 3)


def offset_tombstone_key(group_id: str, topic: str, partition: int) -> bytes:
    """The key whose null value deletes a committed offset (OffsetDelete, DeleteGroups)."""
    return _write(OffsetCommitKey(group=group_id, topic=topic, partition=partition), 1)


def group_tombstone_key(group_id: str) -> bytes:
    """The key whose null value deletes a group's state (DeleteGroups)."""
    return _write(GroupMetadataKey(group=group_id), 2)


def encode_group_owner(owner: GroupOwner) -> tuple[bytes, bytes]:
    """(key, value) of the record saying who a group belongs to."""
    return (_write(GroupMetadataKey(group=owner.group_id), GROUP_OWNER_KEY_VERSION),
            _write(GroupOwnerValue(principal=owner.principal), 0))


def _read(cls: type[E], data: bytes, pos: int) -> E:
    check_shape(cls, data, pos, StorageError)
    entity, size = entity_reader(cls)(data, pos)
    if pos + size != len(data):
        raise StorageError(f"{len(data) - pos - size} bytes after a {cls.__name__}")
    return entity


def decode_offsets_record(
    key: bytes | None, value: bytes | None
) -> (tuple[str, CommittedOffset] | GroupRecord | GroupOwner | OffsetTombstone | GroupTombstone
      | OwnerTombstone):
    """One record of `__consumer_offsets`: (group id, committed offset), a group, or a
    tombstone. StorageError for bytes that are none of Kafka's formats (other record kinds,
    such as transaction markers, included)."""
    if key is None or len(key) < 2:
        raise StorageError("offsets record without a versioned key")
    (version,) = _VERSION.unpack_from(key, 0)
    try:
        if version in (0, 1):
            k = _read(OffsetCommitKey, key, 2)
            assert isinstance(k, OffsetCommitKey)
            if value is None:
                return OffsetTombstone(k.group, k.topic, k.partition)
            return k.group, _decode_offset_value(k, value)
        if version == 2:
            g = _read(GroupMetadataKey, key, 2)
            assert isinstance(g, GroupMetadataKey)
            if value is None:
                return GroupTombstone(g.group)
            return _decode_group_value(g.group, value)
        if version == GROUP_OWNER_KEY_VERSION and value is None:
            return OwnerTombstone(_read(GroupMetadataKey, key, 2).group)
        if version == GROUP_OWNER_KEY_VERSION and value is not None and len(value) >= 2:
            g = _read(GroupMetadataKey, key, 2)
            o = _read(GroupOwnerValue, value, 2)
            assert isinstance(g, GroupMetadataKey) and isinstance(o, GroupOwnerValue)
            return GroupOwner(g.group, o.principal)
    except KIO_DECODE_ERRORS as exc:
        raise StorageError(f"offsets record does not decode: {exc}") from exc
    raise StorageError(f"offsets record key version {version} is not one tq reads")


def _decode_offset_value(key: OffsetCommitKey, value: bytes) -> CommittedOffset:
    if len(value) < 2:
        raise StorageError("offset commit value without a version")
    (version,) = _VERSION.unpack_from(value, 0)
    if version == 3:
        v3 = _read(OffsetCommitValueV3, value, 2)
        assert isinstance(v3, OffsetCommitValueV3)
        return CommittedOffset(key.topic, key.partition, v3.offset, v3.leader_epoch,
                               v3.metadata, v3.commit_timestamp)
    if version == 1:
        v1 = _read(OffsetCommitValueV1, value, 2)
        assert isinstance(v1, OffsetCommitValueV1)
        return CommittedOffset(key.topic, key.partition, v1.offset, -1, v1.metadata,
                               v1.commit_timestamp)
    raise StorageError(f"offset commit value version {version} is not one tq reads")


def _decode_group_value(group_id: str, value: bytes) -> GroupRecord:
    if len(value) < 2:
        raise StorageError("group metadata value without a version")
    (version,) = _VERSION.unpack_from(value, 0)
    if version != 3:
        raise StorageError(f"group metadata value version {version} is not one tq reads")
    v = _read(GroupMetadataValueV3, value, 2)
    assert isinstance(v, GroupMetadataValueV3)
    members = tuple(
        GroupMemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                          m.rebalance_timeout, m.session_timeout, m.subscription, m.assignment)
        for m in v.members)
    return GroupRecord(group_id, v.protocol_type, v.generation, v.protocol, v.leader,
                       v.current_state_timestamp, members)
