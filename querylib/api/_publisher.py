"""`ctx.publish(...)` returns a Publisher: `send(time, records)`, `advance_to(time)`, `close()`.

A PerWorker publisher owns the producer of its worker's partition. Merge and Hash publishers
write through the process's SharedPartitions. Collection publishers send `(value, diff)` pairs
and the diff travels as the `tq.diff` header. A stream's records may be `Record`s (a key,
headers and an event time of their own: the Kafka timestamp); `send`'s `headers=` and
`event_time=` go with every record of a call, on the run path of plain values too.

Producers are idempotent and carry on across a restart of their broker, following it to a
new address through the catalog (`Runtime.locator`); records are neither lost nor stored
twice (DESIGN §5 "Idempotent producers", "Restarts").

Must not: talk to the coordinator except through the Runtime.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterable, Mapping
from typing import Any

from catalog import TopicKind
from catalog.errors import UserError
from querylib.broker import Producer
from querylib.cluster import TopicInfo
from querylib.records import DIFF_HEADER, TIME_HEADER, encode_int64

from ._events import Headers, Record
from ._partitioning import Hash, Partitioning, _PerWorker, per_worker_partition
from ._runtime import Runtime, SharedPartitions, incarnation_of
from .serdes import BYTES, JSON, MSGPACK, Serde

__all__ = ["Publisher"]

# Records per batch of a PerWorker publisher (or 1 MiB, or the producer's 2 ms linger, whichever
# comes first). Up to 8191 records keeps every offset delta a 1- or 2-byte varint, the run
# encoder's fast path; the broker's work is mostly per batch, so fewer, larger batches carry
# more records per second (measured through queries: 1000 -> 8000 records per batch raised
# 0.71-0.92M to 0.93-1.18M records/s of 100 bytes).
_BATCH_RECORDS = 8000
# Headers tq writes and reads itself (the logical time, a collection's diff; the connector's
# tq.msgid and tq.flags): not a user's.
_RESERVED = (TIME_HEADER, DIFF_HEADER)
_RESERVED_PREFIX = "tq."


def _checked_headers(headers: Any) -> Headers:
    """Headers as `(str, bytes | None)` pairs, from pairs or a mapping; UserError for anything
    else, and for tq's own header names."""
    try:
        pairs = tuple(headers.items() if isinstance(headers, Mapping) else map(tuple, headers))
    except TypeError:
        raise UserError(f"headers are (name, bytes) pairs or a dict, not {headers!r}") from None
    checked = []
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise UserError(f"a header is a (name, bytes) pair with a str name, not {pair!r}")
        name, value = pair
        if name.startswith(_RESERVED_PREFIX):
            raise UserError(f"header {name!r}: names starting with {_RESERVED_PREFIX!r} are "
                            f"tq's own (such as {' and '.join(_RESERVED)}); choose another "
                            "name")
        if value is not None and not isinstance(value, bytes):
            if not isinstance(value, bytearray | memoryview):
                raise UserError(f"header {name!r}: a header value is bytes (or None), not "
                                f"{type(value).__name__}")
            value = bytes(value)
        checked.append((name, value))
    return tuple(checked)


def _has_records(values: list[Any]) -> bool:
    return any(isinstance(v, Record) for v in values)


def _checked_time(event_time: Any) -> int:
    """An event time: milliseconds since the Unix epoch, as Kafka's timestamps."""
    if type(event_time) is not int or event_time < 0:
        raise UserError(f"an event time (event_time=, Record.timestamp) is a whole number of "
                        f"milliseconds since the Unix epoch, not {event_time!r}")
    return event_time


class Publisher:
    """Records of one worker into a topic. Use as a context manager, or call close().

    A program run again appends to what its earlier run published, in a new `epoch` (DESIGN
    §5 "Epochs"): its times start again at 0, and readers order times by (epoch, time).
    `resumed_at` is the time this publisher starts at: 0, unless it joined a stream another
    writer of the topic still writes (then the frontier that stream reached; times below it
    are refused: its readers were promised nothing earlier comes)."""

    def __init__(self, runtime: Runtime, worker: int, info: TopicInfo,
                 partitioning: Partitioning, serde: Serde) -> None:
        self.runtime = runtime
        self.worker = worker
        self.info = info
        self.name = info.topic.short_name
        self.partitioning = partitioning
        self.serde = serde
        self.collection = info.topic.kind == TopicKind.COLLECTION
        # Whether a run of values must be searched for Records before it is encoded: only for
        # serdes that might encode a Record rather than refuse it (pickle, a user's own).
        self._scan = serde not in (BYTES, JSON, MSGPACK)
        self.frontier = 0
        self._closed = False
        self._own: Producer | None = None
        self._shared: SharedPartitions | None = None
        env = runtime.env
        if isinstance(partitioning, _PerWorker):
            self.partition = per_worker_partition(env.process, worker, env.processes)
            # Publishing is the owner opening its stream: it reopens one that ended.
            self._own = Producer(info.leader_address(self.partition), self.name, self.partition,
                                 secret=runtime.secret, batch_records=_BATCH_RECORDS,
                                 incarnation=incarnation_of(info),
                                 reopen=True, epoch=info.epoch,
                                 locate=runtime.locator(self.name, self.partition),
                                 watch_leader=runtime.leader_watch(info, self.partition))
        else:
            self.partition = 0
            self._shared = runtime.shared(info)
            self._shared.ready()
        # A topic published before by an earlier run: this run appends in a new epoch,
        # from time 0. One that another writer still writes goes on from the time its stream
        # reached: its readers were promised that nothing earlier comes (DESIGN §5 "Epochs").
        if self._own is not None:
            self.resumed_at, self.epoch = self._own.frontier, self._own.epoch
        else:
            assert self._shared is not None
            self.resumed_at, self.epoch = self._shared.joined, self._shared.epoch
        self.frontier = self.resumed_at

    def send(self, time: int, records: Iterable[Any], *,
             headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None
             = None, event_time: int | None = None) -> None:
        """Records at logical `time` (>= the frontier); for a collection, `(value, diff)`.
        A record may be a `Record`, with a key, headers and a timestamp of its own. `headers`
        go with every record of the call (before a Record's own); `event_time` (ms since the
        Unix epoch) is the Kafka timestamp of every record without one of its own (default:
        now)."""
        if self._closed:
            raise UserError(f"the publisher of {self.name!r} is closed")
        if time < self.frontier:
            raise UserError(self._too_early(time))
        extra = _checked_headers(headers) if headers else ()
        stamp = int(_time.time() * 1000) if event_time is None else _checked_time(event_time)
        encode = self.serde.encode
        if self._own is not None and not self.collection:
            # The common case, kept lean: one timestamp per call, and the records go to the
            # producer as one run of values (encoded a run at a time, not per record). The
            # bytes serde hands its values over as they are: the producer copies them as it
            # encodes and refuses (sending nothing) anything but bytes-likes, which the serde
            # then names. Records (keys, headers, timestamps of their own) are told apart
            # only when encoding refuses them, which the built-in serdes do (see Record), so
            # a run of plain values pays nothing for them; other serdes are asked first.
            values = list(records)
            if self._scan and _has_records(values):
                self._send_records(time, values, extra, stamp)
                return
            if self.serde is BYTES:
                try:
                    self._own.send_values(values, headers=extra, timestamp=stamp, time=time,
                                          allow_none=False)
                    return
                except TypeError:
                    if _has_records(values):
                        self._send_records(time, values, extra, stamp)
                        return
                    values = list(map(encode, values))  # raises the serde's UserError
            else:
                try:
                    values = list(map(encode, values))
                except TypeError:
                    if not _has_records(values):
                        raise
                    self._send_records(time, values, extra, stamp)
                    return
            self._own.send_values(values, headers=extra, timestamp=stamp, time=time)
            return
        for record in records:
            key = None
            timestamp = stamp
            tail = extra
            value = record
            if self.collection:
                try:
                    value, diff = record
                except (TypeError, ValueError):
                    raise UserError(f"{self.name!r} is a collection: send (value, diff) pairs, "
                                    f"not {record!r}") from None
                if isinstance(value, Record):
                    raise UserError(f"{self.name!r} is a collection: its records are (value, "
                                    "diff) pairs, without keys, headers or timestamps of their "
                                    "own (publish a stream for whole records)")
                tail = (*extra, (DIFF_HEADER, encode_int64(int(diff))))
            elif isinstance(record, Record):
                value, key, tail, timestamp = self._parts(record, extra, stamp)
            data = encode(value)
            if self._own is not None:
                self._own.send(data, key=key, headers=tail, timestamp=timestamp, time=time)
                continue
            partition = 0
            if isinstance(self.partitioning, Hash):
                hashed = encode(self.partitioning.key(value))
                partition = self.partitioning.partition_of(hashed)
                if key is None:  # the Hash key is the Kafka key of a record without its own
                    key = hashed
            self._shared.send(partition, data, key, tail, time,  # type: ignore[union-attr]  # shared path: set in __init__
                              timestamp)

    def _parts(self, record: Record, extra: Headers, stamp: int
               ) -> tuple[Any, bytes | None, Headers, int]:
        """A Record's value, encoded key, headers (the call's, then its own) and timestamp."""
        key = None if record.key is None else self.serde.encode(record.key)
        headers = (*extra, *_checked_headers(record.headers)) if record.headers else extra
        timestamp = stamp if record.timestamp is None else _checked_time(record.timestamp)
        return record.value, key, headers, timestamp

    def _send_records(self, time: int, items: list[Any], extra: Headers, stamp: int) -> None:
        """A PerWorker stream's records of which some are Records: each encoded (all before
        any is sent, so a bad one sends nothing), then sent one by one."""
        encode = self.serde.encode
        entries = []
        for item in items:
            if isinstance(item, Record):
                value, key, headers, timestamp = self._parts(item, extra, stamp)
                entries.append((encode(value), key, headers, timestamp))
            else:
                entries.append((encode(item), None, extra, stamp))
        own = self._own
        assert own is not None
        for value, key, headers, timestamp in entries:
            own.send(value, key=key, headers=headers, timestamp=timestamp, time=time)

    def advance_to(self, time: int) -> None:
        """Promise no more records with a time below `time`."""
        if self._closed:
            raise UserError(f"the publisher of {self.name!r} is closed")
        if time < self.frontier:
            if self.resumed_at and self.frontier == self.resumed_at:
                raise UserError(self._too_early(time))
            raise UserError(f"the frontier only advances: {time} < {self.frontier}")
        self.frontier = time
        if self._own is not None:
            self._own.advance(time)
        else:
            self._shared.advance(self.worker, time)  # type: ignore[union-attr]  # shared path: set in __init__

    def _too_early(self, time: int) -> str:
        if self.resumed_at and self.frontier == self.resumed_at:
            return (f"time {time} is below time {self.resumed_at}, which topic {self.name!r} "
                    "had reached when this publisher joined the writers it still has: send "
                    "at `publisher.resumed_at + t`, or publish to another topic")
        return f"time {time} is below the frontier {self.frontier} of this publisher of " \
               f"{self.name!r}"

    def flush(self) -> None:
        """Wait until everything sent is acknowledged (PerWorker only; shared producers
        flush when the last local worker closes)."""
        if self._own is not None:
            self._own.flush()

    def close(self) -> None:
        """End this worker's stream; the publication leaves the catalog when the process's
        last publisher of the topic closes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._own is not None:
                self._own.close()
            else:
                self._shared.close(self.worker)  # type: ignore[union-attr]  # shared path: set in __init__
        finally:
            self.runtime.remove_publication(self.info.topic.name)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
