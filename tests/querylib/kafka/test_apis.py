"""The kio codec around the served apis: every advertised request version decodes (round trip
through kio's own writer), bad bodies are MalformedRequestError, versions outside the ranges are
UnsupportedApiVersionError, responses build from version-free dicts, Produce shapes are bounded."""

from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records, i64Timedelta

from querylib.kafka import (
    SUPPORTED_VERSIONS,
    ApiKey,
    ErrorCode,
    MalformedRequestError,
    UnsupportedApiVersionError,
)
from querylib.kafka._apis import (
    build_response,
    check_produce_shape,
    decode_request,
    encode_response,
    is_flexible,
)
from querylib.server.kafka._handlers import legacy_produce_response
from tests.querylib.server.kafka._support import encode, make_request, request_class

# kio leaves record bytes to the user: any bytes will do for a round trip.
st.register_type_strategy(Records, st.binary(max_size=64).map(Records))
# kio decodes int64 millisecond durations into timedelta and overflows near the int64 bounds
# (e.g. an OffsetCommit retention_time of ~2**63 ms); clients send -1 or real durations, so the
# round trip is checked over durations Python's timedelta can hold.
# kio's own strategy for its i64Timedelta fields draws the whole int64 range, so it is replaced.
_DURATIONS = st.integers(-(2**40), 2**40).map(lambda ms: datetime.timedelta(milliseconds=ms))
st.register_type_strategy(datetime.timedelta, _DURATIONS)
st.register_type_strategy(i64Timedelta, _DURATIONS.map(i64Timedelta.parse))

SERVED = [(key, version) for key, (lo, hi) in SUPPORTED_VERSIONS.items()
          for version in range(lo, hi + 1) if not (key == ApiKey.PRODUCE and version < 3)]


@pytest.mark.parametrize(("api_key", "version"), SERVED)
@settings(max_examples=5, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_served_request_round_trips(api_key: int, version: int,
                                          data: st.DataObject) -> None:
    request = data.draw(st.from_type(request_class(api_key, version)))
    body = encode(request)
    assert decode_request(api_key, version, b"HDR" + body, 3) == request


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_trailing_and_missing_bytes_are_malformed(api_key: int, version: int) -> None:
    body = encode(make_request(api_key, version, **_minimal(api_key)))
    with pytest.raises(MalformedRequestError):
        decode_request(api_key, version, body + b"\x00", 0)
    if body:
        with pytest.raises(MalformedRequestError):
            decode_request(api_key, version, body[:-1], 0)


@pytest.mark.parametrize("version", range(9, SUPPORTED_VERSIONS[ApiKey.METADATA][1] + 1))
def test_librdkafkas_metadata_for_all_topics_with_its_placeholder_decodes(version: int) -> None:
    # As librdkafka 2.16 sends it (captured): the topics count's 4-byte placeholder left in.
    body = bytes.fromhex("00000000" "000000" if version >= 11 else "00000000" "00000000")
    request = decode_request(ApiKey.METADATA, version, body, 0)
    assert request.topics is None
    with pytest.raises(MalformedRequestError):  # nothing else is left over
        decode_request(ApiKey.METADATA, version, body + b"\x00", 0)


def _minimal(api_key: int) -> dict:
    """Enough fields for a request of any version of this api."""
    return {
        ApiKey.PRODUCE: {"acks": 1, "timeout": 1000, "topic_data": []},
        ApiKey.FETCH: {"max_wait": 0, "min_bytes": 0, "topics": [],
                       "forgotten_topics_data": []},
        ApiKey.LIST_OFFSETS: {"replica_id": -1, "isolation_level": 0, "topics": []},
        ApiKey.METADATA: {"topics": [], "include_cluster_authorized_operations": False,
                          "include_topic_authorized_operations": False},
        ApiKey.OFFSET_COMMIT: {"group_id": "g", "member_id": "", "topics": [],
                               "retention_time": -1},
        ApiKey.OFFSET_FETCH: {"group_id": "g", "topics": [], "groups": []},
        ApiKey.FIND_COORDINATOR: {"key": "g", "coordinator_keys": []},
        ApiKey.JOIN_GROUP: {"group_id": "g", "session_timeout": 1000, "member_id": "",
                            "protocol_type": "consumer", "protocols": []},
        ApiKey.HEARTBEAT: {"group_id": "g", "generation_id": 1, "member_id": "m"},
        ApiKey.LEAVE_GROUP: {"group_id": "g", "member_id": "m", "members": []},
        ApiKey.SYNC_GROUP: {"group_id": "g", "generation_id": 1, "member_id": "m",
                            "assignments": []},
        ApiKey.DESCRIBE_GROUPS: {"groups": [], "include_authorized_operations": False},
        ApiKey.LIST_GROUPS: {},
        ApiKey.API_VERSIONS: {"client_software_name": "t", "client_software_version": "1"},
        ApiKey.CREATE_TOPICS: {"topics": [], "timeout": 1000},
        ApiKey.INIT_PRODUCER_ID: {"transactional_id": None, "transaction_timeout": 1000},
        ApiKey.OFFSET_FOR_LEADER_EPOCH: {"replica_id": -1, "topics": []},
        ApiKey.DESCRIBE_CONFIGS: {"resources": []},
        ApiKey.DELETE_TOPICS: {"topic_names": [], "timeout": 1000},
        ApiKey.DELETE_RECORDS: {"topics": [], "timeout": 1000},
        ApiKey.DELETE_GROUPS: {"groups_names": []},
        ApiKey.CREATE_PARTITIONS: {"topics": [], "timeout": 1000, "validate_only": False},
        ApiKey.INCREMENTAL_ALTER_CONFIGS: {"resources": [], "validate_only": False},
        ApiKey.OFFSET_DELETE: {"group_id": "g", "topics": []},
        ApiKey.DESCRIBE_CLUSTER: {"include_cluster_authorized_operations": False,
                                  "endpoint_type": 1, "include_fenced_brokers": False},
        ApiKey.ADD_PARTITIONS_TO_TXN: {"v3_and_below_transactional_id": "t",
                                       "v3_and_below_producer_id": 1,
                                       "v3_and_below_producer_epoch": 0,
                                       "v3_and_below_topics": []},
        ApiKey.ADD_OFFSETS_TO_TXN: {"transactional_id": "t", "producer_id": 1,
                                    "producer_epoch": 0, "group_id": "g"},
        ApiKey.END_TXN: {"transactional_id": "t", "producer_id": 1, "producer_epoch": 0,
                         "committed": True},
        ApiKey.TXN_OFFSET_COMMIT: {"transactional_id": "t", "group_id": "g",
                                   "producer_id": 1, "producer_epoch": 0, "topics": []},
        ApiKey.SASL_HANDSHAKE: {"mechanism": "PLAIN"},
        ApiKey.SASL_AUTHENTICATE: {"auth_bytes": b""},
    }[api_key]


@pytest.mark.parametrize(("api_key", "version"), [
    (ApiKey.FETCH, 3), (ApiKey.FETCH, 18), (ApiKey.METADATA, 14), (ApiKey.API_VERSIONS, 5),
    (ApiKey.OFFSET_COMMIT, 10), (ApiKey.OFFSET_FETCH, 10), (ApiKey.PRODUCE, 13),
    (ApiKey.LIST_OFFSETS, 9), (ApiKey.END_TXN, 3), (27, 0), (-1, 0), (1000, 0)])
def test_versions_outside_the_ranges_are_unsupported(api_key: int, version: int) -> None:
    with pytest.raises(UnsupportedApiVersionError):
        decode_request(api_key, version, b"", 0)


# The first flexible version of each api (Kafka's *.json "flexibleVersions").
FIRST_FLEXIBLE = {
    ApiKey.PRODUCE: 9, ApiKey.FETCH: 12, ApiKey.LIST_OFFSETS: 6, ApiKey.METADATA: 9,
    ApiKey.OFFSET_COMMIT: 8, ApiKey.OFFSET_FETCH: 6, ApiKey.FIND_COORDINATOR: 3,
    ApiKey.JOIN_GROUP: 6, ApiKey.HEARTBEAT: 4, ApiKey.LEAVE_GROUP: 4, ApiKey.SYNC_GROUP: 4,
    ApiKey.DESCRIBE_GROUPS: 5, ApiKey.LIST_GROUPS: 3, ApiKey.API_VERSIONS: 3,
    ApiKey.CREATE_TOPICS: 5, ApiKey.INIT_PRODUCER_ID: 2, ApiKey.DESCRIBE_CONFIGS: 4,
    ApiKey.SASL_AUTHENTICATE: 2, ApiKey.DESCRIBE_CLUSTER: 0, ApiKey.OFFSET_FOR_LEADER_EPOCH: 4,
}


def test_flexible_versions_are_served_for_the_apis_clients_use_most() -> None:
    for api_key, first in FIRST_FLEXIBLE.items():
        assert SUPPORTED_VERSIONS[api_key][1] >= first, api_key.name
        for version in range(SUPPORTED_VERSIONS[api_key][0], SUPPORTED_VERSIONS[api_key][1] + 1):
            assert is_flexible(api_key, version) == (version >= first), (api_key.name, version)
    assert not any(is_flexible(ApiKey.SASL_HANDSHAKE, v) for v in range(2))
    assert is_flexible(ApiKey.API_VERSIONS, 9)  # a future version: header v2


def _produce_v0(acks: int, partitions: list[tuple[int, bytes | None]]) -> bytes:
    body = struct.pack(">hi", acks, 1000) + struct.pack(">i", 1) + b"\x00\x01t"
    body += struct.pack(">i", len(partitions))
    for index, records in partitions:
        body += struct.pack(">i", index)
        body += struct.pack(">i", -1) if records is None else struct.pack(">i", len(records))
        body += records or b""
    return body


def test_produce_v0_to_v2_decode_as_v3_without_a_transactional_id() -> None:
    request = decode_request(ApiKey.PRODUCE, 2, _produce_v0(1, [(0, b"xyz"), (1, None)]), 0)
    assert request.transactional_id is None and request.acks == 1
    assert [(p.index, p.records) for p in request.topic_data[0].partition_data] == [
        (0, b"xyz"), (1, None)]


@pytest.mark.parametrize("version", [9, 10, 11, 12])
def test_flexible_produce_shape_is_walked_with_compact_lengths(version: int) -> None:
    records = Records(b"R" * 200)  # a two-byte compact length
    request = make_request(ApiKey.PRODUCE, version, transactional_id=None, acks=1,
                           timeout=1000, topic_data=[
                               {"name": "t", "partition_data": [
                                   {"index": i, "records": records} for i in range(3)]},
                               {"name": "u", "partition_data": [{"index": 0, "records": None}]}])
    body = encode(request)
    assert decode_request(ApiKey.PRODUCE, version, body, 0) == request
    check_produce_shape(body, 0, 4, flexible=True)
    with pytest.raises(MalformedRequestError, match="more than 3 partition entries"):
        check_produce_shape(body, 0, 3, flexible=True)
    for cut in (1, 30, 250, len(body) - 1):
        with pytest.raises(MalformedRequestError):
            check_produce_shape(body[:cut], 0, 10, flexible=True)


def test_produce_with_too_many_partition_entries_is_refused_before_decoding() -> None:
    body = _produce_v0(1, [(i, None) for i in range(11)])
    v3 = b"\xff\xff" + body
    check_produce_shape(v3, 0, max_partitions=11)
    with pytest.raises(MalformedRequestError):
        check_produce_shape(v3, 0, max_partitions=10)
    with pytest.raises(MalformedRequestError):
        decode_request(ApiKey.PRODUCE, 3, v3, 0, max_produce_partitions=10)


@pytest.mark.parametrize("cut", range(1, 24))
def test_produce_shape_of_a_cut_request_is_malformed(cut: int) -> None:
    v3 = b"\xff\xff" + _produce_v0(1, [(0, b"abc")])
    with pytest.raises(MalformedRequestError):
        check_produce_shape(v3[:len(v3) - cut], 0)


def test_build_response_drops_fields_the_version_lacks() -> None:
    data = {"throttle_time": 0, "brokers": [{"node_id": 0, "host": "h", "port": 1,
                                             "rack": "r"}],
            "cluster_id": "c", "controller_id": 0, "topics": [
                {"error_code": ErrorCode.none, "name": "t", "is_internal": True,
                 "partitions": [{"error_code": 3, "partition_index": 0, "leader_id": 0,
                                 "leader_epoch": -1, "replica_nodes": (0,),
                                 "isr_nodes": (0,), "offline_replicas": ()}]}]}
    v0 = build_response(ApiKey.METADATA, 0, data)
    assert not hasattr(v0, "cluster_id") and not hasattr(v0.topics[0], "is_internal")
    assert v0.topics[0].partitions[0].error_code is ErrorCode.unknown_topic_or_partition
    v8 = build_response(ApiKey.METADATA, 8, data)
    assert v8.cluster_id == "c" and v8.topics[0].is_internal
    assert len(encode_response(v8)) > len(encode_response(v0))


def test_legacy_produce_responses_golden() -> None:
    responses = [{"name": "t", "partition_responses": [
        {"index": 1, "error_code": 35, "base_offset": -1}]}]
    v0 = b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01" + b"\x00\x00\x00\x01\x00\x23" + b"\xff" * 8
    assert legacy_produce_response(0, responses) == v0
    assert legacy_produce_response(1, responses) == v0 + b"\x00" * 4
    assert legacy_produce_response(2, responses) == v0 + b"\xff" * 8 + b"\x00" * 4
