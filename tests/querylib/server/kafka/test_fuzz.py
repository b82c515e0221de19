"""Hostile and random input against the Kafka request path.

- decoding: random frames and mutations of valid ones raise only KafkaProtocolError;
- a live listener: random and mutated frames on their own connections close those connections
  and nothing else (a well-behaved client is answered between every one of them), and no bug
  is logged;
- random well-formed requests of every served api and version are always answered with a
  response kio decodes at that version: a well-framed request never costs the connection.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import random
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from querylib.kafka import SUPPORTED_VERSIONS, ApiKey, ErrorCode, KafkaProtocolError
from querylib.kafka._apis import decode_request, is_flexible
from querylib.kafka._framing import parse_request_header
from querylib.records import encode_batch

from ._support import ListenerThread, WireClient, make_request, request_class, running_listener

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

A = ApiKey
SERVED = [(key, version) for key, (lo, hi) in SUPPORTED_VERSIONS.items()
          for version in range(lo, hi + 1) if not (key == A.PRODUCE and version < 3)]
FUZZ_SEED = 20240611
FUZZ_FRAMES = 150


def _valid_frames() -> list[bytes]:
    """Frames (without size prefix) of valid requests, to mutate."""
    client = WireClient.__new__(WireClient)
    client.client_id = "fuzz"
    client._correlation = 0
    batch = encode_batch([(1, b"k", b"v", (("h", b"x"),))])
    requests = [
        make_request(A.API_VERSIONS, 3, client_software_name="f", client_software_version="1"),
        make_request(A.METADATA, 8, topics=[{"name": "t"}], allow_auto_topic_creation=False,
                     include_cluster_authorized_operations=False,
                     include_topic_authorized_operations=False),
        make_request(A.PRODUCE, 7, acks=1, timeout=1000, transactional_id=None, topic_data=[
            {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]),
        make_request(A.FETCH, 11, replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20,
                     isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                     forgotten_topics_data=[], topics=[{"topic": "t", "partitions": [
                         {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                          "current_leader_epoch": -1, "log_start_offset": -1}]}]),
        make_request(A.OFFSET_COMMIT, 7, group_id="g", generation_id_or_member_epoch=-1,
                     member_id="", group_instance_id=None, topics=[{"name": "t", "partitions": [
                         {"partition_index": 0, "committed_offset": 1,
                          "committed_leader_epoch": -1, "committed_metadata": ""}]}]),
        make_request(A.JOIN_GROUP, 5, group_id="g", session_timeout=100,
                     rebalance_timeout=100, member_id="x", group_instance_id=None,
                     protocol_type="consumer", protocols=[{"name": "range", "metadata": b"m"}]),
    ]
    return [client.frame(r)[0][4:] for r in requests]


def _mutate(frame: bytes, rng: random.Random) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.6:
            data = data[:rng.randrange(len(data) + 1)]
        elif choice < 0.8:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 8))
        elif len(data) >= 4:  # a length field set to something large or negative
            at = rng.randrange(len(data) - 3)
            data[at:at + 4] = struct.pack(">i", rng.choice([-2, -1, 2**31 - 1, 2**20, 70000]))
    return bytes(data)


def _decode(frame: bytes) -> None:
    header, offset = parse_request_header(frame, is_flexible)
    decode_request(header.api_key, header.api_version, frame, offset)


@given(st.binary(max_size=300))
def test_random_frames_decode_or_raise_protocol_errors(frame: bytes) -> None:
    try:
        _decode(frame)
    except KafkaProtocolError:
        pass


@given(st.sampled_from(_valid_frames()), st.randoms(use_true_random=False))
def test_mutated_frames_decode_or_raise_protocol_errors(frame: bytes, rng: random.Random) -> None:
    try:
        _decode(_mutate(frame, rng))
    except KafkaProtocolError:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ListenerThread]:
    with running_listener(str(tmp_path)) as thread:
        thread.call(thread.backend.create_topic("t"))
        yield thread


def test_live_listener_survives_fuzzing_and_serves_others(
        served: ListenerThread, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="querylib.kafka")
    rng = random.Random(FUZZ_SEED)
    # Not the Fetch: a mutation could turn it into a legitimate long poll.
    valid = [f for f in _valid_frames() if struct.unpack_from(">h", f)[0] != A.FETCH]
    api_versions = make_request(A.API_VERSIONS, 3, client_software_name="good",
                                client_software_version="1")
    with WireClient(served.port) as good:
        for i in range(FUZZ_FRAMES):
            if i % 3 == 0:
                frame = rng.randbytes(rng.randint(0, 200))
            else:
                frame = _mutate(rng.choice(valid), rng)
            with WireClient(served.port, timeout=10) as bad:
                bad.send_raw(struct.pack(">i", len(frame)) + frame)
                bad.sock.shutdown(socket.SHUT_WR)
                # The listener answers (the mutation left a valid request) or refuses the frame,
                # then sees the end of the stream: either way it closes the connection.
                while True:
                    try:
                        if not bad.sock.recv(1 << 16):
                            break
                    except ConnectionResetError:
                        break
            assert good.call(api_versions).error_code is ErrorCode.none
    bugs = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert bugs == [], [r.getMessage() for r in bugs]
    assert served.listener.stats.protocol_errors > FUZZ_FRAMES // 3


def _tame(request: object) -> object:
    """Keep a random request from waiting on purpose: no long polls, no joins into groups other
    examples created, no acks=0 (no response to read), no thousands of partitions."""
    changes: dict[str, object] = {}
    if hasattr(request, "max_wait"):
        changes["max_wait"] = datetime.timedelta(0)
    if request.__api_key__ == A.JOIN_GROUP:
        changes["group_id"] = f"fuzz-{uuid.uuid4()}"
    if getattr(request, "acks", None) == 0:
        changes["acks"] = 1
    if request.__api_key__ == A.CREATE_TOPICS:
        changes["topics"] = tuple(dataclasses.replace(t, num_partitions=t.num_partitions % 3)
                                  for t in request.topics)
    return dataclasses.replace(request, **changes)


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_random_well_formed_requests_are_always_answered(
        served: ListenerThread, api_key: int, version: int) -> None:
    with WireClient(served.port) as client:

        @settings(max_examples=4, suppress_health_check=list(HealthCheck), deadline=None)
        @given(st.from_type(request_class(api_key, version)))
        def check(request: object) -> None:
            request = _tame(request)
            correlation = client.send(request)
            got, _response = client.receive(api_key, version)
            assert got == correlation

        check()
