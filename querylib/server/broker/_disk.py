"""The partitions a broker hosts on disk: finding, creating, opening (with recovery), the
frontier a partition's log says it had, and which topic incarnation a directory belongs to
(DESIGN §4 "Topic incarnations").

Blocking file I/O only, meant to run on an executor thread; no asyncio, no sockets, no broker
state. `PartitionLog` does the storage work (and its own crash recovery); this module adds what
the broker needs on top: which directories are partitions, which topic names are acceptable,
the frontier / end-of-stream recovered from the last control batches, the idempotent
producers' last batches found in the log's tail, and the Kafka transactions of the whole log
(`transaction_history`: the history kept beside it, `_txn_index`, and a walk of what follows).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from catalog import TopicName
from catalog.errors import InvalidTopicNameError, StorageError
from querylib._state_file import fsync_dir, replace_file
from querylib.broker._errors import InvalidTopicError, StaleIncarnationError
from querylib.broker.messages import Incarnation
from querylib.errors import CorruptDataError
from querylib.log import LogConfig, PartitionLog
from querylib.records import (
    BatchHeader,
    ControlType,
    control_of,
    decode_batch,
    decode_frontier,
    decode_reopen,
    read_header,
)
from querylib.records._header import ATTRIBUTES_OFFSET
from querylib.records._types import CONTROL_BIT, TRANSACTIONAL_BIT

from ._events import PartitionId
from ._idempotence import last_sequence
from ._txn_index import TxnHistory, forget_history, read_history, write_history

__all__ = ["OpenedPartition", "find_partitions", "keep_transaction_history", "open_partition",
           "partition_path", "purge_deleted", "read_incarnation", "recover_frontier",
           "recover_producers", "remove_partition_dir", "set_aside", "stale_incarnation",
           "transaction_history", "validate_partition", "write_incarnation"]

_DELETED = ".deleted-"  # prefix of a partition directory on its way out
_ORPHANED = ".orphaned-"  # prefix of an older incarnation's directory, kept for the operator
INCARNATION_FILE = "topic.json"

logger = logging.getLogger("querylib.broker")

_MAX_PARTITION = 2**31 - 1
_SCAN_CHUNK = 1024 * 1024


def validate_partition(topic: str, partition: int) -> PartitionId:
    """(topic, partition) if the broker can host it, else InvalidTopicError saying why.

    A broker names a topic by its short form (`numbers`, `tenant/ns/name`: what the catalog
    shows and Kafka clients see), one spelling per topic, so two spellings never make two
    partitions. On disk the directory is `TopicName.partition_dir` (`/` escaped as `%2F`).
    """
    try:
        name = TopicName.parse(topic)
    except InvalidTopicNameError as exc:
        raise InvalidTopicError(str(exc)) from None
    if name.short != topic:
        raise InvalidTopicError(f"topic {topic[:80]!r}: a broker names it {name.short!r} "
                                "(the short form)")
    if not 0 <= partition <= _MAX_PARTITION:
        raise InvalidTopicError(f"partition {partition} is outside 0..{_MAX_PARTITION}")
    return topic, partition


def partition_path(data_dir: str, pid: PartitionId) -> str:
    """Where a (validated) partition's log lives under `data_dir`."""
    return os.path.join(data_dir, TopicName.parse(pid[0]).partition_dir(pid[1]))


_tombstones = itertools.count()


def remove_partition_dir(data_dir: str, pid: PartitionId) -> None:
    """Delete a (closed) partition's directory. Renamed out of the way first, atomically, so
    a crash half way through the deletion never leaves a truncated partition that the next
    start would recover as live (`purge_deleted` finishes the job then)."""
    path = partition_path(data_dir, pid)
    tomb = os.path.join(data_dir, f"{_DELETED}{os.getpid()}-{next(_tombstones)}-"
                        f"{os.path.basename(path)}")
    try:
        os.rename(path, tomb)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"cannot delete partition directory {path}: {exc}") from exc
    shutil.rmtree(tomb, ignore_errors=True)


def purge_deleted(data_dir: str) -> None:
    """Finish deletions a crash interrupted (directories `remove_partition_dir` renamed)."""
    try:
        entries = list(os.scandir(data_dir))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(_DELETED) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)


def read_incarnation(path: str) -> Incarnation | None:
    """The incarnation a partition directory records, None when it records none (a directory
    made without a catalog, or by an older tq)."""
    try:
        with open(os.path.join(path, INCARNATION_FILE), "rb") as f:
            doc = json.loads(f.read(4096))
        created_ms, topic_id = doc["created_ms"], doc["topic_id"]
        # Integers as written: int() of 70.9 or "70" would name another incarnation (and set
        # the directory aside), of Infinity raise OverflowError.
        if type(created_ms) is not int or type(topic_id) is not int:
            raise ValueError(f"created_ms {created_ms!r}, topic_id {topic_id!r}: not integers")
        return Incarnation(created_ms, topic_id)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"{path}/{INCARNATION_FILE}: unreadable ({exc}); move it aside if "
                           "the directory belongs to the topic the catalog names") from exc


def write_incarnation(path: str, pid: PartitionId, incarnation: Incarnation) -> None:
    """Record the incarnation in the partition directory (`replace_file`: a temporary file of
    its own, fsync, rename, fsync the directory)."""
    body = json.dumps({"topic": pid[0], "partition": pid[1], "topic_id": incarnation.topic_id,
                       "created_ms": incarnation.created_ms})
    replace_file(os.path.join(path, INCARNATION_FILE), body.encode(), mode=0o644)


def set_aside(data_dir: str, pid: PartitionId, held: Incarnation) -> str:
    """Rename a (closed) partition directory of an older incarnation out of the broker's sight
    (`.orphaned-<topic id>-<created ms>-<dir>`, never opened or removed by tq); its path."""
    path = partition_path(data_dir, pid)
    aside = os.path.join(data_dir, f"{_ORPHANED}{held.topic_id}-{held.created_ms}-"
                                   f"{os.path.basename(path)}")
    try:
        os.rename(path, aside)
    except OSError as exc:
        raise StorageError(f"cannot move {path} aside to {aside}: {exc}") from exc
    fsync_dir(data_dir)
    logger.warning("%s belongs to an older topic of that name (id %d, created at %d ms), not "
                   "the one the catalog names now: moved it aside to %s", path, held.topic_id,
                   held.created_ms, aside)
    return aside


def find_partitions(data_dir: str) -> list[PartitionId]:
    """The partitions stored under `data_dir` (directories named <topic>-<partition>)."""
    found: list[PartitionId] = []
    try:
        entries = sorted(os.scandir(data_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"cannot list data directory {data_dir}: {exc}") from exc
    for entry in entries:
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        try:
            name, partition = TopicName.parse_partition_dir(entry.name)
            found.append(validate_partition(name.short, partition))
        except (InvalidTopicNameError, InvalidTopicError):
            logger.warning("%s: ignoring %s, not a partition directory", data_dir, entry.name)
    return found


ProducerMark = tuple[int, int, int, int, int, int]
# Kafka transactions of a log's tail: (open: (producer id, first offset), aborted: (producer
# id, first offset, offset of the ABORT marker), fenced: (producer id, epoch of its last
# marker)), see `_scan_tail`.
TailTransactions = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int, int], ...],
                         tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class OpenedPartition:
    log: PartitionLog
    frontier: int
    ended: bool
    incarnation: Incarnation | None = None
    producers: tuple[ProducerMark, ...] = ()
    epoch: int = 0  # of `frontier`
    epoch_since: int = 0  # the offset from which `epoch` is known to hold
    transactions: TailTransactions = ((), (), ())
    # (offset, frontier, ended, epoch, epoch_since) as they stood at the offset readers may
    # see up to, when that is below the log end (`open_partition`'s `visible_bound`).
    at_visible: tuple[int, int, bool, int, int] | None = None


def open_partition(data_dir: str, pid: PartitionId, config: LogConfig,
                   incarnation: Incarnation | None = None, *,
                   producer_scan_bytes: int = 0,
                   visible_bound: int | None = None) -> OpenedPartition:
    """Open (creating if missing) the log of `pid`, recover its frontier and the idempotent
    batches of its last `producer_scan_bytes`. Blocking.

    Readers see the log up to its durable end, and a promoted follower's up to `visible_bound`
    (its high watermark) too: where that is below the log end, the frontier and end of stream
    as they stood there are recovered as well (`at_visible`).

    With `incarnation` (the topic the catalog names), a directory of an older incarnation is
    set aside first and a new one created; one of a newer incarnation is refused
    (StaleIncarnationError); one that records none is taken as this incarnation's."""
    path = partition_path(data_dir, pid)
    held = read_incarnation(path)
    if incarnation is not None and held is not None and held != incarnation:
        if held > incarnation:
            raise stale_incarnation(pid, held, incarnation, path)
        set_aside(data_dir, pid, held)
        held = None
    log = PartitionLog.open(path, config)
    try:
        if incarnation is not None and held is None:
            write_incarnation(path, pid, incarnation)
            held = incarnation
        frontier, ended, epoch, since = recover_frontier(log)
        visible = log.durable_end_offset if visible_bound is None \
            else min(visible_bound, log.durable_end_offset)
        at_visible = None
        if visible < log.log_end_offset:
            at_visible = (visible, *recover_frontier(log, visible))
        producers, _ = _scan_tail(log, producer_scan_bytes)
        history = transaction_history(log, path)
        transactions = (history.open, history.aborted, history.marked)
    except BaseException:
        log.close()
        raise
    return OpenedPartition(log, frontier, ended, held, producers, epoch=epoch,
                           epoch_since=since, transactions=transactions,
                           at_visible=at_visible)


def stale_incarnation(pid: PartitionId, held: Incarnation, asked: Incarnation,
                      path: str) -> StaleIncarnationError:
    return StaleIncarnationError(
        f"partition {pid[1]} of topic {pid[0]!r} here belongs to topic id {held.topic_id} "
        f"created at {held.created_ms} ms, newer than the topic id {asked.topic_id} asked for "
        f"(created at {asked.created_ms} ms): look the topic up again; if the catalog is the "
        f"older one (restored from a backup), move {path} aside")


MAX_ABORTED = 100_000  # aborted transactions remembered per partition (the newest)


def transaction_history(log: PartitionLog, path: str, *,
                        max_aborted: int = MAX_ABORTED) -> TxnHistory:
    """The partition's Kafka transactions up to its log end: the history kept beside the log
    (`_txn_index`) and a walk of the log after it, or a walk of the whole log when there is
    none, it is damaged, or it describes offsets the log does not have (truncated); the
    result is kept for the next opening. Blocking; reads every byte it walks."""
    start, end = log.log_start_offset, log.log_end_offset
    kept = read_history(path)
    if kept is not None and start <= kept.through <= end:
        lo = kept.through
        opened = dict(kept.open)
        aborted = [a for a in kept.aborted if a[2] >= start]
        marked = dict(kept.marked)
    else:
        if kept is not None and kept.through > end:
            # The log lost its tail below the history's end (recovery cut what a power loss
            # left unflushed). Removed durably before the new one is written, by a rename
            # that may fail or not reach the disk: back, it would be trusted once the log grew
            # past its end again, with a lost transaction open for good.
            try:
                forget_history(path)
            except OSError as exc:
                raise StorageError(f"{path}: cannot remove a transaction history ending past "
                                   f"the log end: {exc}") from exc
        lo, opened, aborted, marked = start, {}, [], {}
    if lo < end:
        for data, pos, header in _walk_whole(log, lo, end):
            pid = header.producer_id
            attributes = data[pos + ATTRIBUTES_OFFSET + 1]
            if pid < 0 or not attributes & TRANSACTIONAL_BIT:
                continue
            if not attributes & CONTROL_BIT:
                opened.setdefault(pid, header.base_offset)
                continue
            records = decode_batch(data[pos:pos + header.size], verify_crc=False).records
            kind = control_of(records[0])[0] if records else None
            began = opened.pop(pid, None)  # None: a marker again, nothing to end
            marked[pid] = max(marked.get(pid, -1), header.producer_epoch)
            if kind == ControlType.ABORT and began is not None:
                aborted.append((pid, began, header.base_offset))
    history = TxnHistory(end, tuple(opened.items()), tuple(aborted[-max_aborted:]),
                         tuple(marked.items())[-max_aborted:])
    if kept != history:
        try:
            write_history(path, history)
        except OSError as exc:  # the next opening walks again
            logger.warning("%s: cannot keep the transaction history: %s", path, exc)
    return history


def keep_transaction_history(path: str, history: TxnHistory) -> None:
    """Keep what the broker knew of a partition's transactions when it closed it (through its
    durable end), so the next opening walks nothing already known. Blocking."""
    try:
        write_history(path, history)
    except OSError as exc:
        logger.warning("%s: cannot keep the transaction history: %s", path, exc)


def recover_producers(log: PartitionLog, scan_bytes: int) -> tuple[ProducerMark, ...]:
    """The idempotent producers' batches in the last `scan_bytes` (at least) of the log, oldest
    first: (producer id, epoch, first sequence, last sequence, base offset, next offset)."""
    return _scan_tail(log, scan_bytes)[0]


def _scan_tail(log: PartitionLog,
               scan_bytes: int) -> tuple[tuple[ProducerMark, ...], TailTransactions]:
    """The idempotent producers' batches (see `recover_producers`) and the Kafka transactions
    of the last `scan_bytes` (at least) of the log: the ones still open (transactional data
    with no COMMIT/ABORT marker of its producer after it), the aborted ones (an ABORT
    marker; its first offset is where the scanned tail starts when its data begins before),
    and per producer the epoch of its last marker (batches of an older epoch are a fenced
    producer's: refused, as before the restart).

    Reads backwards in windows of growing size, as `recover_frontier` does, each window
    forwards, and looks at batch headers only (and the key of a transaction marker). A
    producer that may send batches again after a crash had them unacknowledged, within its
    window, so they are in the tail; a transaction lasts at most its timeout (15 minutes),
    so an open one is in the tail unless more than `scan_bytes` were written meanwhile."""
    start, hi = log.log_start_offset, log.log_end_offset
    window, seen = 4096, 0
    windows: list[list[tuple[BatchHeader, int]]] = []
    while hi > start and seen < scan_bytes:
        lo = max(start, hi - window)
        found: list[tuple[BatchHeader, int]] = []
        for data, pos, header in _walk_whole(log, lo, hi):
            seen += header.size
            attributes = data[pos + ATTRIBUTES_OFFSET + 1]
            if header.producer_id < 0:
                continue
            if attributes & CONTROL_BIT:
                if attributes & TRANSACTIONAL_BIT:
                    batch = decode_batch(data[pos:pos + header.size], verify_crc=False)
                    control = control_of(batch.records[0])[0] if batch.records else None
                    found.append((header, _ABORT if control == ControlType.ABORT else _COMMIT))
            else:
                found.append((header, _DATA_TXN if attributes & TRANSACTIONAL_BIT else _DATA))
        windows.append(found)
        hi = lo
        window *= 4
    producers: list[ProducerMark] = []
    opened: dict[int, int] = {}
    aborted: list[tuple[int, int, int]] = []
    marked: dict[int, int] = {}
    first = hi  # where the scanned tail starts
    for found in reversed(windows):
        for header, kind in found:
            pid = header.producer_id
            if kind in (_DATA, _DATA_TXN) and header.base_sequence >= 0:
                producers.append((pid, header.producer_epoch, header.base_sequence,
                                  last_sequence(header.base_sequence, header.last_offset_delta),
                                  header.base_offset, header.next_offset))
            if kind == _DATA_TXN:
                opened.setdefault(pid, header.base_offset)
            elif kind in (_ABORT, _COMMIT):
                began = opened.pop(pid, first)
                marked[pid] = max(marked.get(pid, -1), header.producer_epoch)
                if kind == _ABORT:
                    aborted.append((pid, began, header.base_offset))
    return tuple(producers), (tuple(opened.items()), tuple(aborted), tuple(marked.items()))


_DATA, _DATA_TXN, _ABORT, _COMMIT = range(4)


class RecoveredFrontier(NamedTuple):
    frontier: int
    ended: bool
    epoch: int
    epoch_since: int = 0  # the epoch is known to hold from this offset on


def recover_frontier(log: PartitionLog, end: int | None = None) -> RecoveredFrontier:
    """(frontier, ended, epoch, epoch_since) as the log last recorded them (below `end`, when
    given: as they stood there): the frontier and epoch of the last FRONTIER control record,
    or 0 and its epoch after a REOPEN record that started an epoch (0, 0 if neither), whether
    the log ends with an END_OF_STREAM record (no data, and no REOPEN, after it), and the
    offset of the record that told the epoch (from there on it holds; epoch 0, the first,
    holds from the start).

    Scans backwards from the end in windows of growing size (4096 offsets, then x4), each read
    forwards, so a log whose last frontier is recent costs a small read however large it is.
    """
    start = log.log_start_offset
    hi = log.log_end_offset if end is None else min(end, log.log_end_offset)
    window = 4096
    ended: bool | None = None  # decided by the last batch of the log
    while hi > start:
        lo = max(start, hi - window)
        found: tuple[int, int, int] | None = None
        last: ControlType | None | str = "none"
        for kind, value, offset in _batches(log, lo, hi):
            last = kind
            if kind == ControlType.FRONTIER:
                assert value is not None
                found = (*value, offset)
            elif kind == ControlType.REOPEN and value is not None:
                found = (0, value[1], offset)  # a new epoch starts at frontier 0
        if ended is None and last != "none":
            ended = last == ControlType.END_OF_STREAM
        if found is not None:
            frontier, epoch, offset = found
            return RecoveredFrontier(frontier, bool(ended), epoch, offset if epoch else 0)
        hi = lo
        window *= 4
    return RecoveredFrontier(0, bool(ended), 0)


def _walk(log: PartitionLog, lo: int,
          hi: int) -> Iterator[tuple[bytes, int, BatchHeader] | None]:
    """Each batch in [lo, hi) as (the chunk read, its position there, its header), in order;
    None for a damaged range, which is skipped."""
    offset = lo
    while offset < hi:
        try:
            data = log.read(offset, _SCAN_CHUNK, end_offset=hi)
        except CorruptDataError as exc:
            yield None
            offset = max(exc.end_offset, offset + 1)
            continue
        if not data:
            return
        pos = 0
        while pos < len(data):
            header = read_header(data, pos)
            if header.base_offset >= hi:
                return
            yield data, pos, header
            pos += header.size
            offset = header.next_offset


def _walk_whole(log: PartitionLog, lo: int,
                hi: int) -> Iterator[tuple[bytes, int, BatchHeader]]:
    """`_walk` without the damaged ranges (what they held is unknown)."""
    for found in _walk(log, lo, hi):
        if found is not None:
            yield found


def _batches(log: PartitionLog, lo: int, hi: int
             ) -> Iterator[tuple[ControlType | None, tuple[int, int] | None, int]]:
    """(control type or None for data, value, base offset) of each batch in [lo, hi): a
    FRONTIER's (frontier, epoch), a REOPEN's (0, epoch) when it starts an epoch, else None. A
    damaged range counts as data (what it held is unknown: it ends no stream)."""
    for found in _walk(log, lo, hi):
        if found is None:
            yield None, None, -1
            continue
        data, pos, header = found
        if not data[pos + ATTRIBUTES_OFFSET + 1] & CONTROL_BIT:
            yield None, None, header.base_offset
            continue
        for record in decode_batch(data[pos:pos + header.size], verify_crc=False).records:
            kind, value = control_of(record)
            if kind == ControlType.FRONTIER:
                yield kind, decode_frontier(value), header.base_offset
            elif kind == ControlType.REOPEN:
                epoch = decode_reopen(value)
                yield kind, (0, epoch) if epoch else None, header.base_offset
            elif kind == ControlType.END_OF_STREAM:
                yield kind, None, header.base_offset
