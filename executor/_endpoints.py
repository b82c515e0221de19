"""The catalog as this host's broker sees it (DESIGN §5 "Admission", §8): the broker's
directory, and the Kafka listener's view of the cluster.

`CatalogTopics` is the broker's `TopicDirectory`: the broker's core asks it about a topic it
has no writers rule for (`resolve`), and it tells the core when a topic's rule changes or the
topic goes (`watch`), following the catalog's `topics` collection. A topic's rule is its
owner's principal (a query's, a session's), "*" for an ingest topic; the partitions the
catalog places on this broker are the ones it may open. A topic the catalog does not know yet
is registered as an ingest topic, with every partition on this broker, when the writer may
create it (a connector stream, a Kafka producer with auto-creation): the endpoint that creates
it is the one that will write it. The core, not this module, admits or refuses each writer.

It is also the connector endpoint's `Locate` (`locate`): which other broker holds a partition
and its address (the last one known while a shard restarts), so the endpoint writes it there
(as anonymous: that broker admits it or not).

It tells the broker its role on each replicated partition it holds a replica of (DESIGN §5
"Replication", `watch_replicas`): leader or follower at the catalog's leader epoch, the ISR,
and for a follower its leader's address and CURVE key, from the `topics` and `brokers` it
follows, whenever what it would tell changes; in order, one change at a time.

It is also the Kafka listener's `KafkaCluster`: for Metadata it follows the catalog's
`brokers` too. Every broker registered with a Kafka address is listed, the coordinator's own
too: it is the group coordinator FindCoordinator names, and librdkafka drops a broker
Metadata does not list. A partition's leader is the broker the catalog locates it on, never
the coordinator's for a data topic (those live on executor brokers); the controller is the
coordinator's broker, as every listener says (`controller`). A named topic the
followed view does not have yet is looked up at the coordinator. It is built before the
broker is registered (the endpoints open first, so the registration can carry their
addresses) and answers once `attach` gave it the session and the broker id.

Must not: write to the broker, or decide who may write what (the broker's core does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from catalog import (
    Broker,
    BrokerHome,
    Executor,
    PrincipalKind,
    Record,
    Topic,
    TopicExistsError,
    TopicName,
    TqError,
    UnknownTopicError,
    UserError,
    principal_kind,
)
from querylib.broker import BrokerUnavailableError
from querylib.cluster import AsyncCluster, Snapshot
from querylib.kafka import CoordinatorNotAvailableError
from querylib.server.broker import PartitionRole, TopicAccess, catalog_access
from querylib.server.connector import Remote
from querylib.server.kafka import BrokerInfo, TopicInfo, catalog_topic_info

__all__ = ["CatalogTopics", "RoleSink"]

# Where a broker's role on a replicated partition goes: (topic, partition, role,
# min.insync.replicas).
RoleSink = Callable[[str, int, "PartitionRole | None", int], Awaitable[None]]

logger = logging.getLogger("executor")

_ATTACH_TIMEOUT = 30.0
_RETRY_FOLLOW = 1.0  # seconds before following a collection again after an error
_RETRY_ROLE = 1.0  # seconds before telling the broker again a role it failed to take


class CatalogTopics:
    """The catalog for this host's broker (its directory) and its Kafka listener, through the
    executor's session."""

    def __init__(self) -> None:
        self.cluster: AsyncCluster | None = None
        self.broker_id: int | None = None
        self._attached = asyncio.Event()
        self._views: dict[str, dict[Record, int]] = {"brokers": {}, "topics": {},
                                                     "executors": {}, "homes": {}}
        self._following: asyncio.Task[None] | None = None
        self._learn: Callable[[TopicAccess], None] | None = None
        self._forget: Callable[[str], None] | None = None
        self._told: set[str] = set()  # topics whose rule the broker was told from the view
        self._addresses: dict[int, str] = {}  # broker id -> its last known address
        self._holders: dict[int, str] = {}  # broker id -> who registered it (the homes)
        # Replication: where roles go, what each replica of ours was last told, and the
        # changes not told yet (told in order by one task).
        self._set_role: RoleSink | None = None
        self._holds: Callable[[str, int], bool] = lambda topic, partition: False
        self._roles: dict[tuple[str, int], tuple[PartitionRole, int]] = {}
        self._role_changes: asyncio.Queue[tuple[str, int, PartitionRole | None, int]] = \
            asyncio.Queue()
        self._telling: asyncio.Task[None] | None = None

    def attach(self, cluster: AsyncCluster, broker_id: int, *, follow: bool = False) -> None:
        """Answer from now on, for broker `broker_id`, following the catalog's topics (the
        broker's rules); with `follow`, its brokers and executors too (Metadata of the Kafka
        listener, and the host's brokers its topics spread over)."""
        self.cluster, self.broker_id = cluster, broker_id
        self._attached.set()
        # The brokers too always: a follower fetches from its leader's address.
        # The homes too: who registered each broker, for who may fetch as which replica.
        collections = ["topics", "brokers", "homes"] + (["executors"] if follow else [])
        self._following = asyncio.get_running_loop().create_task(
            self._follow_all(collections), name="catalog view of the executor's broker")

    def watch(self, learn: Callable[[TopicAccess], None],
              forget: Callable[[str], None]) -> None:
        """The broker's callbacks for rules that change (`TopicDirectory`)."""
        self._learn, self._forget = learn, forget

    def watch_replicas(self, set_role: RoleSink,
                       holds: Callable[[str, int], bool] = lambda topic, partition: False
                       ) -> None:
        """Where this broker's roles on replicated partitions go: `set_role(topic, partition,
        role, min_insync)`, awaited one at a time. `holds(topic, partition)`: whether the
        broker has the partition open (found on disk at its start, say), so a copy the
        replicas no longer name hears so even if no role was told it since."""
        self._set_role = set_role
        self._holds = holds

    def may_replicate(self, principal: str, replica: int) -> bool:
        """Whether `principal` may fetch from this host's brokers as broker `replica`: the
        admin's credential (tq up, an admin's executor) holds every broker; an executor's
        holds those its sessions registered (the catalog's homes); nobody else any. A
        follower's fetches move the high watermark, so the replica it names must be its own."""
        try:
            kind = principal_kind(principal)
        except TqError:
            return False
        if kind is PrincipalKind.ADMIN:
            return True
        if kind is not PrincipalKind.EXECUTOR:
            return False
        return self._holders.get(replica) == principal

    def _index_holders(self) -> None:
        """broker id -> the principal that registered it, from the homes view: asked on every
        replica fetch, so looked up, not searched."""
        self._holders = {h.broker_id: h.principal for h in self._views["homes"]
                         if isinstance(h, BrokerHome)}

    def topic_named(self, name: str) -> Topic | None:
        """The followed view's topic of this short name."""
        for topic in self._views["topics"]:
            if isinstance(topic, Topic) and topic.short_name == name:
                return topic
        return None

    async def close(self) -> None:
        for task in (self._following, self._telling):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._following = self._telling = None

    async def _follow_all(self, collections: list[str]) -> None:
        await asyncio.gather(*(self._follow(name) for name in collections))

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
                            touched = None
                        else:
                            touched = set()
                            for record, diff in event.updates:
                                count = view.get(record, 0) + diff
                                if count > 0:
                                    view[record] = count
                                else:
                                    view.pop(record, None)
                                if isinstance(record, Topic):
                                    touched.add(record.short_name)
                        if collection == "topics":
                            self._tell(touched)
                        if collection in ("topics", "brokers"):
                            self._replica_roles()
                        elif collection == "homes":
                            self._index_holders()
            except TqError as exc:  # the coordinator is away or restarting: follow again
                logger.warning("catalog view of %s: %s; following again", collection, exc)
                await asyncio.sleep(_RETRY_FOLLOW)

    def _tell(self, touched: set[str] | None) -> None:
        """Tell the broker the rules of the topics an update touched (None: a snapshot, all
        of them), from the view as it stands after the whole update: a topic deleted and made
        again in one update gets the new topic's rule, not none."""
        if self._learn is None or self._forget is None or self.broker_id is None:
            return
        topics = {t.short_name: t for t in self._views["topics"] if isinstance(t, Topic)}
        names = set(topics) | self._told if touched is None else touched
        for name in sorted(names):
            topic = topics.get(name)
            if topic is None:
                self._told.discard(name)
                self._forget(name)
            else:
                self._told.add(name)
                self._learn(catalog_access(topic, self.broker_id))

    def _replica_roles(self) -> None:
        """Queue the roles of this broker's replicas that changed in the view."""
        if self._set_role is None or self.broker_id is None:
            return
        me = self.broker_id
        brokers = {b.broker_id: b for b in self._views["brokers"] if isinstance(b, Broker)}
        wanted: dict[tuple[str, int], tuple[PartitionRole, int]] = {}
        for topic in self._views["topics"]:
            if not isinstance(topic, Topic) or not topic.replicas:
                continue
            min_insync = int(topic.config("min.insync.replicas") or 1)
            for i, replicas in enumerate(topic.replicas):
                if me not in replicas and (topic.short_name, i) not in self._roles \
                        and not self._holds(topic.short_name, i):
                    continue  # a replica it never held; one it holds hears it holds none
                leader = topic.locations[i]
                found = brokers.get(leader)
                if leader != me and found is None:
                    continue  # its leader is away: keep the last role until it is back
                wanted[(topic.short_name, i)] = (PartitionRole(
                    topic_id=topic.topic_id, partition=i, leader_id=leader,
                    leader_epoch=topic.leader_epochs[i], replicas=replicas,
                    isr=topic.isr[i],
                    leader_address=found.address if leader != me and found else "",
                    leader_curve_key=(found.curve_key or None) if leader != me and found
                    else None), min_insync)
        for key in [k for k in self._roles if k not in wanted]:
            del self._roles[key]  # a deleted topic: its partitions go with its drop
        for key, role in wanted.items():
            if self._roles.get(key) != role:
                self._roles[key] = role
                self._role_changes.put_nowait((*key, *role))
        if self._telling is None and not self._role_changes.empty():
            self._telling = asyncio.get_running_loop().create_task(
                self._tell_roles(), name="replica roles of the executor's broker")

    async def _tell_roles(self) -> None:
        assert self._set_role is not None
        while True:
            topic, partition, role, min_insync = await self._role_changes.get()
            started = time.monotonic()
            try:
                await self._set_role(topic, partition, role, min_insync)
                if role is not None and self.broker_id is not None \
                        and role.is_leader(self.broker_id):
                    logger.info("replica role of %s-%d: leader at epoch %d (taken in %.3fs)",
                                topic, partition, role.leader_epoch,
                                time.monotonic() - started)
            except (TqError, ValueError, OSError) as exc:
                # Told again later, unless a newer role came meanwhile: no change of the
                # catalog may come to retry it, and the replica would stay as it was.
                logger.warning("replica role of %s-%d: %s; telling it again in %.0fs", topic,
                               partition, exc, _RETRY_ROLE)
                asyncio.get_running_loop().call_later(
                    _RETRY_ROLE, self._tell_again, (topic, partition), role, min_insync)

    def _tell_again(self, key: tuple[str, int], role: PartitionRole | None,
                    min_insync: int) -> None:
        if role is not None and self._roles.get(key) == (role, min_insync):
            self._role_changes.put_nowait((*key, role, min_insync))

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

    def controller(self) -> int | None:
        """The coordinator's own broker, when it has a Kafka listener: the one controller
        every listener names (DESIGN §8); else this one."""
        for broker in self._views["brokers"]:
            if isinstance(broker, Broker) and broker.session_id is None \
                    and _broker_info(broker) is not None:
                return broker.broker_id
        return None

    def executor_hosts(self) -> int:
        return sum(1 for e in self._views["executors"] if isinstance(e, Executor))

    def broker_address(self, node_id: int) -> str | None:
        for broker in self._views["brokers"]:
            if isinstance(broker, Broker) and broker.broker_id == node_id:
                return broker.address
        return None

    def state_replica(self, topic: str) -> None:
        return None  # the coordinator's listener coordinates groups and transactions

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

    async def create_kafka_topic(self, name: TopicName, partitions: int,
                                 replication_factor: int | None = None) -> TopicInfo:
        """Spread over this host's brokers that are up (`tq executor --brokers N`), starting
        with this one: a Kafka client finds each partition's leader in Metadata. A replicated
        topic (or the default factor: DESIGN §5 "Replication") is placed by the coordinator,
        over the executor hosts."""
        cluster, broker_id = await self._session()
        if replication_factor != 1:
            return _topic_info((await cluster.create_topic(
                name.short, partitions, ingest=True,
                replication_factor=replication_factor)).topic)
        brokers = self.host_brokers(broker_id)
        info = await cluster.create_topic(
            name.short, partitions, ingest=True,
            locations=tuple(brokers[i % len(brokers)] for i in range(partitions)))
        return _topic_info(info.topic)

    def host_brokers(self, broker_id: int, *, kafka: bool = True) -> tuple[int, ...]:
        """This broker first, then the other brokers of its host's executor that are
        registered and (with `kafka`) have a Kafka listener, as last known (followed with
        `follow`)."""
        listening = {b.broker_id for b in self._views["brokers"]
                     if isinstance(b, Broker) and (_broker_info(b) is not None if kafka
                                                   else bool(b.address))}
        for executor in self._views["executors"]:
            if isinstance(executor, Executor):
                host = (executor.broker_id, *executor.shards)
                if broker_id in host:
                    return (broker_id,) + tuple(b for b in host
                                                if b != broker_id and b in listening)
        return (broker_id,)

    async def delete_kafka_topic(self, name: TopicName) -> None:
        """Through the executor's session, as a forced delete (the listener authorized the
        Kafka principal as the topic's writer or the admin); the catalog still refuses `__`
        topics, and an executor principal other than the admin deletes nothing (DESIGN §12)."""
        cluster, _ = await self._session()
        await cluster.delete_topic(name.short, force=True)

    async def alter_kafka_topic(self, name: TopicName, partitions: int | None,
                                configs: Mapping[str, str | None]) -> None:
        """Through the executor's session: the catalog places new partitions and checks that
        this principal may alter the topic (DESIGN §12)."""
        cluster, _ = await self._session()
        await cluster.alter_topic(name.short, partitions=partitions, configs=dict(configs))

    async def placed_here(self, topic: TopicName, partition: int) -> bool:
        _, broker_id = await self._session()
        found = await self._lookup(topic.short)
        return (found is not None and 0 <= partition < found.partitions
                and found.locations[partition] == broker_id)

    # -- the connector endpoint's routes (querylib.server.connector.Locate) --------------------

    async def locate(self, topic: str, partition: int) -> Remote | None:
        """Where a partition of `topic` lives, if the catalog places it on another broker;
        else None: this broker decides (it creates an unknown topic, refuses a partition that
        does not exist)."""
        cluster, broker_id = await self._session()
        known = [t for t in self._views["topics"]
                 if isinstance(t, Topic) and t.short_name == topic]
        found = known[0] if known else await self._lookup(topic)
        if found is None and partition >= 0:
            # A stream into a topic nobody created registers it, spread over this host's
            # brokers as any topic is (the endpoint reaches each through broker RPC).
            brokers = self.host_brokers(broker_id, kafka=False)
            try:
                found = (await cluster.create_topic(
                    topic, partition + 1, ingest=True,
                    locations=tuple(brokers[i % len(brokers)]
                                    for i in range(partition + 1)))).topic
            except TopicExistsError:  # another stream created it meanwhile
                found = await self._lookup(topic)
        if found is None or not 0 <= partition < found.partitions:
            return None
        where = found.locations[partition]
        if where == broker_id:
            return None
        for broker in self._views["brokers"]:
            if isinstance(broker, Broker) and broker.address:
                self._addresses[broker.broker_id] = broker.address
        address = self._addresses.get(where)
        if address is None:
            raise BrokerUnavailableError(f"partition {partition} of {topic!r} lives on broker "
                                         f"{where}, which is not registered now; retry")
        return Remote(where, address, found.topic_id, found.created_at_ms)

    # -- the broker's directory (querylib.broker.TopicDirectory) --------------------------------

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        """The access of `topic` as the catalog has it: looked up at the coordinator; with
        `create`, registered first if unknown, as an ingest topic with every partition (up to
        the one asked for) on this broker."""
        cluster, broker_id = await self._session()
        try:
            info = await cluster.lookup_topic(topic)
        except UnknownTopicError:
            if not create:
                raise
            try:
                info = await cluster.create_topic(topic, partition + 1, ingest=True,
                                                  locations=(broker_id,) * (partition + 1))
            except TopicExistsError:  # another stream created it meanwhile
                info = await cluster.lookup_topic(topic)
        return catalog_access(info.topic, broker_id)


def _broker_info(broker: Broker) -> BrokerInfo | None:
    """Where a broker's Kafka listener is, if it has one."""
    host, _, port = broker.kafka_address.rpartition(":")
    if host and port.isdigit():
        return BrokerInfo(broker.broker_id, host, int(port))
    return None


def _topic_info(topic: Topic, name: str | None = None) -> TopicInfo:
    """A catalog topic as Kafka's Metadata shows it: each partition led by its broker (with
    its replicas, ISR and leader epoch when replicated)."""
    return catalog_topic_info(topic, name)
