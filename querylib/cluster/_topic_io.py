"""Records into and out of a topic of a running cluster, found through the coordinator
(`tq produce` / `tq consume`, DESIGN §9).

    route = route_topic(cluster, "events")              # where each partition lives
    with TopicWriter(route, secret) as writer:          # one broker producer per partition
        writer.send(b"hello", time=0)
    for event in read_topic(route, secret, follow=True):  # partitions of every broker, merged
        ...

The coordinator only says where partitions live; records go to and come from the brokers
hosting them, as for queries. Several brokers are read by one thread each into one bounded
queue; the merged frontier is the minimum over brokers, the stream ends when every broker's
part of it has ended. A replicated topic's partitions are read one per thread, and each
producer and reader of one follows its partition's leader through the catalog: it asks
`locate` when its broker refuses or goes silent, and, given the route's `watch_leader`
(`Cluster.watch_leader` of a connection kept open while it runs), as soon as the catalog
names another leader, as querylib's clients do (DESIGN §5 "Replication").

Must not: print or parse arguments (the CLI does), or carry data through the coordinator.
"""

from __future__ import annotations

import functools
import queue
import threading
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from catalog import INGEST, UnknownTopicError
from catalog.errors import TqError, UserError

if TYPE_CHECKING:
    from querylib.broker.messages import StartAt
    from querylib.rpc import Credential

__all__ = ["TopicRoute", "TopicWriter", "last_records_start", "partition_infos", "read_topic",
           "route_topic"]

_MERGE_QUEUE = 1024  # events in flight from the broker threads to the reader


@dataclass(frozen=True)
class TopicRoute:
    """A topic as its brokers know it: short name, and the broker address of each partition."""

    name: str
    partitions: int
    addresses: tuple[str, ...]  # addresses[i]: the broker hosting partition i
    ingest: bool
    # Which topic of the name the catalog means (querylib.broker.Incarnation); None for a
    # standalone broker, which has no catalog.
    incarnation: Any = None
    record_type: str = "bytes"  # the catalog's type tag: `serde` or `serde/record_type`
    # A replicated topic's leaders move (DESIGN §5 "Replication"): `locate(partition)` asks
    # the catalog where partition `partition` is led now, for a producer or reader whose
    # broker stopped answering or was deposed. None: the addresses stand (a standalone
    # broker, or a route with no catalog to ask).
    replicated: bool = False
    locate: Callable[[int], str] | None = None
    # The leader of each partition as the look-up found it (TopicInfo.leader: topic id,
    # broker id, leader epoch), and `watch_leader(topic, partition, moved, since=)`
    # (`Cluster.watch_leader`) to follow the catalog's changes of them; None: not watched.
    leaders: tuple[tuple[int, int, int], ...] = ()
    watch_leader: Callable[..., Callable[[], None]] | None = None

    def by_broker(self, partitions: list[int] | None = None) -> dict[str, list[int]]:
        """The partitions to read (all by default), grouped by the broker hosting them."""
        chosen = list(range(self.partitions)) if partitions is None else partitions
        groups: dict[str, list[int]] = {}
        for p in chosen:
            if not 0 <= p < self.partitions:
                raise UserError(f"topic {self.name!r} has partitions 0..{self.partitions - 1}; "
                                f"there is no partition {p}")
            groups.setdefault(self.addresses[p], []).append(p)
        return groups

    def readers(self, partitions: list[int] | None = None) -> list[tuple[str, list[int]]]:
        """The partitions one reader each follows, with its broker's address: those of one
        broker together, but each partition of a replicated topic alone (leaders move one
        partition at a time, and a reader follows its own partition's leader)."""
        groups = self.by_broker(partitions)
        if not (self.replicated and self.locate is not None):
            return list(groups.items())
        return [(address, [p]) for address, chosen in groups.items() for p in chosen]

    def locator(self, partitions: list[int]) -> Callable[[], str] | None:
        """What a producer or reader of `partitions` asks when its broker is gone: the
        leader of now, for a single partition of a replicated topic."""
        locate = self.locate
        if locate is None or not self.replicated or len(partitions) != 1:
            return None
        (partition,) = partitions
        return lambda: locate(partition)

    def watcher(self, partitions: list[int]) -> Callable[[Callable[[], None]],
                                                        Callable[[], None]] | None:
        """What a producer or reader of `partitions` watches to move as soon as the catalog
        names another leader (querylib.broker's `watch_leader`), from the leader the route
        found: for a single partition of a replicated topic followed through `locate`."""
        watch = self.watch_leader
        if watch is None or self.locator(partitions) is None or not self.leaders:
            return None
        (partition,) = partitions
        return functools.partial(watch, self.name, partition, since=self.leaders[partition])


def route_topic(cluster: Any, name: str, *, create_partitions: int | None = None,
                wait: float = 0.0, locate: Callable[[int], str] | None = None,
                watch_leader: Callable[..., Callable[[], None]] | None = None) -> TopicRoute:
    """Look `name` up in the catalog (waiting up to `wait` s for it). With `create_partitions`,
    a missing topic is created as an ingest topic of that many partitions (the cluster needs
    a session for that). `locate`: the route's (kept for a replicated topic only), as is
    `watch_leader` (a cluster's, open while the route is used)."""
    try:
        info = cluster.lookup_topic(name, wait=wait)
    except UnknownTopicError:
        if create_partitions is None:
            raise
        info = cluster.create_topic(name, create_partitions, ingest=True)
    from querylib.broker import Incarnation

    topic = info.topic
    replicated = bool(topic.replicas)
    return TopicRoute(name=topic.short_name, partitions=topic.partitions,
                      addresses=tuple(info.brokers[b] for b in topic.locations),
                      ingest=topic.owner == INGEST,
                      incarnation=Incarnation(topic.created_at_ms, topic.topic_id),
                      record_type=topic.record_type, replicated=replicated, locate=locate,
                      leaders=tuple(info.leader(p) for p in range(topic.partitions))
                      if replicated else (),
                      watch_leader=watch_leader if replicated else None)


class TopicWriter:
    """Records into a topic: one broker producer per partition written, opened on first use.

    A record goes to `partition` when given, else to the hash of its key (CRC-32, stable
    across runs), else round-robin. Only ingest topics are fed from outside a query.
    `lease`: the producers' broker sessions' (seconds unheard before a broker is presumed
    gone)."""

    def __init__(self, route: TopicRoute, secret: bytes | Credential, *,
                 timeout: float = 30.0, lease: float = 10.0) -> None:
        if not route.ingest:
            raise UserError(f"topic {route.name!r} is owned by a query; only ingest topics "
                            f"are fed from outside (tq topic create makes one)")
        self.route = route
        self.secret = secret
        self.timeout = timeout
        self.lease = lease
        self.producers: dict[int, Any] = {}
        self.counts: dict[int, int] = {}
        self._next = 0

    def _producer(self, partition: int) -> Any:
        from querylib.broker import Producer

        producer = self.producers.get(partition)
        if producer is None:
            self.route.by_broker([partition])  # a clear error for a partition out of range
            # Feeding an ingest topic again goes on after the end of its last feed: an
            # explicit reopen (the topic admits any writer).
            producer = Producer(self.route.addresses[partition], self.route.name, partition,
                                secret=self.secret, timeout=self.timeout, reopen=True,
                                incarnation=self.route.incarnation, lease=self.lease,
                                locate=self.route.locator([partition]),
                                watch_leader=self.route.watcher([partition]))
            self.producers[partition] = producer
        return producer

    def send(self, value: bytes, *, key: bytes | None = None, time: int | None = None,
             partition: int | None = None,
             headers: tuple[tuple[str, bytes], ...] = ()) -> int:
        """Queue one record; returns the partition it goes to."""
        if partition is None:
            if key is not None:
                partition = zlib.crc32(key) % self.route.partitions
            else:
                partition = self._next % self.route.partitions
                self._next += 1
        self._producer(partition).send(value, key=key, time=time, headers=headers)
        self.counts[partition] = self.counts.get(partition, 0) + 1
        return partition

    def advance(self, frontier: int) -> None:
        """No more records below `frontier` in any partition written so far."""
        for producer in self.producers.values():
            producer.advance(frontier)

    def close(self, *, end: bool = True) -> None:
        """Flush every producer and, with `end`, end the stream of every partition written."""
        first: BaseException | None = None
        for producer in self.producers.values():
            try:
                producer.close(end=end)
            except BaseException as exc:  # close the others, then raise the first failure
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> TopicWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(end=exc_type is None)


def read_topic(route: TopicRoute, secret: bytes | Credential, *,
               partitions: list[int] | None = None,
               start: StartAt | dict[int, StartAt] = "earliest", follow: bool = False,
               timeout: float = 30.0, lease: float = 10.0) -> Generator[Any, None, None]:
    """Events (`Data`, `Progress`, `EndOfStream` of querylib.broker) of the chosen partitions.
    Without `follow` it stops at the end of what was stored when it started; with it, at the
    end of stream. Progress is the merged frontier (the minimum over the brokers). A partition
    the catalog places on a broker but nobody wrote yet is created there, empty. `lease`:
    the subscribers' broker sessions'."""
    from querylib.broker import Subscriber

    readers = route.readers(partitions)
    if len(readers) == 1:
        ((address, chosen),) = readers
        with Subscriber(address, route.name, chosen, secret=secret, start=start,
                        follow=follow, timeout=timeout, lease=lease, create=True,
                        incarnation=route.incarnation, locate=route.locator(chosen),
                        watch_leader=route.watcher(chosen)) as sub:
            yield from sub
        return
    yield from _merged(route, readers, secret, start, follow, timeout, lease)


_DONE = object()  # a broker thread's last item


def _merged(route: TopicRoute, readers: list[tuple[str, list[int]]],
            secret: bytes | Credential, start: StartAt | dict[int, StartAt], follow: bool,
            timeout: float, lease: float) -> Iterator[Any]:
    from querylib.broker import EndOfStream, Progress, Subscriber

    events: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=_MERGE_QUEUE)
    stop = threading.Event()

    def put(item: tuple[int, Any]) -> bool:
        while not stop.is_set():
            try:
                events.put(item, timeout=0.2)  # wakes to see `stop` when the reader left
                return True
            except queue.Full:
                continue
        return False

    def read(reader: int, address: str, chosen: list[int]) -> None:
        try:
            with Subscriber(address, route.name, chosen, secret=secret, start=start,
                            follow=follow, timeout=timeout, lease=lease, create=True,
                            incarnation=route.incarnation, locate=route.locator(chosen),
                            watch_leader=route.watcher(chosen)) as sub:
                for event in sub:
                    if not put((reader, event)):
                        return
        except TqError as exc:
            put((reader, exc))
        put((reader, _DONE))

    threads = [threading.Thread(target=read, args=(i, *item), daemon=True,
                                name=f"tq-consume {item[0]} {item[1]}")
               for i, item in enumerate(readers)]
    for thread in threads:
        thread.start()
    frontiers: dict[int, int | None] = dict.fromkeys(range(len(readers)))
    running = set(range(len(readers)))
    ended: set[int] = set()
    merged: int | None = None
    try:
        while running:
            reader, item = events.get()
            if item is _DONE:
                running.discard(reader)
            elif isinstance(item, TqError):
                raise item
            elif isinstance(item, EndOfStream):
                ended.add(reader)
                frontiers.pop(reader, None)  # an ended part holds nobody back
                if len(ended) == len(readers):
                    yield item
                    return
            elif isinstance(item, Progress):
                frontiers[reader] = item.frontier
            else:
                yield item
                continue
            known = [f for f in frontiers.values() if f is not None]
            if known and len(known) == len(frontiers) and min(known) != merged:
                merged = min(known)
                yield Progress(merged)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=0)  # daemons: a broker thread blocked on its socket may linger


def partition_infos(route: TopicRoute, secret: bytes | Credential, *,
                    partitions: list[int] | None = None, timeout: float = 30.0) -> dict[int, Any]:
    """What the hosting brokers say of each chosen partition (querylib.broker.PartitionInfo:
    start and end offsets, frontier, ended, bytes); one nobody wrote yet is empty. A
    partition whose broker does not answer is missing, unless that is the only broker (then
    its error is raised)."""
    from querylib.broker import PartitionInfo, list_partitions

    found: dict[int, Any] = {}
    failed: TqError | None = None
    groups = route.by_broker(partitions)
    for address, chosen in groups.items():
        wanted = set(chosen)
        try:
            listed = list_partitions(address, secret, route.name, timeout=timeout)
        except TqError as exc:  # that broker's partitions stay unknown
            failed = exc
            continue
        found.update((i.partition, i) for i in listed if i.partition in wanted)
        for p in wanted - found.keys():  # nobody wrote it yet: a read creates it empty
            found[p] = PartitionInfo(topic=route.name, partition=p, log_start=0, log_end=0,
                                     frontier=0, ended=False)
    if failed is not None and len(groups) == 1:
        raise failed
    return found


def last_records_start(route: TopicRoute, secret: bytes | Credential, count: int, *,
                       partitions: list[int] | None = None,
                       timeout: float = 30.0) -> dict[int, int]:
    """The offset of each chosen partition from which it holds its last `count` records.

    Control batches (frontier, end of stream) take offsets too, so `end - count` may hold
    fewer records: a partition is read from `end - window` to its end, the window growing
    fourfold until it holds `count` records or reaches the log start."""
    from collections import deque

    from querylib.broker import Data

    starts: dict[int, int] = {}
    for p, info in sorted(partition_infos(route, secret, partitions=partitions,
                                          timeout=timeout).items()):
        window = count
        while True:
            start = max(info.log_start, info.log_end - window)
            offsets: deque[int] = deque(maxlen=count)
            for event in read_topic(route, secret, partitions=[p], start=start,
                                    timeout=timeout):
                if isinstance(event, Data):
                    offsets.extend(r.offset for r in event.records
                                   if r.offset < info.log_end)
            if len(offsets) == count or start <= info.log_start:
                starts[p] = offsets[0] if offsets else info.log_end
                break
            window *= 4
    return starts
