"""Damaged ranges of a segment: walking its batches, finding where valid batches resume after
bytes that fail their checks, and remembering those ranges beside the segment.

A damaged range is bytes (or, for offsets that have no bytes at all, an empty span) and the
offsets they should hold: from the offset the last valid batch before them left off to the
base offset of the first valid batch after them. The log keeps every valid batch on both
sides and fails reads of the range (CorruptDataError); only a torn tail after an unclean
shutdown is cut, and recovery decides that, not this module.

Where valid batches resume after bad bytes at `pos` (the first of these that verifies):
1. the damaged batch's own length field, when it points at a plausible batch;
2. the offset index's entries after `pos` (written before the damage, positions of batches);
3. a scan for the next header whose leader epoch is 0 and magic 2 (the bytes `00 00 00 00 02`
   at header offset 12), whose CRC-32C verifies and whose offsets continue (base offset above
   the last good one, within the segment).

`<base offset>.damage` (JSON, written by rename) lists a segment's ranges, so that a reopen
trusts them without validating the whole segment again and `tq log check`, Spark's file
reader and `tq log repair` see them. A range `tq log repair` moved out of the segment is
`repaired` (its bytes in `quarantine`, a file beside the segment); its offsets stay a gap the
segment's batches jump over.

Blocking reads on a file descriptor; the only write is `save_damage`. Must not: truncate,
rebuild indexes or serve reads.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

from querylib._state_file import replace_file
from querylib.errors import RecordError
from querylib.log._batch import LEADER_EPOCH, describe, pread_exact
from querylib.log._config import DAMAGE_SUFFIX, INT32_MAX, LOG_SUFFIX
from querylib.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    BatchHeader,
    read_header,
    verify_batch,
)

logger = logging.getLogger("querylib.log")

_BLOCK = 8 * 1024 * 1024  # bytes validated (or scanned) per read
_MAX_FILE_BYTES = 1 << 20  # a damage file lists a few ranges; anything larger is not ours
# partitionLeaderEpoch 0 then magic 2: bytes 12..16 of every batch the log stores.
_RESUME_MARK = b"\x00\x00\x00\x00\x02"
_MARK_AT = 12


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes [position, end_position) of a segment file that should hold offsets
    [start_offset, end_offset) but fail their checks (`reason` says how)."""

    position: int
    end_position: int
    start_offset: int
    end_offset: int
    reason: str
    repaired: bool = False  # `tq log repair` moved the bytes out: the range is a gap
    quarantine: str = ""  # the file (beside the segment) holding the moved bytes

    def holds(self, offset: int) -> bool:
        return self.start_offset <= offset < self.end_offset

    @property
    def size(self) -> int:
        return self.end_position - self.position

    def describe(self) -> str:
        """One line: offsets, bytes and reason, for logs and `tq log check`."""
        offsets = (f"offsets {self.start_offset}..{self.end_offset - 1}"
                   if self.end_offset > self.start_offset else "no offsets")
        where = (f"bytes {self.position}..{self.end_position - 1}" if self.size
                 else f"no bytes (at position {self.position})")
        state = f"; repaired, bytes in {self.quarantine}" if self.quarantine else (
            "; repaired" if self.repaired else "")
        return f"{offsets}, {where}: {self.reason}{state}"


def load_damage(path: str) -> tuple[Damage, ...] | None:
    """The ranges a damage file lists (() when there is no file), or None when the file is
    unreadable (the caller then validates the segment whole)."""
    try:
        with open(path, "rb") as f:
            text = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        logger.warning("%s: unreadable (%s); validating its segment whole", path, exc)
        return None
    try:
        if len(text) > _MAX_FILE_BYTES:
            raise ValueError("too large")
        doc = json.loads(text)
        if doc.get("version") != 1:
            raise ValueError(f"version {doc.get('version')!r}")
        found = tuple(Damage(**entry) for entry in doc["damage"])
        for d in found:
            if not (0 <= d.position <= d.end_position and 0 <= d.start_offset <= d.end_offset
                    and isinstance(d.reason, str)):
                raise ValueError(f"implausible range {d}")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.warning("%s: unreadable (%s); validating its segment whole", path, exc)
        return None
    return tuple(sorted(found, key=lambda d: (d.position, d.start_offset)))


def segment_damage(log_path: str) -> tuple[Damage, ...]:
    """The damaged ranges recorded for the segment file `log_path` (`<base>.log`), for readers
    of the files that do not open the log (Spark's); () when none or unreadable."""
    return load_damage(log_path[:-len(LOG_SUFFIX)] + DAMAGE_SUFFIX) or ()


def save_damage(path: str, damage: Sequence[Damage]) -> None:
    """Replace the damage file (`replace_file`: a temporary file of its own, fsync, rename,
    fsync the directory), or remove it when `damage` is empty; the caller makes a removal
    durable."""
    if not damage:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    body = json.dumps({"version": 1, "damage": [asdict(d) for d in damage]}, indent=1)
    replace_file(path, body.encode(), mode=0o644)


def damage_at(damage: Iterable[Damage], offset: int) -> Damage | None:
    """The range holding `offset`, if any."""
    for d in damage:
        if d.holds(offset):
            return d
    return None


class SegmentWalk:
    """Validate a segment file's batches from `start`: iterate for `(position, header)` of each
    valid batch and a `Damage` for each damaged range after which valid batches resume. Once
    iterated: `end` (the end of the last batch or range yielded), `next_offset`, and `tail`:
    bad bytes up to the end of the file after which nothing valid follows (a torn write, or
    damage the caller records), else None.

    `expected` is the offset the first batch must start at (None: take its base offset, when
    resuming at an index entry). `end_offset`, when known (the next segment's base, the log
    end a clean close recorded), bounds the offsets and turns a shortfall into a gap. `trusted`
    ranges are taken as they are when the walk reaches their position (repaired gaps always;
    on a resumed open also the ranges recorded before). `hints` are batch positions to try
    before scanning (the offset index's).
    """

    def __init__(self, fd: int, base_offset: int, start: int, file_size: int,
                 expected: int | None, *, end_offset: int | None = None,
                 trusted: Iterable[Damage] = (), hints: Sequence[int] = ()) -> None:
        self.fd = fd
        self.base_offset = base_offset
        self.start = start
        self.file_size = file_size
        self.expected = expected
        self.end_offset = end_offset
        self.trusted = {d.position: d for d in trusted}
        self.hints = sorted(hints)
        self.end = start
        self.next_offset = expected if expected is not None else base_offset
        self.tail: Damage | None = None
        self._block = b""
        self._block_pos = start

    def __iter__(self) -> Iterator[tuple[int, BatchHeader] | Damage]:
        pos, expected = self.start, self.expected
        while True:
            known = self.trusted.get(pos)
            if known is not None and expected in (None, known.start_offset):
                del self.trusted[pos]  # an empty range stays at `pos`: take it once
                yield known
                pos, expected = known.end_position, known.end_offset
                continue
            if pos >= self.file_size:
                break
            header, reason = self._batch(pos, expected)
            if reason is None:
                assert header is not None
                yield pos, header
                expected = header.next_offset
                pos += header.size
                continue
            if header is not None and expected is not None and header.base_offset > expected \
                    and self._batch(pos, None)[1] is None \
                    and not self._base_field_damaged(pos, header, expected):
                # A valid batch after offsets that have no bytes (cut out, or never there).
                yield Damage(pos, pos, expected, header.base_offset,
                             f"offsets missing before the batch at {pos}")
                expected = header.base_offset
                continue
            first = self.base_offset if expected is None else expected
            found = self._resume(pos, first)
            if found is None:
                end = first if self.end_offset is None else max(first, self.end_offset)
                self.tail = Damage(pos, self.file_size, first, end, reason)
                self.end, self.next_offset = pos, first
                return
            position, base = found
            yield Damage(pos, position, first, base, reason)
            pos, expected = position, base
        expected = self.base_offset if expected is None else expected
        if self.end_offset is not None and expected < self.end_offset:
            yield Damage(pos, pos, expected, self.end_offset,
                         f"offsets missing: the segment ends at offset {expected}, the next "
                         f"data starts at {self.end_offset}")
            expected = self.end_offset
        self.end, self.next_offset = pos, expected

    # -- one batch ------------------------------------------------------------------------

    def _read(self, pos: int, need: int) -> tuple[bytes, int]:
        """(buffer, offset of `pos` in it) holding at least `need` bytes from `pos` when the
        file has them."""
        off = pos - self._block_pos
        if off < 0 or off + need > len(self._block):
            size = max(need, min(_BLOCK, self.file_size - pos))
            self._block, self._block_pos, off = pread_exact(self.fd, size, pos), pos, 0
        return self._block, off

    def _batch(self, pos: int, expected: int | None) -> tuple[BatchHeader | None, str | None]:
        """(header, None) for a valid batch at `pos`; (header or None, why not) otherwise."""
        buf, off = self._read(pos, HEADER_SIZE)
        try:
            header = read_header(buf, off)
        except RecordError as exc:
            return None, f"batch at {pos}: {describe(exc)}"
        if pos + header.size > self.file_size:
            return None, f"batch at {pos} of {header.size} bytes cut short by the end of file"
        buf, off = self._read(pos, header.size)
        try:
            verify_batch(buf, off)
        except RecordError as exc:
            return header, f"batch at {pos}: {describe(exc)}"
        if header.partition_leader_epoch < LEADER_EPOCH:
            return header, f"batch at {pos}: leader epoch {header.partition_leader_epoch}"
        if header.last_offset_delta < 0:
            return header, f"batch at {pos}: lastOffsetDelta {header.last_offset_delta}"
        if header.next_offset - 1 - self.base_offset > INT32_MAX:
            return header, f"batch at {pos}: offset beyond this segment's int32 range"
        if header.base_offset < self.base_offset:
            return header, (f"base offset {header.base_offset} of the batch at {pos} is below "
                            f"the segment's {self.base_offset}")
        if self.end_offset is not None and header.next_offset > self.end_offset:
            return header, (f"base offset {header.base_offset} of the batch at {pos}: its "
                            f"offsets pass {self.end_offset}, where the next data starts")
        if expected is not None and header.base_offset != expected:
            return header, (f"base offset {header.base_offset} of the batch at {pos}, "
                            f"expected {expected}")
        return header, None

    def _base_field_damaged(self, pos: int, header: BatchHeader, expected: int) -> bool:
        """A CRC-valid batch whose base offset jumps ahead: a gap, unless the batch after it
        continues from `expected` as if this one were at `expected` (then only the
        unprotected base offset field of this one is wrong)."""
        after = pos + header.size
        if after + HEADER_SIZE > self.file_size:
            return False
        return self._batch(after, expected + header.last_offset_delta + 1)[1] is None

    # -- resuming after bad bytes ----------------------------------------------------------

    def _plausible(self, pos: int, after: int) -> int | None:
        """The base offset of a valid batch at `pos` that could follow bad bytes whose first
        offset is `after`, else None."""
        if pos + HEADER_SIZE > self.file_size:
            return None
        header, reason = self._batch(pos, None)
        if reason is not None or header is None or header.base_offset <= after:
            return None
        return header.base_offset

    def _resume(self, pos: int, first: int) -> tuple[int, int] | None:
        """(position, base offset) of the first valid batch after bad bytes at `pos` that
        should hold offsets from `first` on, or None when none follows."""
        buf, off = self._read(pos, LOG_OVERHEAD)
        if len(buf) - off >= LOG_OVERHEAD:
            length = int.from_bytes(buf[off + 8:off + 12], "big", signed=True)
            if HEADER_SIZE - LOG_OVERHEAD <= length <= MAX_BATCH_SIZE:
                after = pos + LOG_OVERHEAD + length
                base = self._plausible(after, first)
                if base is not None:
                    return after, base
        # An index entry after `pos` that still verifies bounds the scan: valid batches may
        # lie between (entries are one per interval), but none need be looked for past it.
        bound: tuple[int, int] | None = None
        for hint in self.hints:
            if hint > pos:
                base = self._plausible(hint, first)
                if base is not None:
                    bound = hint, base
                    break
        found = self._scan(pos + 1, first, self.file_size if bound is None else bound[0])
        return found if found is not None else bound

    def _scan(self, pos: int, first: int, stop: int) -> tuple[int, int] | None:
        """Search [pos, stop) for the first batch start that verifies."""
        while pos < stop and pos + HEADER_SIZE <= self.file_size:
            chunk = pread_exact(self.fd, min(_BLOCK, stop - pos) + _MARK_AT, pos)
            at = 0
            while True:
                hit = chunk.find(_RESUME_MARK, at + _MARK_AT)
                if hit < 0:
                    break
                candidate = pos + hit - _MARK_AT
                at = hit - _MARK_AT + 1
                if candidate >= stop:
                    return None
                base = self._plausible(candidate, first)
                if base is not None:
                    return candidate, base
            pos += max(1, len(chunk) - _MARK_AT - len(_RESUME_MARK) + 1)
        return None
