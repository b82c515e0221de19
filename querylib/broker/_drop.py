"""Dropping a deleted topic's partitions from the brokers hosting them (DESIGN §11 "Deleting
topics"): the client that deletes a topic in the catalog asks each hosting broker to forget
the partitions and delete their files, so a topic created again with the same name starts
empty.

Must not: decide whether a topic may be deleted (the catalog does, first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from querylib.rpc import RpcClient

from ._errors import PartitionBusyError
from ._link import CLIENT_LIMITS
from ._messages import DropPartitionRequest

__all__ = ["drop_partitions"]

_BUSY_RETRY = 0.05  # seconds between asks while appends or reads are in flight


async def drop_partitions(address: str, secret: bytes, topic: str, partitions: Iterable[int],
                          *, timeout: float = 30.0) -> None:
    """Ask the broker at `address` to drop these partitions of `topic` (its short name).
    Retries a partition that is busy (appends or reads in flight) until `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with RpcClient(address, secret, limits=CLIENT_LIMITS, timeout=timeout) as client:
        for partition in partitions:
            while True:
                try:
                    await client.request(DropPartitionRequest(topic=topic, partition=partition))
                    break
                except PartitionBusyError:
                    if loop.time() >= deadline:
                        raise
                    await asyncio.sleep(_BUSY_RETRY)  # a backoff: the appends finish by then
