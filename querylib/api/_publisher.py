"""`ctx.publish(...)` returns a Publisher: `send(time, records)`, `advance_to(time)`, `close()`.

A PerWorker publisher owns the producer of its worker's partition. Merge and Hash publishers
write through the process's SharedPartitions. Collection publishers send `(value, diff)` pairs
and the diff travels as the `tq.diff` header.

Producers are idempotent and carry on across a restart of their broker, following it to a
new address through the catalog (`Runtime.locator`); records are neither lost nor stored
twice (DESIGN §5 "Idempotent producers", "Restarts").

Must not: talk to the coordinator except through the Runtime.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterable
from typing import Any

from catalog import TopicKind
from catalog.errors import UserError
from querylib.broker import Producer
from querylib.cluster import TopicInfo
from querylib.records import DIFF_HEADER, encode_int64

from ._partitioning import Hash, Partitioning, _PerWorker, per_worker_partition
from ._runtime import Runtime, SharedPartitions, address_of, incarnation_of
from .serdes import BYTES, Serde

__all__ = ["Publisher"]

# Records per batch of a PerWorker publisher (or 1 MiB, or the producer's 2 ms linger, whichever
# comes first). Up to 8191 records keeps every offset delta a 1- or 2-byte varint, the run
# encoder's fast path; the broker's work is mostly per batch, so fewer, larger batches carry
# more records per second (measured through queries: 1000 -> 8000 records per batch raised
# 0.71-0.92M to 0.93-1.18M records/s of 100 bytes).
_BATCH_RECORDS = 8000


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
        self.frontier = 0
        self._closed = False
        self._own: Producer | None = None
        self._shared: SharedPartitions | None = None
        env = runtime.env
        if isinstance(partitioning, _PerWorker):
            self.partition = per_worker_partition(env.process, worker, env.processes)
            # Publishing is the owner opening its stream: it reopens one that ended.
            self._own = Producer(address_of(info, self.partition), self.name, self.partition,
                                 secret=runtime.secret, batch_records=_BATCH_RECORDS,
                                 incarnation=incarnation_of(info),
                                 reopen=True, epoch=info.epoch,
                                 locate=runtime.locator(self.name, self.partition))
        else:
            self.partition = 0
            self._shared = runtime.shared(info)
            self._shared.ready()
        # A topic published before by an earlier run: this run appends in a new epoch,
        # from time 0. One that another writer still writes goes on from the time its stream
        # reached: its readers were promised that nothing earlier comes (DESIGN §5 "Epochs").
        self.resumed_at = self._own.frontier if self._own is not None else self._shared.joined
        self.epoch = self._own.epoch if self._own is not None else self._shared.epoch
        self.frontier = self.resumed_at

    def send(self, time: int, records: Iterable[Any]) -> None:
        """Records at logical `time` (>= the frontier); for a collection, `(value, diff)`."""
        if self._closed:
            raise UserError(f"the publisher of {self.name!r} is closed")
        if time < self.frontier:
            raise UserError(self._too_early(time))
        encode = self.serde.encode
        if self._own is not None and not self.collection:
            # The common case, kept lean: one append-time stamp per call, and the records go
            # to the producer as one run of values (encoded a run at a time, not per record).
            # The bytes serde hands its values over as they are: the producer copies them as
            # it encodes and refuses (sending nothing) anything but bytes-likes, which the
            # serde then names.
            values = list(records)
            stamp = int(_time.time() * 1000)
            if self.serde is BYTES:
                try:
                    self._own.send_values(values, timestamp=stamp, time=time, allow_none=False)
                    return
                except TypeError:
                    values = list(map(encode, values))  # raises the serde's UserError
            else:
                values = list(map(encode, values))
            self._own.send_values(values, timestamp=stamp, time=time)
            return
        for record in records:
            headers: tuple[tuple[str, bytes], ...] = ()
            value = record
            if self.collection:
                try:
                    value, diff = record
                except (TypeError, ValueError):
                    raise UserError(f"{self.name!r} is a collection: send (value, diff) pairs, "
                                    f"not {record!r}") from None
                headers = ((DIFF_HEADER, encode_int64(int(diff))),)
            data = encode(value)
            if self._own is not None:
                self._own.send(data, headers=headers, time=time)
                continue
            key = None
            partition = 0
            if isinstance(self.partitioning, Hash):
                key = encode(self.partitioning.key(value))
                partition = self.partitioning.partition_of(key)
            self._shared.send(partition, data, key, headers, time)  # type: ignore[union-attr]

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
            self._shared.advance(self.worker, time)  # type: ignore[union-attr]

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
                self._shared.close(self.worker)  # type: ignore[union-attr]
        finally:
            self.runtime.remove_publication(self.info.topic.name)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
