"""What the workers of one process share: the coordinator session, topics joined, catalog
entries counted per process, and the producers of partitions every worker writes (Merge, Hash).

Those shared producers join each partition as one writer of a cohort, the process being
the writer and the query's process count the writers expected, so the broker holds the
partition's frontier until every process has joined (DESIGN §5 "Collective publishing").

The catalog records a publication per party, held by the processes of a query that publish
it: the first local publish adds this process to it, the last local close takes this process
off, and it leaves the catalog when no process holds it. Subscriptions are per party: every
process of a query acts as the same subscriber.

Must not: encode records (publishers do) or hold its lock across a blocking wait.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from catalog import TopicKind
from catalog.errors import (
    AlreadyPublishedError,
    AlreadySubscribedError,
    NotPublishedError,
    NotSubscribedError,
    RecordTypeMismatchError,
    TopicExistsError,
    UnknownTopicError,
    UserError,
)
from querylib.cluster import Cluster, TopicInfo

from ._env import QueryEnv

if TYPE_CHECKING:
    # The broker client is loaded by the first shared publication, not at import: a query
    # process registers before it needs it (DESIGN §6 "Query process start").
    from querylib.broker import Cohort, Incarnation, Producer
    from querylib.broker._session import WatchLeader
    from querylib.rpc import Credential

__all__ = ["Runtime", "SharedPartitions"]

OPEN_TIMEOUT = 90.0


class Runtime:
    """One process's connection to the cluster, shared by its worker threads."""

    def __init__(self, cluster: Cluster, env: QueryEnv) -> None:
        self.cluster = cluster
        self.env = env
        self._lock = threading.Lock()
        self._publications: dict[str, int] = {}
        self._epochs: dict[str, int] = {}  # of this process's publications
        self._subscriptions: dict[str, int] = {}
        self._shared: dict[str, SharedPartitions] = {}
        self._opened: dict[str, int] = {}  # topic -> SharedPartitions made for it so far

    @property
    def secret(self) -> bytes | Credential:
        return self.cluster.secret

    @property
    def principal(self) -> str:
        """Who this process acts as: the principal of its credential (its query's, in a query
        process; DESIGN §12)."""
        return self.cluster.principal

    # -- topics --------------------------------------------------------------------------------

    def join_topic(self, name: str, partitions: int, record_type: str,
                   kind: TopicKind, replication: int | None = None) -> TopicInfo:
        """The topic `name`, created if missing (with `replication` copies of each partition,
        None: the coordinator's default); refuses one of another shape or type."""
        try:
            info = self.cluster.lookup_topic(name)
        except UnknownTopicError:
            try:
                info = self.cluster.create_topic(name, partitions, record_type=record_type,
                                                 kind=kind, replication_factor=replication)
            except TopicExistsError:  # another worker or process was first
                info = self.cluster.lookup_topic(name)
        topic = info.topic
        # A program changed since it last published the topic: say how to start it anew.
        anew = (f": publish to another topic, or delete it first (tq topic delete "
                f"{topic.short_name})")
        if topic.record_type != record_type or topic.kind != kind:
            raise RecordTypeMismatchError(
                f"topic {topic.short_name!r} is a {topic.kind.value} of {topic.record_type!r} "
                f"records; this publisher writes a {kind.value} of {record_type!r}{anew}")
        if topic.partitions != partitions:
            raise UserError(f"topic {topic.short_name!r} has {topic.partitions} "
                            f"partition{'' if topic.partitions == 1 else 's'}; this "
                            f"publication needs {partitions}{anew}")
        return info

    def add_publication(self, name: str) -> int:
        """Publish `name` (once per process); returns the epoch its writers start (DESIGN §5
        "Epochs")."""
        with self._lock:
            count = self._publications.get(name, 0)
            if count == 0:
                try:
                    self._epochs[name] = self.cluster.publish(name).epoch
                except AlreadyPublishedError:
                    self._epochs[name] = 0  # a catalog from before per-process holders
            self._publications[name] = count + 1
            return self._epochs.get(name, 0)

    def remove_publication(self, name: str) -> None:
        with self._lock:
            count = self._publications.get(name, 0) - 1
            if count > 0:
                self._publications[name] = count
                return
            self._publications.pop(name, None)
            try:
                self.cluster.unpublish(name)
            except NotPublishedError:
                pass  # the query ended meanwhile, which retracted it

    def add_subscription(self, name: str, record_type: str | None,
                         kind: TopicKind | None) -> TopicInfo:
        with self._lock:
            count = self._subscriptions.get(name, 0)
            try:
                info = self.cluster.subscribe(name, record_type=record_type, kind=kind)
            except AlreadySubscribedError:
                info = self.cluster.lookup_topic(name)
            self._subscriptions[name] = count + 1
            return info

    def remove_subscription(self, name: str) -> None:
        with self._lock:
            count = self._subscriptions.get(name, 0) - 1
            if count > 0:
                self._subscriptions[name] = count
                return
            self._subscriptions.pop(name, None)
            try:
                self.cluster.unsubscribe(name)
            except NotSubscribedError:
                pass

    def shared(self, info: TopicInfo) -> SharedPartitions:
        """The producers this process uses for a topic every worker writes (Merge, Hash).
        Publishing is collective, so the n-th opening in this process is the n-th in every
        process: it names the cohort."""
        name = info.topic.name
        with self._lock:
            shared = self._shared.get(name)
            if shared is None or shared.closed:
                generation = self._opened.get(name, 0) + 1
                self._opened[name] = generation
                shared = SharedPartitions(self, info, self._cohort(info, generation))
                self._shared[name] = shared
            return shared

    def _cohort(self, info: TopicInfo, generation: int) -> Cohort | None:
        from querylib.broker import Cohort

        env = self.env
        if env.processes <= 1:
            return None  # the only writer: nothing to wait for
        return Cohort(f"q{env.query_id}/{info.topic.short_name}#{generation}",
                           str(env.process), env.processes)

    def locator(self, name: str, partition: int) -> Callable[[], str]:
        """Where partition `partition` of topic `name` is now, asked of the catalog: what a
        producer or subscriber calls when its broker stops answering (a restarted broker
        whose address was taken comes back at another, registered under its id)."""
        def locate() -> str:
            return self.cluster.lookup_topic(name).leader_address(partition)

        return locate

    def leader_watch(self, info: TopicInfo, partition: int) -> WatchLeader | None:
        """What a producer or subscriber of a replicated topic's partition watches to follow
        its leader as soon as the catalog moves it (`Cluster.watch_leader`: one follower of
        the catalog per process), from the leader `info` names (where the client starts);
        None for a topic of one replica, whose broker stays."""
        if not info.topic.replicas:
            return None
        return functools.partial(self.cluster.watch_leader, info.topic.short_name, partition,
                                 since=info.leader(partition))

    def close(self) -> None:
        self.cluster.close()


def readers_of(info: TopicInfo, partitions: list[int]) -> list[tuple[str, list[int]]]:
    """The partitions one reader each follows, with its broker's address: those of one
    broker together; each partition of a replicated topic alone, since leaders move one
    partition at a time and a reader follows its partition's leader through the catalog
    (DESIGN §5 "Replication")."""
    if info.topic.replicas:
        return [(info.leader_address(p), [p]) for p in partitions]
    by_address: dict[str, list[int]] = {}
    for p in partitions:
        by_address.setdefault(info.leader_address(p), []).append(p)
    return list(by_address.items())


def incarnation_of(info: TopicInfo) -> Incarnation:
    """Which topic of its name `info` is, for the brokers (DESIGN §4 "Topic incarnations")."""
    from querylib.broker import Incarnation

    return Incarnation(info.topic.created_at_ms, info.topic.topic_id)


class SharedPartitions:
    """Producers of every partition of a topic, shared by this process's workers. The process
    advances a partition's frontier to the minimum over its workers, and ends it when the last
    worker closes: each worker is expected to publish (as in Timely, publish is collective).
    Each producer is this process's writer of `cohort` (None when the query has one process)."""

    def __init__(self, runtime: Runtime, info: TopicInfo, cohort: Cohort | None) -> None:
        self.runtime = runtime
        self.info = info
        self.cohort = cohort
        self.closed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._opening = False
        workers = runtime.env.workers
        self._frontiers = dict.fromkeys(range(workers), 0)
        self._open = set(range(workers))
        self._frontier = 0
        self.joined = 0  # the frontier its partitions had when this process opened them
        self.epoch = 0  # and their epoch
        self.producers: dict[int, Producer] = {}

    def ready(self) -> None:
        """Open the producers once per process; the other workers wait for that. Nobody waits
        for the other processes: the broker holds the frontier until they join."""
        with self._lock:
            first = not self._opening
            self._opening = True
        if first:
            from querylib.broker import Producer

            try:
                topic = self.info.topic
                # Publishing is the owner opening its stream: it reopens one that ended.
                for p in range(topic.partitions):
                    self.producers[p] = Producer(
                        self.info.leader_address(p), topic.short_name, p,
                        secret=self.runtime.secret, cohort=self.cohort,
                        incarnation=incarnation_of(self.info), reopen=True,
                        epoch=self.info.epoch,
                        locate=self.runtime.locator(topic.short_name, p),
                        watch_leader=self.runtime.leader_watch(self.info, p))
                # The time the topic's stream reached (an earlier run's, when it was published
                # before): this process's workers go on from there.
                self.joined = max(p.frontier for p in self.producers.values())
                self.epoch = max(p.epoch for p in self.producers.values())
                self._frontier = self.joined
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._ready.set()
        elif not self._ready.wait(OPEN_TIMEOUT):
            raise UserError("timed out waiting for the producers of "
                            f"{self.info.topic.short_name!r}")
        if self._error is not None:
            raise UserError(f"opening {self.info.topic.short_name!r} failed: {self._error}")

    def send(self, partition: int, value: bytes, key: bytes | None,
             headers: tuple[tuple[str, bytes | None], ...], time: int,
             timestamp: int | None = None) -> None:
        with self._lock:
            self.producers[partition].send(value, key=key, headers=headers, time=time,
                                           timestamp=timestamp)

    def advance(self, worker: int, frontier: int) -> None:
        with self._lock:
            self._frontiers[worker] = frontier
            self._advance_locked()

    def close(self, worker: int) -> None:
        with self._lock:
            self._open.discard(worker)
            self._frontiers.pop(worker, None)
            if self._open:
                self._advance_locked()
                return
            self.closed = True
            producers, self.producers = self.producers, {}
        for producer in producers.values():
            producer.close()

    def _advance_locked(self) -> None:
        low = min(self._frontiers.values())
        if low > self._frontier:
            self._frontier = low
            for producer in self.producers.values():
                producer.advance(low)

