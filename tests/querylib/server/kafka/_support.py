"""Test helpers for the Kafka endpoint: a listener on its own event-loop thread (real sockets on
127.0.0.1, a real data directory), and a blocking wire client that speaks the protocol with
kio's generated request/response classes."""

from __future__ import annotations

import asyncio
import io
import socket
import struct
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from querylib.kafka import ListenerLimits
from querylib.kafka._apis import _build, _payload_class, response_header_flexible
from querylib.server import serve_local
from querylib.server.kafka import BrokerBackend, GroupConfig, KafkaListener

T = TypeVar("T")


class ListenerThread:
    """`serve_local` (a broker with only its Kafka listener, as `tq kafka` runs) on a private
    event loop in a daemon thread."""

    def __init__(self, data_dir: str, **options: Any) -> None:
        self.data_dir = data_dir
        self.options = options
        self.loop = asyncio.new_event_loop()
        self.listener: KafkaListener | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="kafka-listener")

    @property
    def backend(self) -> BrokerBackend:
        assert self.listener is not None
        backend = self.listener.backend
        assert isinstance(backend, BrokerBackend)
        return backend

    @property
    def port(self) -> int:
        assert self.listener is not None
        return self.listener.port

    def start(self) -> ListenerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("listener thread did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start() or stop()
            self._error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with serve_local(self.data_dir, "127.0.0.1", 0, **self.options) as listener:
            self.listener = listener
            self._ready.set()
            await self._stop.wait()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the listener's loop (e.g. a backend method) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        if self._error is not None:
            raise self._error


@contextmanager
def running_listener(data_dir: str, **options: Any) -> Iterator[ListenerThread]:
    # No initial delay: here it would only cost time (test_group.py and the tq up interop
    # tests cover it).
    options.setdefault("group_config", GroupConfig(min_session_timeout_ms=100,
                                                   initial_rebalance_delay_ms=0))
    options.setdefault("limits", ListenerLimits())
    thread = ListenerThread(data_dir, **options).start()
    try:
        yield thread
    finally:
        thread.stop()


_SIZE = struct.Struct(">i")


def request_class(api_key: int, version: int) -> type:
    return _payload_class(api_key, version, EntityType.request)


def response_class(api_key: int, version: int) -> type:
    return _payload_class(api_key, version, EntityType.response)


def make_request(api_key: int, version: int, **fields: Any) -> Any:
    """kio's request dataclass for (api, version) from version-free fields (extra dropped)."""
    return _build(request_class(api_key, version), fields)


def encode(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


class WireClient:
    """A blocking Kafka client that sends kio requests and reads kio responses."""

    def __init__(self, port: int, timeout: float = 10.0, client_id: str | None = "wire-test"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.client_id = client_id
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def frame(self, request: Any, version: int | None = None, correlation_id: int | None = None,
              api_key: int | None = None) -> tuple[bytes, int]:
        api_key = request.__api_key__ if api_key is None else api_key
        version = request.__version__ if version is None else version
        if correlation_id is None:
            self._correlation += 1
            correlation_id = self._correlation
        header_cls = RequestHeaderV2 if request.__flexible__ else RequestHeaderV1
        header = header_cls(request_api_key=api_key, request_api_version=version,
                            correlation_id=correlation_id, client_id=self.client_id)
        body = encode(header) + encode(request)
        return _SIZE.pack(len(body)) + body, correlation_id

    def send(self, request: Any, **kwargs: Any) -> int:
        frame, correlation_id = self.frame(request, **kwargs)
        self.sock.sendall(frame)
        return correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes:
        size = _SIZE.unpack(self._read_exact(4))[0]
        return self._read_exact(size)

    def _read_exact(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self.sock.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError("connection closed by the listener")
            chunks += chunk
        return bytes(chunks)

    def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        """(correlation id, decoded response) of the next response frame."""
        frame = self.read_frame()
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        offset = 4
        if response_header_flexible(api_key, version):
            assert frame[4] == 0, "tagged fields in a response header"
            offset = 5
        response, size = entity_reader(response_class(api_key, version))(frame, offset)
        assert offset + size == len(frame), "bytes left after the response body"
        return correlation_id, response

    def call(self, request: Any) -> Any:
        correlation_id = self.send(request)
        got, response = self.receive(request.__api_key__, request.__version__)
        assert got == correlation_id
        return response

    def authenticate(self, user: str, password: str) -> None:
        """SASL PLAIN (SaslHandshake v1, then SaslAuthenticate v2), as Kafka clients do."""
        shake = self.call(make_request(17, 1, mechanism="PLAIN"))
        assert shake.error_code == 0, shake
        done = self.call(make_request(36, 2, auth_bytes=f"\0{user}\0{password}".encode()))
        assert done.error_code == 0, done

    def is_closed(self, timeout: float = 10.0) -> bool:
        """True once the listener has closed this connection (EOF within `timeout`)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
