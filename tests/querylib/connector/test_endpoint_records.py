"""How connector messages become records: encode_messages writes exactly what the reference
encoder (querylib.records.encode_batch) writes for the documented field mapping; stream names
map to topics and partitions unambiguously; the last message id is found again."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog.errors import InvalidTopicNameError
from querylib.connector import FLAGS_HEADER, MSGID_HEADER, MalformedFrameError, parse_stream_name
from querylib.connector._records import encode_messages, last_message_id, source_id
from querylib.records import TIME_HEADER, decode_batch, encode_batch

_Q, _H = struct.Struct(">Q"), struct.Struct(">H")

message = st.tuples(
    st.integers(0, 2**64 - 1),
    st.binary(max_size=300) | st.just(b"x" * 9000),
    st.none() | st.integers(-(2**63), 2**63 - 1)
    | st.integers(1_600_000_000_000, 1_800_000_000_000),
    st.none() | st.binary(max_size=20),
    st.sampled_from([0, 0, 0, 1, 8, 16, 17]),
)


def reference(messages, time, now_ms, producer_id):
    entries = []
    for mid, payload, event_time, key, flags in messages:
        headers = [(TIME_HEADER, _Q.pack(time % 2**64)), (MSGID_HEADER, _Q.pack(mid))]
        if flags:
            headers.append((FLAGS_HEADER, _H.pack(flags)))
        entries.append((now_ms if event_time is None else event_time, key, payload, headers))
    return encode_batch(entries, producer_id=producer_id, producer_epoch=0)


@given(messages=st.lists(message, min_size=1, max_size=40), time=st.integers(0, 2**63 - 1),
       now_ms=st.integers(0, 2**62), producer_id=st.integers(0, 2**63 - 1))
def test_encode_messages_matches_the_reference_encoder(messages, time, now_ms, producer_id):
    got = encode_messages(messages, time=time, now_ms=now_ms, producer_id=producer_id)
    assert got == reference(messages, time, now_ms, producer_id)
    batch = decode_batch(got)
    assert batch.producer_id == producer_id
    assert [r.value for r in batch.records] == [m[1] for m in messages]


def test_many_records_cross_the_varint_tables():
    messages = [(i, b"v", None, None, 0) for i in range(9000)]
    got = encode_messages(messages, time=3, now_ms=5, producer_id=1)
    assert got == reference(messages, 3, 5, 1)


def test_an_event_time_outside_int64_is_the_connectors_fault():
    with pytest.raises(MalformedFrameError):
        encode_messages([(1, b"", 2**63, None, 16)], time=0, now_ms=0, producer_id=0)


def test_last_message_id_skips_ephemeral_records():
    messages = [(1, b"", None, None, 0), (9, b"", None, None, 0), (3, b"", None, None, 1)]
    batch = decode_batch(encode_messages(messages, time=0, now_ms=0, producer_id=0))
    assert last_message_id(batch) == 9
    only = decode_batch(encode_messages(messages[2:], time=0, now_ms=0, producer_id=0))
    assert last_message_id(only) is None


@pytest.mark.parametrize(("name", "topic", "partition"), [
    ("events", "events", 0),
    ("events:3", "events", 3),
    ("events/3", "events", 3),
    ("t/ns/events", "t/ns/events", 0),
    ("t/ns/events/7", "t/ns/events", 7),
    ("t/ns/events:7", "t/ns/events", 7),
    ("t/ns/5", "t/ns/5", 0),  # two '/': the last part is a name, even made of digits
    ("persistent://t/ns/events", "t/ns/events", 0),
    ("persistent://t/ns/events/2", "t/ns/events", 2),
    ("persistent://public/default/events:1", "events", 1),
])
def test_stream_names_map_to_topic_and_partition(name, topic, partition):
    parsed, number = parse_stream_name(name)
    assert (parsed.short, number) == (topic, partition)


@pytest.mark.parametrize("name", ["", "a:", "a:x", "a:-1", "a:99999999999", "a/b", "a/b/c/d/e",
                                  "a b", "a/x/", "x" * 2000, "a:1:2"])
def test_bad_stream_names_are_refused_with_a_reason(name):
    with pytest.raises(InvalidTopicNameError):
        parse_stream_name(name)


def test_source_ids_are_stable_and_distinct():
    assert source_id("p", "i", 1) == source_id("p", "i", 1)
    assert len({source_id("p", "i", s) for s in range(1000)}) == 1000
    assert 0 <= source_id("p", "i", 2**64 - 1) < 2**63
