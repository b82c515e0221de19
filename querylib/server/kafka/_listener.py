"""KafkaListener: the thin asyncio server of the Kafka endpoint.

It moves bytes: frames cut by `FrameReader`, headers parsed by `_framing`, bodies decoded by
`_apis`, requests given to the handlers, responses written back in request order (Kafka clients
pipeline requests and match responses by order and correlation id), Fetch record slices sent
with `loop.sendfile` (which falls back to read-and-write where the transport cannot sendfile).

Per connection, one request at a time, as Kafka's broker does: a Fetch waiting for data holds
back the responses behind it. Frames are cut as bytes arrive; while more than
`ListenerLimits.max_inflight_request_bytes` of requests wait behind the one being handled, the
connection is not read (Kafka mutes a channel the same way), so TCP holds the client back. A
`KafkaProtocolError` (bad frame, unknown api or version, body that does not decode) closes that
connection only, after the requests before it are answered; nothing a client sends stops the
listener.

Connections are accepted by `querylib._tcp.TcpListener`: caps in total and per client address,
the process's descriptor budget, the idle timeout (a connection with a request queued or being
handled is not idle), refusals logged once per interval; with `ssl`, TLS (Python's ssl).

Authentication (DESIGN §12). With `sasl` mechanisms enabled a connection must authenticate
first, as on Kafka's SASL_PLAINTEXT/SASL_SSL listeners: before SaslHandshake v1 and
SaslAuthenticate succeed it may send ApiVersions and nothing else (anything else closes it); a
failed authentication is answered with its error and the connection closed. The exchange is
`_sasl.SaslExchange`; the password comes from the backend (the principal's broker key).
Requests then act as the authenticated principal (`RequestContext.principal`); without SASL
every client is "anonymous".
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

from catalog import ANONYMOUS
from catalog.errors import TqError
from querylib._tcp import Connection, TcpListener
from querylib.kafka._apis import (
    ApiKey,
    ListenerLimits,
    build_response,
    decode_request,
    encode_response,
    is_flexible,
    is_supported,
    response_header_flexible,
)
from querylib.kafka._errors import (
    ErrorCode,
    IllegalSaslStateError,
    KafkaProtocolError,
    ListenError,
    RequestTooLargeError,
    SaslError,
    UnsupportedSaslMechanismError,
    error_code_of,
)
from querylib.kafka._framing import (
    FrameReader,
    OversizedFrame,
    parse_request_header,
    response_prefix,
)

from ._admin import AdminHandlers
from ._backend import KafkaBackend
from ._group import GroupConfig
from ._group_service import GroupService
from ._handlers import (
    DataHandlers,
    RawResponse,
    RequestContext,
    api_versions_error,
    oversized_produce_response,
)
from ._sasl import MECHANISMS, SaslExchange, principal_of_username
from ._txn_service import TxnHandlers

__all__ = ["KafkaListener", "ListenerStats"]

logger = logging.getLogger("querylib.kafka")

Handler = Callable[[RequestContext, Any], Awaitable[Any]]


class ListenerStats:
    """Counters for tests and metrics."""

    __slots__ = ("_tcp", "auth_failures", "connections", "max_inflight_bytes", "muted",
                 "open_connections", "protocol_errors", "requests", "unauthenticated",
                 "versions")

    def __init__(self) -> None:
        self._tcp: TcpListener | None = None
        self.connections = 0
        self.open_connections = 0
        self.requests = 0
        self.protocol_errors = 0
        self.muted = 0  # times a connection stopped being read: too many requests waiting
        self.max_inflight_bytes = 0  # most request bytes read ahead on one connection
        self.auth_failures = 0  # SASL exchanges that failed (wrong password, unknown user)
        self.unauthenticated = 0  # connections closed for a request before authenticating
        self.versions: Counter[tuple[int, int]] = Counter()  # requests by (api key, version)

    @property
    def refused_connections(self) -> int:
        """Connections closed at once: over a connection limit."""
        return self._tcp.counters["refused"] if self._tcp is not None else 0

    @property
    def idle_closed(self) -> int:
        """Connections closed after the idle timeout."""
        return self._tcp.counters["idle_closed"] if self._tcp is not None else 0


class _Inbound(asyncio.Protocol):
    """One connection's transport side: cuts frames as bytes arrive and queues them, stops
    reading while too many wait, and lets the writer wait for the socket (`drain`)."""

    def __init__(self, frames: FrameReader, cap: int, conn: Connection,
                 stats: ListenerStats) -> None:
        self.frames = frames
        self.cap = cap
        self.conn = conn
        self.stats = stats
        self.queue: deque[bytes | OversizedFrame] = deque()
        self.queued = 0  # bytes of the frames in `queue`
        self.handling = False
        self.error: KafkaProtocolError | None = None
        self.eof = False
        self.transport: asyncio.Transport | None = None
        self._ready: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._reading = True
        self._lost = False
        self._lingering = False

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn.touch()
        if self._lingering:
            return  # answered and closing: what the client still sends is dropped
        frames = self.frames
        try:
            frames.receive_data(data)
            while (frame := frames.next_frame()) is not None:
                if isinstance(frame, OversizedFrame):
                    # Answered (with the api's error, where it can be) after the requests
                    # before it; then the connection closes: read nothing more.
                    self.queue.append(frame)
                    self.queued += len(frame.prefix)
                    raise RequestTooLargeError(f"request of {frame.size} bytes exceeds the "
                                             "listener's limit for its api")
                self.queue.append(frame)
                self.queued += len(frame)
        except KafkaProtocolError as exc:
            # Answer what came before it, then close: read nothing more.
            self.error = exc
            self._pause()
        inflight = self.queued + frames.buffered
        if inflight > self.stats.max_inflight_bytes:
            self.stats.max_inflight_bytes = inflight
        if inflight > self.cap and (self.queue or self.handling):
            self.stats.muted += 1
            self._pause()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        # Half-closed: the responses to what it sent may still go out. Over TLS there is no
        # half-close (asyncio closes the connection whatever this says, and warns of a True).
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = self._lost = True
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- for the connection's task ---------------------------------------------------------------

    async def next_frame(self) -> bytes | OversizedFrame | None:
        """The next whole request, or None at the end of the connection (EOF, or a protocol
        error, which is raised once the requests before it are taken). The previous request
        is taken as answered."""
        self.handling = False
        while not self.queue:
            if self.error is not None:
                raise self.error
            if self.eof:
                return None
            self._resume()  # nothing waits: read the next request, however big
            self._ready = asyncio.get_running_loop().create_future()
            await self._ready
        frame = self.queue.popleft()
        self.queued -= len(frame.prefix if isinstance(frame, OversizedFrame) else frame)
        if self.queued + self.frames.buffered <= self.cap:
            self._resume()
        self.handling = True
        return frame

    def busy(self) -> bool:
        return self.handling or bool(self.queue)

    def write(self, data: bytes) -> None:
        if self._lost:
            raise ConnectionResetError("the Kafka client closed the connection")
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("the Kafka client closed the connection")
        if self._writing_paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
            if self._lost:
                raise ConnectionResetError("the Kafka client closed the connection")

    async def linger(self, timeout: float) -> None:
        """Before closing: drop what the client still sends for `timeout` seconds, or until it
        closes. Closing at once could reset the connection under a response the client has not
        read yet (bytes arriving at a closed socket), and a client that sees the end of the
        connection in the same read as the response may drop the response (kafka-python)."""
        transport = self.transport
        if transport is None or self._lost:
            return
        self._lingering = True
        self.eof = False
        self._reading = False  # resume even though an error was seen
        transport.resume_reading()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.eof and (remaining := deadline - loop.time()) > 0:
            self._ready = loop.create_future()
            try:
                await asyncio.wait_for(self._ready, remaining)
            except TimeoutError:
                return

    def _pause(self) -> None:
        if self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()

    def _resume(self) -> None:
        if not self._reading and self.error is None and not self._lost:
            self._reading = True
            assert self.transport is not None
            self.transport.resume_reading()

    def _wake(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)


class _Auth:
    """One connection's authentication: who it is once SASL succeeded (at once "anonymous"
    on a listener without SASL), and the exchange under way."""

    __slots__ = ("exchange", "principal")

    def __init__(self, required: bool) -> None:
        self.principal: str | None = None if required else ANONYMOUS
        self.exchange: SaslExchange | None = None


_BEFORE_AUTH = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


_LINGER = 1.0  # seconds a connection closing after an oversized request waits for the client


class _Close(Exception):  # noqa: N818 - control flow: answered, now close the connection
    pass


class KafkaListener:
    """Serves the Kafka protocol for `backend` on host:port (port 0: any free port); `sasl`:
    the SASL mechanisms clients must authenticate with (none: every client is anonymous);
    `ssl`: a server TLS context."""

    def __init__(
        self,
        backend: KafkaBackend,
        host: str = "127.0.0.1",
        port: int = 9092,
        *,
        limits: ListenerLimits | None = None,
        group_config: GroupConfig | None = None,
        sasl: tuple[str, ...] = (),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        unknown = [m for m in sasl if m not in MECHANISMS]
        if unknown:
            raise UnsupportedSaslMechanismError(
                f"SASL mechanism(s) {', '.join(unknown)} not supported; tq offers "
                f"{', '.join(MECHANISMS)}")
        self.backend = backend
        self.sasl = tuple(sasl)
        self.ssl_context = ssl_context
        self.limits = limits or ListenerLimits()
        self.stats = ListenerStats()
        self._host, self._port = host, port
        self._data = DataHandlers(backend)
        self.groups = GroupService(backend, group_config)
        self._tcp: TcpListener | None = None
        g = self.groups
        admin = AdminHandlers(backend)
        txn = TxnHandlers(backend)
        self._handlers: dict[int, Handler] = {
            ApiKey.PRODUCE: self._data.produce,
            ApiKey.FETCH: self._data.fetch,
            ApiKey.LIST_OFFSETS: self._data.list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self._data.offset_for_leader_epoch,
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
            ApiKey.DESCRIBE_CONFIGS: admin.describe_configs,
            ApiKey.DELETE_TOPICS: admin.delete_topics,
            ApiKey.DELETE_RECORDS: admin.delete_records,
            ApiKey.DESCRIBE_CLUSTER: admin.describe_cluster,
            ApiKey.CREATE_PARTITIONS: admin.create_partitions,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: admin.incremental_alter_configs,
            ApiKey.DELETE_GROUPS: g.delete_groups,
            ApiKey.OFFSET_DELETE: g.offset_delete,
            ApiKey.ADD_PARTITIONS_TO_TXN: txn.add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: txn.add_offsets_to_txn,
            ApiKey.END_TXN: txn.end_txn,
            ApiKey.TXN_OFFSET_COMMIT: txn.txn_offset_commit,
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
        limits = self.limits
        tcp = TcpListener(f"Kafka listener {self._host}:{self._port}", self._accept, self._host,
                          self._port, max_connections=limits.max_connections,
                          max_per_address=limits.max_connections_per_address,
                          idle_timeout=limits.idle_timeout_ms / 1000, log=logger,
                          ssl_context=self.ssl_context)
        try:
            _host, self._port = await tcp.start()
        except OSError as exc:
            await self.groups.stop()
            raise ListenError(f"cannot listen for Kafka clients on {self._host}:{self._port}: "
                              f"{exc.strerror or exc}", exc.errno) from exc
        tcp.name = f"Kafka listener {self._host}:{self._port}"
        self._tcp = self.stats._tcp = tcp
        logger.info("Kafka listener on %s:%d", self._host, self._port)

    async def stop(self) -> None:
        """Stop accepting, close every connection, stop the group timers. The backend stays
        open (its owner closes it)."""
        tcp, self._tcp = self._tcp, None
        if tcp is not None:
            await tcp.close()
        await self.groups.stop()

    async def __aenter__(self) -> KafkaListener:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- connections --------------------------------------------------------------------------

    async def _accept(self, conn: Connection) -> None:
        self.stats.connections += 1
        self.stats.open_connections += 1
        client_host = f"/{conn.address}"
        limits = self.limits
        frames = FrameReader(lambda api_key: limits.max_frame_bytes
                             if api_key == ApiKey.PRODUCE else limits.max_request_bytes,
                             read_past=(ApiKey.PRODUCE,))  # answered MESSAGE_TOO_LARGE
        auth = _Auth(required=bool(self.sasl))
        try:
            inbound = await conn.open(lambda: _Inbound(frames, limits.max_inflight_request_bytes,
                                                       conn, self.stats))
            conn.busy = inbound.busy
            while (frame := await inbound.next_frame()) is not None:
                await self._handle_frame(frame, inbound, client_host, auth)
        except _Close:
            pass
        except KafkaProtocolError as exc:
            self.stats.protocol_errors += 1
            logger.info("closing Kafka connection from %s: %s", client_host, exc)
            if isinstance(exc, RequestTooLargeError):
                await inbound.linger(_LINGER)  # the client reads its MESSAGE_TOO_LARGE
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            pass
        except TqError as exc:
            logger.warning("closing Kafka connection from %s: %s", client_host, exc)
        except Exception:
            logger.exception("bug: closing Kafka connection from %s", client_host)
        finally:
            self.stats.open_connections -= 1

    async def _handle_frame(self, frame: bytes | OversizedFrame, out: _Inbound,
                            client_host: str, auth: _Auth) -> None:
        if isinstance(frame, OversizedFrame):
            await self._answer_oversized(frame, out, auth)
            return
        header, offset = parse_request_header(frame, is_flexible)
        self.stats.requests += 1
        api_key, version = header.api_key, header.api_version
        if is_supported(api_key, version):  # pairs a client makes up are not kept
            self.stats.versions[api_key, version] += 1
        if auth.principal is None and api_key not in _BEFORE_AUTH:
            self.stats.unauthenticated += 1
            raise KafkaProtocolError(f"api key {api_key} before SASL authentication: this "
                                     "listener needs SASL (PLAIN or SCRAM)")
        if api_key == ApiKey.API_VERSIONS and not is_supported(api_key, version):
            body = encode_response(api_versions_error())
            out.write(response_prefix(header.correlation_id, len(body), False) + body)
            await out.drain()
            return
        request = decode_request(api_key, version, frame, offset,
                                 max_produce_partitions=self.limits.max_produce_partitions)
        ctx = RequestContext(api_key, version, header.correlation_id, header.client_id,
                             client_host, auth.principal or ANONYMOUS)
        close = False
        if api_key == ApiKey.SASL_HANDSHAKE:
            response, close = self._handshake(ctx, request, auth)
        elif api_key == ApiKey.SASL_AUTHENTICATE:
            response, close = await self._authenticate(ctx, request, auth)
        else:
            response = await self._handlers[api_key](ctx, request)
        flexible = response_header_flexible(api_key, version)
        if close:  # answer, then end the connection (as Kafka does after a SASL failure)
            body = encode_response(response)
            out.write(response_prefix(header.correlation_id, len(body), flexible) + body)
            await out.drain()
            raise _Close()
        if response is None:
            return
        if isinstance(response, RawResponse):
            try:
                await self._send_raw(out, header.correlation_id, flexible, response)
            finally:
                response.close()
            return
        body = encode_response(response)
        out.write(response_prefix(header.correlation_id, len(body), flexible) + body)
        await out.drain()

    async def _answer_oversized(self, frame: OversizedFrame, out: _Inbound,
                                auth: _Auth) -> None:
        """A request over its frame limit: a Produce (from an authenticated connection) is
        answered MESSAGE_TOO_LARGE for the partitions its kept prefix names, as the client
        expects for a batch too large, not a silent close; the connection closes after it."""
        header, offset = parse_request_header(frame.prefix, is_flexible)
        self.stats.requests += 1
        api_key, version = header.api_key, header.api_version
        if auth.principal is None or api_key != ApiKey.PRODUCE or \
                not is_supported(api_key, version):
            return
        response = oversized_produce_response(version, frame.prefix, offset)
        if response is None:
            return
        flexible = response_header_flexible(api_key, version)
        body = response.chunks[0] if isinstance(response, RawResponse) else \
            encode_response(response)
        out.write(response_prefix(header.correlation_id, len(body), flexible) + body)
        await out.drain()

    # ---- SASL (DESIGN §12) ------------------------------------------------------------------

    def _handshake(self, ctx: RequestContext, request: Any, auth: _Auth) -> tuple[Any, bool]:
        """SaslHandshake v1: pick the mechanism for the SaslAuthenticate requests to come."""
        error: TqError | None = None
        if not self.sasl:
            error = UnsupportedSaslMechanismError("this listener takes no SASL")
        elif auth.principal is not None or auth.exchange is not None:
            error = IllegalSaslStateError("SASL handshake twice on one connection")
        elif ctx.api_version < 1:
            error = UnsupportedSaslMechanismError("SaslHandshake v0 (raw SASL tokens) is not "
                                                  "supported: use v1 and SaslAuthenticate")
        elif request.mechanism not in self.sasl:
            error = UnsupportedSaslMechanismError(f"mechanism {request.mechanism[:40]!r}")
        else:
            auth.exchange = SaslExchange(request.mechanism)
        return build_response(ApiKey.SASL_HANDSHAKE, ctx.api_version, {
            "error_code": ErrorCode.none if error is None else error_code_of(error),
            # A SASL listener closes the connection after a failed handshake, as Kafka does;
            # one without SASL only says so (the client was misconfigured, nothing more).
            "mechanisms": list(self.sasl)}), error is not None and bool(self.sasl)

    async def _authenticate(self, ctx: RequestContext, request: Any,
                            auth: _Auth) -> tuple[Any, bool]:
        """SaslAuthenticate: one token of the exchange; the connection is authenticated once
        the exchange is done, and closed when it fails."""
        exchange = auth.exchange
        token = bytes(request.auth_bytes)
        try:
            if exchange is None or exchange.done:
                raise IllegalSaslStateError("SaslAuthenticate without a SASL handshake")
            if exchange.username_needed:
                user = exchange.username(token)
                password = await self.backend.password(principal_of_username(user))
                reply = exchange.respond(token, password)
            else:
                reply = exchange.respond(token)
        except SaslError as exc:
            self.stats.auth_failures += 1
            logger.info("Kafka SASL %s from %s failed: %s",
                        exchange.mechanism if exchange else "-", ctx.client_host, exc)
            return build_response(ApiKey.SASL_AUTHENTICATE, ctx.api_version, {
                "error_code": error_code_of(exc), "error_message": str(exc),
                "auth_bytes": b""}), bool(self.sasl)
        if exchange.done:
            auth.principal = exchange.principal
        return build_response(ApiKey.SASL_AUTHENTICATE, ctx.api_version, {
            "error_code": ErrorCode.none, "error_message": None, "auth_bytes": reply}), False

    async def _send_raw(self, out: _Inbound, correlation_id: int, flexible: bool,
                        response: RawResponse) -> None:
        loop = asyncio.get_running_loop()
        out.write(response_prefix(correlation_id, response.size, flexible))
        for chunk in response.chunks:
            if isinstance(chunk, bytes):
                out.write(chunk)
                continue
            await out.drain()
            if self.ssl_context is not None:
                # TLS encrypts in this process: no sendfile. (asyncio's fallback for SSL
                # transports swaps the transport's protocol for its own while it copies, and
                # the connection's reads stall behind it.)
                await _copy_slice(out, chunk.fd, chunk.position, chunk.length)
                continue
            if out.transport is None or out.transport.is_closing():
                # The client left while the answer was made (a consumer closing while its
                # fetch waited): nothing to send it, and sendfile would refuse.
                raise ConnectionResetError("the client closed its connection")
            # The slice owns its descriptor; the wrapper must not close it. loop.sendfile
            # seeks the wrapper when done, harmless: segments are written with O_APPEND and
            # read with pread.
            with os.fdopen(chunk.fd, "rb", buffering=0, closefd=False) as file:
                await loop.sendfile(out.transport, file, chunk.position,
                                    chunk.length)
        await out.drain()


_COPY_BYTES = 256 * 1024


async def _copy_slice(out: _Inbound, fd: int, position: int, length: int) -> None:
    """Write `length` bytes of the file at `position` to the connection, a piece at a time,
    waiting for the socket between pieces (reads on a thread: the page cache may miss)."""
    end = position + length
    while position < end:
        data = await asyncio.to_thread(os.pread, fd, min(_COPY_BYTES, end - position), position)
        if not data:
            raise ConnectionResetError("the log slice ended early")  # truncated under us
        out.write(data)
        await out.drain()
        position += len(data)
