"""What the workers of one process share: the coordinator session, topics joined, catalog
entries counted per process, and the producers of partitions every worker writes (Merge, Hash).

The catalog records a publication or subscription per party, and every process of a query acts
as the same party, so several workers (and processes) publishing one topic are one entry: the
first local publish adds it (another process may have added it already), the last local close
removes it.

Must not: encode records (publishers do) or hold its lock across a blocking wait.
"""

from __future__ import annotations

import threading
import time as _time
from typing import Any

from catalog import TopicKind, TopicName
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
from querylib.broker import Producer, Progress, Subscriber
from querylib.cluster import Cluster, TopicInfo

from ._env import QueryEnv

__all__ = ["Runtime", "SharedPartitions"]

BARRIER_TIMEOUT = 60.0


class Runtime:
    """One process's connection to the cluster, shared by its worker threads."""

    def __init__(self, cluster: Cluster, env: QueryEnv) -> None:
        self.cluster = cluster
        self.env = env
        self._lock = threading.Lock()
        self._publications: dict[str, int] = {}
        self._subscriptions: dict[str, int] = {}
        self._shared: dict[str, SharedPartitions] = {}

    @property
    def secret(self) -> bytes:
        return self.cluster.secret

    # -- topics --------------------------------------------------------------------------------

    def join_topic(self, name: str, partitions: int, record_type: str,
                   kind: TopicKind) -> TopicInfo:
        """The topic `name`, created if missing; refuses one of another shape or type."""
        try:
            info = self.cluster.lookup_topic(name)
        except UnknownTopicError:
            try:
                info = self.cluster.create_topic(name, partitions, record_type=record_type,
                                                 kind=kind)
            except TopicExistsError:  # another worker or process was first
                info = self.cluster.lookup_topic(name)
        topic = info.topic
        if topic.record_type != record_type or topic.kind != kind:
            raise RecordTypeMismatchError(
                f"topic {topic.short_name!r} is a {topic.kind.value} of {topic.record_type!r} "
                f"records; this publisher writes a {kind.value} of {record_type!r}")
        if topic.partitions != partitions:
            raise UserError(f"topic {topic.short_name!r} has {topic.partitions} partitions; "
                            f"this publication needs {partitions}")
        return info

    def add_publication(self, name: str) -> None:
        with self._lock:
            count = self._publications.get(name, 0)
            if count == 0:
                try:
                    self.cluster.publish(name)
                except AlreadyPublishedError:
                    pass  # another process of this query published it
            self._publications[name] = count + 1

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
                pass  # another process of this query unpublished it first

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
        The first worker opens them and waits until every process of the query has."""
        with self._lock:
            shared = self._shared.get(info.topic.name)
            if shared is None or shared.closed:
                shared = SharedPartitions(self, info)
                self._shared[info.topic.name] = shared
            return shared

    def close(self) -> None:
        self.cluster.close()


def address_of(info: TopicInfo, partition: int) -> str:
    broker_id = info.topic.locations[partition]
    try:
        return info.brokers[broker_id]
    except KeyError:
        raise UnknownTopicError(f"partition {partition} of {info.topic.short_name!r} is on "
                                f"broker {broker_id}, which is not up") from None


class SharedPartitions:
    """Producers of every partition of a topic, shared by this process's workers. The process
    advances a partition's frontier to the minimum over its workers, and ends it when the last
    worker closes: each worker is expected to publish (as in Timely, publish is collective)."""

    def __init__(self, runtime: Runtime, info: TopicInfo) -> None:
        self.runtime = runtime
        self.info = info
        self.closed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._opening = False
        workers = runtime.env.workers
        self._frontiers = dict.fromkeys(range(workers), 0)
        self._open = set(range(workers))
        self._frontier = 0
        self.producers: dict[int, Producer] = {}

    def ready(self) -> None:
        """Open the producers once per process, then meet the other processes."""
        with self._lock:
            first = not self._opening
            self._opening = True
        if first:
            try:
                topic = self.info.topic
                for p in range(topic.partitions):
                    self.producers[p] = Producer(address_of(self.info, p), topic.short_name, p,
                                                 secret=self.runtime.secret)
                env = self.runtime.env
                if env.processes > 1:
                    _barrier(self.info, env.query_id, env.process, env.processes,
                             self.runtime.secret)
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._ready.set()
        elif not self._ready.wait(BARRIER_TIMEOUT + 30):
            raise UserError("timed out waiting for the producers of "
                            f"{self.info.topic.short_name!r}")
        if self._error is not None:
            raise UserError(f"opening {self.info.topic.short_name!r} failed: {self._error}")

    def send(self, partition: int, value: bytes, key: bytes | None,
             headers: tuple[tuple[str, bytes], ...], time: int) -> None:
        with self._lock:
            self.producers[partition].send(value, key=key, headers=headers, time=time)

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


def _barrier(info: TopicInfo, query_id: int | None, process: int, processes: int,
             secret: bytes) -> None:
    """Wait until every process of the query has joined the partitions of `info`.

    A partition's frontier is the minimum over the producers joined so far, so a process that
    joined late could find the frontier moved past its first records. Each process writes its
    index to a scratch partition next to partition 0 once its producers are open, then reads
    that partition until it has seen every index. (A count of producers in the broker's
    partition info, or a writer barrier in the coordinator, would make this unnecessary.)
    """
    name = TopicName.parse(info.topic.name)
    scratch = TopicName(name.tenant, name.namespace, f"{name.local}.__join.q{query_id}").short
    address = address_of(info, 0)
    with Producer(address, scratch, 0, secret=secret) as producer:
        producer.send(str(process).encode())
        producer.flush()
        producer.close(end=False)
    seen: set[bytes] = set()
    deadline = _time.monotonic() + BARRIER_TIMEOUT
    with Subscriber(address, scratch, [0], secret=secret, create=True) as sub:
        while len(seen) < processes:
            left = deadline - _time.monotonic()
            if left <= 0:
                raise UserError(f"only {len(seen)} of {processes} processes joined "
                                f"{info.topic.short_name!r} within {BARRIER_TIMEOUT:g}s")
            event: Any = sub.next_event(timeout=min(left, 1.0))
            if event is None or isinstance(event, Progress):
                continue
            seen.update(r.value for r in event.records if r.value is not None)
