"""KafkaListener: the thin asyncio server of the Kafka endpoint.

It moves bytes: frames cut by `FrameReader`, headers parsed by `_framing`, bodies decoded by
`_apis`, requests given to the handlers, responses written back in request order (Kafka clients
pipeline requests and match responses by order and correlation id), Fetch record slices sent
with `loop.sendfile` (which falls back to read-and-write where the transport cannot sendfile).

Per connection, one request at a time, as Kafka's broker does: a Fetch waiting for data holds
back the responses behind it. A `KafkaProtocolError` (bad frame, unknown api or version, body
that does not decode) closes that connection only; nothing a client sends stops the listener.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from catalog.errors import TqError
from querylib.kafka._apis import (
    ApiKey,
    ListenerLimits,
    decode_request,
    encode_response,
    is_flexible,
    is_supported,
    response_header_flexible,
)
from querylib.kafka._backend import KafkaBackend
from querylib.kafka._errors import KafkaProtocolError, ListenError
from querylib.kafka._framing import FrameReader, parse_request_header, response_prefix
from querylib.kafka._group import GroupConfig
from querylib.kafka._group_service import GroupService
from querylib.kafka._handlers import DataHandlers, RawResponse, RequestContext, api_versions_error

__all__ = ["KafkaListener", "ListenerStats"]

logger = logging.getLogger("querylib.kafka")

_READ_SIZE = 256 * 1024
Handler = Callable[[RequestContext, Any], Awaitable[Any]]


class ListenerStats:
    """Counters for tests and metrics."""

    __slots__ = ("connections", "open_connections", "requests", "protocol_errors")

    def __init__(self) -> None:
        self.connections = 0
        self.open_connections = 0
        self.requests = 0
        self.protocol_errors = 0


class KafkaListener:
    """Serves the Kafka protocol for `backend` on host:port (port 0: any free port)."""

    def __init__(
        self,
        backend: KafkaBackend,
        host: str = "127.0.0.1",
        port: int = 9092,
        *,
        limits: ListenerLimits | None = None,
        group_config: GroupConfig | None = None,
    ) -> None:
        self.backend = backend
        self.limits = limits or ListenerLimits()
        self.stats = ListenerStats()
        self._host, self._port = host, port
        self._data = DataHandlers(backend)
        self.groups = GroupService(backend, group_config)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        g = self.groups
        self._handlers: dict[int, Handler] = {
            ApiKey.PRODUCE: self._data.produce,
            ApiKey.FETCH: self._data.fetch,
            ApiKey.LIST_OFFSETS: self._data.list_offsets,
            ApiKey.METADATA: self._data.metadata,
            ApiKey.OFFSET_COMMIT: g.offset_commit,
            ApiKey.OFFSET_FETCH: g.offset_fetch,
            ApiKey.FIND_COORDINATOR: g.find_coordinator,
            ApiKey.JOIN_GROUP: g.join_group,
            ApiKey.HEARTBEAT: g.heartbeat,
            ApiKey.LEAVE_GROUP: g.leave_group,
            ApiKey.SYNC_GROUP: g.sync_group,
            ApiKey.DESCRIBE_GROUPS: g.describe_groups,
            ApiKey.LIST_GROUPS: g.list_groups,
            ApiKey.API_VERSIONS: self._data.api_versions,
            ApiKey.CREATE_TOPICS: self._data.create_topics,
            ApiKey.INIT_PRODUCER_ID: self._data.init_producer_id,
            ApiKey.DESCRIBE_CONFIGS: self._data.describe_configs,
        }

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The bound port (after `start`)."""
        return self._port

    async def start(self) -> None:
        """Bind and start accepting connections. ListenError when the address cannot be bound
        (`errno.EADDRINUSE`: another process has the port)."""
        await self.groups.start()
        try:
            self._server = await asyncio.start_server(self._accept, self._host, self._port)
        except OSError as exc:
            await self.groups.stop()
            raise ListenError(f"cannot listen for Kafka clients on {self._host}:{self._port}: "
                              f"{exc.strerror or exc}", exc.errno) from exc
        self._port = self._server.sockets[0].getsockname()[1]
        logger.info("Kafka listener on %s:%d", self._host, self._port)

    async def stop(self) -> None:
        """Stop accepting, close every connection, stop the group timers. The backend stays
        open (its owner closes it)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await self.groups.stop()

    async def __aenter__(self) -> KafkaListener:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- connections --------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.stats.connections += 1
        self.stats.open_connections += 1
        peer = writer.get_extra_info("peername")
        client_host = f"/{peer[0]}" if peer else "/unknown"
        try:
            await self._serve(reader, writer, client_host)
        except KafkaProtocolError as exc:
            self.stats.protocol_errors += 1
            logger.info("closing Kafka connection from %s: %s", client_host, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except TqError as exc:
            logger.warning("closing Kafka connection from %s: %s", client_host, exc)
        except Exception:
            logger.exception("bug: closing Kafka connection from %s", client_host)
        finally:
            self.stats.open_connections -= 1
            self._connections.discard(task)
            writer.close()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_host: str
    ) -> None:
        limits = self.limits
        frames = FrameReader(lambda api_key: limits.max_frame_bytes
                             if api_key == ApiKey.PRODUCE else limits.max_request_bytes)
        while True:
            data = await reader.read(_READ_SIZE)
            if not data:
                return
            frames.receive_data(data)
            while (frame := frames.next_frame()) is not None:
                await self._handle_frame(frame, writer, client_host)

    async def _handle_frame(
        self, frame: bytes, writer: asyncio.StreamWriter, client_host: str
    ) -> None:
        header, offset = parse_request_header(frame, is_flexible)
        self.stats.requests += 1
        api_key, version = header.api_key, header.api_version
        if api_key == ApiKey.API_VERSIONS and not is_supported(api_key, version):
            body = encode_response(api_versions_error())
            writer.write(response_prefix(header.correlation_id, len(body), False) + body)
            await writer.drain()
            return
        request = decode_request(api_key, version, frame, offset,
                                 max_produce_partitions=self.limits.max_produce_partitions)
        ctx = RequestContext(api_key, version, header.correlation_id, header.client_id,
                             client_host)
        response = await self._handlers[api_key](ctx, request)
        if response is None:
            return
        flexible = response_header_flexible(api_key, version)
        if isinstance(response, RawResponse):
            try:
                await self._send_raw(writer, header.correlation_id, flexible, response)
            finally:
                response.close()
            return
        body = encode_response(response)
        writer.write(response_prefix(header.correlation_id, len(body), flexible) + body)
        await writer.drain()

    async def _send_raw(self, writer: asyncio.StreamWriter, correlation_id: int,
                        flexible: bool, response: RawResponse) -> None:
        loop = asyncio.get_running_loop()
        writer.write(response_prefix(correlation_id, response.size, flexible))
        for chunk in response.chunks:
            if isinstance(chunk, bytes):
                writer.write(chunk)
                continue
            await writer.drain()
            # The slice owns its descriptor; the wrapper must not close it. loop.sendfile
            # seeks the wrapper when done, harmless: segments are written with O_APPEND and
            # read with pread.
            with os.fdopen(chunk.fd, "rb", buffering=0, closefd=False) as file:
                await loop.sendfile(writer.transport, file, chunk.position, chunk.length)
        await writer.drain()
