"""The catalog's say over what this host's broker endpoints create (DESIGN §8, §11).

A connector stream or a Kafka producer may name a topic partition the broker does not host yet.
Under an executor the catalog decides: the partition may be created here only if the catalog
places it on this broker, and a topic that does not exist yet is registered first, owned by
`ingest`, with every partition on this broker (the endpoint that creates it is the one that
will write it). A standalone `tq broker` has no catalog and skips all this.

`CatalogTopics` answers the connector endpoint's `TopicAdmission` and is the Kafka listener's
`KafkaCluster`: for Metadata it follows the catalog's `brokers` and `topics` collections. Every
broker registered with a Kafka address is listed, the coordinator's own too: it is the group
coordinator FindCoordinator names, and librdkafka drops a broker Metadata does not list. A
partition's leader is the broker the catalog locates it on, never the coordinator's for a data
topic (those live on executor brokers). A named topic the followed view does not have yet is
looked up at the coordinator. It is built before the broker is registered (the endpoints open
first, so the registration can carry their addresses) and answers once `attach` gave it the
session and the broker id.

Must not: write to the broker, or let a connector or Kafka producer feed a topic some query
owns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from catalog import (
    INGEST,
    Broker,
    Record,
    Topic,
    TopicExistsError,
    TopicName,
    TqError,
    UnknownTopicError,
    UserError,
)
from querylib.broker import UnknownPartitionError
from querylib.cluster import AsyncCluster, Snapshot
from querylib.kafka import BrokerInfo, CoordinatorNotAvailableError, PartitionInfo, TopicInfo

__all__ = ["CatalogTopics", "NotHereError", "NotIngestError"]

logger = logging.getLogger("executor")

_ATTACH_TIMEOUT = 30.0
_RETRY_FOLLOW = 1.0  # seconds before following a collection again after an error


class NotHereError(UserError):
    """The catalog places the partition on another broker (Kafka clients refresh metadata)."""

    kafka_error_code = 6  # NOT_LEADER_OR_FOLLOWER
    retriable = True


class NotIngestError(UserError):
    """The topic is written by its owner, not fed from outside."""

    kafka_error_code = 44  # POLICY_VIOLATION


class CatalogTopics:
    """Topic admission for this host's broker endpoints, through the executor's session."""

    def __init__(self) -> None:
        self.cluster: AsyncCluster | None = None
        self.broker_id: int | None = None
        self._attached = asyncio.Event()
        self._views: dict[str, dict[Record, int]] = {"brokers": {}, "topics": {}}
        self._following: asyncio.Task[None] | None = None

    def attach(self, cluster: AsyncCluster, broker_id: int, *, follow: bool = False) -> None:
        """Answer from now on, for broker `broker_id`; `follow` the catalog for Metadata."""
        self.cluster, self.broker_id = cluster, broker_id
        self._attached.set()
        if follow:
            self._following = asyncio.get_running_loop().create_task(
                self._follow_all(), name="catalog view for the Kafka listener")

    async def close(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
            self._following = None

    async def _follow_all(self) -> None:
        await asyncio.gather(*(self._follow(name) for name in self._views))

    async def _follow(self, collection: str) -> None:
        assert self.cluster is not None
        view = self._views[collection]
        while True:
            try:
                async with self.cluster.follow(collection) as follower:
                    async for event in follower:
                        if isinstance(event, Snapshot):
                            view.clear()
                            view.update(event.records)
                            continue
                        for record, diff in event.updates:
                            count = view.get(record, 0) + diff
                            if count > 0:
                                view[record] = count
                            else:
                                view.pop(record, None)
            except TqError as exc:  # the coordinator is away or restarting: follow again
                logger.warning("catalog view of %s: %s; following again", collection, exc)
                await asyncio.sleep(_RETRY_FOLLOW)

    async def _session(self) -> tuple[AsyncCluster, int]:
        try:
            await asyncio.wait_for(self._attached.wait(), _ATTACH_TIMEOUT)
        except TimeoutError:
            raise UserError("this broker is not registered with the coordinator yet; "
                            "retry shortly") from None
        assert self.cluster is not None and self.broker_id is not None
        return self.cluster, self.broker_id

    # -- the Kafka listener's view (querylib.kafka.KafkaCluster) --------------------------------

    async def node_id(self) -> int:
        return (await self._session())[1]

    def kafka_brokers(self) -> Sequence[BrokerInfo]:
        # The coordinator's own broker (no session) is listed too: librdkafka decommissions a
        # group coordinator that Metadata does not list, and then keeps finding it again.
        found = [_broker_info(b) for b in self._views["brokers"] if isinstance(b, Broker)]
        return sorted((b for b in found if b is not None), key=lambda b: b.node_id)

    async def group_coordinator(self) -> BrokerInfo | None:
        """The coordinator's own broker coordinates every group (DESIGN §8)."""
        await self._session()
        for broker in self._views["brokers"]:
            if isinstance(broker, Broker) and broker.session_id is None:
                found = _broker_info(broker)
                if found is not None:
                    return found
        raise CoordinatorNotAvailableError(
            "the coordinator's broker has no Kafka listener (yet): no group coordinator")

    async def kafka_topics(self, names: Sequence[str] | None) -> list[TopicInfo]:
        known = {t.name: t for t in self._views["topics"] if isinstance(t, Topic)}
        if names is None:
            system = {b.broker_id for b in self._views["brokers"]
                      if isinstance(b, Broker) and b.session_id is None}
            listening = ({b.node_id for b in self.kafka_brokers()} - system) | \
                {await self.node_id()}
            # Topics on brokers without a Kafka listener would have leaders no client can
            # reach, and the coordinator's broker holds only the system's own topics: leave
            # both out of the full list.
            return [_topic_info(t) for _, t in sorted(known.items())
                    if set(t.locations) <= listening]
        found = []
        for name in names:
            topic = known.get(TopicName.parse(name).full)
            if topic is None:
                topic = await self._lookup(name)
            if topic is not None:
                found.append(_topic_info(topic, name))
        return found

    async def _lookup(self, name: str) -> Topic | None:
        cluster, _ = await self._session()
        try:
            return (await cluster.lookup_topic(name)).topic
        except UnknownTopicError:
            return None

    async def create_kafka_topic(self, name: TopicName, partitions: int) -> TopicInfo:
        cluster, broker_id = await self._session()
        info = await cluster.create_topic(name.short, partitions, ingest=True,
                                          locations=(broker_id,) * partitions)
        return _topic_info(info.topic)

    async def placed_here(self, topic: TopicName, partition: int) -> bool:
        _, broker_id = await self._session()
        found = await self._lookup(topic.short)
        return (found is not None and 0 <= partition < found.partitions
                and found.locations[partition] == broker_id)

    # -- admission (connector streams, Kafka producers) -----------------------------------------

    async def admit(self, topic: TopicName, partition: int, *, create: bool) -> bool:
        cluster, broker_id = await self._session()
        try:
            info = await cluster.lookup_topic(topic.short)
        except UnknownTopicError:
            if not create:
                raise
            try:
                info = await cluster.create_topic(topic.short, partition + 1, ingest=True,
                                                  locations=(broker_id,) * (partition + 1))
            except TopicExistsError:  # another stream created it meanwhile
                info = await cluster.lookup_topic(topic.short)
        found = info.topic
        if found.owner != INGEST:
            raise NotIngestError(f"topic {topic.short!r} is written by its owner, not fed from "
                               "outside; connectors and Kafka producers write ingest topics "
                               "(create one with `tq topic create`)")
        if not 0 <= partition < found.partitions:
            raise UnknownPartitionError(f"topic {topic.short!r} has {found.partitions} "
                                        f"partition(s); there is no partition {partition}")
        located = found.locations[partition]
        if located != broker_id:
            where = info.brokers.get(located, f"broker {located}")
            raise NotHereError(f"partition {partition} of {topic.short!r} lives on {where}, "
                               "not on this broker: send it there")
        return True


def _broker_info(broker: Broker) -> BrokerInfo | None:
    """Where a broker's Kafka listener is, if it has one."""
    host, _, port = broker.kafka_address.rpartition(":")
    if host and port.isdigit():
        return BrokerInfo(broker.broker_id, host, int(port))
    return None


def _topic_info(topic: Topic, name: str | None = None) -> TopicInfo:
    """A catalog topic as Kafka's Metadata shows it: each partition led by its broker."""
    return TopicInfo(name or topic.short_name,
                     tuple(PartitionInfo(i, b) for i, b in enumerate(topic.locations)),
                     internal=topic.internal)
