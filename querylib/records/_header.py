"""The fixed 61-byte header of a Kafka RecordBatch (magic 2), and what the log needs from it.

Peeking at a header never allocates more than the header itself and never trusts a length it has
not bounded. The log stamps base offsets through `stamp_base_offset` without touching the CRC,
which covers only attributes..end.

Byte layout (Kafka's names):
    baseOffset            int64   0
    batchLength           int32   8   bytes after this field
    partitionLeaderEpoch  int32   12
    magic                 int8    16  2 (0 and 1 are the legacy MessageSet, same position)
    crc                   uint32  17  CRC-32C over attributes..end
    attributes            int16   21
    lastOffsetDelta       int32   23
    baseTimestamp         int64   27
    maxTimestamp          int64   35
    producerId            int64   43
    producerEpoch         int16   51
    baseSequence          int32   53
    recordsCount          int32   57
    records               ...     61
"""

from __future__ import annotations

import struct
from typing import NamedTuple, final

import crc32c

from querylib.errors import InvalidLengthError, TruncatedRecordError, UnsupportedMagicError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: what precedes the length-counted part
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAGIC_OFFSET = 16
SEQUENCE_MODULUS = 2**31  # baseSequence is an int32 and wraps to 0 after 2^31 - 1
MAX_BATCH_SIZE = 64 * 1024 * 1024  # no batch we accept is larger than this (Kafka default 1 MiB)

_PREFIX = struct.Struct(">qi4xb")  # baseOffset, batchLength, (partitionLeaderEpoch skipped) magic
_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")  # partitionLeaderEpoch, 12 bytes in
PRODUCER_OFFSET = 43  # producerId, producerEpoch, baseSequence: 14 bytes from here
_PRODUCER = struct.Struct(">qhi")
_CRC = struct.Struct(">I")


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies in a log: LOG_OVERHEAD + batch_length."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


@final  # so `type(batch) is SplitBatch` narrows both ways for a type checker
class SplitBatch:
    """One batch in two buffers: its 61-byte header (`head`) and the records after it
    (`body`), as `stamp_producer_split` makes it and a broker receives it (two frames). Not
    bytes-like: what reads the header reads `head` (`batch_head`); len() is the whole batch's.
    """

    __slots__ = ("_size", "body", "head")

    def __init__(self, head: bytes | memoryview, body: bytes | memoryview) -> None:
        self.head = head
        self.body = body
        self._size = len(head) + len(body)  # asked several times per batch on a broker

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return b"".join((self.head, self.body))


Batch = bytes | bytearray | memoryview | SplitBatch


def batch_head(batch: Batch) -> bytes | bytearray | memoryview:
    """The buffer holding the batch's header (all of it, unless the batch is split)."""
    return batch.head if type(batch) is SplitBatch else batch


def stamp_base_offset(batch: Batch, base_offset: int, leader_epoch: int | None = None) -> bytes:
    """Return the batch with its baseOffset field replaced and, given `leader_epoch`, its
    partitionLeaderEpoch too, in one copy of the batch. The CRC stays valid (it starts at
    attributes, after both), so the batch is never re-encoded."""
    head = memoryview(batch.head if type(batch) is SplitBatch else batch)
    if leader_epoch is None:
        parts: tuple[bytes | memoryview, ...] = (_OFFSET.pack(base_offset), head[8:])
    else:
        parts = (_OFFSET.pack(base_offset), head[8:12], _EPOCH.pack(leader_epoch), head[16:])
    if type(batch) is SplitBatch:
        parts = (*parts, batch.body)
    return b"".join(parts)


def stamp_producer(batch: bytes | bytearray | memoryview, producer_id: int, producer_epoch: int,
                   base_sequence: int) -> bytearray:
    """Return the batch with its producerId, producerEpoch and baseSequence replaced and its CRC
    computed again (those fields are inside the CRC): one copy and one CRC pass over the batch,
    for batches an idempotent producer did not encode itself (an encoder stamps them for
    free). The copy is returned as is (a bytearray: a second copy into bytes cost a third of
    the stamping of a 110 KB batch)."""
    out = bytearray(batch)
    _PRODUCER.pack_into(out, PRODUCER_OFFSET, producer_id, producer_epoch, base_sequence)
    _CRC.pack_into(out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out


def stamp_producer_split(batch: bytes | bytearray | memoryview, producer_id: int,
                         producer_epoch: int, base_sequence: int) -> SplitBatch:
    """`stamp_producer` without copying the records: a new 61-byte header (producer fields
    and CRC replaced) and a view of the caller's bytes after it. One CRC pass over the batch;
    the caller must not change `batch` while the result is in use."""
    view = memoryview(batch).cast("B")
    if len(view) < HEADER_SIZE:
        raise TruncatedRecordError(f"batch of {len(view)} bytes: need at least {HEADER_SIZE}")
    head = bytearray(view[:HEADER_SIZE])
    body = view[HEADER_SIZE:]
    _PRODUCER.pack_into(head, PRODUCER_OFFSET, producer_id, producer_epoch, base_sequence)
    # With the GIL held: a ~5 us pass, shorter than the handoffs releasing it would cost the
    # calling thread (a producer's loop thread would take the GIL in between).
    crc = crc32c.crc32c(body, crc32c.crc32c(memoryview(head)[ATTRIBUTES_OFFSET:]),
                        gil_release_mode=0)
    _CRC.pack_into(head, CRC_OFFSET, crc)
    return SplitBatch(bytes(head), body)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse and bound-check the batch header at `pos`, without reading or checking the body.

    Raises TruncatedRecordError when fewer than 61 bytes remain, InvalidLengthError when
    batchLength is below the header or above MAX_BATCH_SIZE, UnsupportedMagicError when the
    magic byte is not 2 (legacy message sets have their own reader).
    """
    avail = len(buf) - pos
    if avail < LOG_OVERHEAD + 5:
        raise TruncatedRecordError(f"batch header at {pos}: {avail} bytes left, need 17")
    _base, length, magic = _PREFIX.unpack_from(buf, pos)
    if magic != 2:
        raise UnsupportedMagicError(f"batch at {pos}: magic {magic}, expected 2")
    if length < HEADER_SIZE - LOG_OVERHEAD or length > MAX_BATCH_SIZE:
        raise InvalidLengthError(f"batch at {pos}: batchLength {length} out of bounds")
    if avail < HEADER_SIZE:
        raise TruncatedRecordError(f"batch header at {pos}: {avail} bytes left, need 61")
    return BatchHeader._make(HEADER.unpack_from(buf, pos))
