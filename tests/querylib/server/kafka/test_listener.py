"""The listener over real sockets: every advertised api version answers with a response that
kio decodes at that version; ApiVersions from the future, Produce v0-2, acks=0, pipelining,
long-poll fetches, fetch size limits; refusals as error codes; bad frames close only their own
connection."""

from __future__ import annotations

import dataclasses
import logging
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import TopicName
from querylib.kafka import SUPPORTED_VERSIONS, ApiKey, ErrorCode, ListenerLimits
from querylib.records import encode_batch, iter_batches
from querylib.server.kafka import kafka_topic_id
from tests.conftest import wait_for

from ._support import ListenerThread, WireClient, make_request, running_listener

A = ApiKey


def versions(api: ApiKey) -> range:
    lo, hi = SUPPORTED_VERSIONS[api]
    return range(max(lo, 3) if api == A.PRODUCE else lo, hi + 1)


def batch(*values: bytes, **kwargs) -> bytes:
    return encode_batch([(1_700_000_000_000 + i, b"k", v, ()) for i, v in enumerate(values)],
                        **kwargs)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ListenerThread]:
    with running_listener(str(tmp_path), limits=ListenerLimits(max_request_bytes=64 * 1024)
                          ) as thread:
        thread.call(thread.backend.create_topic("t", 2))
        thread.call(thread.backend.append("t", 0, [batch(b"a", b"b")], acks=1))
        yield thread


@pytest.fixture
def client(served: ListenerThread) -> Iterator[WireClient]:
    with WireClient(served.port) as c:
        yield c


def produce(version: int, topic: str, partition: int, records: bytes | None, acks: int = 1,
            **extra) -> object:
    return make_request(A.PRODUCE, version, acks=acks, timeout=5000, topic_data=[
        {"name": topic, "partition_data": [{"index": partition, "records": records}]}],
        **extra)


def topic_id(name: str) -> uuid.UUID:
    """The Kafka topic id a broker alone gives `name` (DESIGN §8 "Topic ids")."""
    return kafka_topic_id(TopicName.parse(name).full)


def fetch(version: int, partitions: list[tuple[str, int, int]], *, max_wait: int = 0,
          min_bytes: int = 0, max_bytes: int = 1 << 20, partition_max: int = 1 << 20) -> object:
    """A Fetch request; from v13 its topics are named by their ids."""
    topics: dict[str, list] = {}
    for topic, partition, offset in partitions:
        topics.setdefault(topic, []).append({
            "partition": partition, "fetch_offset": offset, "partition_max_bytes": partition_max,
            "current_leader_epoch": -1, "log_start_offset": -1})
    return make_request(A.FETCH, version, replica_id=-1, max_wait=max_wait, min_bytes=min_bytes,
                        max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
                        topics=[{"topic": t, "topic_id": topic_id(t), "partitions": p}
                                for t, p in topics.items()],
                        forgotten_topics_data=[], rack_id="")


# ---- every api, every version -----------------------------------------------------------------


@pytest.mark.parametrize("version", versions(A.API_VERSIONS))
def test_api_versions(client: WireClient, version: int) -> None:
    response = client.call(make_request(A.API_VERSIONS, version, client_software_name="t",
                                        client_software_version="1"))
    assert response.error_code is ErrorCode.none
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == dict(
        SUPPORTED_VERSIONS)


@pytest.mark.parametrize("version", versions(A.METADATA))
def test_metadata(served: ListenerThread, client: WireClient, version: int) -> None:
    response = client.call(make_request(
        A.METADATA, version, topics=[{"name": n, "topic_id": None}
                                     for n in ("t", "missing", "bad name")],
        allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False))
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [
        (0, "127.0.0.1", served.port)]
    t, missing, bad = response.topics
    assert (t.error_code, [p.partition_index for p in t.partitions]) == (ErrorCode.none, [0, 1])
    assert all(p.leader_id == 0 for p in t.partitions)
    if version >= 7:
        assert all(p.leader_epoch == -1 for p in t.partitions)
    if version < 4:  # always auto-created before v4
        assert missing.error_code is ErrorCode.none
    else:
        assert missing.error_code is ErrorCode.unknown_topic_or_partition
    assert bad.error_code is ErrorCode.invalid_topic_exception
    if version >= 10:  # topic ids: the same for every spelling of the name, and found by id
        assert t.topic_id == topic_id("t") == topic_id("public/default/t") != uuid.UUID(int=0)
        assert t.topic_id.version == 5
        by_id = client.call(make_request(
            A.METADATA, version, topics=[{"name": None, "topic_id": t.topic_id},
                                         {"name": None, "topic_id": topic_id("missing")}],
            allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False))
        found, unknown = by_id.topics
        assert (found.error_code, found.name, len(found.partitions)) == (ErrorCode.none, "t", 2)
        assert unknown.error_code is ErrorCode.unknown_topic_id
        assert unknown.name == (None if version >= 12 else "")
    if version >= 13:
        assert response.error_code is ErrorCode.none
    assert served.listener is not None
    assert served.listener.stats.versions[A.METADATA, version] >= 1  # counted by version


def test_metadata_of_all_topics_marks_internal_ones(client: WireClient) -> None:
    response = client.call(make_request(A.METADATA, 8, topics=None,
                                        include_cluster_authorized_operations=False,
                                        include_topic_authorized_operations=False))
    assert {t.name: t.is_internal for t in response.topics} == {
        "__consumer_offsets": True, "t": False}


@pytest.mark.parametrize("version", versions(A.PRODUCE))
def test_produce_then_fetch(client: WireClient, version: int) -> None:
    response = client.call(produce(version, "t", 1, batch(b"x", b"y")))
    result = response.responses[0].partition_responses[0]
    assert (result.error_code, result.base_offset) == (ErrorCode.none, 0)
    for fetch_version in versions(A.FETCH):
        fetched = client.call(fetch(fetch_version, [("t", 1, 0)]))
        partition = fetched.responses[0].partitions[0]
        assert (partition.error_code, partition.high_watermark) == (ErrorCode.none, 2)
        values = [r.value for b in iter_batches(partition.records) for r in b.records]
        assert values == [b"x", b"y"]
        if fetch_version >= 7:
            assert fetched.session_id == 0
        if fetch_version >= 13:
            assert fetched.responses[0].topic_id == topic_id("t")


@pytest.mark.parametrize("version", range(13, SUPPORTED_VERSIONS[A.FETCH][1] + 1))
def test_fetch_by_an_unknown_topic_id_is_unknown_topic_id(client: WireClient,
                                                          version: int) -> None:
    request = fetch(version, [("t", 0, 0)])
    stranger = uuid.uuid4()
    request = dataclasses.replace(request, topics=(
        dataclasses.replace(request.topics[0], topic_id=stranger),))
    fetched = client.call(request)
    (topic,) = fetched.responses
    assert topic.topic_id == stranger
    assert [p.error_code for p in topic.partitions] == [ErrorCode.unknown_topic_id]


@pytest.mark.parametrize("version", versions(A.LIST_OFFSETS))
def test_list_offsets(served: ListenerThread, client: WireClient, version: int) -> None:
    # Partition 1: the largest timestamp is not the last record's.
    served.call(served.backend.append("t", 1, [encode_batch(
        [(1_700_000_000_005, None, b"a", ()), (1_700_000_000_009, None, b"b", ()),
         (1_700_000_000_009, None, b"c", ()), (1_700_000_000_003, None, b"d", ())])], acks=1))
    response = client.call(make_request(A.LIST_OFFSETS, version, replica_id=-1,
                                        isolation_level=0, topics=[{"name": "t", "partitions": [
                                            {"partition_index": 0, "timestamp": -1},
                                            {"partition_index": 0, "timestamp": -2},
                                            {"partition_index": 0,
                                             "timestamp": 1_700_000_000_001},
                                            {"partition_index": 5, "timestamp": -1},
                                            {"partition_index": 1, "timestamp": -3},
                                            {"partition_index": 1, "timestamp": -4}]}]))
    latest, earliest, by_time, unknown, largest, local = response.topics[0].partitions
    assert (latest.offset, earliest.offset, by_time.offset) == (2, 0, 1)
    assert by_time.timestamp == 1_700_000_000_001
    assert unknown.error_code is ErrorCode.unknown_topic_or_partition
    # v7 MAX_TIMESTAMP: the first record with the largest timestamp; v8 EARLIEST_LOCAL: the
    # log start (tq keeps every segment locally). The broker answers them at any version, as
    # Kafka's does; clients send them only from v7 and v8.
    assert (largest.offset, largest.timestamp) == (1, 1_700_000_000_009)
    assert (local.offset, local.error_code) == (0, ErrorCode.none)


@pytest.mark.parametrize("version", versions(A.FIND_COORDINATOR))
def test_find_coordinator(served: ListenerThread, client: WireClient, version: int) -> None:
    response = client.call(make_request(A.FIND_COORDINATOR, version, key="g", key_type=0,
                                        coordinator_keys=["g", "h"]))
    if version >= 4:  # a batch of keys, answered each
        assert [(c.key, c.error_code, c.node_id, c.port) for c in response.coordinators] == [
            ("g", ErrorCode.none, 0, served.port), ("h", ErrorCode.none, 0, served.port)]
        return
    assert (response.error_code, response.node_id, response.port) == (
        ErrorCode.none, 0, served.port)


@pytest.mark.parametrize("version", versions(A.OFFSET_COMMIT))
def test_offset_commit_and_fetch(client: WireClient, version: int) -> None:
    group = f"simple-{version}"
    response = client.call(make_request(
        A.OFFSET_COMMIT, version, group_id=group, generation_id_or_member_epoch=-1,
        member_id="", retention_time=-1, topics=[{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 2, "committed_metadata": "meta"}]},
            {"name": "missing", "partitions": [
                {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}]))
    assert [[p.error_code for p in t.partitions] for t in response.topics] == [
        [ErrorCode.none], [ErrorCode.unknown_topic_or_partition]]
    for fetch_version in versions(A.OFFSET_FETCH):
        wanted = [{"name": "t", "partition_indexes": [0, 1]}]
        fetched = client.call(make_request(
            A.OFFSET_FETCH, fetch_version, group_id=group, topics=wanted, require_stable=True,
            groups=[{"group_id": group, "topics": wanted, "member_epoch": -1},
                    {"group_id": "", "topics": None, "member_epoch": -1},
                    {"group_id": "never", "topics": None, "member_epoch": -1}]))
        if fetch_version >= 8:  # several groups, answered each
            mine, empty_id, never = fetched.groups
            assert (mine.group_id, mine.error_code) == (group, ErrorCode.none)
            assert empty_id.error_code is ErrorCode.invalid_group_id
            assert (never.error_code, never.topics) == (ErrorCode.none, ())
            committed = mine.topics[0].partitions
        else:
            committed = fetched.topics[0].partitions
        assert [(p.committed_offset, p.metadata) for p in committed] == [(2, "meta"), (-1, "")]


@pytest.mark.parametrize("version", versions(A.JOIN_GROUP))
def test_group_lifecycle(client: WireClient, version: int) -> None:
    group = f"group-{version}"
    join = dict(group_id=group, session_timeout=10_000, rebalance_timeout=10_000,
                protocol_type="consumer", protocols=[{"name": "range", "metadata": b"m"}])
    response = client.call(make_request(A.JOIN_GROUP, version, member_id="", **join))
    if version >= 4:
        assert response.error_code is ErrorCode.member_id_required
        response = client.call(make_request(A.JOIN_GROUP, version,
                                            member_id=response.member_id, **join))
    assert (response.error_code, response.generation_id) == (ErrorCode.none, 1)
    member = response.member_id
    assert response.leader == member and [m.member_id for m in response.members] == [member]
    if version >= 7:
        assert response.protocol_type == "consumer"
    if version >= 9:
        assert response.skip_assignment is False
    sync_version = min(version, SUPPORTED_VERSIONS[A.SYNC_GROUP][1])
    sync = dict(group_id=group, generation_id=1, member_id=member, protocol_type="consumer",
                assignments=[{"member_id": member, "assignment": b"a"}])
    if sync_version >= 5:  # the protocol a member names must be the group's
        wrong = client.call(make_request(A.SYNC_GROUP, sync_version, protocol_name="roundrobin",
                                         **sync))
        assert wrong.error_code is ErrorCode.inconsistent_group_protocol
    synced = client.call(make_request(A.SYNC_GROUP, sync_version, protocol_name="range", **sync))
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"a")
    if sync_version >= 5:
        assert (synced.protocol_type, synced.protocol_name) == ("consumer", "range")
    for hb_version in versions(A.HEARTBEAT):
        beat = client.call(make_request(A.HEARTBEAT, hb_version, group_id=group,
                                        generation_id=1, member_id=member))
        assert beat.error_code is ErrorCode.none
    for describe_version in versions(A.DESCRIBE_GROUPS):
        described = client.call(make_request(A.DESCRIBE_GROUPS, describe_version,
                                             groups=[group, "nobody"],
                                             include_authorized_operations=False))
        ours, nobody = described.groups
        assert (ours.group_state, [m.member_id for m in ours.members]) == ("Stable", [member])
        assert nobody.group_state == "Dead"
        assert nobody.error_code is (ErrorCode.group_id_not_found if describe_version >= 6
                                     else ErrorCode.none)
    for list_version in versions(A.LIST_GROUPS):
        listed = client.call(make_request(A.LIST_GROUPS, list_version))
        assert group in {g.group_id for g in listed.groups}
        if list_version >= 4:  # filtered by state (and from v5 by type), case-insensitively
            assert {(g.group_id, g.group_state) for g in listed.groups} >= {(group, "Stable")}
            for states, types, found in [(["stable"], [], True), (["Empty"], [], False),
                                         ([], ["Classic"], True), ([], ["consumer"], False)]:
                if types and list_version < 5:
                    continue
                listed = client.call(make_request(A.LIST_GROUPS, list_version,
                                                  states_filter=states, types_filter=types))
                assert (group in {g.group_id for g in listed.groups}) is found, (states, types)
    leave_version = min(version, SUPPORTED_VERSIONS[A.LEAVE_GROUP][1])
    left = client.call(make_request(A.LEAVE_GROUP, leave_version, group_id=group,
                                    member_id=member, members=[{"member_id": member}]))
    assert left.error_code is ErrorCode.none
    if leave_version >= 3:
        assert [m.error_code for m in left.members] == [ErrorCode.none]


@pytest.mark.parametrize("version", versions(A.CREATE_TOPICS))
def test_create_topics(client: WireClient, version: int) -> None:
    topic = dict(num_partitions=2, replication_factor=1, assignments=[], configs=[])
    response = client.call(make_request(A.CREATE_TOPICS, version, timeout=1000,
                                        validate_only=False, topics=[
                                            {"name": f"new-{version}", **topic},
                                            {"name": "t", **topic},
                                            {"name": "x", **topic, "replication_factor": 3}]))
    assert [t.error_code for t in response.topics] == [
        ErrorCode.none, ErrorCode.topic_already_exists, ErrorCode.invalid_replication_factor]
    created, exists, refused = response.topics
    if version >= 5:  # the topic as created; -1 for those not created
        assert (created.num_partitions, created.replication_factor) == (2, 1)
        assert (exists.num_partitions, refused.replication_factor) == (-1, -1)
    if version >= 7:
        assert created.topic_id == topic_id(f"new-{version}") != uuid.UUID(int=0)
        assert exists.topic_id is None  # the zero id, as kio decodes it


@pytest.mark.parametrize("version", versions(A.INIT_PRODUCER_ID))
def test_init_producer_id(client: WireClient, version: int) -> None:
    first = client.call(make_request(A.INIT_PRODUCER_ID, version, transactional_id=None,
                                     transaction_timeout=1000))
    second = client.call(make_request(A.INIT_PRODUCER_ID, version, transactional_id=None,
                                      transaction_timeout=1000))
    assert first.error_code is ErrorCode.none and second.producer_id > first.producer_id
    # A transactional id keeps its producer id; each init bumps the epoch (fencing the last).
    transactional = [client.call(make_request(A.INIT_PRODUCER_ID, version,
                                              transactional_id="tx", transaction_timeout=1000))
                     for _ in range(2)]
    assert [t.error_code for t in transactional] == [ErrorCode.none] * 2
    assert transactional[0].producer_id == transactional[1].producer_id
    assert transactional[1].producer_epoch == transactional[0].producer_epoch + 1


@pytest.mark.parametrize("version", versions(A.DESCRIBE_CONFIGS))
def test_describe_configs(client: WireClient, version: int) -> None:
    response = client.call(make_request(A.DESCRIBE_CONFIGS, version, resources=[
        {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
        {"resource_type": 2, "resource_name": "missing", "configuration_keys": None}]))
    assert [r.error_code for r in response.results] == [
        ErrorCode.none, ErrorCode.unknown_topic_or_partition]


# ---- behaviours ----------------------------------------------------------------------------------


def test_api_versions_from_the_future_gets_error_35_and_the_ranges(client: WireClient) -> None:
    request = make_request(A.API_VERSIONS, 3, client_software_name="t",
                           client_software_version="1")
    correlation = client.send(request, version=9)
    got, response = client.receive(A.API_VERSIONS, 0)
    assert got == correlation and response.error_code is ErrorCode.unsupported_version
    assert {k.api_key for k in response.api_keys} == {int(k) for k in SUPPORTED_VERSIONS}
    assert client.call(request).error_code is ErrorCode.none  # the connection goes on


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_are_answered_unsupported_version(client: WireClient,
                                                           version: int) -> None:
    body = struct.pack(">hi", 1, 1000) + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(
        ">iii", 1, 0, 3) + b"abc"
    header = struct.pack(">hhih", 0, version, 77, 1) + b"c"
    client.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
    frame = client.read_frame()
    expected = b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\x00\x23" + b"\xff" * 8
    expected += b"\xff" * 8 if version == 2 else b""
    expected += b"\x00" * 4 if version >= 1 else b""
    assert frame == struct.pack(">i", 77) + expected


def test_acks_zero_gets_no_response_and_pipelined_requests_come_back_in_order(
        served: ListenerThread, client: WireClient) -> None:
    silent = client.send(produce(7, "t", 1, batch(b"quiet"), acks=0))
    metadata = make_request(A.METADATA, 8, topics=[], include_cluster_authorized_operations=False,
                            include_topic_authorized_operations=False)
    sent = [client.send(metadata) for _ in range(3)]
    received = [client.receive(A.METADATA, 8)[0] for _ in range(3)]
    assert received == sent and silent not in received
    assert served.call(served.backend.offsets("t", 1)).high_watermark == 1


def test_produce_refusals_are_error_codes(client: WireClient) -> None:
    corrupt = bytearray(batch(b"x"))
    corrupt[-1] ^= 0xFF
    cases = [
        (produce(7, "t", 0, batch(b"a") + batch(b"b")), ErrorCode.invalid_record),
        (produce(7, "t", 0, bytes(corrupt)), ErrorCode.corrupt_message),
        (produce(7, "t", 0, None), ErrorCode.invalid_record),
        (produce(7, "t", 9, batch(b"x")), ErrorCode.unknown_topic_or_partition),
        # tq's own topics are tq's to write (the broker's core decides, for every way in)
        (produce(7, "__consumer_offsets", 0, batch(b"x")),
         ErrorCode.topic_authorization_failed),
        (produce(7, "t", 0, batch(b"x"), acks=2), ErrorCode.invalid_required_acks),
    ]
    for request, error in cases:
        response = client.call(request)
        assert response.responses[0].partition_responses[0].error_code is error, error


def test_fetch_errors_come_with_offsets(client: WireClient) -> None:
    response = client.call(fetch(11, [("t", 0, 99), ("t", 7, 0), ("nope", 0, 0)]))
    out_of_range, no_partition = response.responses[0].partitions
    assert (out_of_range.error_code, out_of_range.high_watermark) == (
        ErrorCode.offset_out_of_range, 2)
    assert no_partition.error_code is ErrorCode.unknown_topic_or_partition
    assert response.responses[1].partitions[0].error_code is (
        ErrorCode.unknown_topic_or_partition)


def test_fetch_max_bytes_gives_only_the_first_partition_an_oversized_batch(
        served: ListenerThread, client: WireClient) -> None:
    served.call(served.backend.append("t", 1, [batch(b"z" * 500)], acks=1))
    response = client.call(fetch(11, [("t", 0, 0), ("t", 1, 0)], max_bytes=10,
                                 partition_max=10))
    first, second = response.responses[0].partitions
    assert [r.value for b in iter_batches(first.records) for r in b.records] == [b"a", b"b"]
    assert second.records in (b"", None) and second.high_watermark == 1


def test_long_poll_fetch_returns_when_another_client_produces(served: ListenerThread,
                                                              client: WireClient) -> None:
    correlation = client.send(fetch(11, [("t", 1, 0)], max_wait=60_000, min_bytes=1))
    with WireClient(served.port) as producer:
        producer.call(produce(7, "t", 1, batch(b"late")))
    got, response = client.receive(A.FETCH, 11)
    assert got == correlation
    records = response.responses[0].partitions[0].records
    assert [r.value for b in iter_batches(records) for r in b.records] == [b"late"]


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x03abc",                                    # shorter than a header
    struct.pack(">ihhih", 10, 3, 99, 1, -1),                   # Metadata v99
    struct.pack(">ihhih", 10, 1234, 0, 1, -1),                 # unknown api key
    struct.pack(">ihhih", 14, 3, 8, 1, -1) + b"\x00\x00\x00\x07",  # body cut short
    struct.pack(">ih", 64 * 1024 + 1, 3),                      # too large for Metadata
    struct.pack(">ih", 200 * 1024 * 1024, 3),                  # too large for anything
])
def test_bad_frames_close_only_their_connection(served: ListenerThread, client: WireClient,
                                                garbage: bytes) -> None:
    with WireClient(served.port) as bad:
        bad.send_raw(garbage)
        assert bad.is_closed()
    response = client.call(make_request(A.API_VERSIONS, 3, client_software_name="t",
                                        client_software_version="1"))
    assert response.error_code is ErrorCode.none
    assert served.listener.stats.protocol_errors >= 1


@pytest.mark.parametrize("version", [3, 7])
def test_a_produce_over_the_frame_limit_gets_message_too_large_then_closes(
        tmp_path: Path, version: int) -> None:
    """Read past (never buffered), answered MESSAGE_TOO_LARGE for the partitions it names (as
    a batch over the broker's maximum is), and then the connection closes: not a silent
    close, which librdkafka reported as a timeout long after."""
    with running_listener(str(tmp_path), limits=ListenerLimits(max_frame_bytes=64 * 1024)
                          ) as thread, WireClient(thread.port) as wire:
        big = batch(b"x" * 100_000)
        correlation = wire.send(make_request(A.PRODUCE, version, acks=-1, timeout=5000,
                                             topic_data=[
            {"name": "big", "partition_data": [{"index": 0, "records": big},
                                               {"index": 3, "records": big}]},
            {"name": "other", "partition_data": [{"index": 1, "records": big}]}]))
        got, response = wire.receive(A.PRODUCE, version)
        assert got == correlation
        # What the kept prefix names: the first topic's partitions before its first records.
        assert [(t.name, [(p.index, p.error_code) for p in t.partition_responses])
                for t in response.responses] == [("big", [(0, ErrorCode.message_too_large)])]
        assert wire.is_closed()
        assert thread.listener.stats.protocol_errors == 1
        assert thread.listener.stats.max_inflight_bytes < 64 * 1024 + 300 * 1024
        assert not thread.call(thread.backend.topics(["big"]))


def test_idempotent_retry_gets_its_offset_and_a_gap_is_out_of_order(client: WireClient) -> None:
    producer = client.call(make_request(A.INIT_PRODUCER_ID, 1, transactional_id=None,
                                        transaction_timeout=1000))
    pid = producer.producer_id
    first = batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0)
    second = batch(b"c", producer_id=pid, producer_epoch=0, base_sequence=2)
    results = [client.call(produce(7, "t", 1, b, acks=-1)).responses[0].partition_responses[0]
               for b in (first, second, first, batch(b"d", producer_id=pid, producer_epoch=0,
                                                     base_sequence=7))]
    assert [(r.error_code, r.base_offset) for r in results[:3]] == [
        (ErrorCode.none, 0), (ErrorCode.none, 2), (ErrorCode.none, 0)]
    assert results[3].error_code is ErrorCode.out_of_order_sequence_number


def test_fetch_sends_the_stored_bytes_with_sendfile(served: ListenerThread, client: WireClient,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    calls: list[int] = []
    real_sendfile = os.sendfile

    def counting_sendfile(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        calls.append(count)
        return real_sendfile(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    served.call(served.backend.append("t", 0, [batch(b"x" * 5000)], acks=1))
    response = client.call(fetch(11, [("t", 0, 0)]))
    stored = served.backend.port.log(("t", 0)).read(0, 1 << 20)
    assert response.responses[0].partitions[0].records == stored  # unchanged, byte for byte
    assert calls, "the records did not go through os.sendfile"


def test_fetch_waits_for_min_bytes(served: ListenerThread, client: WireClient) -> None:
    correlation = client.send(fetch(11, [("t", 0, 0)], max_wait=60_000, min_bytes=4000))
    with WireClient(served.port) as producer:
        producer.call(produce(7, "t", 0, batch(b"small")))  # still below min_bytes
        producer.call(produce(7, "t", 0, batch(b"y" * 5000)))
    got, response = client.receive(A.FETCH, 11)
    assert got == correlation
    records = response.responses[0].partitions[0].records
    assert [r.value for b in iter_batches(records) for r in b.records] == [
        b"a", b"b", b"small", b"y" * 5000]


def test_a_port_in_use_is_a_listen_error(served: ListenerThread, tmp_path: Path) -> None:
    import errno

    from querylib.kafka import ListenError
    from querylib.server.kafka import KafkaListener

    async def clash() -> None:
        listener = KafkaListener(served.backend, "127.0.0.1", served.port)
        with pytest.raises(ListenError) as caught:
            await listener.start()
        assert caught.value.errno == errno.EADDRINUSE

    served.call(clash())


def test_a_client_gone_while_its_long_poll_fetch_waits_is_no_bug(
        served: ListenerThread, caplog: pytest.LogCaptureFixture) -> None:
    """A consumer closes while its fetch waits for data (every consumer that closes does):
    when data comes, the answer has nowhere to go, and the connection ends quietly. Before,
    sending the stored bytes to a connection found closing raised "Transport is closing",
    logged as a bug with its traceback (a race, lost in most rounds)."""
    import socket

    assert served.listener is not None
    stats = served.listener.stats
    for round_ in range(60):
        gone = WireClient(served.port)
        gone.send(fetch(11, [("t", 0, 1 + round_), ("t", 1, round_)], max_wait=60_000,
                        min_bytes=1))
        wait_for(lambda: stats.open_connections == 1, timeout=30, what="the fetch to wait")
        if round_ % 2:  # a reset, else a close
            gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()
        with WireClient(served.port) as producer:
            for partition in (0, 1):
                producer.call(produce(7, "t", partition, batch(b"late" * 1000)))
        wait_for(lambda: stats.open_connections == 0, timeout=30, what="the connection to end")
    bugs = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert bugs == [], [r.getMessage() for r in bugs]
