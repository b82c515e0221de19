"""The catalog topics on disk: how changes and checkpoints become record batches, and how
recovery reads them back.

Each collection is one partition, `__catalog.<collection>-0`, on the coordinator's broker. A
change with version v becomes, in each collection it touches, one Kafka record per update:

    key      null
    value    the record, MessagePack (catalog.encode_record), its type tag checked on decode
    headers  tq.time = v (int64 BE), tq.diff = the multiplicity change (int64 BE)

Atomicity across topics: a change touches several partitions, and a crash can leave some of its
batches written and others not. Every change retracts and re-inserts the `counters` record, so
the counters topic is the commit record: the writer appends a commit's counters batch only after
every other batch of the commit is durable, and answers clients only after that. On recovery the
last version in the counters topic, V, is the committed version; updates with a time above V
in the other topics belong to a change that never committed. They are not cut out of the log
(the broker owns it); recovery returns them negated as `compensation`, which the coordinator
appends at the same times before anything else. A follower consolidates by time, and frontiers
only pass a time once its change committed, so the aborted updates and their compensation net
to zero before anyone sees that time complete.

Checkpoints keep what a late follower (and recovery) reads bounded. At a committed version S the
writer appends to every collection topic a block: a marker record (null value, tq.time = S,
tq.snapshot = S, tq.count = N) and then the N records of the collection at S (tq.time = S,
tq.diff = multiplicity, tq.snapshot = S). Once every block is durable it appends the block
offsets to `__catalog_checkpoints` (one `CheckpointEntry` per checkpoint, tq.time = S). A reader
starts at the last entry's offsets: the block is the collection at S, what follows are the
changes after S. A reader that starts elsewhere (the earliest offset, an older checkpoint)
skips every block it meets: it has that state already, through the changes. A block written
before a crash but never indexed is such a block.

Blocking file I/O (reading partition logs), meant for an executor thread, before the broker
opens the logs. Must not: write anything but through the broker; decide what a change is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import msgspec

from catalog import (
    COLLECTIONS,
    Catalog,
    CatalogDecodeError,
    CorruptCatalogError,
    Record,
    TqError,
    Update,
    catalog_topic,
    decode_record,
    encode_record,
)
from querylib.cluster._format import CHECKPOINT_TOPIC, COUNT_HEADER, SNAPSHOT_HEADER
from querylib.errors import CorruptDataError, QuarantinedDataError
from querylib.log import LogConfig, PartitionLog, data_records, partition_dir_name
from querylib.records import (
    DIFF_HEADER,
    TIME_HEADER,
    decode_int64,
    encode_batch,
    encode_int64,
)
from querylib.records import Record as LogRecord

from ._events import Persist

__all__ = [
    "CHECKPOINT_TOPIC",
    "COUNT_HEADER",
    "MAX_BATCH_BYTES",
    "SNAPSHOT_HEADER",
    "CheckpointEntry",
    "Recovered",
    "TimedUpdate",
    "decode_checkpoint",
    "encode_block",
    "encode_checkpoint",
    "encode_updates",
    "group_updates",
    "read_catalog",
    "read_collection",
]

logger = logging.getLogger("coordinator")

# Keep each batch well under the broker's default max_batch_bytes (8 MiB).
MAX_BATCH_BYTES = 1024 * 1024
_INT64_CACHE: dict[int, bytes] = {}


def _int64(n: int) -> bytes:
    # Diffs are almost always +1/-1: cache the small encodings.
    value = _INT64_CACHE.get(n)
    if value is None:
        value = encode_int64(n)
        if -16 <= n <= 16:
            _INT64_CACHE[n] = value
    return value


@dataclass(frozen=True, slots=True)
class TimedUpdate:
    """One update of one collection at catalog version `time`."""

    time: int
    record: Record
    diff: int


class CheckpointEntry(msgspec.Struct, frozen=True):
    """A checkpoint at `version`: where each collection's block starts (the marker's offset)."""

    version: int
    offsets: dict[str, int]


_entry_decoder = msgspec.msgpack.Decoder(CheckpointEntry)


def group_updates(changes: Iterable[Persist]) -> dict[str, list[TimedUpdate]]:
    """The updates of one commit's changes, per collection, in version order."""
    per: dict[str, list[TimedUpdate]] = {}
    for change in changes:
        for collection, record, diff in change.updates:
            per.setdefault(collection, []).append(TimedUpdate(change.version, record, diff))
    return per


Entry = tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]


def _batches(entries: Iterable[tuple[Entry, int]]) -> Iterator[bytes]:
    """Record batches of (entry, its size estimate), each under MAX_BATCH_BYTES."""
    batch: list[Entry] = []
    size = 0
    for entry, entry_size in entries:
        batch.append(entry)
        size += entry_size
        if size >= MAX_BATCH_BYTES:
            yield encode_batch(batch)
            batch, size = [], 0
    if batch:
        yield encode_batch(batch)


def encode_updates(updates: Sequence[TimedUpdate], wall_ms: int) -> Iterator[bytes]:
    """Record batches for one collection's updates, in order."""
    def entries() -> Iterator[tuple[Entry, int]]:
        for update in updates:
            value = encode_record(update.record)
            yield (wall_ms, None, value, ((TIME_HEADER, encode_int64(update.time)),
                                          (DIFF_HEADER, _int64(update.diff)))), len(value) + 48

    return _batches(entries())


def encode_block(version: int, records: Sequence[tuple[Record, int]],
                 wall_ms: int) -> list[bytes]:
    """A checkpoint block: the marker, then every (record, multiplicity) of a collection."""
    time = encode_int64(version)
    mark = ((TIME_HEADER, time), (SNAPSHOT_HEADER, time))

    def entries() -> Iterator[tuple[Entry, int]]:
        yield (wall_ms, None, None, (*mark, (COUNT_HEADER, encode_int64(len(records))))), 64
        for record, count in records:
            value = encode_record(record)
            yield (wall_ms, None, value, ((TIME_HEADER, time), (DIFF_HEADER, _int64(count)),
                                          (SNAPSHOT_HEADER, time))), len(value) + 64

    return list(_batches(entries()))


def encode_checkpoint(entry: CheckpointEntry, wall_ms: int) -> bytes:
    return encode_batch([(wall_ms, None, msgspec.msgpack.encode(entry),
                          ((TIME_HEADER, encode_int64(entry.version)),))])


def decode_checkpoint(value: bytes | None) -> CheckpointEntry:
    try:
        entry = _entry_decoder.decode(value or b"")
    except msgspec.DecodeError as exc:
        raise CorruptCatalogError(f"{CHECKPOINT_TOPIC}: not a checkpoint entry: {exc}") from exc
    unknown = set(entry.offsets) - set(COLLECTIONS)
    if unknown or entry.version < 0 or min(entry.offsets.values(), default=0) < 0:
        raise CorruptCatalogError(f"{CHECKPOINT_TOPIC}: a malformed entry {entry!r}")
    return entry


# -- reading ------------------------------------------------------------------------------------


@dataclass
class _Collected:
    base: list[tuple[Record, int]] = field(default_factory=list)  # the starting block
    updates: list[TimedUpdate] = field(default_factory=list)  # changes after it


def _headers(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, int]:
    out = {}
    for name, value in headers:
        if name in (TIME_HEADER, DIFF_HEADER, SNAPSHOT_HEADER, COUNT_HEADER):
            out[name] = decode_int64(value)
    return out


def read_collection(log: PartitionLog, collection: str, *, start: int = 0,
                    block: int | None = None) -> _Collected:
    """The updates stored in a catalog partition from offset `start`. With `block`, the first
    record must be the marker of that checkpoint's block, which becomes the base; every other
    block is skipped. Raises CorruptCatalogError for anything that is not a catalog update."""
    topic = catalog_topic(collection)
    out = _Collected()
    expected: int | None = None  # records of the starting block still to come
    for record in data_records(log, start):
        offset = record.offset
        try:
            headers = _headers(record.headers)
        except TqError as exc:
            raise CorruptCatalogError(f"{topic} offset {offset}: {exc}") from exc
        snapshot = headers.get(SNAPSHOT_HEADER)
        if expected is None and block is not None:
            if snapshot != block or COUNT_HEADER not in headers:
                raise CorruptCatalogError(f"{topic} offset {offset}: the checkpoint at "
                                          f"version {block} does not start here")
            expected = headers[COUNT_HEADER]
            continue
        if snapshot is not None:
            if expected and snapshot == block and COUNT_HEADER not in headers:
                out.base.append((_value(topic, collection, record, offset),
                                 _need(headers, DIFF_HEADER, topic, offset)))
                expected -= 1
            continue  # a marker, or a block we do not start from
        time = _need(headers, TIME_HEADER, topic, offset)
        out.updates.append(TimedUpdate(time, _value(topic, collection, record, offset),
                                       _need(headers, DIFF_HEADER, topic, offset)))
    if expected:
        raise CorruptCatalogError(f"{topic}: the checkpoint block at version {block} is "
                                  f"missing {expected} records")
    return out


def _need(headers: dict[str, int], name: str, topic: str, offset: int) -> int:
    value = headers.get(name)
    if value is None:
        raise CorruptCatalogError(f"{topic} offset {offset}: a record without {name}")
    return value


def _value(topic: str, collection: str, record: LogRecord, offset: int) -> Record:
    value = record.value
    if value is None:
        raise CorruptCatalogError(f"{topic} offset {offset}: a record without a value")
    try:
        return decode_record(collection, value)
    except CatalogDecodeError as exc:
        raise CorruptCatalogError(f"{topic} offset {offset}: {exc}") from exc


@dataclass
class Recovered:
    """What the catalog topics hold: the committed catalog, the checkpoint it started from,
    and what to take back."""

    catalog: Catalog
    # collection -> updates of changes above the committed version, negated: append them
    # (at their own times) before any new change.
    compensation: dict[str, list[TimedUpdate]] = field(default_factory=dict)
    checkpoint: CheckpointEntry | None = None
    records: int = 0  # how many updates were read (block records included)
    since_checkpoint: int = 0  # how many of them came after the checkpoint's blocks


def _open(broker_dir: str, topic: str) -> PartitionLog | None:
    path = os.path.join(broker_dir, partition_dir_name(topic, 0))
    return PartitionLog.open(path, LogConfig()) if os.path.isdir(path) else None


def _damaged_catalog(broker_dir: str, topic: str, exc: CorruptDataError) -> CorruptCatalogError:
    """The coordinator's refusal to start on a catalog topic it cannot read whole."""
    what = "quarantined by `tq log repair`" if isinstance(exc, QuarantinedDataError) else \
        "damaged"
    return CorruptCatalogError(
        f"catalog topic {topic} is {what} at offsets {exc.start_offset}..{exc.end_offset - 1} "
        f"({exc.path}): the coordinator will not start without the catalog changes those "
        f"records hold (it would forget topics whose data stays on disk); run `tq log check "
        f"--data {broker_dir}` for details, then restore {broker_dir} from a backup "
        f"(DESIGN.md §4 \"Damaged logs\")")


def _skip_damaged_checkpoints(exc: CorruptDataError) -> None:
    # Any checkpoint is a valid starting point (later changes are replayed on top of it), so
    # one lost in a damaged range only makes recovery start from an older one.
    logger.warning("%s: skipping damaged checkpoint entries: %s", CHECKPOINT_TOPIC, exc)


def _last_checkpoint(broker_dir: str) -> CheckpointEntry | None:
    log = _open(broker_dir, CHECKPOINT_TOPIC)
    if log is None:
        return None
    try:
        last = None
        for record in data_records(log, on_damage=_skip_damaged_checkpoints):
            offset = record.offset
            entry = decode_checkpoint(record.value)
            if last is not None and entry.version <= last.version:
                raise CorruptCatalogError(f"{CHECKPOINT_TOPIC} offset {offset}: versions go "
                                          "backwards")
            last = entry
        return last
    finally:
        log.close()


def read_catalog(broker_dir: str | os.PathLike[str]) -> Recovered:
    """Rebuild the committed catalog from the catalog partitions under `broker_dir`, starting
    at the last checkpoint. A missing directory is an empty catalog. Raises
    CorruptCatalogError if what is stored does not form a valid catalog or a catalog topic is
    damaged past its last checkpoint (a damaged range is never skipped: the coordinator would
    forget what it held), StorageError if a log cannot be read."""
    broker_dir = os.fspath(broker_dir)
    checkpoint = _last_checkpoint(broker_dir)
    collected: dict[str, _Collected] = {}
    for collection in COLLECTIONS:
        # A collection the checkpoint has no block for is newer than it (written by an
        # older tq): it was empty then, so its topic, if any, holds only later changes.
        whole = checkpoint is None or collection not in checkpoint.offsets
        log = _open(broker_dir, catalog_topic(collection))
        if log is None:
            if not whole:
                raise CorruptCatalogError(f"{catalog_topic(collection)} is missing")
            collected[collection] = _Collected()
            continue
        try:
            if whole:
                collected[collection] = read_collection(log, collection)
            else:
                assert checkpoint is not None
                collected[collection] = read_collection(
                    log, collection, start=checkpoint.offsets[collection],
                    block=checkpoint.version)
        except CorruptDataError as exc:
            raise _damaged_catalog(broker_dir, catalog_topic(collection), exc) from exc
        finally:
            log.close()
    base = checkpoint.version if checkpoint is not None else 0
    committed = max((u.time for u in collected["counters"].updates), default=base)
    updates: list[Update] = []
    compensation: dict[str, list[TimedUpdate]] = {}
    for collection, found in collected.items():
        updates += [Update(collection, r, n) for r, n in found.base]  # type: ignore[arg-type]  # a COLLECTIONS name
        aborted: dict[tuple[int, Record], int] = {}
        for u in found.updates:
            if u.time <= base:
                raise CorruptCatalogError(f"{catalog_topic(collection)}: a change at version "
                                          f"{u.time} after the checkpoint at {base}")
            if u.time <= committed:
                updates.append(Update(collection, u.record, u.diff))  # type: ignore[arg-type]  # a COLLECTIONS name
            else:
                key = (u.time, u.record)
                aborted[key] = aborted.get(key, 0) + u.diff
        undo = [TimedUpdate(t, r, -d) for (t, r), d in aborted.items() if d]
        if undo:
            compensation[collection] = undo
    catalog = Catalog.replay(updates)
    if catalog.version != committed:
        raise CorruptCatalogError(f"the counters topic ends at version {committed}, but its "
                                  f"last counters record says {catalog.version}")
    tail = sum(len(c.updates) for c in collected.values())
    read = tail + sum(len(c.base) for c in collected.values())
    return Recovered(catalog, compensation, checkpoint, read, tail)
