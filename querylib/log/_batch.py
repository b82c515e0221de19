"""What the log checks and rewrites in a record batch's bytes, and how it walks batches in a file.

Producer bytes are hostile: `check_batch` bounds the header, requires magic 2 and checks the
CRC-32C before the log writes anything. Bytes read back from disk are only trusted as far as
recovery validated them, so every length read from a file is bounded before it is used.
Nothing here decodes records.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from typing import NamedTuple

import crc32c

from querylib.errors import (
    CorruptRecordError,
    InvalidLengthError,
    RecordError,
    TruncatedRecordError,
)
from querylib.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    Batch,
    BatchHeader,
    SplitBatch,
    batch_head,
    read_header,
    verify_batch,
)

# A partition of one replica has no leader election, so its batches carry leader epoch 0, as
# on a Kafka partition whose leader never changed; a replicated partition's leader stamps its
# epoch (DESIGN §5 "Replication"). The log stamps it on append (outside the CRC, like the base
# offset, and as Kafka's broker does); recovery rejects a negative one.
LEADER_EPOCH = 0

# baseOffset, batchLength, partitionLeaderEpoch: the 16 bytes the log rewrites on append.
_PREFIX = struct.Struct(">qii")
# baseOffset .. maxTimestamp: the header fields a read needs (HEADER's first nine).
_PEEK = struct.Struct(">qiibIhiqq")
_MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD
_CRC_START = 21  # the CRC-32C covers attributes..end
_LENGTH = struct.Struct(">i")
PREFIX_SIZE = _PREFIX.size
_POSITION_PREFIX = re.compile(r"^batch (header )?at \d+: ")


def describe(exc: RecordError) -> str:
    """The codec's message without its "batch at N:" prefix, whose N counts from the start of
    whatever buffer the codec was given rather than from the start of the file."""
    return _POSITION_PREFIX.sub("", str(exc))


def check_batch(buf: Batch) -> BatchHeader:
    """Validate producer bytes that must be exactly one batch; raise a RecordError if not.

    Beyond `verify_batch`: nothing may follow the batch, and it must hold 1..n records with
    offset deltas 0..n-1, as every producer writes them, since the log assigns offsets from
    lastOffsetDelta. A SplitBatch is checked as the batch its two parts make.
    """
    if type(buf) is SplitBatch:
        header = _verify_split(buf)
    else:  # the codec's check: bounds, magic 2, CRC-32C
        header = verify_batch(buf, 0)
    if header.size != len(buf):
        raise InvalidLengthError(
            f"batch is {header.size} bytes but {len(buf)} were given: append one batch at a time"
        )
    if header.records_count < 1 or header.last_offset_delta != header.records_count - 1:
        raise InvalidLengthError(
            f"batch has {header.records_count} records and lastOffsetDelta "
            f"{header.last_offset_delta}; expected n >= 1 records with deltas 0..n-1"
        )
    return header


def _verify_split(batch: SplitBatch) -> BatchHeader:
    """verify_batch for a batch in two parts: a head of exactly the 61-byte header, then the
    records (one CRC-32C pass over both, nothing copied)."""
    head = memoryview(batch.head).cast("B")
    if len(head) != HEADER_SIZE:
        raise InvalidLengthError(f"a split batch's head is its {HEADER_SIZE}-byte header, not "
                                 f"{len(head)} bytes")
    header = read_header(head)
    if header.size > len(batch):
        raise TruncatedRecordError(
            f"batch at 0: {len(batch)} bytes left, batchLength says {header.size}")
    actual = crc32c.crc32c(batch.body, crc32c.crc32c(head[_CRC_START:]))
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch at 0: CRC-32C {actual:#010x}, header says {header.crc:#010x}")
    return header


def stamp_prefix(base_offset: int, header: BatchHeader, leader_epoch: int = LEADER_EPOCH) -> bytes:
    """The first 16 bytes of the batch as stored: our base offset and leader epoch."""
    return _PREFIX.pack(base_offset, header.batch_length, leader_epoch)


def stored_batch(batch: Batch, base_offset: int) -> bytes:
    """The bytes PartitionLog stores (and serves) for `batch` appended at `base_offset`: the
    producer's bytes with base offset and leader epoch stamped. Validates like check_batch."""
    if type(batch) is SplitBatch:
        prefix = stamp_prefix(base_offset, check_batch(batch))
        return b"".join((prefix, memoryview(batch.head)[PREFIX_SIZE:], batch.body))
    view = memoryview(batch).cast("B")
    return stamp_prefix(base_offset, check_batch(view)) + bytes(view[PREFIX_SIZE:])


def appended_batch(batch: Batch, base_offset: int, leader_epoch: int | None = None) -> bytes:
    """`stored_batch` of a batch this log appended at `base_offset` (and `leader_epoch`, a
    replicated partition's leader's; None: LEADER_EPOCH), so checked then (and unchanged
    since: producer bytes are never written to): the same bytes, in one copy, without checking
    them a second time (a CRC pass per batch a broker hands subscribers from memory)."""
    head = batch_head(batch)
    prefix = _PREFIX.pack(base_offset, _LENGTH.unpack_from(head, 8)[0],
                          LEADER_EPOCH if leader_epoch is None else leader_epoch)
    if type(batch) is SplitBatch:
        return b"".join((prefix, memoryview(head)[PREFIX_SIZE:], batch.body))
    return b"".join((prefix, memoryview(batch).cast("B")[PREFIX_SIZE:]))  # one copy, not two


def pread_exact(fd: int, length: int, pos: int) -> bytes:
    """`length` bytes at `pos`, or fewer only if the file ends first."""
    data = os.pread(fd, length, pos)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class Span(NamedTuple):
    """Where a batch lies and the header fields serving needs."""

    position: int
    base_offset: int
    next_offset: int  # base offset + lastOffsetDelta + 1
    size: int  # LOG_OVERHEAD + batchLength
    max_timestamp: int | None = None  # None when known from the index, not read from disk


def iter_spans(fd: int, start: int, stop: int, chunk: int = 8192) -> Iterator[Span]:
    """The batch at `start` and each one after it, while a header fits before `stop`.

    Reads `chunk` bytes at a time and only headers, so a 1 MiB batch costs one small read.
    The header is bounded as read_header bounds it (and read_header raises the RecordError
    for one that is not); the caller decides whether that is corruption to truncate or to
    report. A batch whose end passes `stop` is still yielded: the caller bounds it.
    """
    chunk = max(chunk, HEADER_SIZE)
    buf = b""
    buf_pos = start
    pos = start
    while pos + HEADER_SIZE <= stop:
        off = pos - buf_pos
        if off + HEADER_SIZE > len(buf):
            buf = pread_exact(fd, min(chunk, stop - pos), pos)
            buf_pos, off = pos, 0
            if len(buf) < HEADER_SIZE:
                raise TruncatedRecordError(f"batch header at {pos}: file ends early")
        # The hot path of every read: unpack only what serving needs, not a full BatchHeader.
        base, length, _epoch, magic, _crc, _attributes, delta, _base_ts, max_ts = (
            _PEEK.unpack_from(buf, off))
        if magic != 2 or not _MIN_LENGTH <= length <= MAX_BATCH_SIZE:
            read_header(buf, off)  # raises the precise RecordError
        yield Span(pos, base, base + delta + 1, LOG_OVERHEAD + length, max_ts)
        pos += LOG_OVERHEAD + length
    if pos < stop:
        raise TruncatedRecordError(f"batch header at {pos}: {stop - pos} bytes left, need 61")
