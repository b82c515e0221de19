"""The connector endpoint: a TCP listener inside a broker process that turns connector streams
into appends to the broker's partitions (issue 8 §2; DESIGN §8).

    server = BrokerServer(data_dir, secret)
    await server.start("tcp://127.0.0.1:7500")
    endpoint = ConnectorEndpoint(server.port, EndpointConfig(port=7600), secret=secret)
    host, port = await endpoint.start()
    ...
    await endpoint.close()          # before server.close()
    await server.close()

What it owns: the listener, one `PeerConnection` per accepted socket, the registry that makes a
(program, instance) pair live on one connection at a time (a new HELLO of the same pair fences
the old connection and waits for its appends to settle before answering), and the
`OffsetStore` with its checkpoint timer.

Configuration (`EndpointConfig`): bound to 127.0.0.1 by default; `max_frame_size` bounds every
frame; `initial_credits` is the window per connection. Connections are accepted by
`querylib._tcp.TcpListener`: at most `max_connections` (and the process's descriptor budget),
`max_connections_per_address` from one client address, refusals logged once per interval; a
connection that has sent nothing for `idle_timeout` seconds and has nothing unacknowledged is
closed (the client library reconnects when it has something to send). The cookie is the
configured one, else derived from the cluster secret (`derive_cookie`: HMAC-SHA256 of a fixed
label, hex, so a client that can read the secret file computes the same), else empty
(development). A stream writes through a broker session of its own, as "anonymous"
(connectors are not authenticated yet), so the broker's core admits it as any writer: the
topic's writers rule (ingest topics only; `__` topics are tq's own), its placement (under an
executor the catalog; a new topic is registered as ingest when `auto_create` is on), and its
stream not ended. A refusal refuses the stream, with the broker's message. Under an executor
with several brokers (`tq executor --brokers N`), `locate` routes a partition the catalog placed
on another broker there, through broker RPC with the executor's credential, still as
"anonymous" (`_partitions.py`), so that broker admits the stream as this one would; the
checkpoints stay here.

It must not decide what the broker decides (admission, durability, frontiers, credit windows
of broker sessions): it asks the broker hosting each partition and waits for the answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from dataclasses import dataclass
from typing import Any

from catalog.errors import TqError, UserError
from querylib._keyed_lock import KeyedLock
from querylib._tcp import Connection, TcpListener
from querylib.broker import UnknownPartitionError
from querylib.connector._dialect import Dialect
from querylib.connector._records import broker_topic, parse_stream_name, source_id
from querylib.connector._wire import DEFAULT_MAX_FRAME_SIZE
from querylib.rpc import Credential
from querylib.server.broker import BrokerPort

from ._connection import PeerConnection
from ._offsets import OffsetStore, StreamKey, StreamProgress
from ._partitions import Locate, Partitions
from ._sink import StreamSink

__all__ = ["DEFAULT_CONNECTOR_PORT", "ConnectorEndpoint", "EndpointConfig", "derive_cookie"]

logger = logging.getLogger("querylib.connector")

DEFAULT_CONNECTOR_PORT = 7600
_COOKIE_LABEL = b"tq connector cookie v1"
_BATCH_OVERHEAD = 64 * 1024  # record framing and headers around a frame's payload, generously


def derive_cookie(secret: bytes) -> str:
    """The connector cookie of a cluster: 32 hex digits derived from its secret."""
    return hmac.new(secret, _COOKIE_LABEL, hashlib.sha256).hexdigest()[:32]


@dataclass(frozen=True)
class EndpointConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_CONNECTOR_PORT  # 0: any free port
    cookie: bytes | str | None = None  # None: derive_cookie(secret) if a secret is given
    dialects: tuple[Dialect, ...] = (Dialect.DRAFT, Dialect.RELEASED)
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    initial_credits: int = 1024  # frames a connection may have unacknowledged
    max_held_bytes: int = 32 * 1024 * 1024  # received, not yet appended: reading pauses above
    max_streams: int = 1024  # per connection
    max_connections: int = 1024
    max_connections_per_address: int | None = None  # None: only max_connections
    idle_timeout: float = 600.0  # seconds without a frame (and nothing unacknowledged)
    auto_create: bool = True  # create a topic partition at the first NOTIFY naming it
    checkpoint_interval: float = 1.0  # seconds between writes to __connector_offsets
    lease: float = 30.0  # of each stream's broker session; heartbeats every lease / 3
    handshake_timeout: float = 10.0  # a connection must send HELLO within this
    max_batch_records: int = 4096  # per record batch appended
    max_batch_bytes: int = 1024 * 1024
    ssl_context: Any = None  # an ssl.SSLContext: connections speak TLS (DESIGN §12)


class ConnectorEndpoint:
    """Serves the connector protocol for the partitions of one in-process broker, through its
    `BrokerPort`, and with `locate` and `credential` those of the other brokers of its host
    (`Partitions`)."""

    def __init__(self, port: BrokerPort, config: EndpointConfig | None = None, *,
                 secret: bytes | None = None, locate: Locate | None = None,
                 credential: Credential | None = None) -> None:
        self.config = config = config or EndpointConfig()
        self.port = port
        self.partitions = Partitions(port, locate=locate, credential=credential)
        if config.cookie is not None:
            cookie = config.cookie
        else:
            cookie = derive_cookie(secret) if secret else b""
        self.cookie = cookie.encode() if isinstance(cookie, str) else bytes(cookie)
        limit = self.port.limits.max_batch_bytes - _BATCH_OVERHEAD
        if config.max_frame_size > limit:
            raise UserError(f"max_frame_size {config.max_frame_size} exceeds what one broker "
                            f"batch can hold ({limit} bytes)")
        if config.initial_credits < 1:
            raise UserError("initial_credits must be at least 1")
        self.store = OffsetStore(self.port, lease=config.lease)
        self.counters: dict[str, int] = {
            "connections": 0, "protocol_errors": 0, "bugs": 0, "nacks": 0,
            "append_failures": 0, "streams_refused": 0, "fenced": 0, "write_waits": 0}
        self._peers: set[PeerConnection] = set()
        self._live: dict[tuple[str, str], PeerConnection] = {}
        self._admitting: KeyedLock[tuple[str, str]] = KeyedLock()
        self._tcp: TcpListener | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.address: tuple[str, int] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Replay the checkpoints, then listen. Returns the bound (host, port)."""
        known = await self.store.load()
        config = self.config
        name = f"connector endpoint {config.host}:{config.port}"
        tcp = TcpListener(name, self._accept, config.host, config.port,
                          max_connections=config.max_connections,
                          max_per_address=config.max_connections_per_address,
                          idle_timeout=config.idle_timeout, log=logger,
                          ssl_context=config.ssl_context)
        host, port = await tcp.start()
        tcp.name = f"connector endpoint {host}:{port}"
        self._tcp = tcp
        self.address = (host, port)
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="connector")
        logger.info("connector endpoint on %s:%d (%d streams known)", host, port, known)
        return self.address

    async def close(self) -> None:
        """Stop listening, end every connection (their appends settle), checkpoint. Idempotent."""
        tcp = self._tcp  # kept: its counters stay readable
        if tcp is not None:
            tcp.stop_accepting()
        await asyncio.gather(*(p.stop("the broker is shutting down") for p in list(self._peers)),
                             return_exceptions=True)
        if tcp is not None:
            await tcp.close()
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
            await self.store.checkpoint()
        await self.store.close()

    async def __aenter__(self) -> ConnectorEndpoint:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def statistics(self) -> dict[str, int]:
        tcp = self._tcp.counters if self._tcp is not None else {}
        return {**self.counters, "live_connections": len(self._peers),
                "refused_connections": tcp.get("refused", 0),
                "idle_closed": tcp.get("idle_closed", 0),
                "checkpoints": self.store.checkpoints}

    async def _accept(self, conn: Connection) -> None:
        reader, writer = await conn.streams()
        self.counters["connections"] += 1
        peer = PeerConnection(self, reader, writer, activity=conn.touch)
        conn.busy = peer.busy
        conn.on_idle = lambda: peer.end(f"idle for {self.config.idle_timeout:g}s")
        self._peers.add(peer)
        try:
            await peer.run()
        finally:
            self._peers.discard(peer)

    async def _tick(self) -> None:
        # The broker sessions keep their own leases (their links heartbeat); this checkpoints.
        while True:
            await asyncio.sleep(self.config.checkpoint_interval)
            try:
                await self.store.checkpoint()
            except TqError as exc:  # the broker refused or the disk failed: next tick retries
                logger.warning("connector checkpoint failed: %s", exc)

    # -- what connections ask for -------------------------------------------------------------

    async def admit(self, peer: PeerConnection, key: tuple[str, str]) -> dict[int, int | None]:
        """Make `peer` the live connection of (program, instance); return where each stream
        this instance has history of stands (checked against the data)."""
        async with self._admitting.hold(key):
            old = self._live.get(key)
            if old is not None and old is not peer:
                self.counters["fenced"] += 1
                await old.fence("superseded by a new connection of the same program and "
                                "instance")
            self._live[key] = peer
            points = {}
            for sid, progress in self.store.streams_of(*key).items():
                if not progress.verified:
                    await self._verify((*key, sid), progress)
                points[sid] = progress.processed
            return points

    def release(self, peer: PeerConnection) -> None:
        if peer.instance is not None and self._live.get(peer.instance) is peer:
            del self._live[peer.instance]
        for sink in peer.sinks.values():
            self.store.touch(sink.key)

    def save(self, key: StreamKey, progress: StreamProgress) -> None:
        self.store.put(key, progress)

    async def resolve(self, sink: StreamSink, name: str) -> StreamProgress:
        """The progress record of the partition a NOTIFY names (see StreamSink), which the
        broker admitted the stream to (so it hosts it)."""
        topic, partition = parse_stream_name(name)
        pid = (broker_topic(topic), partition)
        hosted = await self.partitions.info(pid)
        if hosted is None:  # the broker did not open it for us
            raise UnknownPartitionError(f"partition {partition} of {pid[0]!r} is not hosted")
        progress = self.store.get(sink.key)
        if progress is not None and (progress.topic, progress.partition) == pid:
            if not progress.verified:
                await self._verify(sink.key, progress)
            progress.name = name
            self.store.put(sink.key, progress)
            return progress
        if progress is None:
            # Never seen: nothing of it can be in the partition, because a stream's record is
            # made durable (below) before its first append. Later crashes are then covered by
            # scanning from the recorded offset, never the whole partition.
            found = None
        else:
            # The stream moved to another partition, where it may have written before.
            found = await self._scan(pid, sink.source_id, 0)
        offset = found[1] if found else hosted.log_end
        progress = StreamProgress(name, pid[0], pid[1], found[0] if found else None, offset,
                                  True)
        self.store.put(sink.key, progress)
        await self.store.checkpoint()
        return progress

    async def _verify(self, key: StreamKey, progress: StreamProgress) -> None:
        """Check a checkpointed point against the data partition (it lags, and the data may
        have lost its tail)."""
        pid = (progress.topic, progress.partition)
        info = await self.partitions.info(pid)
        if info is None:
            progress.processed, progress.offset = None, 0
        else:
            if progress.offset > info.log_end:
                # The log is shorter than when we checkpointed: what we acknowledged is gone.
                logger.warning("connector stream %s: %s-%d ends at %d below its checkpoint %d",
                               key, *pid, info.log_end, progress.offset)
                found = await self._scan(pid, source_id(*key), 0)
                progress.processed = found[0] if found else None
                progress.offset = found[1] if found else info.log_start
            else:
                found = await self._scan(pid, source_id(*key), progress.offset)
                if found is not None:
                    old = -1 if progress.processed is None else progress.processed
                    progress.processed = max(old, found[0])
                    progress.offset = found[1]
        progress.verified = True
        self.store.put(key, progress)

    async def _scan(self, pid: tuple[str, int], producer_id: int,
                    start: int) -> tuple[int, int] | None:
        return await self.partitions.scan(pid, producer_id, start)
