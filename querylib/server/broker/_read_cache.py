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
- And only where it is about as much as a read of the disk would give: at least half the
  later read's size, or everything up to its end offset. Readers at one offset with little
  credit and with much would otherwise cut each other's reads into one-batch deliveries
  (64 subscribers: three times the deliveries). Up to `PER_OFFSET` reads of different
  lengths are kept at one offset; the longest that serves is used.
- Memory is bounded: at most `max_bytes` kept over all partitions, the offset least
  recently used dropped first, whoever reads or stops reading; a read bigger than that is
  not kept. No subscription holds an entry: a slow one finds it gone and reads again.

Must not: read the disk, hash, or decide what a subscription is sent (the core does).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from querylib.log import PartitionLog
from querylib.records import read_header
from querylib.rpc import payload_digest

from ._events import PartitionId

__all__ = ["PER_OFFSET", "ReadCache", "SharedRead", "read_shared"]

_LENGTH = struct.Struct(">qi")  # a batch's baseOffset, batchLength

PER_OFFSET = 3  # reads of different lengths kept at one offset


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
        size = len(self.data)
        if size > max_bytes:
            fits = self.batches == 1  # as a read: at least one batch, whatever its size
        else:
            fits = 2 * size >= max_bytes or self.next_offset == end_offset
        return (fits and self.log is log and self.batches > 0
                and self.truncations == log.truncations and self.next_offset <= end_offset
                and offset >= log.log_start_offset)


class ReadCache:
    """Recent reads by (partition, offset), at most `max_bytes` of them, the offset least
    recently used dropped first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        # (partition, offset) -> its kept reads, shortest first
        self._reads: OrderedDict[tuple[PartitionId, int], list[SharedRead]] = OrderedDict()

    def __len__(self) -> int:
        """How many reads are kept."""
        return sum(map(len, self._reads.values()))

    def get(self, pid: PartitionId, offset: int, log: PartitionLog, max_bytes: int,
            end_offset: int) -> SharedRead | None:
        """The longest kept read that answers this one, if any (its offset then used most
        recently)."""
        key = (pid, offset)
        for read in reversed(self._reads.get(key, ())):
            if read.serves(log, offset, max_bytes, end_offset):
                self._reads.move_to_end(key)
                return read
        return None

    def put(self, pid: PartitionId, offset: int, read: SharedRead) -> None:
        """Keep `read` (made at `offset`) beside the longest others kept there, in place of
        one of the same length."""
        if read.batches == 0 or len(read.data) > self.max_bytes:
            return
        key = (pid, offset)
        reads = self._reads.pop(key, [])
        kept = [r for r in reads if len(r.data) != len(read.data)]
        kept = sorted([*kept, read], key=lambda r: len(r.data))[-PER_OFFSET:]
        self.bytes += sum(len(r.data) for r in kept) - sum(len(r.data) for r in reads)
        self._reads[key] = kept
        while self.bytes > self.max_bytes:
            _, dropped = self._reads.popitem(last=False)
            self.bytes -= sum(len(r.data) for r in dropped)

    def forget(self, pid: PartitionId) -> None:
        """Drop every read of partition `pid` (it closed)."""
        for key in [k for k in self._reads if k[0] == pid]:
            self.bytes -= sum(len(r.data) for r in self._reads.pop(key))


def read_shared(log: PartitionLog, offset: int, max_bytes: int, end_offset: int) -> SharedRead:
    """A catch-up read on a read thread: whole batches from `offset`, with the offset after
    the last of them, how many there are and the digest their push is signed with
    (`payload_digest`: hashed here, not on the loop)."""
    truncations = log.truncations  # sampled before reading (see ReadCache)
    data = log.read(offset, max_bytes, end_offset=end_offset)
    pos, last, batches = 0, -1, 0
    while pos < len(data):
        last = pos
        batches += 1
        pos += 12 + _LENGTH.unpack_from(data, pos)[1]
    next_offset = offset if last < 0 else read_header(data, last).next_offset
    return SharedRead(log, truncations, data, next_offset, batches, payload_digest(data))
