"""The connector endpoint's way into a `BrokerServer` running in the same process.

The endpoint appends through the broker's own state machine, as an RPC producer would: a broker
session per connector stream, `OpenProducer`, `Produce` (answered once the append is durable
under the broker's flush policy), `AdvanceFrontier`, `EndStream`. So credit windows, frontiers,
end-of-stream and durability acknowledgements are exactly the broker's, and subscribers see
connector records like any others.

It uses only the broker's public hooks for in-process endpoints (`BrokerServer.submit`,
`ensure_partition`, `partition_log`, `state`). Nothing here decides anything; it forwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from querylib.broker import BrokerServer
from querylib.broker._events import (
    AdvanceFrontier,
    CloseSession,
    EndStream,
    Heartbeat,
    OpenProducer,
    OpenSession,
    PartitionId,
    Produce,
)
from querylib.broker._messages import PartitionInfo, Produced, ProducerOpened
from querylib.log import PartitionLog

__all__ = ["BrokerPort"]


class BrokerPort:
    """Requests to one in-process broker, each answered through a future."""

    def __init__(self, server: BrokerServer) -> None:
        self.server = server

    @property
    def max_batch_bytes(self) -> int:
        return self.server.state.limits.max_batch_bytes

    def _submit(self, make: Callable[[asyncio.Future[Any]], Any]) -> asyncio.Future[Any]:
        return self.server.submit(make)

    async def open_session(self, session: str, lease: float) -> None:
        await self._submit(lambda t: OpenSession(t, session, lease))

    async def heartbeat(self, session: str) -> None:
        await self._submit(lambda t: Heartbeat(t, session))

    async def close_session(self, session: str) -> None:
        await self._submit(lambda t: CloseSession(t, session))

    async def ensure(self, topic: str, partition: int, create: bool) -> PartitionId:
        return await self.server.ensure_partition(topic, partition, create=create)

    def hosts(self, pid: PartitionId) -> bool:
        return pid in self.server.state.partitions

    def info(self, pid: PartitionId) -> PartitionInfo:
        return self.server.state.partition_info(pid)

    async def open_producer(self, session: str, pid: PartitionId) -> ProducerOpened:
        return await self._submit(lambda t: OpenProducer(t, session, pid))

    def produce(self, session: str, pid: PartitionId, batch: bytes) -> asyncio.Future[Produced]:
        """Append `batch`; the future resolves once it is durable (or fails)."""
        return self._submit(lambda t: Produce(t, session, pid, batch))

    async def advance(self, session: str, pid: PartitionId, frontier: int) -> None:
        await self._submit(lambda t: AdvanceFrontier(t, session, pid, frontier))

    async def end_stream(self, session: str, pid: PartitionId) -> None:
        await self._submit(lambda t: EndStream(t, session, pid))

    def log(self, pid: PartitionId) -> PartitionLog:
        """The partition's log, for reads on a worker thread (reads are thread-safe)."""
        return self.server.partition_log(pid)
