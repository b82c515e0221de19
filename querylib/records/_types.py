"""The decoded shapes of Kafka records and batches: what `decode_batch` returns.

Plain immutable values, no behaviour beyond derived properties. `Record` is created once per
record on the decode hot path, so it is a positional, frozen msgspec Struct without GC tracking
(it can hold only ints, bytes, str and tuples of them, so it can never be part of a cycle).
"""

from __future__ import annotations

from enum import IntEnum

import msgspec

from querylib.records._header import LOG_OVERHEAD

Header = tuple[str, bytes | None]


class Compression(IntEnum):
    """RecordBatch attributes bits 0-2 (and the legacy message attributes bits 0-2)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    """RecordBatch attributes bit 3. With LOG_APPEND_TIME every record's timestamp is the
    batch's maxTimestamp, whatever its timestampDelta says."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


# RecordBatch attributes (int16), Kafka's bit assignment.
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20


class Record(msgspec.Struct, frozen=True, gc=False):
    """One record with its absolute offset and timestamp (base + delta already applied)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


class RecordBatch(msgspec.Struct, frozen=True):
    """One RecordBatch (magic 2), or one legacy message / compressed wrapper (magic 0 or 1)
    presented with the same fields. `batch_length` is Kafka's batchLength (the legacy
    MessageSize): the bytes after the length field."""

    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    compression: Compression
    timestamp_type: TimestampType
    is_transactional: bool
    is_control: bool
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[Record]
    batch_length: int

    @property
    def next_offset(self) -> int:
        """The offset after this batch's last offset (what a reader fetches next)."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def size_in_bytes(self) -> int:
        """Bytes the batch occupies in a log or fetch response."""
        return LOG_OVERHEAD + self.batch_length
