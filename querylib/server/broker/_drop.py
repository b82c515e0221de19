"""Dropping a deleted topic's partitions from the broker hosting them (DESIGN §3 "Deleting
topics"): the broker forgets each partition and deletes its files, so a topic created again
with the same name starts empty.

Under a coordinator the coordinator drives this: it tells the executor running the hosting
broker, which calls `drop_hosted` on its own broker in-process. `drop_partitions` asks a broker
over RPC (`broker.partition.drop`): for a standalone `tq broker`, which has no coordinator
(nothing in tq calls it that way today; the request stays served for such tools and tests).

Must not: decide whether a topic may be deleted (the catalog does, first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from querylib.broker._errors import PartitionBusyError
from querylib.broker._session import CLIENT_LIMITS
from querylib.broker.messages import DropPartitionRequest
from querylib.rpc import BROKER, RpcClient

if TYPE_CHECKING:
    from ._server import BrokerServer

__all__ = ["drop_hosted", "drop_partitions"]

_BUSY_RETRY = 0.05  # seconds between asks while appends or reads are in flight


async def drop_partitions(address: str, secret: bytes, topic: str, partitions: Iterable[int],
                          *, timeout: float = 30.0) -> None:
    """Ask the broker at `address` to drop these partitions of `topic` (its short name).
    Retries a partition that is busy (appends or reads in flight) until `timeout`."""
    async with RpcClient(address, secret, limits=CLIENT_LIMITS, timeout=timeout,
                         audience=BROKER) as client:
        async def drop(partition: int) -> None:
            await client.request(DropPartitionRequest(topic=topic, partition=partition))

        await _drop_each(drop, partitions, timeout)


async def drop_hosted(broker: BrokerServer, topic: str, partitions: Iterable[int], *,
                      timeout: float = 30.0) -> None:
    """Drop these partitions of `topic` (its short name) from `broker`, running in this
    process. Done already for a partition it does not hold; retries a busy one until
    `timeout` (then PartitionBusyError)."""
    await _drop_each(lambda partition: broker.drop_partition(topic, partition), partitions,
                     timeout)


async def _drop_each(drop: Callable[[int], Awaitable[None]], partitions: Iterable[int],
                     timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for partition in partitions:
        while True:
            try:
                await drop(partition)
                break
            except PartitionBusyError:
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(_BUSY_RETRY)  # a backoff: the appends finish by then
