"""Framing, sans-I/O: frames cut from any split of the stream, sizes bounded before buffering,
request headers v1/v2 parsed, response prefixes byte for byte."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querylib.kafka import FrameReader, MalformedRequestError, RequestTooLargeError
from querylib.kafka._framing import (
    OVERSIZED_PREFIX,
    OversizedFrame,
    parse_request_header,
    response_prefix,
)


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _header(api_key: int = 3, version: int = 8, correlation: int = 7,
            client: bytes | None = b"cli") -> bytes:
    if client is None:
        client_bytes = struct.pack(">h", -1)
    else:
        client_bytes = struct.pack(">h", len(client)) + client
    return struct.pack(">hhi", api_key, version, correlation) + client_bytes


def _limit(api_key: int) -> int:
    return 1000 if api_key == 0 else 100


@given(st.lists(st.binary(min_size=0, max_size=60), min_size=1, max_size=5), st.data())
def test_frames_come_out_whole_from_any_split(bodies: list[bytes], data: st.DataObject) -> None:
    frames = [_header(api_key=0) + body for body in bodies]
    stream = b"".join(_frame(f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = FrameReader(_limit)
    out = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        reader.receive_data(stream[start:end])
        while (frame := reader.next_frame()) is not None:
            out.append(frame)
    assert out == frames
    assert reader.buffered == 0


def test_oversized_frame_is_refused_from_its_first_six_bytes() -> None:
    reader = FrameReader(_limit)
    reader.receive_data(struct.pack(">ih", 101, 3))  # Metadata: limit 100
    with pytest.raises(RequestTooLargeError):
        reader.next_frame()
    reader = FrameReader(_limit)
    reader.receive_data(struct.pack(">ih", 1000, 0))  # Produce: limit 1000
    assert reader.next_frame() is None


def test_oversized_frame_of_an_answered_api_is_read_past() -> None:
    """Over its api's limit from the size and api key on: never buffered, only its first
    OVERSIZED_PREFIX bytes kept; it comes out once the client sent it all, and the frames
    behind it are cut as before."""
    body = _header(api_key=3) + bytes(range(256)) * 400  # Metadata: limit 100
    big = _frame(body)
    reader = FrameReader(_limit, read_past={3})
    for start in range(0, len(big), 7000):
        reader.receive_data(big[start:start + 7000])
        frame = reader.next_frame()
        assert reader.buffered == 0
        if start + 7000 < len(big):
            assert frame is None
    assert frame == OversizedFrame(body[:OVERSIZED_PREFIX], len(body))
    reader.receive_data(_frame(_header(api_key=3)))
    assert reader.next_frame() == _header(api_key=3)


@pytest.mark.parametrize("size", [-1, 0, 9, -(2**31)])
def test_frame_shorter_than_a_header_is_malformed(size: int) -> None:
    reader = FrameReader(_limit)
    reader.receive_data(struct.pack(">ih", size, 3))
    with pytest.raises(MalformedRequestError):
        reader.next_frame()


def test_header_v1_golden() -> None:
    frame = b"\x00\x03\x00\x08\x00\x00\x00\x07\x00\x03cli" + b"BODY"
    header, offset = parse_request_header(frame, lambda k, v: False)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        3, 8, 7, "cli")
    assert frame[offset:] == b"BODY"


def test_header_v2_skips_tagged_fields() -> None:
    frame = _header(18, 3, 1) + b"\x02\x00\x01X\x05\x02YZ" + b"BODY"
    header, offset = parse_request_header(frame, lambda k, v: True)
    assert header.client_id == "cli"
    assert frame[offset:] == b"BODY"


def test_null_client_id() -> None:
    header, offset = parse_request_header(_header(client=None), lambda k, v: False)
    assert header.client_id is None and offset == 10


@pytest.mark.parametrize("frame", [
    b"\x00\x03\x00\x08\x00\x00",                          # cut inside the fixed fields
    b"\x00\x03\x00\x08\x00\x00\x00\x07\x00\x09cli",       # client_id longer than the frame
    b"\x00\x03\x00\x08\x00\x00\x00\x07\x00\x02\xff\xfe",  # client_id not UTF-8
    b"\x00\x03\x00\x08\x00\x00\x00\x07\xff\xfe",          # client_id length -2
])
def test_bad_headers_are_malformed(frame: bytes) -> None:
    with pytest.raises(MalformedRequestError):
        parse_request_header(frame, lambda k, v: False)


@pytest.mark.parametrize("tags", [
    b"\x41",                      # 65 tagged fields
    b"\x01\x00\x09X",             # a tag longer than the frame
    b"\x80\x80\x80\x80\x80\x01",  # a varint of six bytes
    b"",                          # no tag count at all
])
def test_bad_tagged_fields_are_malformed(tags: bytes) -> None:
    with pytest.raises(MalformedRequestError):
        parse_request_header(_header() + tags, lambda k, v: True)


def test_response_prefix_golden() -> None:
    assert response_prefix(7, 3, False) == b"\x00\x00\x00\x07\x00\x00\x00\x07"
    assert response_prefix(7, 3, True) == b"\x00\x00\x00\x08\x00\x00\x00\x07\x00"
