"""Topics of a running cluster: found through the coordinator, read from and written to the
brokers that host their partitions.

The driver asks the coordinator (`querylib.cluster`, no session needed) for topics and their
partitions' brokers, and each broker for its partitions' offsets. Tasks get the broker's
address and the path of the secret file, never the secret: they load it where they run (the
file must be readable there, as on one host or a shared file system). A reading task
subscribes to its partition from its start offset and takes the delivered chunks of whole
batches until its stop offset, granting credit as it decodes; a writing task publishes encoded
batches through a `Producer` and closes without ending the stream. On a replicated topic both
follow the partition's leader when it moves, through the coordinator whose address the place
carries: they watch the catalog for another leader and ask where it is led now, over one
connection their process keeps (`_CatalogLink`, DESIGN §7 "Read path").

A writer's missing topic is created as an ingest topic (`ensure_topic`), in a short session.

Errors: an unknown topic is catalog's UnknownTopicError; a coordinator or broker that does not
answer (not running, or a wrong secret: unsigned messages are dropped unanswered) is
NoCoordinatorError / BrokerUnreachableError, saying both.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar

from catalog import Topic, TopicName
from catalog.errors import TopicExistsError, TqError, UnknownTopicError
from querylib.broker import Incarnation, Producer, Subscriber, list_partitions
from querylib.cluster import Cluster, NoCoordinatorError, TopicInfo, discover
from querylib.rpc import RpcError, SecretRejectedError, load_credential, remember_server_key
from querylib.spark._errors import BrokerUnreachableError
from querylib.spark._options import Location

__all__ = ["ClusterTopics", "PartitionPlace", "broker_read", "open_producer"]

logger = logging.getLogger("querylib.spark")

READ_CREDIT = 8 * 1024 * 1024  # bytes a reading task lets a broker send ahead


@dataclass(frozen=True)
class PartitionPlace:
    """Where a task finds its partition: the broker, the secret file to sign with, and how
    long the broker may take to answer (seconds)."""

    broker: str
    secret_file: str
    timeout: float = 30.0
    # The catalog's topic, (creation ms, topic id): a broker serves only that topic's
    # partition under the name (DESIGN §4 "Topic incarnations"); None: not checked.
    incarnation: tuple[int, int] | None = None
    # The broker's CURVE public key when it is a CURVE server (another host's), else "": a
    # task, in a process of its own, connects with it (DESIGN §2 "Handshake").
    broker_key: str = ""
    # A replicated topic's leader moves (DESIGN §5 "Replication"): a task whose broker is gone
    # or deposed asks the coordinator at `coordinator` where the partition is led now.
    coordinator: str = ""
    replicated: bool = False
    # How long the task's broker sessions may go unheard before the broker is presumed gone
    # (seconds; querylib's default). A replicated topic's task does not wait for it when the
    # catalog moves the leader.
    lease: float = 10.0


def _secret_hint(secret_file: str) -> str:
    return f"is it running, and is {secret_file} this cluster's secret?"


class ClusterTopics:
    """Planning's view of a cluster's topics (see _plan.TopicAccess)."""

    def __init__(self, location: Location) -> None:
        found = discover(location.coordinator, secret_file=location.secret_file)
        self.secret = found.secret
        self.secret_file = found.secret_file
        self.timeout = location.timeout
        self.lease = location.lease
        try:
            self.cluster = Cluster(found.address, found.secret, session=False, source=found.source,
                                   timeout=self.timeout, connect_timeout=self.timeout)
        except SecretRejectedError as exc:
            raise SecretRejectedError(f"{exc}: {found.secret_file} is not this cluster's "
                                      "secret (option secretFile)") from exc
        except NoCoordinatorError as exc:
            raise NoCoordinatorError(f"{exc} (option coordinator, or the cluster file's "
                                     "address)") from exc
        self.coordinator = found.address
        self._source = found.source
        self._infos: dict[str, TopicInfo] = {}
        self._offsets: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}

    def close(self) -> None:
        self.cluster.close()

    def refresh(self) -> None:
        """Forget what was looked up: topics, placements and offsets move."""
        self._infos.clear()
        self._offsets.clear()

    def _info(self, topic: str) -> TopicInfo:
        info = self._infos.get(topic)
        if info is None:
            try:
                info = self.cluster.lookup_topic(topic)
            except UnknownTopicError:
                raise UnknownTopicError(f"topic {topic!r} not found in the cluster at "
                                        f"{self.coordinator}") from None
            self._infos[topic] = info
        return info

    def topics(self) -> dict[str, int]:
        records = self.cluster.snapshot("topics", timeout=self.timeout)["topics"].records
        return {t.short_name: t.partitions for t, _ in records if isinstance(t, Topic)}

    def partitions(self, topic: str) -> int:
        return self._info(topic).topic.partitions

    def ensure_topic(self, topic: str, partitions: int) -> int:
        """The partition count of `topic`, which is created first when missing: an ingest
        topic of `partitions` partitions, in a session of our own (creating needs one)."""
        try:
            return self.partitions(topic)
        except UnknownTopicError:
            pass
        try:
            with Cluster(self.coordinator, self.secret, source=self._source,
                         timeout=self.timeout, connect_timeout=self.timeout) as session:
                info = session.create_topic(topic, partitions, ingest=True)
        except TopicExistsError:  # another writer created it meanwhile
            self._infos.pop(topic, None)
            return self.partitions(topic)
        self._infos[topic] = info
        return info.topic.partitions

    def place(self, topic: str, partition: int) -> PartitionPlace:
        info = self._info(topic)
        broker_id = info.topic.locations[partition]
        address = info.brokers.get(broker_id)
        if address is None:
            raise BrokerUnreachableError(f"partition {partition} of {topic!r} is on broker "
                                         f"{broker_id}, which is not up")
        return PartitionPlace(address, self.secret_file, self.timeout,
                              (info.topic.created_at_ms, info.topic.topic_id),
                              info.broker_keys.get(broker_id, ""), self.coordinator,
                              bool(info.topic.replicas), self.lease)

    def offset_range(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, durable log end); (0, 0) for a partition no one has written yet."""
        place = self.place(topic, partition)
        key = (place.broker, topic)
        known = self._offsets.get(key)
        if known is None:
            try:
                listed = list_partitions(place.broker, self.secret,
                                         TopicName.parse(topic).short, timeout=self.timeout)
            except RpcError as exc:
                raise BrokerUnreachableError(f"broker {place.broker} does not answer: {exc}; "
                                             f"{_secret_hint(self.secret_file)}") from exc
            known = self._offsets[key] = {p.partition: (p.log_start, p.log_end) for p in listed}
        return known.get(partition, (0, 0))


def _incarnation(place: PartitionPlace) -> Incarnation | None:
    return None if place.incarnation is None else Incarnation(*place.incarnation)


def _know_key(place: PartitionPlace) -> None:
    """A task's process learns the broker's CURVE key with its address (none: PLAIN)."""
    remember_server_key(place.broker, place.broker_key)


class _CatalogLink:
    """One coordinator connection (no session) in a task's process per coordinator and
    secret file, shared by the readers and producers of replicated topics open there: their
    start look-ups, their `locate`, and the catalog watch of their leaders
    (`Cluster.watch_leader`: one follower of the catalog's topics for all of them, whose
    snapshot costs in proportion to the catalog's topics). Opened by the first; kept
    `LINGER` seconds after the last closed, so the tasks a reused Python worker runs one
    after another share the connection and the follower (held between them), then closed."""

    LINGER: ClassVar[float] = 30.0
    _links: ClassVar[dict[tuple[str, str], _CatalogLink]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, key: tuple[str, str], cluster: Cluster) -> None:
        self.key = key
        self.cluster = cluster
        self.users = 0
        self._idle: threading.Timer | None = None  # closes the link when it fires
        cluster.hold_leaders()  # the follower outlives each task's watches: closed with it

    @classmethod
    def acquire(cls, place: PartitionPlace) -> _CatalogLink:
        key = (place.coordinator, place.secret_file)
        with cls._lock:
            link = cls._links.get(key)
            if link is None:
                cluster = Cluster(place.coordinator, load_credential(place.secret_file),
                                  session=False, timeout=place.timeout,
                                  connect_timeout=place.timeout)
                link = cls._links[key] = cls(key, cluster)
            if link._idle is not None:
                link._idle.cancel()
                link._idle = None
            link.users += 1
            return link

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            self._idle = threading.Timer(self.LINGER, self._expire)
            self._idle.daemon = True
            self._idle.start()

    def _expire(self) -> None:
        with self._lock:
            if self.users > 0 or self._links.get(self.key) is not self:
                return
            del self._links[self.key]
        self.cluster.close()

    def leader(self, topic: str, partition: int) -> tuple[str, TopicInfo]:
        """Where the partition is led now (its broker's CURVE key learnt with it)."""
        info = self.cluster.lookup_topic(topic)
        address = info.leader_address(partition)
        remember_server_key(address, info.broker_keys.get(info.topic.locations[partition], ""))
        return address, info


@dataclass
class _Route:
    """Where a task's producer or reader starts, and how it follows a moving leader."""

    broker: str
    locate: Callable[[], str] | None = None
    # `watch_leader(moved)`: the catalog's word that the leader moved (querylib.broker's)
    watch_leader: Callable[[Callable[[], None]], Callable[[], None]] | None = None
    link: _CatalogLink | None = None

    def close(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.release()


def _route(place: PartitionPlace, topic: str, partition: int) -> _Route:
    """The broker a task starts with: the planned one, or for a replicated topic the leader
    of now (it may have moved since the driver planned: a streaming query plans once a
    micro-batch, a task may run much later), which it follows through the catalog: asking
    where the partition is led when its broker is gone or deposed (`locate`), and as soon as
    the catalog names another leader (`watch_leader`, from the one it started at). The
    planned broker when the coordinator does not answer; then `locate` asks on a short
    connection of its own each time, and nothing is watched."""
    if not (place.replicated and place.coordinator):
        _know_key(place)
        return _Route(place.broker)
    try:
        link = _CatalogLink.acquire(place)
    except (TqError, OSError) as exc:
        logger.info("asking %s where the partition is led: %s; starting at the planned "
                    "broker %s", place.coordinator, exc, place.broker)
        _know_key(place)
        return _Route(place.broker, locate=_locator(place, topic, partition))
    route = _Route(place.broker, link=link,
                   locate=lambda: link.leader(topic, partition)[0])
    short = TopicName.parse(topic).short
    since = None  # unknown: the watch has the link look again once it reads the catalog
    try:
        route.broker, info = link.leader(topic, partition)
        since = info.leader(partition)
    except (TqError, OSError) as exc:  # the planned broker may still lead: try it
        logger.info("asking %s where the partition is led: %s; starting at the planned "
                    "broker %s", place.coordinator, exc, place.broker)
        _know_key(place)
    route.watch_leader = functools.partial(link.cluster.watch_leader, short, partition,
                                           since=since)
    return route


def _locator(place: PartitionPlace, topic: str, partition: int) -> Callable[[], str]:
    """What a task's producer or reader asks when its broker is gone or deposed and no
    coordinator connection could be kept: the partition's leader of now, from the
    coordinator (a short connection, no session; the new broker's CURVE key learnt with
    it)."""
    def locate() -> str:
        with Cluster(place.coordinator, load_credential(place.secret_file), session=False,
                     timeout=place.timeout, connect_timeout=place.timeout) as cluster:
            info = cluster.lookup_topic(topic)
        address = info.leader_address(partition)
        remember_server_key(address, info.broker_keys.get(info.topic.locations[partition], ""))
        return address

    return locate


def broker_read(place: PartitionPlace, topic: str, partition: int, start: int,
                stop: int) -> Generator[bytes, None, None]:
    """Buffers of whole batches of one partition from the batch holding `start` until one
    reaches `stop`, as the hosting broker delivers them."""
    secret = load_credential(place.secret_file)
    route = _route(place, topic, partition)
    broker = route.broker
    try:
        subscriber = Subscriber(broker, topic, [partition], secret=secret, start=start,
                                credit=READ_CREDIT, follow=True, timeout=place.timeout,
                                lease=place.lease, incarnation=_incarnation(place),
                                locate=route.locate, watch_leader=route.watch_leader)
    except RpcError as exc:
        route.close()
        raise BrokerUnreachableError(f"broker {broker} does not answer: {exc}; "
                                     f"{_secret_hint(place.secret_file)}") from exc
    except BaseException:
        route.close()
        raise
    with contextlib.closing(route), subscriber:
        while True:
            chunk = subscriber.next_chunk(timeout=place.timeout)
            if chunk is None:
                raise BrokerUnreachableError(
                    f"broker {broker} sent nothing of {topic}-{partition} for "
                    f"{place.timeout:g}s before offset {stop}")
            data = bytes(chunk.data)
            subscriber.consumed(chunk)
            yield data
            if chunk.next_offset >= stop:
                return


def open_producer(place: PartitionPlace, topic: str, partition: int) -> Producer:
    """A producer into one partition, which it creates on the broker if needed (the
    coordinator placed it there); on a replicated topic it follows the leader, the catalog
    connection it shares closed with it."""
    route = _route(place, topic, partition)
    try:
        return _TaskProducer(route, topic, partition,
                             secret=load_credential(place.secret_file), create=True,
                             timeout=place.timeout, lease=place.lease,
                             incarnation=_incarnation(place))
    except RpcError as exc:
        route.close()
        raise BrokerUnreachableError(f"broker {route.broker} does not answer: {exc}; "
                                     f"{_secret_hint(place.secret_file)}") from exc
    except BaseException:
        route.close()
        raise


class _TaskProducer(Producer):
    """A task's Producer, which gives its catalog connection back when it closes."""

    def __init__(self, route: _Route, topic: str, partition: int, **options: Any) -> None:
        super().__init__(route.broker, topic, partition, locate=route.locate,
                         watch_leader=route.watch_leader, **options)
        self._route = route

    def close(self, *, end: bool = True) -> None:
        try:
            super().close(end=end)
        finally:
            self._route.close()
