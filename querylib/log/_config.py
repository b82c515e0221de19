"""Configuration of a partition log, and the names of its directory and files.

Pure values and name parsing: nothing here touches the disk.

A partition lives in `<topic>-<partition>/`; its segments are named by their 20-digit base
offset, as Kafka names them, so Kafka's tools can read a tq data directory.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from catalog.errors import StorageError, UserError

__all__ = [
    "FlushPolicy",
    "LogConfig",
    "parse_partition_dir",
    "parse_segment_name",
    "partition_dir_name",
    "segment_name",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
# tq's own: the damaged ranges of a segment (querylib.log._damage), when it has any.
DAMAGE_SUFFIX = ".damage"
# `tq log repair` moves damaged bytes to `<segment>.log.corrupt-<position>` beside it.
QUARANTINE_INFIX = ".corrupt-"

# Files of our own in a partition directory. Kafka keeps its recovery points and clean-shutdown
# marker one level up (per log dir); tq keeps them per partition because each partition has
# exactly one writer and no shared log-dir manager. Kafka's loader ignores unknown files.
CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
# The boot id of the kernel that last opened the log (Linux's /proc/sys/kernel/random/boot_id):
# after an unclean close on the same boot, the process died but the page cache kept every write.
BOOT_ID_FILE = "boot-id"
# The log start offset DeleteRecords advanced past the first segment's base (Kafka keeps it in
# log-start-offset-checkpoint per log dir); absent until a DeleteRecords.
LOG_START_FILE = "log-start-offset-checkpoint"
# Leader epoch -> its first offset, as Kafka's file of that name in the partition directory.
EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
LOCK_FILE = ".lock"

# Kafka's offset index stores positions and relative offsets as int32.
INT32_MAX = 2**31 - 1

_SEGMENT_RE = re.compile(r"^(\d{20})(\.log|\.index|\.timeindex|\.damage)$")
_PARTITION_RE = re.compile(r"^(.+)-(\d{1,10})$")


class FlushPolicy(enum.StrEnum):
    """When appended bytes are forced to disk (fsync)."""

    NEVER = "never"  # the OS decides; segments are still fsynced when rolled and on close
    INTERVAL = "interval"  # at most flush_interval_ms after an append
    ALWAYS = "always"  # before append returns (`sync=False`: by the next synced one)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How one partition log rolls, retains and flushes. Values as in Kafka's topic configs
    (segment.bytes, index.interval.bytes, retention.bytes, retention.ms, flush.ms)."""

    segment_bytes: int = 1024 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_bytes: int = -1  # -1: no size limit
    retention_ms: int = -1  # -1: no age limit
    flush: FlushPolicy | str = FlushPolicy.NEVER
    flush_interval_ms: int = 1000

    def __post_init__(self) -> None:
        try:
            policy = FlushPolicy(self.flush)
        except ValueError:
            choices = ", ".join(p.value for p in FlushPolicy)
            raise UserError(f"flush policy {self.flush!r} unknown; use one of {choices}") from None
        object.__setattr__(self, "flush", policy)
        # A segment position is an int32 in the index; 14 bytes is Kafka's minimum segment.
        if not 14 <= self.segment_bytes <= INT32_MAX:
            raise UserError(f"segment_bytes {self.segment_bytes} must be in 14..{INT32_MAX}")
        if not 0 <= self.index_interval_bytes <= INT32_MAX:
            raise UserError(f"index_interval_bytes {self.index_interval_bytes} must be >= 0")
        if self.retention_bytes < -1 or self.retention_ms < -1:
            raise UserError("retention_bytes and retention_ms must be >= 0, or -1 for no limit")
        if self.flush_interval_ms < 0:
            raise UserError(f"flush_interval_ms {self.flush_interval_ms} must be >= 0")


def segment_name(base_offset: int, suffix: str) -> str:
    """`00000000000000000042.log` for base offset 42 and suffix `.log`."""
    return f"{base_offset:020d}{suffix}"


def parse_segment_name(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a segment file name, or None when `name` is not one."""
    match = _SEGMENT_RE.match(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def partition_dir_name(topic: str, partition: int) -> str:
    """The directory name of a partition: `<topic>-<partition>`."""
    if not topic or "/" in topic or "\0" in topic or topic in (".", ".."):
        raise UserError(f"topic name {topic!r} cannot name a directory")
    if not 0 <= partition <= INT32_MAX:
        raise UserError(f"partition {partition} must be in 0..{INT32_MAX}")
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int]:
    """(topic, partition) of a directory named `<topic>-<partition>`.

    The topic may itself contain dashes; the partition is the part after the last one. Raises
    StorageError for a name that is not a partition directory (a stray entry of a data dir).
    """
    match = _PARTITION_RE.match(name)
    if match is None or int(match.group(2)) > INT32_MAX:
        raise StorageError(f"{name!r} is not a partition directory (<topic>-<partition>)")
    return match.group(1), int(match.group(2))
