"""Opening a partition directory: find the segments, decide which to trust, validate the rest.

Like Kafka, a clean close leaves a marker and an unclean one does not; the recovery-point
checkpoint names the first offset whose segment was not yet forced to disk. On open:

- the segment holding the recovery point and every later one are validated batch by batch
  (bounds, CRC-32C, continuing offsets); only the last segment's torn tail is cut, and only
  after an unclean shutdown: bad bytes at the end of the file with no valid batch after them,
  a write the crash tore (as Kafka truncates from the first invalid batch past the recovery
  point);
- bad bytes anywhere else (after a clean close nothing is cut at all) are a damaged range:
  every valid batch before and after them is kept, the range is remembered beside the segment
  and reads of it fail with CorruptDataError (`_damage`; `tq log check` / `repair`);
- earlier segments (or all of them after a clean close) are trusted up to their last index
  entry and their recorded damaged ranges; only the bytes after it are validated;
- a segment with a missing or implausible index, or whose files changed after the checkpoint
  (or marker) was written, is validated whole and its indexes rebuilt: a sealed segment is never
  written again, so an mtime at or past the reference file's means someone else wrote it. File
  clocks are coarse (a write right after the marker may get the marker's very mtime), so when
  the log writes a reference file it sets its own files' mtimes strictly before it ("settles"
  them), and any later write then compares at or after it;
- offsets missing between a segment's last batch and the next segment's base offset (or the
  log end offset a clean close recorded in its marker) are a damaged range with no bytes: the
  log keeps its offsets and never hands them out again. Batches whose offsets run past the
  next segment's base offset are damage too (valid batches never overlap).

Everything removed or truncated is logged on the `querylib.log` logger. This module owns the
checkpoint and marker files; it never serves reads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from catalog.errors import StorageError
from querylib._state_file import fsync_dir, replace_file
from querylib.log._config import (
    BOOT_ID_FILE,
    CHECKPOINT_FILE,
    CLEAN_SHUTDOWN_FILE,
    LOG_SUFFIX,
    LogConfig,
    parse_partition_dir,
    parse_segment_name,
)
from querylib.log._segment import LogSegment

logger = logging.getLogger("querylib.log")

_CHECKPOINT_MAX_BYTES = 4096  # the file holds one line; anything larger is not ours


def read_checkpoint(directory: str, file: str = CHECKPOINT_FILE) -> int | None:
    """The recovery point (or the offset another checkpoint `file` holds, such as the log
    start offset DeleteRecords advanced), or None when the file is missing or unreadable
    (then every segment is validated)."""
    path = os.path.join(directory, file)
    try:
        with open(path, "rb") as f:
            text = f.read(_CHECKPOINT_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    # Kafka's checkpoint format: version, entry count, then "topic partition offset" lines.
    lines = text.decode("utf-8", "replace").split("\n")
    try:
        if len(text) > _CHECKPOINT_MAX_BYTES or lines[0] != "0" or lines[1] != "1":
            raise ValueError("not a version 0 checkpoint with one entry")
        offset = int(lines[2].rsplit(" ", 1)[1])
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
    except (ValueError, IndexError) as exc:
        logger.warning("%s: unreadable (%s); ignoring it", path, exc)
        return None
    return offset


def write_checkpoint(directory: str, offset: int, settled: Iterable[str] = (),
                     file: str = CHECKPOINT_FILE) -> None:
    """Replace the recovery point (or checkpoint `file`) atomically (`replace_file`: a
    temporary file of its own, fsync, rename, fsync the directory), then settle the `settled`
    files below its mtime."""
    name = os.path.basename(os.path.normpath(directory))
    try:
        topic, partition = parse_partition_dir(name)
    except StorageError:  # a directory not named <topic>-<partition> (tests, tools)
        topic, partition = name.replace(" ", "_") or "-", 0
    path = os.path.join(directory, file)
    replace_file(path, f"0\n1\n{topic} {partition} {offset}\n".encode(), mode=0o644)
    settle(settled, path)


def write_clean_marker(directory: str, log_end_offset: int, settled: Iterable[str]) -> None:
    """Leave the clean-shutdown marker, then settle the `settled` files below its mtime."""
    path = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
    with open(path, "wb") as f:
        f.write(f"{log_end_offset}\n".encode())  # for people reading the directory
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)
    settle(settled, path)


def writes_kept(directory: str, clean: bool) -> bool:
    """Whether every write made before the last close is still in the log: a clean close, a
    new log, or an unclean close with the same kernel still running (only the process died;
    the page cache keeps what it wrote, fsynced or not). After a reboot, or where the boot id
    cannot be read, writes not fsynced may be lost. Then records this boot's id (not fsynced:
    a power loss that takes it changes the boot id anyway)."""
    path = os.path.join(directory, BOOT_ID_FILE)
    boot = current_boot_id()
    try:
        with open(path, "rb") as f:
            recorded = f.read(64).decode("ascii", "replace").strip()
    except FileNotFoundError:
        recorded = None
    if boot is not None and recorded != boot:
        with open(path, "wb") as f:
            f.write(f"{boot}\n".encode())
    if clean:
        return True
    return boot is not None and recorded == boot


_BOOT_ID: list[str | None] = []


def current_boot_id() -> str | None:
    """This kernel's boot id (changes with every boot), None where the system has none."""
    if not _BOOT_ID:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                _BOOT_ID.append(f.read(64).decode("ascii").strip() or None)
        except (OSError, UnicodeDecodeError):
            _BOOT_ID.append(None)
    return _BOOT_ID[0]


def settle(paths: Iterable[str], reference: str) -> None:
    """Set each file's mtime strictly before the reference file's, where it is not already, so
    that any later write to it shows as a change (see the module docstring)."""
    limit = os.stat(reference).st_mtime_ns
    for path in paths:
        st = os.stat(path)
        if st.st_mtime_ns >= limit:
            os.utime(path, ns=(st.st_atime_ns, limit - 1))


def read_clean_marker(directory: str) -> int | None:
    """The log end offset a clean close recorded in its marker, or None (no marker, or one
    that does not say)."""
    try:
        with open(os.path.join(directory, CLEAN_SHUTDOWN_FILE), "rb") as f:
            text = f.read(64)
    except FileNotFoundError:
        return None
    try:
        end = int(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return end if end >= 0 else None


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


def _scan(directory: str) -> list[int]:
    """Base offsets of the .log files, after removing leftovers: temporary files, and indexes
    whose log is gone (a crash in the middle of deleting a segment)."""
    names = os.listdir(directory)
    parsed = [p for p in map(parse_segment_name, names) if p is not None]
    bases = sorted({base for base, suffix in parsed if suffix == LOG_SUFFIX})
    logs = set(bases)
    for name in names:
        stray = name.endswith((".tmp", ".deleted"))
        p = parse_segment_name(name)
        if p is not None and p[0] not in logs:
            stray = True
        if stray:
            logger.info("%s: removing leftover file %s", directory, name)
            os.unlink(os.path.join(directory, name))
    return bases


def load_segments(directory: str, config: LogConfig) -> list[LogSegment]:
    """Open every segment of `directory`, validated as the module docstring says, creating the
    first segment of a new log. Leaves no clean-shutdown marker behind: from now on a crash is
    an unclean shutdown."""
    bases = _scan(directory)
    marker = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
    clean = os.path.exists(marker)
    clean_end = read_clean_marker(directory) if clean else None
    recovery_point = read_checkpoint(directory)
    reference = _mtime_ns(marker) if clean else (
        _mtime_ns(os.path.join(directory, CHECKPOINT_FILE)) if recovery_point is not None else None)
    if not clean and bases:
        logger.info("%s: no clean shutdown marker; validating from offset %s", directory,
                    recovery_point if recovery_point is not None else 0)
    segments: list[LogSegment] = []
    touched: list[LogSegment] = []  # segments whose files this open changed
    try:
        for i, base in enumerate(bases):
            segment, indexes_ok = LogSegment.open(directory, base, config.index_interval_bytes)
            segments.append(segment)
            is_last = i == len(bases) - 1
            unflushed = not clean and (
                recovery_point is None or is_last or bases[i + 1] > recovery_point)
            changed = reference is None or any(
                (m := _mtime_ns(p)) is None or m >= reference for p in segment.file_paths())
            if not indexes_ok or changed:
                logger.info("%s: indexes missing or files changed since the last checkpoint; "
                            "validating the whole segment", segment.path)
            full = unflushed or changed or not indexes_ok
            end_offset = clean_end if is_last else bases[i + 1]
            if segment.recover(resume=not full, end_offset=end_offset,
                               torn_tail=is_last and unflushed) or changed or not indexes_ok:
                touched.append(segment)  # the checkpoint's mtime must move past its files
        if not segments:
            segments.append(LogSegment.create(directory, 0, config.index_interval_bytes))
            touched.append(segments[0])
        # Whatever this open validated may still sit in the page cache only: force it to disk
        # so the new checkpoint (and the log's flushed end offset) can vouch for it.
        for segment in {id(s): s for s in [*touched, segments[-1]]}.values():
            segment.sync_all()
        active_base = segments[-1].base_offset
        if touched or recovery_point != active_base:
            # Rewritten even when unchanged: its mtime is the reference for "changed since".
            write_checkpoint(directory, active_base, settled=[
                p for segment in segments[:-1] for p in segment.file_paths()])
        if clean:
            os.unlink(marker)
            fsync_dir(directory)
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments
