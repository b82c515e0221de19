"""Running the console: uvicorn and the feed on an event loop thread of their own, beside the
coordinator's (DESIGN §13 "Console").

`Console(coordinator, secret, port=...).start()` binds the port (a default port that is taken
falls back to a free one; a port the caller named does not), then serves until `stop()`. The
console holds the cluster secret: it checks logins (a principal's password is its Kafka SASL
password) and acts as the logged-in principal, with the key the coordinator derives for it.

Must not: run on the coordinator's loop (a slow browser or a large page never delays the
control plane), or serve on an address other than the one it was given.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import math
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from catalog import ADMIN, User
from catalog.errors import UserError
from querylib.cluster import AsyncCluster
from querylib.rpc import Credential, kafka_password, principal_key

from ._app import Access, Changes, build_app, is_loopback
from ._feed import Feed
from ._logs import query_lines
from ._model import ClusterModel

__all__ = ["DEFAULT_CONSOLE_PORT", "Console", "ConsoleUnavailableError"]

DEFAULT_CONSOLE_PORT = 7480
MAX_CONNECTIONS = 256  # open HTTP connections (an event stream holds one): past it, 503
MAX_CONNECTIONS_PER_ADDRESS = 32  # of them from one client address: past it, 503 for it alone
REQUEST_TIMEOUT = 10.0  # seconds for a request to arrive, head and body: past it, closed
logger = logging.getLogger("querylib.console")


class ConsoleUnavailableError(UserError):
    """The console's port could not be bound."""


class Console:
    """The web console of one cluster (see the module docstring)."""

    def __init__(self, coordinator: str, secret: bytes, *, host: str = "127.0.0.1",
                 port: int = DEFAULT_CONSOLE_PORT, fallback: bool = True,
                 metrics: Any = None,
                 groups: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
                 max_connections: int = MAX_CONNECTIONS,
                 max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
                 request_timeout: float = REQUEST_TIMEOUT,
                 tls: tuple[str, str] | None = None) -> None:
        """`tls`: (certificate chain, private key) PEM files: HTTPS only, and login cookies
        that go back over HTTPS only."""
        self.coordinator = coordinator
        self.secret = secret
        self.host = host
        self.asked = port
        self.fallback = fallback
        self.model = ClusterModel()
        self.metrics = metrics  # a querylib.server.ProcessMetrics, served at /metrics
        # the consumer groups, when this process runs the group coordinator: an async
        # function of the coordinator's loop (called there through `_on_owner`)
        self.groups = groups
        self.max_connections = max_connections
        self.max_connections_per_address = max_connections_per_address
        self.request_timeout = request_timeout
        self.tls = tls
        self.access = Access(loopback=is_loopback(host), check_password=self._password_ok,
                             secure=tls is not None)
        self.port = 0
        self.moved = False  # the default port was taken and another one was used
        self._thread: threading.Thread | None = None
        self._server: uvicorn.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._changes: Changes | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/"

    @property
    def login_url(self) -> str:
        """The start-up link: whoever opens it is logged in as the admin."""
        return f"{self.url}login?token={self.access.token}"

    def start(self, timeout: float = 30.0) -> Console:
        sock = self._bind()
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, args=(sock,), daemon=True,
                                        name="tq-console")
        self._thread.start()
        if not self._started.wait(timeout):
            raise ConsoleUnavailableError(f"the console on port {self.port} did not start "
                                          f"within {timeout:g}s")
        if self._failure is not None:
            raise ConsoleUnavailableError(f"the console did not start: {self._failure}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        server, loop, changes = self._server, self._loop, self._changes
        if loop is not None and not loop.is_closed():
            try:  # end every event stream, then the server (it waits for open requests)
                if changes is not None:
                    loop.call_soon_threadsafe(changes.close)
            except RuntimeError:
                pass
        if server is not None:
            server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    # -- inside -------------------------------------------------------------------------------

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        for port in (self.asked, 0) if self.fallback else (self.asked,):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, port))
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE and port != 0:
                    continue
                raise ConsoleUnavailableError(
                    f"the console cannot listen on {self.host}:{port}: {exc.strerror}") \
                    from None
            sock.listen(128)
            self.moved = port != self.asked
            return sock
        raise ConsoleUnavailableError(f"the console's port {self.asked} is taken "
                                      f"(--console-port PORT, or -1 for no console)")

    def _run(self, sock: socket.socket) -> None:
        try:
            asyncio.run(self._main(sock))
        except BaseException as exc:  # noqa: BLE001 - told to start(), or logged once
            if not self._started.is_set():
                self._failure = exc
                self._started.set()
            else:
                logger.exception("the console stopped")

    async def _main(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self._changes = changes = Changes()
        feed = Feed(self.coordinator, Credential.of(self.secret), self.model,
                    changed=changes.bump, groups=None if self.groups is None else self._groups)
        app = build_app(self.model, changes, self.access, self._kill, self._lines,
                        delete=self._delete,
                        metrics=None if self.metrics is None else self.metrics.text)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1,
                                # bounded: past these, 503 (and idle connections close)
                                # uvicorn counts the arriving connection among the open
                                limit_concurrency=self.max_connections + 1,
                                http=_timed_http(self.request_timeout,
                                                 self.max_connections_per_address),
                                timeout_keep_alive=math.ceil(self.request_timeout),
                                h11_max_incomplete_event_size=16 * 1024,
                                ssl_certfile=self.tls[0] if self.tls else None,
                                ssl_keyfile=self.tls[1] if self.tls else None)
        self._server = server = uvicorn.Server(config)
        feeding = asyncio.create_task(self._feed(feed))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        self._started.set()
        try:
            await serving
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            sock.close()

    async def _feed(self, feed: Feed) -> None:
        while True:  # the coordinator may restart: follow it again
            try:
                await feed.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a lost coordinator: try again
                logger.info("console: lost the cluster (%s); again in 1 s", exc)
            await asyncio.sleep(1.0)

    async def _groups(self) -> list[dict[str, Any]]:
        assert self.groups is not None
        return await self.groups()

    def _key(self, principal: str) -> bytes | None:
        if principal == ADMIN:
            return self.secret
        for user in self.model.records("users"):
            if isinstance(user, User) and user.principal == principal:
                return principal_key(self.secret, principal, user.generation)
        return None

    def _password_ok(self, principal: str, password: str) -> bool:
        key = self._key(principal)
        if key is None:
            return False
        expected = kafka_password(Credential(principal, key))
        return hmac.compare_digest(expected.encode(), password.strip().encode())

    def _lines(self, query_id: int) -> AsyncIterator[list[dict[str, Any]]]:
        brokers = {b.broker_id: b.address for b in self.model.records("brokers")}
        addresses = [brokers[e.broker_id] for e in self.model.records("executors")
                     if e.broker_id in brokers]
        return query_lines(addresses, Credential.of(self.secret), query_id)

    async def _kill(self, principal: str, query_id: int) -> Any:
        async with self._as(principal) as cluster:
            return await cluster.kill_query(query_id, reason=f"killed from the console by "
                                                             f"{principal}")

    async def _delete(self, principal: str, name: str) -> None:
        async with self._as(principal) as cluster:
            await cluster.delete_topic(name)

    def _as(self, principal: str) -> AsyncCluster:
        """A session of `principal`'s own: the coordinator authorizes what it asks."""
        key = self._key(principal)
        if key is None:
            raise UserError(f"{principal} is not a principal of this cluster any more")
        return AsyncCluster(self.coordinator, Credential(principal, key),
                            peer=f"tq console ({principal})")


class _TimedHttp(H11Protocol):
    """uvicorn's HTTP/1.1 with a time for each request to arrive in: its head and body within
    `request_timeout` seconds of the connection's start or of the previous response, or the
    connection closes. uvicorn itself times out only a connection idle after a response, and
    no longer once a byte came: connections that send nothing, or a byte now and then, would
    hold every place `limit_concurrency` counts, for good.

    And at most `per_address` open connections from one client address: past that a
    connection gets a 503 and is closed, so one client holding event streams open (or
    reconnecting as fast as its connections time out) cannot take every place. `open_by`
    counts them, shared by the server's connections."""

    request_timeout = REQUEST_TIMEOUT
    per_address = MAX_CONNECTIONS_PER_ADDRESS
    open_by: ClassVar[dict[str, int]] = {}
    _deadline: asyncio.TimerHandle | None = None
    _counted: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self.open_by.get(address, 0) >= self.per_address:
            body = f"too many connections from {address}; close some and retry\n".encode()
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; "
                            b"charset=utf-8\r\nConnection: close\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\n\r\n" + body)
            transport.close()
            return
        self.open_by[address] = self.open_by.get(address, 0) + 1
        self._counted = address
        self._await_request()

    def on_response_complete(self) -> None:
        self._await_request()  # first: a pipelined request may start in there
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self._counted is not None:
            left = self.open_by[self._counted] - 1
            if left:
                self.open_by[self._counted] = left
            else:
                del self.open_by[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def _await_request(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.request_timeout, self._late, self.cycle)

    def _late(self, answered: object) -> None:
        # no request since `answered` (None: since the start), or its body is still coming
        if self.cycle is answered or self.cycle.more_body:
            self.transport.close()


def _timed_http(request_timeout: float, per_address: int) -> type[_TimedHttp]:
    """The protocol class of one console server: its own timeout, bound and counts."""
    return type("TimedHttp", (_TimedHttp,), {"request_timeout": request_timeout,
                                             "per_address": per_address, "open_by": {}})
