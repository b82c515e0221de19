"""The Kafka listener of the coordinator's own broker: the cluster's group coordinator
(DESIGN §8 "Consumer groups").

Every group's state and committed offsets live in `__consumer_offsets` of the coordinator's
broker, whose log flushes `always`, so an OffsetCommit is answered only once it is on disk, and
with failover also in etcd (`_etcd_state.py`), where a coordinator that takes over finds them;
so is `__transaction_state`.
Executor brokers name this listener in FindCoordinator (they find it in the catalog's
`brokers` collection: the broker registered without a session, with a `kafka_address`).

`CatalogView` is this listener's `querylib.kafka.KafkaCluster`, read straight from the
coordinator's in-memory catalog (no session, no following): Metadata lists every broker with
a Kafka listener, this one included (librdkafka drops a group coordinator that Metadata does
not list), and the topics the executor brokers lead, as their own listeners do; it
coordinates groups itself. Kafka's admin apis that change topics (DeleteTopics,
CreatePartitions, IncrementalAlterConfigs, which clients send to the controller or any broker)
are requests of the coordinator's own, through `serve` on a short session of the admin, as an
executor's listener makes them through its session: the listener has authorized its Kafka
client first (the topic's writers or the admin, DESIGN §12).

Topics Kafka clients create through this listener (auto-creation, CreateTopics) are made by
the coordinator's core, in process (`Coordinator.create_ingest_topic`): ingest topics placed
on the executors' brokers that have a Kafka listener, as `tq topic create` places them. Every
listener of the cluster names this broker as the controller.
Must not: host data topics (they belong on executor brokers), or change the catalog but
through the core. Who may write what here is the broker's core's decision (`_directory.py` is
what it asks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from catalog import Broker, Catalog, Executor, SessionKind, Topic, TopicName
from querylib.cluster import messages as m
from querylib.kafka import PolicyViolationError
from querylib.server.kafka import BrokerInfo, StateReplica, TopicInfo, catalog_topic_info

__all__ = ["CatalogView", "previous_port"]


class CatalogView:
    """The coordinator's catalog as its broker's Kafka listener sees it."""

    def __init__(self, catalog: Callable[[], Catalog], broker_id: Callable[[], int | None],
                 create: Callable[[str, int, int | None], Awaitable[Topic]],
                 serve: Callable[[Any], Awaitable[Any]] | None = None,
                 replicas: Mapping[str, StateReplica] | None = None) -> None:
        """`replicas`: where each state topic is kept beyond this broker (etcd, with
        failover), by topic."""
        self._catalog = catalog
        self._replicas = dict(replicas or {})
        self._broker_id = broker_id
        self._create = create
        self._serve = serve  # a request of the coordinator's own, as the admin
        self._registered = asyncio.Event()

    def registered(self) -> None:
        """The broker is in the catalog now (bootstrap committed): answer."""
        self._registered.set()

    async def node_id(self) -> int:
        await self._registered.wait()
        found = self._broker_id()
        assert found is not None, "the coordinator's broker is registered at bootstrap"
        return found

    def kafka_brokers(self) -> Sequence[BrokerInfo]:
        found = []
        for broker in self._catalog().brokers:
            if isinstance(broker, Broker):
                host, _, port = broker.kafka_address.rpartition(":")
                if host and port.isdigit():
                    found.append(BrokerInfo(broker.broker_id, host, int(port)))
        return sorted(found, key=lambda b: b.node_id)

    async def kafka_topics(self, names: Sequence[str] | None) -> list[TopicInfo]:
        catalog = self._catalog()
        if names is None:
            # This broker holds only the system's own topics: no data topic is led here.
            listening = {b.node_id for b in self.kafka_brokers()} - {self._broker_id()}
            topics = [t for t in catalog.topics if isinstance(t, Topic)]
            return [self._topic_info(t) for t in sorted(topics, key=lambda t: t.name)
                    if set(t.locations) <= listening]
        found = []
        for name in names:
            topic = catalog.find_topic(name)
            if topic is not None:
                found.append(self._topic_info(topic, name))
        return found

    async def create_kafka_topic(self, name: TopicName, partitions: int,
                                 replication_factor: int | None = None) -> TopicInfo:
        """Created by the coordinator's core (in process, as the catalog's owner), placed on
        the brokers with a Kafka listener, never on this one (it holds no data topic)."""
        return self._topic_info(await self._create(name.short, partitions,
                                                   replication_factor))

    def _topic_info(self, topic: Topic, name: str | None = None) -> TopicInfo:
        registered = {b.broker_id for b in self._catalog().brokers if isinstance(b, Broker)}
        return catalog_topic_info(topic, name, registered)

    def executor_hosts(self) -> int:
        return sum(1 for e in self._catalog().executors if isinstance(e, Executor))

    def controller(self) -> int | None:
        return None  # this broker is the controller every listener names

    async def delete_kafka_topic(self, name: TopicName) -> None:
        await self._in_session(lambda session: m.DeleteTopic(
            session_id=session, name=name.short, force=True))

    async def alter_kafka_topic(self, name: TopicName, partitions: int | None,
                                configs: Mapping[str, str | None]) -> None:
        await self._in_session(lambda session: m.AlterTopic(
            session_id=session, name=name.short, partitions=partitions,
            configs=dict(configs)))

    async def _in_session(self, make: Callable[[int], Any]) -> Any:
        if self._serve is None:
            raise PolicyViolationError("this listener changes no topics")
        opened = await self._serve(m.OpenSession(kind=SessionKind.CLIENT,
                                                 peer="the group coordinator's Kafka listener"))
        try:
            return await self._serve(make(opened.session_id))
        finally:
            await self._serve(m.CloseSession(session_id=opened.session_id))

    async def placed_here(self, topic: TopicName, partition: int) -> bool:
        found = self._catalog().find_topic(topic.short)
        broker_id = self._broker_id()
        return (found is not None and 0 <= partition < found.partitions
                and found.locations[partition] == broker_id)

    async def group_coordinator(self) -> BrokerInfo | None:
        return None  # this broker coordinates every group

    def broker_address(self, node_id: int) -> str | None:
        """Where the transaction coordinator (this broker) writes markers into an executor
        broker's partitions."""
        for broker in self._catalog().brokers:
            if isinstance(broker, Broker) and broker.broker_id == node_id:
                return broker.address
        return None

    def state_replica(self, topic: str) -> StateReplica | None:
        return self._replicas.get(topic)


def previous_port(catalog: Catalog, advertised: str) -> int | None:
    """The port the group coordinator's listener had in the previous run (its broker record,
    recovered from the catalog topics), if it advertised the same host then."""
    for broker in catalog.brokers:
        if isinstance(broker, Broker) and broker.session_id is None:
            host, _, port = broker.kafka_address.rpartition(":")
            if host == advertised and port.isdigit() and 0 < int(port) < 65536:
                return int(port)
    return None
