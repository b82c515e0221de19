"""`ctx.subscribe(...)`: events of one or more topics, all partitions merged.

Each broker holding subscribed partitions gets one `querylib.broker.Subscriber`. With one
broker it is read on the caller's thread; with several, each is read by a thread of its own
into one bounded queue. This module decodes values with the serde (the topics' own when the
caller named none: never pickle, and one serde for all of them) and merges frontiers:
Progress(f) is the minimum over every live source, EndOfStream comes once all ended. A stream
subscriber reads values only (`Values` runs), unless it asked for whole records
(`records=True`: the Subscriber's Data, each record a `querylib.Record` with key and value
decoded by the serde).

A collection topic is first read to the end of what is stored (a non-following read), its
records below the frontier F0 seen then are consolidated into one Snapshot, records at or
after F0 follow as diffs, and a following read goes on from where the first stopped, so
nothing is missed or counted twice. A collection whose stream had ended when it was read
(its publishers closed) ends the subscription after the Snapshot and those diffs, as an ended
stream does: the following read starts after that end and would never see it.

With `group="g"` the subscriber is a member of Kafka consumer group g (`_group_client`): the
group's coordinator assigns it partitions, which it reads from the group's committed offsets
(or `start` where none), and a rebalance revokes them. What it hands out is committed every
second and on close, as the next offset to read; an event counts as consumed once the next
`next_event` call (or `close`) comes, so delivery is at-least-once: records handed out after
the last commit before a rebalance or crash are read again by the partition's next owner.

A broker that restarts (at its address, or at another one the catalog then names) is
followed without a gap or a duplicate; one unreachable for 60 s makes `next_event` raise
BrokerUnavailableError (DESIGN §5 "Restarts").

Must not: decode on the reader threads (CPU stays with the consumer), or buffer unboundedly
(the queue is bounded, and broker credit bounds each reader).
"""

from __future__ import annotations

import queue
import threading
import time as _time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from catalog import TopicKind
from catalog.errors import RecordTypeMismatchError, TqError, UserError
from querylib.broker import Data as RawData
from querylib.broker import EndOfStream as RawEnd
from querylib.broker import Progress as RawProgress
from querylib.broker import Subscriber, Values
from querylib.cluster import TopicInfo
from querylib.records import DIFF_HEADER, TIME_HEADER, decode_int64
from querylib.records import Record as RawRecord

from ._events import Data, EndOfStream, Progress, Record, Snapshot
from ._runtime import Runtime, incarnation_of, readers_of
from .serdes import PICKLE, Serde, decode_value, decode_values, resolve, type_tag

if TYPE_CHECKING:  # the group client pulls in the Kafka codecs: loaded only for a group
    from ._group_client import GroupMember

__all__ = ["Subscription"]

Start = str | int | dict[int, int]
_QUEUE_EVENTS = 256
# Bytes each broker may push ahead of what this process consumed: several batches in flight,
# so the broker's pushes and this process's decoding overlap (1 MiB, the default, stalled it).
_CREDIT = 4 * 1024 * 1024


@dataclass
class _Source:
    """The subscribed partitions of one topic on one broker."""

    info: TopicInfo
    address: str
    partitions: list[int]
    subscriber: Subscriber | None = None
    frontier: int = 0
    epoch: int = 0  # of `frontier`: times order by (epoch, time) (DESIGN §5 "Epochs")
    ended: bool = False
    ended_epoch: int = 0  # the earliest epoch one of its partitions ended in
    thread: threading.Thread | None = None
    start: Any = "earliest"
    pending: list[Data] = field(default_factory=list)
    revoked: bool = False  # a group rebalance took its partitions: drop what it still queued


_OWN_HEADERS = (TIME_HEADER, DIFF_HEADER)


def _diff_of(record: RawRecord) -> int:
    for name, value in record.headers:
        if name == DIFF_HEADER:
            return decode_int64(value)
    return 1


def _whole(serde: Serde, event: RawData, topic: str) -> list[Record]:
    """The records of `event` as whole Records: key and value decoded by the serde (a null
    stays None), headers without the ones tq reads itself (the logical time is Data.time)."""
    partition = event.partition
    out = []
    for r in event.records:
        headers = r.headers
        if headers and any(n in _OWN_HEADERS for n, _ in headers):
            headers = tuple(h for h in headers if h[0] not in _OWN_HEADERS)
        out.append(Record(None if r.value is None else decode_value(serde, r.value),
                          None if r.key is None else decode_value(serde, r.key, "key"),
                          headers, r.timestamp, topic=topic, partition=partition,
                          offset=r.offset))
    return out


class Subscription:
    """An iterator of Data / Progress / EndOfStream (and a Snapshot first for collections)."""

    def __init__(self, runtime: Runtime, names: list[str], *, partitions: list[int] | None,
                 start: Start, timeout: float, serde: Serde | None, record_type: str | None,
                 kind: TopicKind | None, group: str | None = None,
                 records: bool = False) -> None:
        self.runtime = runtime
        self.records = records  # whole Records rather than values (streams only)
        # None: the topics' own serde, chosen (and checked) as each topic is looked up.
        self.serde: Serde = serde  # type: ignore[assignment]  # None until each topic is looked up
        self._implicit = serde is None
        self._serde_topic = ""  # the topic whose serde an implicit choice took
        self.group = group
        self.member: GroupMember | None = None
        self._start = start
        self._infos: dict[str, TopicInfo] = {}
        self._lock = threading.Lock()  # sources, positions: the group thread changes them too
        self._handed: dict[tuple[str, int], int] = {}  # by the last next_event
        self._consumed: dict[tuple[str, int], int] = {}  # next offset to read, to commit
        self._queue: queue.Queue[tuple[_Source, Any]] = queue.Queue(_QUEUE_EVENTS)
        self._closed = threading.Event()
        self._sources: list[_Source] = []
        self._names: list[str] = []
        self._published: int | None = None
        self._published_epoch = 0
        self._ended = False
        self._head: list[Any] = []
        self._direct: _Source | None = None  # the one source read on the caller's thread
        deadline = _time.monotonic() + timeout
        try:
            for name in names:
                info = runtime.cluster.lookup_topic(name, wait=max(deadline - _time.monotonic(),
                                                                  0.001))
                if self._implicit:
                    self._choose_serde(info)
                self._check(info, record_type, kind)
                if records and info.topic.kind == TopicKind.COLLECTION:
                    raise UserError(f"topic {info.topic.short_name!r} is a collection: its "
                                    "records are consolidated values with counts, without keys, "
                                    "headers or timestamps; subscribe without records=True")
                runtime.add_subscription(info.topic.name,
                                         type_tag(self.serde, record_type) if record_type
                                         else None,
                                         kind)
                self._names.append(info.topic.name)
                if group is None:
                    self._add_sources(info, partitions, start)
                else:
                    self._check_group(info, partitions)
            if group is None:
                self._open()
            else:
                self._join(group, max(deadline - _time.monotonic(), 0.001))
        except BaseException:
            self.close()
            raise

    # ---- consumer groups ----------------------------------------------------------------------

    def _check_group(self, info: TopicInfo, partitions: list[int] | None) -> None:
        if partitions is not None:
            raise UserError("a group member reads the partitions the group assigns it: pass "
                            "either group= or partitions=, not both")
        if info.topic.kind == TopicKind.COLLECTION:
            raise UserError(f"topic {info.topic.short_name!r} is a collection: every "
                            "subscriber needs all of it, so it cannot be split in a group")
        self._infos[info.topic.short_name] = info

    def _join(self, group: str, timeout: float) -> None:
        cluster = self.runtime.cluster

        def counts(names: Any) -> dict[str, int]:
            return {n: cluster.lookup_topic(n).topic.partitions for n in names}

        from ._group_client import GroupMember  # noqa: PLC0415 - see the import block

        self.member = GroupMember(group, list(self._infos), locate=self._locate_coordinator,
                                  partition_counts=counts, partitions=self).start()
        # The first assignment normally comes within a heartbeat or two; a group that is
        # rebalancing slowly just delivers later.
        self.member.wait_assigned(timeout)

    def _locate_coordinator(self) -> str:
        from catalog import Broker

        records = self.runtime.cluster.snapshot("brokers")["brokers"].records
        for broker, _ in records:
            if isinstance(broker, Broker) and broker.session_id is None and \
                    broker.kafka_address:
                return broker.kafka_address
        raise UserError("the coordinator's broker has no Kafka listener, so there is no group "
                        "coordinator: start the coordinator with --kafka-port 0 (the default)")

    def assign(self, assignment: dict[str, list[int]],
               starts: Mapping[tuple[str, int], int | None]) -> None:
        """The group gave this member `assignment`: read it, from the committed offsets."""
        fallback = "earliest" if self._start == "committed" else self._start
        added = []
        for topic, parts in sorted(assignment.items()):
            info = self._infos[topic]
            for address, mine in readers_of(info, parts):
                start: dict[int, Any] = {}
                for p in mine:
                    found = starts.get((topic, p))
                    if found is not None:
                        start[p] = found
                    elif isinstance(fallback, dict):
                        start[p] = fallback.get(p, "earliest")
                    else:
                        start[p] = fallback
                source = _Source(info, address, mine, start=start)
                source.subscriber = self._follow(source)
                source.frontier = source.subscriber.frontier or 0
                source.epoch = source.subscriber.epoch
                source.thread = threading.Thread(target=self._pump, args=(source,),
                                                 name=f"tq-subscription {address}", daemon=True)
                added.append(source)
        with self._lock:
            for (topic, p), offset in starts.items():
                if offset is not None:
                    self._consumed[(topic, p)] = offset
            self._sources.extend(added)
        for source in added:
            source.thread.start()  # type: ignore[union-attr]  # set above for each added source

    def revoke(self) -> None:
        """Stop reading every partition (a rebalance, or close); what they queued is dropped."""
        with self._lock:
            gone, self._sources = self._sources, []
            for source in gone:
                source.revoked = True
        for source in gone:
            if source.thread is not None and source.thread.is_alive():
                source.thread.join(timeout=5)
            if source.subscriber is not None:
                source.subscriber.close()

    def consumed(self) -> dict[tuple[str, int], int]:
        """The next offset to read of each partition whose events were consumed."""
        with self._lock:
            return dict(self._consumed)

    def _promote(self) -> None:
        """Events handed out before this call have been consumed."""
        with self._lock:
            self._consumed.update(self._handed)
            self._handed.clear()

    # ---- topics -------------------------------------------------------------------------------

    def _choose_serde(self, info: TopicInfo) -> None:
        """subscribe() without serde=: decode with the serde the topic records (its type tag's
        first part), never pickle, and the same one for every topic of the subscription."""
        topic = info.topic
        carried = topic.record_type.split("/", 1)[0]
        if carried == PICKLE.name:
            raise UserError(f"topic {topic.short_name!r} is pickled, and unpickling runs code "
                            "chosen by whoever wrote it: pass serde='pickle' if you trust the "
                            "topic's writers")
        if self.serde is not None:
            if carried != self.serde.name:
                raise UserError(f"topic {self._serde_topic!r} is {self.serde.name} but topic "
                                f"{topic.short_name!r} is {carried}: one subscription decodes "
                                "with one serde, so subscribe to them separately")
            return
        try:
            self.serde = resolve(carried)
            self._serde_topic = topic.short_name
        except UserError:
            raise UserError(f"topic {topic.short_name!r} carries {carried!r} records, a serde "
                            "querylib does not know: pass serde= the querylib.serdes.Serde "
                            "its writers used") from None

    def _check(self, info: TopicInfo, record_type: str | None, kind: TopicKind | None) -> None:
        topic = info.topic
        carried = topic.record_type.split("/", 1)[0]
        if carried != self.serde.name:
            raise RecordTypeMismatchError(
                f"topic {topic.short_name!r} carries {topic.record_type!r} records; this "
                f"subscriber decodes {self.serde.name!r} (pass serde={carried!r})")
        if kind is not None and topic.kind != kind:
            raise RecordTypeMismatchError(f"topic {topic.short_name!r} is a "
                                          f"{topic.kind.value}, not a {kind.value}")

    def _add_sources(self, info: TopicInfo, partitions: list[int] | None, start: Start) -> None:
        wanted = list(range(info.topic.partitions)) if partitions is None else partitions
        for p in wanted:
            if not 0 <= p < info.topic.partitions:
                raise UserError(f"topic {info.topic.short_name!r} has partitions 0.."
                                f"{info.topic.partitions - 1}, not {p}")
        for address, parts in readers_of(info, wanted):
            src_start: Any = start
            if isinstance(start, dict):
                src_start = {p: start[p] for p in parts if p in start}
            if info.topic.kind == TopicKind.COLLECTION:
                src_start = "earliest"  # a snapshot is the whole collection
            self._sources.append(_Source(info, address, parts, start=src_start))

    def _open(self) -> None:
        snapshot: dict[bytes, int] = {}
        collections = [s for s in self._sources if s.info.topic.kind == TopicKind.COLLECTION]
        low: tuple[int, int] | None = None
        for source in collections:
            f0 = self._read_stored(source, snapshot)
            low = f0 if low is None else min(low, f0)
        if collections:
            assert low is not None
            self._head.append(Snapshot(low[1], [(decode_value(self.serde, b), c)
                                                for b, c in snapshot.items() if c != 0],
                                       low[0]))
            for source in collections:
                self._head.extend(source.pending)
        for source in self._sources:
            source.subscriber = self._follow(source)
            if source not in collections:
                source.frontier = source.subscriber.frontier or 0
                source.epoch = source.subscriber.epoch
        self._published_epoch, self._published = min((s.epoch, s.frontier)
                                                      for s in self._sources)
        if all(s.ended for s in self._sources):  # only collections that ended
            self._head.append(EndOfStream())
            self._ended = True
        if len(self._sources) == 1:
            # One broker: read it on the caller's thread. A reader thread and queue only pay
            # off when several brokers must be waited on at once (measured: the extra thread
            # handoff per event cost the GIL-bound subscriber throughput).
            self._direct = self._sources[0]
            return
        for source in self._sources:
            source.thread = threading.Thread(target=self._pump, args=(source,),
                                             name=f"tq-subscription {source.address}",
                                             daemon=True)
            source.thread.start()

    def _follow(self, source: _Source) -> Subscriber:
        """The subscriber that follows `source` from its start (values only for a stream)."""
        name = source.info.topic.short_name
        return Subscriber(source.address, name, source.partitions,
                          secret=self.runtime.secret, start=source.start, create=True,
                          values=not self.records and
                          source.info.topic.kind != TopicKind.COLLECTION,
                          credit=_CREDIT, incarnation=incarnation_of(source.info),
                          locate=self.runtime.locator(name, source.partitions[0]),
                          watch_leader=self.runtime.leader_watch(source.info,
                                                                 source.partitions[0]))

    def _read_stored(self, source: _Source, snapshot: dict[bytes, int]) -> tuple[int, int]:
        """Read what the broker stores now; fold records below its frontier into `snapshot`,
        keep later ones as diffs. Returns that (epoch, frontier); the follower resumes after
        it."""
        stored: list[RawData] = []
        name = source.info.topic.short_name
        with Subscriber(source.address, name, source.partitions,
                        secret=self.runtime.secret, start="earliest", follow=False,
                        create=True, incarnation=incarnation_of(source.info),
                        locate=self.runtime.locator(name, source.partitions[0]),
                        watch_leader=self.runtime.leader_watch(source.info,
                                                               source.partitions[0])) as sub:
            for event in sub:
                if isinstance(event, RawData):
                    stored.append(event)
                elif isinstance(event, RawEnd):
                    # Every partition's stream ended as stored: the follower, which starts
                    # after the end, would never see it.
                    source.ended = True
            # The frontier after replaying the stored control batches: all data below it
            # was stored before it, so the snapshot below it is complete.
            f0 = (sub.epoch, sub.frontier or 0)
            source.start = sub.positions
        for event in stored:
            if event.time is not None and (event.epoch, event.time) < f0:
                for r in event.records:
                    key = r.value or b""
                    snapshot[key] = snapshot.get(key, 0) + _diff_of(r)
            else:
                source.pending.append(self._decode(event, source))
        source.epoch, source.frontier = f0
        return f0

    def _pump(self, source: _Source) -> None:
        sub = source.subscriber
        assert sub is not None
        try:
            while not self._closed.is_set() and not source.revoked:
                event = sub.next_event(timeout=0.2)
                if event is not None:
                    self._put((source, event))
        except TqError as exc:
            if not source.revoked:
                self._put((source, exc))

    def _put(self, item: tuple[_Source, Any]) -> None:
        while not self._closed.is_set() and not item[0].revoked:
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _decode(self, event: RawData | Values, source: _Source) -> Data:
        serde = self.serde
        if isinstance(event, Values):  # a stream topic: values only
            return Data(event.time, decode_values(serde, event.values, nulls=event.nulls),
                        event.partition, event.epoch)
        if self.records:  # a stream topic, whole records
            return Data(event.time, _whole(serde, event, source.info.topic.short_name),
                        event.partition, event.epoch)
        records = [(decode_value(serde, r.value or b""), _diff_of(r)) for r in event.records]
        return Data(event.time, records, event.partition, event.epoch)

    @property
    def frontier(self) -> int | None:
        """The merged frontier as of the last event handed out."""
        return self._published

    @property
    def epoch(self) -> int:
        """The epoch of `frontier` (DESIGN §5 "Epochs")."""
        return self._published_epoch

    def next_event(self, timeout: float | None = None) -> Any:
        """The next event, or None after `timeout` seconds (or after EndOfStream)."""
        if self._head:
            return self._head.pop(0)
        if self.member is not None:
            self._promote()
            if self.member.error is not None:
                raise self.member.error
        deadline = None if timeout is None else _time.monotonic() + timeout
        direct = self._direct
        while not self._ended:
            left = None if deadline is None else deadline - _time.monotonic()
            if left is not None and left <= 0:
                return None
            if direct is not None:
                assert direct.subscriber is not None
                event = direct.subscriber.next_event(timeout=left)
                if event is None:
                    return None
                source = direct
            else:
                try:
                    source, event = self._queue.get(timeout=left)
                except queue.Empty:
                    return None
            out = self._handle(source, event)
            if out is not None:
                return out
        return None

    def _handle(self, source: _Source, event: Any) -> Any:
        if self.member is not None:
            with self._lock:
                if source.revoked:
                    return None  # its partitions belong to another member now
                if isinstance(event, Values):
                    self._handed[(source.info.topic.short_name, event.partition)] = \
                        event.next_offset
                elif isinstance(event, RawData) and event.records:
                    key = (source.info.topic.short_name, event.partition)
                    self._handed[key] = event.records[-1].offset + 1
        if isinstance(event, TqError):
            raise event
        if isinstance(event, RawData | Values):
            source.ended = False
            return self._decode(event, source)
        if isinstance(event, RawProgress):
            source.epoch, source.frontier = max((source.epoch, source.frontier),
                                                (event.epoch, event.frontier))
        elif isinstance(event, RawEnd):
            source.ended = True
            source.ended_epoch = event.epoch
        with self._lock:
            live = [(s.epoch, s.frontier) for s in self._sources if not s.ended]
            # A source that ended in an earlier epoch may yet start this one (FrontierMerge).
            held = any(s.ended and s.ended_epoch < min(live)[0] for s in self._sources) \
                if live else False
            holding = bool(self._sources)
        if not live:
            if not holding:
                return None  # a group member between assignments
            # A group member's end of stream covers the partitions it holds now; a later
            # assignment may bring more, so it does not end the subscription.
            self._ended = self.member is None
            return EndOfStream()
        low = min(live)
        if held:
            return None
        if self._published is None or low > (self._published_epoch, self._published):
            self._published_epoch, self._published = low
            return Progress(low[1], low[0])
        return None

    def __iter__(self) -> Iterator[Any]:
        while (event := self.next_event()) is not None:
            yield event
            if isinstance(event, EndOfStream):
                return

    def close(self) -> None:
        """Stop reading; the subscription leaves the catalog (once per process). Idempotent."""
        if self._closed.is_set():
            return
        if self.member is not None:
            self._promote()  # the caller is done with everything handed out
            self.member.close()  # stops reading, commits, leaves the group
        self._closed.set()
        for source in self._sources:
            if source.thread is not None and source.thread.is_alive():
                source.thread.join(timeout=5)
            if source.subscriber is not None:
                source.subscriber.close()
        for name in self._names:
            self.runtime.remove_subscription(name)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
