"""Checking and repairing partition logs offline: what `tq log check` and `tq log repair` do.

`check_partition` validates every segment of a partition directory whole, as recovery would
after the same shutdown (clean marker, recovery point), and reports each damaged range: the
segment, byte range, offsets and what is wrong, and whether it is a torn tail (which the next
open cuts), damage (which reads fail on) or already repaired. It writes nothing.

`repair_partition` quarantines what check finds: the damaged bytes go to
`<segment>.corrupt-<position>` beside the segment, the segment is rewritten without them (so
Kafka's tools and every read of the rest work), and the offsets they held stay a gap that the
segment's `.damage` file marks repaired: Kafka clients step over it, tq readers get
QuarantinedDataError naming it (`PartitionLog.read`). The indexes are removed; the next open
rebuilds them.

Both take the log's lock (a running broker holds it: LogLockedError) and refuse to work on a
log in use. Blocking file I/O; no broker, no sockets.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, replace
from typing import BinaryIO, Literal

from catalog.errors import StorageError, UserError
from querylib.errors import LogLockedError
from querylib.log._batch import pread_exact
from querylib.log._config import (
    CLEAN_SHUTDOWN_FILE,
    DAMAGE_SUFFIX,
    INDEX_SUFFIX,
    LOCK_FILE,
    LOG_SUFFIX,
    QUARANTINE_INFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_name,
    segment_name,
)
from querylib.log._damage import Damage, SegmentWalk, load_damage, save_damage
from querylib.log._recovery import fsync_dir, read_clean_marker

__all__ = ["Finding", "check_partition", "find_partition_dirs", "repair_partition"]

_COPY = 8 * 1024 * 1024

Kind = Literal["damaged", "torn tail", "repaired"]


@dataclass(frozen=True)
class Finding:
    """One damaged range of a segment, as `tq log check` reports it."""

    partition: str  # the partition directory
    segment: str  # the segment file
    damage: Damage
    kind: Kind

    def describe(self) -> str:
        what = {"damaged": "DAMAGED", "torn tail": "TORN TAIL (cut at the next open)",
                "repaired": "repaired"}[self.kind]
        return f"{self.segment}: {what}: {self.damage.describe()}"

    def as_json(self) -> dict[str, object]:
        d = self.damage
        return {"partition": self.partition, "segment": self.segment, "kind": self.kind,
                "position": d.position, "end_position": d.end_position,
                "start_offset": d.start_offset, "end_offset": d.end_offset,
                "reason": d.reason, "quarantine": d.quarantine}


def find_partition_dirs(root: str) -> list[str]:
    """Every directory under `root` (itself included) holding segment files, sorted; hidden
    directories (partitions on their way out) are left out."""
    if not os.path.isdir(root):
        raise UserError(f"{root}: no such directory")
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        if any((p := parse_segment_name(f)) is not None and p[1] == LOG_SUFFIX for f in files):
            found.append(directory)
    return sorted(found)


def _segments(path: str) -> list[int]:
    return sorted(p[0] for name in os.listdir(path)
                  if (p := parse_segment_name(name)) is not None and p[1] == LOG_SUFFIX)


def _lock(path: str, exclusive: bool) -> int | None:
    """Take the log's lock as a broker would (LogLockedError when one holds it); None when
    the directory has no lock file (no PartitionLog ever opened it, nothing holds it)."""
    lock = os.path.join(path, LOCK_FILE)
    try:
        fd = os.open(lock, (os.O_RDWR | os.O_CREAT) if exclusive else os.O_RDONLY, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogLockedError(f"{path}: the log is open in a running broker (its {LOCK_FILE} is "
                             "locked): stop the broker (tq up, tq executor, tq broker) first"
                             ) from None
    return fd


def _findings(path: str) -> list[tuple[int, list[Finding]]]:
    """(segment base offset, its findings) for every segment, the caller holding the lock."""
    bases = _segments(path)
    clean = os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE))
    clean_end = read_clean_marker(path) if clean else None
    out = []
    for i, base in enumerate(bases):
        log_path = os.path.join(path, segment_name(base, LOG_SUFFIX))
        is_last = i == len(bases) - 1
        recorded = load_damage(os.path.join(path, segment_name(base, DAMAGE_SUFFIX))) or ()
        fd = os.open(log_path, os.O_RDONLY)
        try:
            walk = SegmentWalk(fd, base, 0, os.fstat(fd).st_size, base,
                               end_offset=clean_end if is_last else bases[i + 1],
                               trusted=[d for d in recorded if d.repaired])
            found = [Finding(path, log_path, d, "repaired" if d.repaired else "damaged")
                     for d in walk if isinstance(d, Damage)]
        finally:
            os.close(fd)
        if walk.tail is not None:
            torn = is_last and not clean
            found.append(Finding(path, log_path, walk.tail, "torn tail" if torn else "damaged"))
        out.append((base, found))
    return out


def check_partition(path: str) -> list[Finding]:
    """Every damaged range of the partition log in directory `path` (repaired ones included),
    found by validating each segment whole. Writes nothing; LogLockedError while a broker
    holds the log open."""
    try:
        fd = _lock(path, exclusive=False)
        try:
            return [f for _, found in _findings(path) for f in found]
        finally:
            if fd is not None:
                os.close(fd)
    except OSError as exc:
        raise StorageError(f"{path}: cannot check the log: {exc}") from exc


def repair_partition(path: str) -> list[Finding]:
    """Quarantine every damaged range that is not repaired yet (the module docstring says
    how); returns those ranges (positions as they were, with the quarantine file). Raises
    LogLockedError while a broker holds the log open."""
    try:
        fd = _lock(path, exclusive=True)
        try:
            repaired: list[Finding] = []
            for base, found in _findings(path):
                if any(f.kind != "repaired" for f in found):
                    moved = _repair_segment(path, base, [f.damage for f in found])
                    repaired += [Finding(f.partition, f.segment, moved[f.damage], "repaired")
                                 for f in found if f.kind != "repaired"]
            if repaired:
                fsync_dir(path)
            return repaired
        finally:
            if fd is not None:
                os.close(fd)
    except OSError as exc:
        raise StorageError(f"{path}: cannot repair the log: {exc}") from exc


def _repair_segment(path: str, base: int, damage: list[Damage]) -> dict[Damage, Damage]:
    """Move the damaged bytes of one segment aside and rewrite it without them; each range
    mapped to itself marked repaired (with its quarantine file)."""
    moved: dict[Damage, Damage] = {}
    log_path = os.path.join(path, segment_name(base, LOG_SUFFIX))
    tmp = log_path + ".tmp"  # a crash leaves it behind; the next open removes it
    kept: list[Damage] = []
    removed = 0  # damaged bytes before the current position, moved out
    src = os.open(log_path, os.O_RDONLY)
    try:
        with open(tmp, "wb") as out:
            position = 0
            for d in sorted(damage, key=lambda d: (d.position, d.start_offset)):
                _copy(src, out, position, d.position)
                quarantine = d.quarantine
                if d.size:
                    quarantine = _unused(path, f"{os.path.basename(log_path)}"
                                               f"{QUARANTINE_INFIX}{d.position}")
                    with open(os.path.join(path, quarantine), "wb") as q:
                        _copy(src, q, d.position, d.end_position)
                        q.flush()
                        os.fsync(q.fileno())
                moved[d] = replace(d, repaired=True, quarantine=quarantine)
                position = d.end_position
                at = d.position - removed
                removed += d.size
                if d.end_offset > d.start_offset:  # the offsets stay a gap, marked repaired
                    kept.append(Damage(at, at, d.start_offset, d.end_offset, d.reason,
                                       repaired=True, quarantine=quarantine))
            _copy(src, out, position, os.fstat(src).st_size)
            out.flush()
            os.fsync(out.fileno())
    finally:
        os.close(src)
    # Indexes first: their positions are stale once the new file is in place, and a missing
    # index makes the next open validate (and rebuild) the segment whole.
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        try:
            os.unlink(os.path.join(path, segment_name(base, suffix)))
        except FileNotFoundError:
            pass
    os.replace(tmp, log_path)
    save_damage(os.path.join(path, segment_name(base, DAMAGE_SUFFIX)), kept)
    return moved


def _unused(path: str, name: str) -> str:
    """`name`, or `name-N` when an earlier repair used it."""
    candidate, n = name, 1
    while os.path.exists(os.path.join(path, candidate)):
        candidate, n = f"{name}-{n}", n + 1
    return candidate


def _copy(src: int, out: BinaryIO, start: int, end: int) -> None:
    while start < end:
        data = pread_exact(src, min(_COPY, end - start), start)
        if not data:
            raise OSError(f"file ended at {start}, before {end}")
        out.write(data)
        start += len(data)
