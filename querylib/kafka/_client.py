"""A small blocking Kafka client: one TCP connection, one request at a time, kio codecs.

    with KafkaClient("127.0.0.1:9092", client_id="tq-group") as client:
        response = client.call(ApiKey.HEARTBEAT, 3, group_id="g", generation_id=1,
                               member_id="m", group_instance_id=None)

Requests are written as version-free dicts with Kafka's field names (as `build_response` does
for the listener's responses) and sent with request header v1; only non-flexible versions are
used. It is what querylib's consumer-group member speaks to the group coordinator.

Must not: retry, pick coordinators or interpret error codes (its caller does), or buffer a
response larger than `max_response_bytes`.
"""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Mapping
from typing import Any

from kio.schema.request_header.v1.header import RequestHeader
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32

from catalog.errors import ProtocolError, TqError
from querylib.kafka._apis import _build, _payload_class, decode_response

__all__ = ["KafkaClient", "KafkaConnectionError"]

_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")
_write_header = entity_writer(RequestHeader)


class KafkaConnectionError(TqError):
    """The Kafka listener could not be reached, closed the connection, or sent garbage."""

    retriable = True


class KafkaClient:
    """One connection to a Kafka listener at HOST:PORT."""

    def __init__(self, address: str, *, client_id: str = "tq", timeout: float = 30.0,
                 max_response_bytes: int = 16 * 1024 * 1024) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.client_id = client_id
        self.max_response_bytes = max_response_bytes
        self._correlation = 0
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        except (OSError, ValueError) as exc:
            raise KafkaConnectionError(f"cannot connect to Kafka listener {address}: "
                                       f"{exc}") from exc

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        """Send one request and return kio's decoded response."""
        request = _build(_payload_class(api_key, version, EntityType.request), fields)
        assert not request.__flexible__, "only non-flexible versions are spoken"
        self._correlation += 1
        buffer = io.BytesIO()
        _write_header(buffer, RequestHeader(request_api_key=i16(api_key),
                                            request_api_version=i16(version),
                                            correlation_id=i32(self._correlation),
                                            client_id=self.client_id))
        entity_writer(type(request))(buffer, request)
        body = buffer.getvalue()
        try:
            self._sock.sendall(_SIZE.pack(len(body)) + body)
            (size,) = _SIZE.unpack(self._read(4))
            if not 4 <= size <= self.max_response_bytes:
                raise KafkaConnectionError(f"{self.address}: response of {size} bytes")
            frame = self._read(size)
        except OSError as exc:
            raise KafkaConnectionError(f"Kafka listener {self.address}: {exc}") from exc
        (correlation,) = _CORRELATION.unpack_from(frame)
        if correlation != self._correlation:
            raise KafkaConnectionError(f"{self.address}: response to request {correlation}, "
                                       f"expected {self._correlation}")
        try:
            return decode_response(api_key, version, frame, 4)
        except ProtocolError as exc:
            raise ProtocolError(f"{self.address}: {exc}") from exc

    def _read(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self._sock.recv(n - len(chunks))
            if not chunk:
                raise KafkaConnectionError(f"Kafka listener {self.address} closed the "
                                           "connection")
            chunks += chunk
        return bytes(chunks)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> KafkaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fields_of(entity: Any) -> Mapping[str, Any]:
    """kio's entity as a dict (for logs and tests)."""
    return {name: getattr(entity, name) for name in entity.__dataclass_fields__}
