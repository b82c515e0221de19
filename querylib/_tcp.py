"""The accept loop every TCP listener of tq runs on (the Kafka listener, the connector
endpoint), and the process's budget of descriptors for accepted connections.

Why not `asyncio.start_server`: its accept loop reports every failed accept() through the
loop's exception handler, a traceback each, and on EMFILE it keeps trying the rest of its
burst of 100 accepts and schedules one restart per failure (CPython 3.11): a flood of
connections against a process out of descriptors wrote millions of tracebacks. It also has
no connection limits. `TcpListener` accepts itself:

- Admission. A connection is refused (accepted and closed at once) when its listener holds
  `max_connections`, when its address holds `max_per_address`, or when the process's
  `ConnectionBudget` is spent. The budget keeps every listener of the process together below
  RLIMIT_NOFILE with a reserve (`fd_reserve`) for what the process needs besides accepted
  connections: ZeroMQ sockets (and their reconnects), log segments, pipes to child processes.
  Each listener keeps a small guaranteed share of the budget, so a flood on one listener does
  not lock out the others (the group coordinator's Kafka listener beside an executor's).
- Accept failures (EMFILE, ENFILE, ENOBUFS, ENOMEM, anything else accept() raises) pause
  this listener's accepting for a moment; the connections wait in the kernel's backlog.
- Refusals and failures (failed TLS handshakes too) are counted and logged once per interval
  (`RefusalLog`), never once per connection.
- Idle connections are closed after `idle_timeout` seconds without activity (Kafka's
  connections.max.idle.ms): the owner marks activity (`Connection.touch`) and says when a
  connection is busy with a request (`Connection.busy`), which is never idle. One timer per
  listener checks the least recently active connections only.

Must not: read or write a connection's bytes (the owner's handler does), or know a protocol.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import ssl
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = [
    "Connection",
    "ConnectionBudget",
    "RefusalLog",
    "TcpListener",
    "TlsHandshakeError",
    "connection_budget",
    "fd_reserve",
    "raise_fd_limit",
]

logger = logging.getLogger("querylib")
TLS_HANDSHAKE_TIMEOUT = 10.0  # seconds a client has to finish its TLS handshake

ACCEPT_BURST = 128  # accepts per readiness callback, before other callbacks get their turn
BACKLOG = 1024  # the kernel's queue of connections not yet accepted (capped by somaxconn)
ACCEPT_PAUSE = 0.25  # seconds a listener stops accepting after accept() failed
LOG_INTERVAL = 10.0  # seconds between two summaries of refusals
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_MIN_RESERVE = 512
_SHARE = 64  # connections each listener keeps for itself out of the process budget


class TlsHandshakeError(ConnectionError):
    """A connection to a TLS listener did not complete its handshake (`Connection.open`):
    counted with the listener's refusals, so its handler ends quietly."""


# ---- descriptors --------------------------------------------------------------------------


def fd_reserve(limit: int) -> int:
    """Descriptors kept out of the connection budget for the process's own sockets and files:
    a quarter of the limit, at least 512, at most half."""
    return min(max(_MIN_RESERVE, limit // 4), limit // 2)


class ConnectionBudget:
    """How many accepted connections the process may hold, over all its listeners.

    `capacity` is RLIMIT_NOFILE minus `fd_reserve`. A listener takes a slot per connection and
    gives it back when the connection ends; each registered listener keeps `share` slots that
    the others cannot take while it uses fewer.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self._held: dict[object, int] = {}  # listener -> slots it holds
        self._lock = threading.Lock()  # listeners may run on loops of several threads

    def register(self, owner: object) -> None:
        with self._lock:
            self._held.setdefault(owner, 0)

    def unregister(self, owner: object) -> None:
        with self._lock:
            self.in_use -= self._held.pop(owner, 0)

    def share(self) -> int:
        return min(_SHARE, self.capacity // (4 * max(1, len(self._held))))

    def try_take(self, owner: object) -> bool:
        """A slot for `owner`, or False when none is left for it."""
        with self._lock:
            share = self.share()
            kept = sum(max(0, share - held) for other, held in self._held.items()
                       if other is not owner)
            if self.in_use + kept >= self.capacity:
                return False
            self.in_use += 1
            self._held[owner] = self._held.get(owner, 0) + 1
            return True

    def give_back(self, owner: object) -> None:
        with self._lock:
            if self._held.get(owner, 0) > 0:
                self._held[owner] -= 1
                self.in_use -= 1


_budget: ConnectionBudget | None = None


def _nofile() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _nr_open() -> int:
    """The kernel's ceiling for RLIMIT_NOFILE (an unlimited hard limit cannot be set)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def connection_budget() -> ConnectionBudget:
    """The process's budget, sized from RLIMIT_NOFILE when first asked for."""
    global _budget
    if _budget is None:
        limit = _nofile()
        _budget = ConnectionBudget(limit - fd_reserve(limit))
    return _budget


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit and say at INFO what the listeners
    may hold; returns the soft limit in force. Call it when a server process starts, before
    its listeners."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = _nr_open()
    raised = ""
    if soft == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)
        else:
            raised = f" (raised from {soft})"
    limit = _nofile()
    budget = connection_budget()
    budget.capacity = limit - fd_reserve(limit)
    logger.info("open-files limit %d%s: listeners may hold %d connections, %d descriptors are "
                "kept for the process's own sockets and files", limit, raised, budget.capacity,
                fd_reserve(limit))
    return limit


# ---- logging ------------------------------------------------------------------------------


class RefusalLog:
    """Counts refusals by reason and logs them at most once per `interval`: the first at once,
    later ones summed up when the interval has passed."""

    def __init__(self, name: str, log: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self.name = name
        self.log = log
        self.interval = interval
        self.counts: Counter[str] = Counter()  # every refusal so far, by reason
        self._pending: Counter[str] = Counter()
        self._last = -float("inf")
        self._timer: asyncio.TimerHandle | None = None

    def add(self, reason: str) -> None:
        self.counts[reason] += 1
        self._pending[reason] += 1
        if self._timer is not None:
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self.flush()
        else:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._last + self.interval - now, self.flush)

    def flush(self) -> None:
        self._timer = None
        if not self._pending:
            return
        self._last = time.monotonic()
        reasons = self._pending.most_common()
        parts = ", ".join(f"{n} {reason}" for reason, n in reasons[:5])
        if len(reasons) > 5:
            parts += f", {sum(n for _, n in reasons[5:])} for {len(reasons) - 5} other reasons"
        total = sum(self._pending.values())
        self._pending.clear()
        self.log.warning("%s: refused %d connection(s) in the last %gs: %s", self.name,
                         total, self.interval, parts)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.flush()


# ---- the listener -------------------------------------------------------------------------


class Connection:
    """One accepted connection as its listener sees it: the client's address, when it was last
    active, and whether its owner is busy with it (then it is never idle).

    The owner turns the socket into a transport once, with `streams()` or `open(factory)`.
    """

    __slots__ = ("address", "busy", "ended", "last_active", "on_idle", "peer", "transport",
                 "_listener", "_sock")

    def __init__(self, listener: TcpListener, sock: socket.socket, peer: tuple) -> None:
        self._listener = listener
        self._sock: socket.socket | None = sock
        self.transport: asyncio.Transport | None = None
        self.peer = peer
        self.address: str = peer[0] if peer else "unknown"
        self.last_active = time.monotonic()
        self.ended = False  # its handler has returned
        self.busy: Callable[[], bool] = _never
        # What closing an idle connection does; by default the socket is closed at once.
        self.on_idle: Callable[[], object] = self.abort

    def touch(self) -> None:
        """The connection did something (bytes arrived, a response went out)."""
        self.last_active = time.monotonic()
        if self.ended:
            return
        idle = self._listener._idle
        idle[self] = None  # back in, if the sweeper took it out meanwhile
        idle.move_to_end(self)

    async def open(self, protocol_factory: Callable[[], P]) -> P:
        """The socket as an asyncio transport driving the protocol `protocol_factory()` makes."""
        assert self._sock is not None, "a connection is opened once"
        sock, self._sock = self._sock, None
        loop = asyncio.get_running_loop()
        tls = self._listener.ssl_context
        try:
            transport, protocol = await loop.connect_accepted_socket(
                protocol_factory, sock, ssl=tls,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if tls is not None else None)
        except OSError as exc:  # ssl.SSLError, and ConnectionAbortedError at the timeout
            sock.close()
            if tls is None:
                raise
            # A client that does not speak TLS, or not ours, or too slowly, or gone: bad
            # input, counted with the listener's refusals rather than told one by one.
            if isinstance(exc, ssl.SSLError):
                reason = exc.reason or "SSL error"
            elif isinstance(exc, ConnectionAbortedError):
                reason = f"none within {TLS_HANDSHAKE_TIMEOUT:g}s"
            else:
                reason = type(exc).__name__
            self._listener.refusals.add(f"TLS handshake failed ({reason})")
            raise TlsHandshakeError(f"TLS handshake with {self.address} failed: {reason}") \
                from exc
        except BaseException:
            sock.close()
            raise
        self.transport = transport
        return protocol

    async def streams(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The socket as a StreamReader (with the listener's `stream_limit`) and StreamWriter."""
        reader = asyncio.StreamReader(limit=self._listener.stream_limit)
        protocol = await self.open(lambda: asyncio.StreamReaderProtocol(reader))
        assert self.transport is not None
        return reader, asyncio.StreamWriter(self.transport, protocol, reader,
                                            asyncio.get_running_loop())

    def abort(self) -> None:
        """Close the connection now, dropping whatever is unsent."""
        if self.transport is not None:
            self.transport.abort()
        elif self._sock is not None:
            self._sock.close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        elif self._sock is not None:
            self._sock.close()


def _never() -> bool:
    return False


P = TypeVar("P", bound=asyncio.BaseProtocol)
Handler = Callable[[Connection], Awaitable[None]]


class TcpListener:
    """Accepts connections on host:port and runs `handler(conn)` for each (a `Connection`
    whose socket the handler opens as streams or with its own protocol).

    `name` says which listener it is in log lines ("Kafka listener 127.0.0.1:9092").
    `stream_limit` is each StreamReader's limit: it stops reading the socket (TCP then holds
    the client back) while more than twice that is buffered and unread.
    """

    def __init__(self, name: str, handler: Handler, host: str, port: int, *,
                 max_connections: int | None = None, max_per_address: int | None = None,
                 idle_timeout: float | None = None, stream_limit: int = 64 * 1024,
                 budget: ConnectionBudget | None = None,
                 log: logging.Logger = logger,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """`ssl_context`: a server TLS context every connection is wrapped in (the handshake
        is bounded by `TLS_HANDSHAKE_TIMEOUT`)."""
        for what, value in (("max_connections", max_connections),
                            ("max_per_address", max_per_address)):
            if value is not None and value < 1:
                raise ValueError(f"{what} must be at least 1, not {value}")
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive, not {idle_timeout}")
        self.refusals = RefusalLog(name, log)
        self.host, self.port = host, port
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.idle_timeout = idle_timeout
        self.stream_limit = stream_limit
        self.ssl_context = ssl_context
        self.budget = budget if budget is not None else connection_budget()
        self.log = log
        self.counters: Counter[str] = Counter()  # accepted, refused, idle_closed, accept_failed
        self._handler = handler
        self._sockets: list[socket.socket] = []
        self._paused: set[socket.socket] = set()
        self._per_address: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: OrderedDict[Connection, None] = OrderedDict()
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False

    @property
    def name(self) -> str:
        """How log lines name this listener, e.g. "Kafka listener 127.0.0.1:9092"."""
        return self.refusals.name

    @name.setter
    def name(self, value: str) -> None:
        self.refusals.name = value

    @property
    def open_connections(self) -> int:
        return len(self._tasks)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Bind and start accepting; returns the bound (host, port) of the first socket.
        Raises OSError when the address cannot be bound."""
        loop = self._loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host or None, self.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _name, address in infos:
                if (family, address) in seen:
                    continue
                seen.add((family, address))
                sock = socket.socket(family, kind, proto)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except OSError:
            self._close_sockets()
            raise
        self.budget.register(self)
        self._accepting = True
        for sock in self._sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)
        if self.idle_timeout is not None:
            self._arm_sweeper()
        host, port = self._sockets[0].getsockname()[:2]
        self.port = port
        return host, port

    def stop_accepting(self) -> None:
        """Close the listening sockets; connections go on until their handlers end."""
        self._accepting = False
        self._close_sockets()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.refusals.close()

    async def close(self) -> None:
        """Stop accepting, cancel every connection's handler and wait for them. Idempotent."""
        self.stop_accepting()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.budget.unregister(self)

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            if self._loop is not None and sock not in self._paused and sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets.clear()
        self._paused.clear()

    # -- accepting ---------------------------------------------------------------------------

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, peer = sock.accept()
                conn.setblocking(False)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._accept_failed(sock, exc)
                return
            address = peer[0] if peer else "unknown"
            reason = self._refusal(address)
            if reason is not None:
                self.counters["refused"] += 1  # counted before the client can see it
                self.refusals.add(reason)
                conn.close()
                continue
            self._per_address[address] += 1
            self.counters["accepted"] += 1
            assert self._loop is not None
            task = self._loop.create_task(self._serve(conn, peer, address))
            self._tasks.add(task)

    def _refusal(self, address: str) -> str | None:
        if self.max_connections is not None and len(self._tasks) >= self.max_connections:
            return f"at this listener's limit of {self.max_connections} connections"
        if self.max_per_address is not None and \
                self._per_address[address] >= self.max_per_address:
            return f"at the limit of {self.max_per_address} connections from {address}"
        if not self.budget.try_take(self):
            return (f"at the process's limit of {self.budget.capacity} connections (open "
                    "files limit minus a reserve)")
        return None

    def _accept_failed(self, sock: socket.socket, exc: OSError) -> None:
        self.counters["accept_failed"] += 1
        what = "out of descriptors or memory" if exc.errno in _RESOURCE_ERRNOS else "failed"
        self.refusals.add(f"left waiting: accept() {what} ({exc.strerror or exc})")
        # Stop watching this socket for a moment: the connections wait in the backlog, and the
        # loop does not spin on a socket it cannot accept from.
        assert self._loop is not None
        self._loop.remove_reader(sock.fileno())
        self._paused.add(sock)
        self._loop.call_later(ACCEPT_PAUSE, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        if sock in self._paused and self._accepting:
            self._paused.discard(sock)
            assert self._loop is not None
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    async def _serve(self, sock: socket.socket, peer: tuple, address: str) -> None:
        task = asyncio.current_task()
        conn = Connection(self, sock, peer)
        self._idle[conn] = None
        try:
            await self._handler(conn)
        except TlsHandshakeError:
            pass  # counted as a refusal
        finally:
            conn.ended = True
            self._idle.pop(conn, None)
            conn._close()
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]
            self.budget.give_back(self)
            self._tasks.discard(task)

    # -- idle connections --------------------------------------------------------------------

    def _arm_sweeper(self) -> None:
        assert self._loop is not None and self.idle_timeout is not None
        interval = min(max(self.idle_timeout / 10, 0.05), 5.0)
        self._sweeper = self._loop.call_later(interval, self._sweep)

    def _sweep(self) -> None:
        assert self.idle_timeout is not None
        cutoff = time.monotonic() - self.idle_timeout
        idle = self._idle
        while idle:
            conn = next(iter(idle))
            if conn.last_active > cutoff:
                break
            if conn.busy():
                conn.touch()  # busy with a request: look again a whole timeout later
                continue
            del idle[conn]
            self.counters["idle_closed"] += 1
            conn.on_idle()
        self._arm_sweeper()

