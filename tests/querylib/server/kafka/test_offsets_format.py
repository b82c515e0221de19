"""`__consumer_offsets` records in Kafka's formats: golden bytes, round trips, tombstones, and
StorageError (never anything else) for bytes that are none of them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog.errors import StorageError
from querylib.server.kafka import (
    CommittedOffset,
    GroupMemberRecord,
    GroupRecord,
    decode_offsets_record,
    encode_group,
    encode_offset,
)
from querylib.server.kafka._offsets_format import GroupTombstone, OffsetTombstone


def s(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_offset_commit_key_v1_and_value_v3_golden() -> None:
    key, value = encode_offset("g", CommittedOffset("t", 3, 42, 7, "meta", 1_700_000_000_000))
    assert key == b"\x00\x01" + s("g") + s("t") + struct.pack(">i", 3)
    assert value == (b"\x00\x03" + struct.pack(">qi", 42, 7) + s("meta")
                     + struct.pack(">q", 1_700_000_000_000))


def test_group_metadata_key_v2_and_value_v3_golden() -> None:
    member = GroupMemberRecord("m", None, "c", "/h", 300, 100, b"sub", b"as")
    key, value = encode_group(GroupRecord("g", "consumer", 5, "range", "m", 99, (member,)))
    assert key == b"\x00\x02" + s("g")
    assert value == (b"\x00\x03" + s("consumer") + struct.pack(">i", 5) + s("range") + s("m")
                     + struct.pack(">q", 99) + struct.pack(">i", 1)
                     + s("m") + b"\xff\xff" + s("c") + s("/h") + struct.pack(">ii", 300, 100)
                     + struct.pack(">i", 3) + b"sub" + struct.pack(">i", 2) + b"as")


texts = st.text(max_size=20)


@given(texts, texts, st.integers(0, 2**31 - 1), st.integers(-1, 2**63 - 1),
       st.integers(-1, 2**31 - 1), texts, st.integers(-1, 2**62))
def test_offsets_round_trip(group, topic, partition, offset, epoch, metadata, ts) -> None:
    committed = CommittedOffset(topic, partition, offset, epoch, metadata, ts)
    assert decode_offsets_record(*encode_offset(group, committed)) == (group, committed)


members = st.builds(GroupMemberRecord, texts, st.none() | texts, texts, texts,
                    st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1),
                    st.binary(max_size=20), st.binary(max_size=20))


@given(st.builds(GroupRecord, texts, texts, st.integers(0, 2**31 - 1), st.none() | texts,
                 st.none() | texts, st.integers(-1, 2**62),
                 st.lists(members, max_size=3).map(tuple)))
def test_groups_round_trip(record: GroupRecord) -> None:
    assert decode_offsets_record(*encode_group(record)) == record


def test_tombstones() -> None:
    key, _ = encode_offset("g", CommittedOffset("t", 1, 5))
    assert decode_offsets_record(key, None) == OffsetTombstone("g", "t", 1)
    key, _ = encode_group(GroupRecord("g", "consumer", 1, None, None, 0))
    assert decode_offsets_record(key, None) == GroupTombstone("g")


def test_offset_commit_value_v1_is_read() -> None:
    key, _ = encode_offset("g", CommittedOffset("t", 1, 5))
    v1 = b"\x00\x01" + struct.pack(">q", 17) + s("m") + struct.pack(">qq", 123, 456)
    assert decode_offsets_record(key, v1) == ("g", CommittedOffset("t", 1, 17, -1, "m", 123))


@pytest.mark.parametrize(("key", "value"), [
    (None, b""), (b"\x00", b""), (b"\x00\x05" + s("g"), b""),         # no / unknown key version
    (b"\x00\x01" + s("g"), b"\x00\x03"),                               # key cut short
    (b"\x00\x02" + s("g") + b"x", b""),                                # bytes after a key
    (b"\x00\x01" + s("g") + s("t") + b"\x00\x00\x00\x01", b"\x00\x09"),  # value version 9
    (b"\x00\x02" + s("g"), b"\x00\x03\x00"),                           # value cut short
    (b"\x00\x02" + s("g"), b"\x00\x01"),                               # group value version 1
])
def test_bytes_that_are_no_offsets_record(key, value) -> None:
    with pytest.raises(StorageError):
        decode_offsets_record(key, value)


@given(st.binary(max_size=40), st.none() | st.binary(max_size=80))
def test_random_bytes_raise_only_storage_errors(key: bytes, value: bytes | None) -> None:
    try:
        decode_offsets_record(key, value)
    except StorageError:
        pass
