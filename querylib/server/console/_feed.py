"""What feeds the console's model: the catalog's collections as they change, the executors'
loads and every broker's partitions, sampled (DESIGN §13 "Console").

`Feed.run` follows each collection of `_model.COLLECTIONS` through the coordinator (the
ordinary catalog follow), asks the coordinator for the executors' loads every
`load_interval` seconds, and each broker of the `brokers` collection for its partitions every
`partition_interval` seconds, and tells `changed` after each change it applied. It reads as the
console's principal, with a session of its own; it writes nothing.

With `groups` (the process runs the cluster's group coordinator), the consumer groups come
with the loads. Must not: write to the cluster, or let one unreachable broker stop the
others' samples (a broker that does not answer keeps its last sample and is asked again
next time).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from catalog import TopicName
from catalog.errors import InvalidTopicNameError, TqError
from querylib.broker.messages import ListPartitions, ListSubscriptions
from querylib.cluster import AsyncCluster, Snapshot
from querylib.rpc import BROKER, Credential, RpcClient

from ._model import COLLECTIONS, ClusterModel, PartitionSample, SubscriptionSample

__all__ = ["Feed"]

logger = logging.getLogger("querylib.console")


class Feed:
    """The model's inputs, kept current (see the module docstring)."""

    def __init__(self, coordinator: str, credential: Credential, model: ClusterModel, *,
                 changed: Callable[[], None] = lambda: None, load_interval: float = 2.0,
                 partition_interval: float = 1.0,
                 groups: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None) -> None:
        self.coordinator = coordinator
        self.credential = credential
        self.model = model
        self.changed = changed
        self.load_interval = load_interval
        self.partition_interval = partition_interval
        self.groups = groups  # the consumer groups, from the group coordinator's process
        self._brokers: dict[str, RpcClient] = {}

    async def run(self) -> None:
        """Until cancelled: follow, sample, tell."""
        cluster = AsyncCluster(self.coordinator, self.credential, peer="tq console")
        await cluster.start()
        try:
            async with asyncio.TaskGroup() as group:
                for collection in COLLECTIONS:
                    group.create_task(self._follow(cluster, collection))
                group.create_task(self._loads(cluster))
                group.create_task(self._partitions())
        finally:
            for client in self._brokers.values():
                await client.close()
            await cluster.close()

    async def _follow(self, cluster: AsyncCluster, collection: str) -> None:
        async with cluster.follow(collection) as follower:
            async for event in follower:
                if isinstance(event, Snapshot):
                    self.model.replace(collection, event.version, event.records)
                else:
                    self.model.update(collection, event.version, event.updates)
                self.changed()

    async def _loads(self, cluster: AsyncCluster) -> None:
        while True:
            try:
                self.model.set_loads(await cluster.loads(), time.monotonic())
                if self.groups is not None:
                    self.model.set_groups(await self.groups())
                self.changed()
            except TqError as exc:
                logger.debug("console: loads not sampled: %s", exc)
            await asyncio.sleep(self.load_interval)

    async def _partitions(self) -> None:
        while True:
            addresses = {b.address for b in self.model.records("brokers")}
            for gone in set(self._brokers) - addresses:
                await self._brokers.pop(gone).close()
            sampled = await asyncio.gather(*(self._sample(a) for a in sorted(addresses)))
            found = [sample for samples, _ in sampled if samples for sample in samples]
            if found:  # one sample of all brokers: rates over one interval
                self.model.set_partitions(found, time.monotonic())
                self.model.set_subscriptions(
                    [sub for _, subs in sampled if subs for sub in subs])
                self.changed()
            await asyncio.sleep(self.partition_interval)

    async def _sample(self, address: str
                      ) -> tuple[list[PartitionSample] | None, list[SubscriptionSample] | None]:
        client = self._brokers.get(address)
        if client is None:
            client = RpcClient(address, self.credential, audience=BROKER,
                               timeout=max(2.0, self.partition_interval * 2))
            await client.connect()
            self._brokers[address] = client
        try:
            reply: Any = await client.request(ListPartitions(topic=""))
            subscribed: Any = await client.request(ListSubscriptions(topic=""))
        except TqError as exc:
            logger.debug("console: broker %s not sampled: %s", address, exc)
            return None, None
        samples = []
        for p in reply.partitions:
            if (name := _canonical(p.topic)) is not None:
                samples.append(PartitionSample(name, p.partition, p.log_start, p.log_end,
                                               p.size, p.frontier, p.ended))
        subscriptions = [SubscriptionSample(name, s.partition, s.principal, s.next_offset)
                         for s in subscribed.subscriptions
                         if (name := _canonical(s.topic)) is not None]
        return samples, subscriptions


def _canonical(topic: str) -> str | None:
    """A broker's topic name (relative to public/default) as the catalog spells it."""
    try:
        return TopicName.parse(topic, fixed=True).full
    except InvalidTopicNameError:
        return None
