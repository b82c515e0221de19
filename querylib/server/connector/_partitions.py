"""Where a connector stream's partition lives, and the endpoint's calls to it (DESIGN §8
"Connector endpoint"): the broker in this process, or another broker of this host (a shard of
`tq executor --brokers N`).

    partitions = Partitions(port, locate=..., credential=...)
    route = await partitions.route(("events", 3))   # None: this process's broker
    link = partitions.link(route, session=..., lease=...)
    info = await partitions.info(("events", 3))     # None: not hosted (yet)
    found = await partitions.scan(("events", 3), producer_id, start)

One interface, two transports, as for any broker client (`SessionLink`): a session of the
in-process door (`BrokerPort.link`), or a `BrokerLink` over broker RPC to the broker the catalog
places the partition on (`locate`: the host's catalog view), authenticated with the executor's
credential. Both write as "anonymous", as connectors do (over RPC a downgrade the broker grants
its client, DESIGN §12), so the broker hosting the partition admits a stream exactly as broker 0
would: ingest topics only. The producer opens the topic's incarnation the catalog named. A
stream's session id there is keyed with the credential's key (`remote_session`): stable for the
executor, so a restarted endpoint reopens it, and unknown to other principals, which could
otherwise open it first and keep the stream out.

The scan of a partition for a stream's last appended message reads a remote partition through
querylib's subscriber core (`SubscriberCore`: subscribe at an offset, credit, whole batches),
in the windows `backward_windows` gives, as `last_appended` reads a local log. Checkpoints
(`__connector_offsets`) stay on the in-process broker (`OffsetStore`).

Must not: decide admission (the broker hosting the partition does), or write anything itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from catalog.errors import TqError
from querylib.broker import BrokerLink, Chunk, PartitionInfo, SessionLink, SubscriberCore
from querylib.broker.messages import ListPartitions
from querylib.connector._records import header_of, last_message_id
from querylib.records import decode_batch, read_header
from querylib.rpc import Credential
from querylib.server.broker import BrokerPort

from ._offsets import backward_windows, last_appended

__all__ = ["Locate", "Partitions", "Remote"]

PartitionId = tuple[str, int]
_SESSION_LABEL = b"tq connector session v1\0"  # keyed ids of streams' sessions elsewhere

@dataclass(frozen=True)
class Remote:
    """A partition on another broker of this host."""

    broker_id: int
    address: str  # its broker's RPC address
    topic_id: int  # the topic's incarnation, which the producer opens
    created_ms: int


# (topic, partition) -> where it lives: None for this process's broker (or a topic the catalog
# does not know yet, which that broker's directory creates), a Remote for another broker of the
# host; a TqError when it cannot be said now.
Locate = Callable[[str, int], Awaitable[Remote | None]]


class Partitions:
    """The partitions a connector endpoint writes: its own broker's through `port`, the
    host's other brokers' through broker RPC with `credential` (see the module docstring)."""

    def __init__(self, port: BrokerPort, *, locate: Locate | None = None,
                 credential: Credential | None = None) -> None:
        self.port = port
        self._locate = locate if credential is not None else None
        self._credential = credential

    async def route(self, pid: PartitionId) -> Remote | None:
        """Where `pid` lives now (None: here)."""
        if self._locate is None or self.port.hosts(pid):
            return None
        return await self._locate(*pid)

    def link(self, route: Remote | None, *, session: str, lease: float) -> SessionLink:
        """A (not yet started) broker session for writing a partition at `route`. `session`
        names the stream's session: the same name for the same stream, so a restarted
        endpoint reopens it (see `remote_session` for its id on another broker)."""
        if route is None:
            return self.port.link("anonymous", lease=lease, session=session)
        assert self._credential is not None
        return BrokerLink(route.address, self._credential, lease=lease,
                          session=self.remote_session(session), principal="anonymous")

    def remote_session(self, session: str) -> str:
        """The id of session `session` on another broker. In process an id is out of RPC
        clients' reach (`LOCAL_SESSIONS`); over RPC, a principal that opened a predictable id
        first would hold it and keep the stream out, so it is keyed with the credential's key:
        the same for this executor across restarts, unguessable by anyone else."""
        assert self._credential is not None
        mac = hmac.new(self._credential.key, _SESSION_LABEL + session.encode(), hashlib.sha256)
        return f"tq.connector.{mac.hexdigest()[:32]}"

    async def info(self, pid: PartitionId) -> PartitionInfo | None:
        """The partition as its broker has it, None if that broker does not host it."""
        route = await self.route(pid)
        if route is None:
            return self.port.info(pid) if self.port.hosts(pid) else None
        async with _Reader(self._link(route), pid) as reader:
            return await reader.info()

    async def scan(self, pid: PartitionId, producer_id: int,
                   start: int) -> tuple[int, int] | None:
        """(last message id, offset after its batch) of the last data batch `producer_id`
        appended to `pid` at or after `start`, or None (`last_appended`)."""
        route = await self.route(pid)
        if route is None:
            log = self.port.log(pid)
            return await asyncio.get_running_loop().run_in_executor(
                None, last_appended, log, producer_id, start)
        async with _Reader(self._link(route), pid) as reader:
            return await reader.last_appended(producer_id, start)

    def _link(self, route: Remote) -> BrokerLink:
        assert self._credential is not None
        return BrokerLink(route.address, self._credential, lease=10.0)


class _Reader:
    """Reads one remote partition through a session of its own (closed on exit), with
    querylib's subscriber core (subscribe at an offset, credit, deliveries of whole batches,
    resubscribing after a reconnect)."""

    def __init__(self, link: BrokerLink, pid: PartitionId) -> None:
        self.link = link
        self.pid = pid

    async def __aenter__(self) -> _Reader:
        await self.link.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.link.close()

    async def info(self) -> PartitionInfo | None:
        listed = await self.link.request(ListPartitions(topic=self.pid[0]))
        for found in listed.partitions:
            if found.partition == self.pid[1]:
                return found
        return None

    async def last_appended(self, producer_id: int, start: int) -> tuple[int, int] | None:
        info = await self.info()
        if info is None:
            return None
        for lo, high in backward_windows(max(start, info.log_start), info.log_end):
            found = await self._window(lo, high, producer_id)
            if found is not None:
                return found
        return None

    async def _window(self, lo: int, high: int, producer_id: int) -> tuple[int, int] | None:
        """The last batch of `producer_id` from the one holding `lo` to the one holding
        `high - 1` that holds a point of reference (as `last_appended` reads a log), reading
        the window forwards through one subscription."""
        assert self.link.opened is not None
        topic, partition = self.pid
        chunks: asyncio.Queue[Chunk | TqError] = asyncio.Queue()
        core = SubscriberCore(self.link, topic, [partition], {partition: lo},
                              credit=self.link.opened.max_credit, sink=chunks.put_nowait)
        await core.open()
        found = None
        try:
            position = lo
            while position < high:
                chunk = await asyncio.wait_for(chunks.get(), self.link.timeout)
                if isinstance(chunk, TqError):
                    raise chunk
                data, position = chunk.data, chunk.next_offset
                pos = 0
                while pos < len(data):
                    size, producer, next_offset, control = header_of(data, pos)
                    if read_header(data, pos).base_offset >= high:
                        break
                    if producer == producer_id and not control:
                        mid = last_message_id(decode_batch(bytes(data[pos:pos + size])))
                        if mid is not None:
                            found = (mid, next_offset)
                    pos += size
                core.consumed(partition, len(data))
        finally:
            await core.close()
        return found
