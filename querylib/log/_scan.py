"""Reading a partition log back as records: the scans that replay a log (the coordinator's
journal, the group store) and Kafka's timestamp lookup, written once.

Blocking reads on the caller's thread; nothing here writes. Must not: decode more than one
chunk ahead of the caller (a replay of a long log stays in bounded memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from querylib.errors import CorruptDataError
from querylib.log._log import PartitionLog
from querylib.records import Record, decode_batch, iter_batches

__all__ = ["data_records", "record_at_timestamp"]

SCAN_CHUNK = 4 * 1024 * 1024


def data_records(log: PartitionLog, start: int | None = None, end: int | None = None, *,
                 on_damage: Callable[[CorruptDataError], None] | None = None
                 ) -> Iterator[Record]:
    """Every data record (control batches skipped) with offset in [start, end); `start`
    defaults to the log start, `end` to the log end. A damaged range raises its
    CorruptDataError, unless `on_damage` is given: then it is told of the range, and the scan
    goes on after it (for bookkeeping topics whose records a later one supersedes)."""
    first = log.log_start_offset if start is None else max(start, log.log_start_offset)
    end = log.log_end_offset if end is None else end
    offset = first
    while offset < end:
        try:
            data = log.read(offset, SCAN_CHUNK, end_offset=end)
        except CorruptDataError as exc:
            if on_damage is None or exc.end_offset <= offset:
                raise
            on_damage(exc)
            offset = exc.end_offset
            continue
        if not data:
            return
        for batch in iter_batches(data):
            offset = batch.next_offset
            if batch.is_control:
                continue
            for record in batch.records:
                if first <= record.offset < end:
                    yield record


def record_at_timestamp(log: PartitionLog, timestamp_ms: int,
                        end: int) -> tuple[int, int] | None:
    """Kafka's ListOffsets by time: (offset, timestamp) of the first record at or after
    `timestamp_ms` below `end`, or None when there is none."""
    offset = log.offset_for_timestamp(timestamp_ms)
    if offset is None or offset >= end:
        return None
    for record in decode_batch(log.read(offset, 1, end_offset=end)).records:
        if record.offset >= offset:
            return offset, record.timestamp
    return offset, timestamp_ms
