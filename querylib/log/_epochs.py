"""Which leader epoch wrote which offsets of a replicated partition, and where a follower's log
parts from its leader's (DESIGN §5 "Replication"; Kafka's LeaderEpochFileCache, KIP-101 and
KIP-279).

A replicated partition's leader stamps each batch with its leader epoch; every replica keeps,
beside its log, the first offset each epoch wrote (`leader-epoch-checkpoint`, Kafka's format:
a version line `0`, a count line, then `epoch start-offset` lines). A follower that (re)joins
asks its leader where the latest epoch it knows ended there (OffsetForLeaderEpoch) and cuts its
own log at `truncation_point`: what it has beyond that was written by a leader whose records no
quorum kept, never acknowledged, and must go before it fetches again.

    cache = LeaderEpochCache.load(directory)     # empty when the file is absent
    cache.assign(epoch, start_offset)            # a new epoch's first batch; persisted
    cache.end_offset_for(epoch, log_end)         # (epoch, end offset): OffsetForLeaderEpoch
    cache.truncate_from_end(offset); cache.truncate_from_start(offset)
    truncation_point(leader_epoch, leader_end, cache, log_end, high_watermark)

Must not: read the log; it keeps offsets only. The file is replaced atomically (temporary file,
fsync, rename, fsync the directory); one that does not parse raises StorageError naming it:
guessing epochs could keep a divergent tail.
"""

from __future__ import annotations

import bisect
import os
from typing import NamedTuple

from querylib.errors import StorageError
from querylib.log._recovery import fsync_dir

__all__ = ["LEADER_EPOCH_FILE", "UNDEFINED", "EpochEntry", "LeaderEpochCache",
           "truncation_point"]

LEADER_EPOCH_FILE = "leader-epoch-checkpoint"
UNDEFINED = -1  # Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET
_VERSION = 0


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The epochs of one replica's log, in increasing epoch and start offset. `directory`
    None keeps it in memory only (tests of the rules)."""

    def __init__(self, directory: str | None = None,
                 entries: tuple[EpochEntry, ...] = ()) -> None:
        self._directory = directory
        self._entries = list(entries)

    @classmethod
    def load(cls, directory: str) -> LeaderEpochCache:
        path = os.path.join(directory, LEADER_EPOCH_FILE)
        try:
            with open(path, "rb") as f:
                text = f.read(1 << 20).decode("ascii")
        except FileNotFoundError:
            return cls(directory)
        except (OSError, UnicodeDecodeError) as exc:
            raise StorageError(f"{path}: unreadable leader epochs: {exc}") from exc
        return cls(directory, tuple(_parse(path, text)))

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> None:
        """Epoch `epoch` wrote its first batch at `start_offset`. Entries it contradicts (a
        later or equal epoch, or one starting at or after it: a tail cut since) are dropped, as
        Kafka's cache does; the same epoch again at a later offset changes nothing."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"leader epoch {epoch} at offset {start_offset}")
        if self._entries and self._entries[-1].epoch == epoch \
                and self._entries[-1].start_offset <= start_offset:
            return
        while self._entries and (self._entries[-1].epoch >= epoch
                                 or self._entries[-1].start_offset >= start_offset):
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self._save()

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch on this replica: the largest epoch at most `epoch` it
        knows and the offset where that epoch's records end here (`log_end` for the latest);
        (UNDEFINED, UNDEFINED) for an undefined epoch or one past the latest."""
        if epoch == UNDEFINED or not self._entries or epoch > self.latest_epoch:
            return UNDEFINED, UNDEFINED
        if epoch == self.latest_epoch:
            return epoch, log_end
        epochs = [e.epoch for e in self._entries]
        higher = bisect.bisect_right(epochs, epoch)  # the first entry of a later epoch
        end = self._entries[higher].start_offset
        if higher == 0:  # older than every epoch known: ends where the first one starts
            return epoch, end
        return self._entries[higher - 1].epoch, end

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut to end at `end_offset`: epochs starting there or later go."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            self._save()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset` (retention, DeleteRecords): epochs wholly
        before it go, the one in force there starts there."""
        before = [e for e in self._entries if e.start_offset <= start_offset]
        if not before or (len(before) == 1 and before[0].start_offset == start_offset):
            return
        self._entries = [EpochEntry(before[-1].epoch, start_offset)] + self._entries[len(before):]
        self._save()

    def _save(self) -> None:
        if self._directory is None:
            return
        path = os.path.join(self._directory, LEADER_EPOCH_FILE)
        lines = [str(_VERSION), str(len(self._entries))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self._entries]
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(("\n".join(lines) + "\n").encode("ascii"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(self._directory)
        except OSError as exc:
            raise StorageError(f"{path}: cannot write leader epochs: {exc}") from exc


def _parse(path: str, text: str) -> list[EpochEntry]:
    lines = text.splitlines()
    try:
        version, count = int(lines[0]), int(lines[1])
        if version != _VERSION or count != len(lines) - 2:
            raise ValueError(f"version {version}, {count} entries for {len(lines) - 2} lines")
        entries = []
        for line in lines[2:]:
            epoch, start = (int(field) for field in line.split(" "))
            entries.append(EpochEntry(epoch, start))
    except (ValueError, IndexError) as exc:
        raise StorageError(f"{path}: not a leader epoch checkpoint: {exc}") from None
    for earlier, later in zip(entries, entries[1:], strict=False):
        if later.epoch <= earlier.epoch or later.start_offset < earlier.start_offset \
                or earlier.epoch < 0 or earlier.start_offset < 0:
            raise StorageError(f"{path}: leader epochs out of order: {earlier} then {later}")
    return entries


def truncation_point(leader_epoch: int, leader_end: int, cache: LeaderEpochCache,
                     log_end: int, high_watermark: int) -> tuple[int, bool]:
    """Where a follower cuts its log given its leader's answer to OffsetForLeaderEpoch for the
    follower's latest epoch (`leader_epoch`, `leader_end`), as KIP-279: (offset, done). Not
    done: the follower does not know the epoch the leader named, so it cuts to the end of its
    own largest epoch before it and asks again for that one. A leader that knows no such
    epoch, or a follower that knows none, falls back to the high watermark (KIP-101)."""
    if leader_epoch == UNDEFINED or leader_end == UNDEFINED:
        return min(high_watermark, log_end), True
    epoch, end = cache.end_offset_for(leader_epoch, log_end)
    if epoch == UNDEFINED:
        return min(high_watermark, log_end), True
    if epoch != leader_epoch:
        return min(end, log_end), False
    return min(end, leader_end, log_end), True
