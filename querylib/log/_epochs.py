"""A partition's leader epochs (Kafka's LeaderEpochFileCache): leader epoch -> the first offset
written at that epoch, and its file, `leader-epoch-checkpoint`, in Kafka's format.

The log keeps the cache as it appends, replicates, truncates and deletes (DESIGN §5
"Replication"), and writes the file BEFORE the first batch of a new epoch: the file then names
every epoch the log holds, and perhaps one more whose batch a crash kept from the log, which
the next open forgets (`truncate_from_end` at the log end). So OffsetForLeaderEpoch and a
follower's truncation point never scan the log; `scan_epochs` rebuilds a missing or damaged
file from the batch headers, once.

Readers on other threads may use a cache while the writer changes it: every change replaces
the entry list whole.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from querylib._state_file import replace_file
from querylib.log._config import EPOCH_CHECKPOINT_FILE

_VERSION = 0
_MAX_BYTES = 1 << 20  # a checkpoint holds one short line per leader change
_PREFIX = struct.Struct(">qii")  # a stored batch's baseOffset, batchLength, leader epoch
_LAST_DELTA = struct.Struct(">i")  # lastOffsetDelta, 23 bytes into a batch
_LAST_DELTA_END = 27


class LeaderEpochCache:
    """Leader epoch -> the first offset written at that epoch, both growing. Answers
    OffsetForLeaderEpoch and follows its log's truncations."""

    UNDEFINED = (-1, -1)  # OffsetForLeaderEpoch's answer for an epoch older than any known

    def __init__(self, entries: tuple[tuple[int, int], ...] = ()) -> None:
        self._entries: list[tuple[int, int]] = []
        for epoch, start in entries:
            self.assign(epoch, start)

    @property
    def entries(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        entries = self._entries
        return entries[-1][0] if entries else -1

    def copy(self) -> LeaderEpochCache:
        cache = LeaderEpochCache()
        cache._entries = self._entries
        return cache

    def needs(self, epoch: int) -> bool:
        """Whether a batch of `epoch` appended now starts a new entry."""
        return epoch > self.latest_epoch

    def assign(self, epoch: int, start_offset: int) -> None:
        """The first batch of `epoch` lands at `start_offset` (a known epoch keeps its start)."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} at offset {start_offset}: both must be >= 0")
        if self._entries:
            last_epoch, last_start = self._entries[-1]
            if epoch == last_epoch:
                return
            if epoch < last_epoch or start_offset < last_start:
                raise ValueError(
                    f"epoch {epoch} at {start_offset} after epoch {last_epoch} at {last_start}:"
                    " epochs and their offsets only grow")
        self._entries = [*self._entries, (epoch, start_offset)]

    def end_offset_for(self, epoch: int, *, log_end: int) -> tuple[int, int]:
        """(the largest known epoch <= `epoch`, the offset where it ended): the next epoch's
        start, or `log_end` for the latest. UNDEFINED below the first known epoch."""
        entries = self._entries
        found = -1
        for i, (known, _start) in enumerate(entries):
            if known <= epoch:
                found = i
        if found < 0:
            return LeaderEpochCache.UNDEFINED
        if found + 1 < len(entries):
            return entries[found][0], entries[found + 1][1]
        return entries[found][0], log_end

    def start_of(self, epoch: int) -> int | None:
        """Where `epoch` starts in the log (None: no batch of it)."""
        return next((start for known, start in self._entries if known == epoch), None)

    def truncate_from_end(self, end_offset: int) -> bool:
        """The log ends at `end_offset`: forget epochs that start at or after it. Whether
        anything was forgotten."""
        kept = [(e, s) for e, s in self._entries if s < end_offset]
        changed = len(kept) != len(self._entries)
        self._entries = kept
        return changed

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log starts at `start_offset`: epochs wholly below it go, and the one holding it
        starts there (Kafka's truncateFromStart). Whether anything changed."""
        entries = self._entries
        holding = None
        for i, (_epoch, start) in enumerate(entries):
            if start <= start_offset:
                holding = i
        if holding is None:
            return False
        kept = [(entries[holding][0], start_offset), *entries[holding + 1:]]
        changed = kept != entries
        self._entries = kept
        return changed

    def dumps(self) -> str:
        lines = [str(_VERSION), str(len(self._entries))]
        lines += [f"{epoch} {start}" for epoch, start in self._entries]
        return "\n".join(lines) + "\n"

    @classmethod
    def loads(cls, text: str) -> LeaderEpochCache:
        """A checkpoint as `dumps` writes it; an empty file is an empty cache. Damage (another
        version, a wrong count, epochs or offsets that do not grow) raises ValueError."""
        if not text:
            return cls()
        lines = text.splitlines()
        if len(lines) < 2 or lines[0] != str(_VERSION):
            raise ValueError(f"not a version {_VERSION} leader epoch checkpoint")
        count = int(lines[1])
        if count != len(lines) - 2:
            raise ValueError(
                f"leader epoch checkpoint says {count} entries, holds {len(lines) - 2}")
        entries = []
        for line in lines[2:]:
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"leader epoch checkpoint line {line!r} is not 'epoch offset'")
            entries.append((int(parts[0]), int(parts[1])))
        return cls(tuple(entries))


def read_epoch_checkpoint(directory: str) -> LeaderEpochCache | None:
    """The cache `directory`'s checkpoint holds; None when there is none. ValueError when it
    is damaged (unreadable, too large, or not as `dumps` writes it)."""
    try:
        with open(os.path.join(directory, EPOCH_CHECKPOINT_FILE), "rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES} bytes")
    try:
        return LeaderEpochCache.loads(data.decode("ascii"))
    except UnicodeDecodeError as exc:
        raise ValueError("not ASCII text") from exc


def write_epoch_checkpoint(directory: str, cache: LeaderEpochCache) -> None:
    """Replace the checkpoint atomically (`replace_file`: a temporary file of its own, fsync,
    rename, fsync the directory)."""
    replace_file(os.path.join(directory, EPOCH_CHECKPOINT_FILE), cache.dumps().encode("ascii"),
                 mode=0o644)


def epochs_of(data: bytes | memoryview, cache: LeaderEpochCache) -> int | None:
    """Add the leader epochs of the stored batches in `data` (whole batches, as a log read
    returns them) to `cache`; returns the offset after the last batch (None: no batch)."""
    pos, end = 0, None
    while len(data) - pos >= _LAST_DELTA_END:
        base, length, epoch = _PREFIX.unpack_from(data, pos)
        if epoch >= 0 and epoch >= cache.latest_epoch:
            cache.assign(epoch, base)
        end = base + _LAST_DELTA.unpack_from(data, pos + 23)[0] + 1
        pos += length + 12
    return end


def scan_epochs(read: Callable[[int], bytes], start: int) -> LeaderEpochCache:
    """The leader epoch cache of a log, from its batch headers: `read(offset)` returns whole
    stored batches from `offset` (b"" at the end)."""
    cache = LeaderEpochCache()
    offset = start
    while data := read(offset):
        end = epochs_of(data, cache)
        if end is None or end <= offset:
            break
        offset = end
    return cache
