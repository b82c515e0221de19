"""Kafka's wire framing, sans-I/O: size-prefixed frames in, request headers parsed, response
headers and size prefixes out.

    frame           = size:int32 (bytes that follow) , request or response
    request header  = request_api_key:int16 request_api_version:int16 correlation_id:int32
                      client_id:nullable legacy string (int16 length)
                      [v2 only: tagged fields = uvarint count, (uvarint tag, uvarint size, bytes)*]
    response header = correlation_id:int32 [v1 only: tagged fields, always empty here]

Header v2 / v1 goes with the flexible versions of each api (ApiVersions responses always use
header v0, whatever the request's version, so a client can read the error of an ApiVersions
request the broker does not understand).

No sockets, no asyncio, no clocks. A size below a header raises `MalformedRequestError`, a
frame over its api's limit `RequestTooLargeError`, before anything is buffered beyond the
limit; but one of an api the listener answers when too large (Produce: MESSAGE_TOO_LARGE) is
read past, never buffered: its first `OVERSIZED_PREFIX` bytes are kept and the rest dropped
as it arrives, and it comes out as an `OversizedFrame` once the client has sent it all
(DESIGN §8).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection
from dataclasses import dataclass

from querylib.errors import BadVarintError
from querylib.kafka._errors import MalformedRequestError, RequestTooLargeError
from querylib.records._varint import read_uvarint as _read_uvarint

__all__ = ["OVERSIZED_PREFIX", "FrameReader", "OversizedFrame", "RequestHeader",
           "parse_request_header", "response_prefix"]

_SIZE = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhih")  # api key, api version, correlation id, client_id length
_API_KEY = struct.Struct(">h")
_RESPONSE_HEADER = struct.Struct(">ii")  # frame size, correlation id
# A request header is at least 10 bytes (the fixed fields with a null client_id).
MIN_REQUEST_SIZE = _HEADER_FIXED.size
_MAX_TAGGED_FIELDS = 64  # the header defines no tags; a few unknown ones are tolerated
# What is kept of a frame over its limit: the header and the start of the body (Produce: the
# topics and partitions before the first records, which are what its error names).
OVERSIZED_PREFIX = 64 * 1024


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class OversizedFrame:
    """A frame larger than its api's limit, read past: its first bytes and announced size."""

    prefix: bytes  # at most OVERSIZED_PREFIX bytes: the request header and the body's start
    size: int


class FrameReader:
    """Cuts a byte stream into frames.

    `max_frame_bytes(api_key)` bounds each frame by its api (Produce carries record batches,
    everything else is small), checked as soon as the size and api key have arrived, before
    the frame's bytes are buffered. A frame over it comes out as an `OversizedFrame` once all
    its bytes have arrived (and been dropped) when its api is one of `read_past`.
    """

    def __init__(self, max_frame_bytes: Callable[[int], int],
                 read_past: Collection[int] = ()) -> None:
        self._limit = max_frame_bytes
        self._read_past_apis = frozenset(read_past)
        self._buffer = bytearray()
        self._need: int | None = None  # size of the frame being read, once checked
        self._past: bytearray | None = None  # the kept prefix of an oversized frame
        self._left = 0  # bytes of the oversized frame still to drop
        self._past_size = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def next_frame(self) -> bytes | OversizedFrame | None:
        """The next whole frame (without its size prefix), or None until more bytes arrive.
        Raises RequestTooLargeError / MalformedRequestError for a size no request may have."""
        buffer = self._buffer
        if self._past is not None:
            return self._read_past()
        if self._need is None:
            if len(buffer) < _SIZE.size + _API_KEY.size:
                return None
            (size,) = _SIZE.unpack_from(buffer, 0)
            (api_key,) = _API_KEY.unpack_from(buffer, _SIZE.size)
            if size < MIN_REQUEST_SIZE:
                raise MalformedRequestError(f"frame of {size} bytes is shorter than a header")
            limit = self._limit(api_key)
            if size > limit and api_key not in self._read_past_apis:
                raise RequestTooLargeError(
                    f"frame of {size} bytes for api key {api_key} exceeds the limit of {limit}")
            if size > limit:
                del buffer[:_SIZE.size]
                self._past, self._left, self._past_size = bytearray(), size, size
                return self._read_past()
            self._need = size
        end = _SIZE.size + self._need
        if len(buffer) < end:
            return None
        frame = bytes(buffer[_SIZE.size:end])
        del buffer[:end]
        self._need = None
        return frame

    def _read_past(self) -> OversizedFrame | None:
        """Keep the prefix of the oversized frame, drop the rest as it arrives."""
        buffer, past = self._buffer, self._past
        assert past is not None
        take = min(len(buffer), self._left)
        keep = min(take, OVERSIZED_PREFIX - len(past))
        past += buffer[:keep]
        del buffer[:take]
        self._left -= take
        if self._left:
            return None
        self._past = None
        return OversizedFrame(bytes(past), self._past_size)


def parse_request_header(
    frame: bytes, flexible: Callable[[int, int], bool]
) -> tuple[RequestHeader, int]:
    """(header, offset of the body). `flexible(api_key, version)` says whether header v2
    (with tagged fields) applies."""
    if len(frame) < _HEADER_FIXED.size:
        raise MalformedRequestError("request shorter than its header")
    api_key, version, correlation_id, length = _HEADER_FIXED.unpack_from(frame, 0)
    pos = _HEADER_FIXED.size
    client_id: str | None = None
    if length >= 0:
        if pos + length > len(frame):
            raise MalformedRequestError("client_id runs past the end of the request")
        try:
            client_id = frame[pos:pos + length].decode()
        except UnicodeDecodeError:
            raise MalformedRequestError("client_id is not UTF-8") from None
        pos += length
    elif length != -1:
        raise MalformedRequestError(f"client_id length {length}")
    header = RequestHeader(api_key, version, correlation_id, client_id)
    if flexible(api_key, version):
        pos = skip_tagged_fields(frame, pos)
    return header, pos


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (a uint32) at `pos`: (value, next position)."""
    try:
        return _read_uvarint(buf, pos)
    except BadVarintError as exc:
        raise MalformedRequestError(f"request: {exc}") from None


def skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    if count > _MAX_TAGGED_FIELDS:
        raise MalformedRequestError(f"{count} tagged fields in one place of a request")
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        if pos + size > len(buf):
            raise MalformedRequestError("tagged field runs past the end of the request")
        pos += size
    return pos


def response_prefix(correlation_id: int, body_size: int, flexible_header: bool) -> bytes:
    """Size prefix and response header for a body of `body_size` bytes."""
    if flexible_header:
        return _RESPONSE_HEADER.pack(body_size + 5, correlation_id) + b"\x00"
    return _RESPONSE_HEADER.pack(body_size + 4, correlation_id)
