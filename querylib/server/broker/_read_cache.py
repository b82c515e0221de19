"""Catch-up reads shared by the subscriptions at one position (DESIGN §5 "Flow control",
issue 17): the broker's shell keeps its recent reads of the log, each with the digest its
pushes are signed with, so subscriptions reading the same offset (a fan-out's readers move
in step) get one read of the disk, one hash and one zmq frame between them, not one each.

Rules (tests in tests/querylib/server/broker/test_read_cache.py):
- A kept read serves a later read of the same partition log at the same offset only where a
  read of the log could have answered the same: it ends at or before the later read's end
  offset (the stable end then), and it fits the later read's size or is one batch (a read
  returns at least one batch); the log still starts at or before it and was not truncated
  since (`PartitionLog.truncations`), so its bytes are still the log's.
- Memory is bounded: at most `max_bytes` kept over all partitions, the least recently used
  dropped first, whoever reads or stops reading; a read bigger than that is not kept. No
  subscription holds an entry: a slow one finds it gone and reads again.

Must not: read the disk, hash, or decide what a subscription is sent (the core does).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from querylib.log import PartitionLog

from ._events import PartitionId

__all__ = ["ReadCache", "SharedRead"]


@dataclass(slots=True)
class SharedRead:
    """One read of `log`: whole batches (`batches` of them) from the offset it was asked at,
    the offset after the last, their `payload_digest`, and the count of the log's truncations
    sampled before reading. `frame`: the zmq frame its pushes share, once made."""

    log: PartitionLog
    truncations: int
    data: bytes
    next_offset: int
    batches: int
    digest: bytes
    frame: Any = None

    def serves(self, log: PartitionLog, offset: int, max_bytes: int, end_offset: int) -> bool:
        """Whether this read answers a read of `log` at `offset` (the offset it was made at)
        of at most `max_bytes` (or one batch) below `end_offset`."""
        return (self.log is log and self.batches > 0 and self.truncations == log.truncations
                and self.next_offset <= end_offset
                and (len(self.data) <= max_bytes or self.batches == 1)
                and offset >= log.log_start_offset)


class ReadCache:
    """Recent reads by (partition, offset), at most `max_bytes` of them, least recently used
    dropped first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._reads: OrderedDict[tuple[PartitionId, int], SharedRead] = OrderedDict()

    def __len__(self) -> int:
        return len(self._reads)

    def get(self, pid: PartitionId, offset: int, log: PartitionLog, max_bytes: int,
            end_offset: int) -> SharedRead | None:
        """The kept read that answers this one, if any (then used most recently)."""
        key = (pid, offset)
        found = self._reads.get(key)
        if found is None or not found.serves(log, offset, max_bytes, end_offset):
            return None
        self._reads.move_to_end(key)
        return found

    def put(self, pid: PartitionId, offset: int, read: SharedRead) -> None:
        """Keep `read` (made at `offset`), in place of one kept there before."""
        key = (pid, offset)
        old = self._reads.pop(key, None)
        if old is not None:
            self.bytes -= len(old.data)
        if read.batches == 0 or len(read.data) > self.max_bytes:
            return
        self._reads[key] = read
        self.bytes += len(read.data)
        while self.bytes > self.max_bytes:
            _, dropped = self._reads.popitem(last=False)
            self.bytes -= len(dropped.data)

    def forget(self, pid: PartitionId) -> None:
        """Drop every read of partition `pid` (it closed)."""
        for key in [k for k in self._reads if k[0] == pid]:
            self.bytes -= len(self._reads.pop(key).data)
