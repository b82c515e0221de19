"""Decode legacy Kafka message sets (magic 0 and 1), so logs written by old clients can be read.

Read-only: tq writes RecordBatch v2 only. Byte layout of one message-set entry (Kafka's names):
    offset       int64   absolute; for a v1 compressed wrapper, the offset of its last inner message
    messageSize  int32   bytes after this field
    crc          uint32  CRC-32 (zlib) over magic..end
    magic        int8    0 or 1
    attributes   int8    bits 0-2 compression (1 gzip, 2 snappy, 3 lz4), bit 3 timestamp type (v1)
    timestamp    int64   v1 only
    keyLength    int32   -1 for null
    key          bytes
    valueLength  int32   -1 for null
    value        bytes   for a compressed wrapper: the compressed inner message set

Inner messages of a wrapper carry offsets relative to the first (v1) or absolute ones (v0), must
have the wrapper's magic and must not be compressed themselves. One message, or one wrapper with
all its inner messages, is returned as one `RecordBatch` with magic 0 or 1.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from querylib.errors import (
    CompressionError,
    CorruptRecordError,
    InvalidLengthError,
    InvalidRecordError,
    TruncatedRecordError,
    UnsupportedMagicError,
)
from querylib.records._compression import MAX_DECOMPRESSED_SIZE, decompress
from querylib.records._header import LOG_OVERHEAD, MAX_BATCH_SIZE
from querylib.records._types import (
    COMPRESSION_MASK,
    TIMESTAMP_TYPE_BIT,
    Compression,
    Record,
    RecordBatch,
    TimestampType,
)

_PREFIX = struct.Struct(">qiIbb")  # offset, messageSize, crc, magic, attributes
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_CRC_START = 16  # magic: where the CRC-32 starts
MIN_MESSAGE_SIZE = (14, 22)  # by magic: crc, magic, attributes, [timestamp], two lengths
NO_TIMESTAMP = -1


class _Message(NamedTuple):
    offset: int
    size: int
    crc: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def _read_bytes(buf: bytes, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    (length,) = _INT32.unpack_from(buf, pos)
    pos += 4
    if length == -1:
        return None, pos
    if length < 0 or pos + length > end:
        raise InvalidLengthError(f"legacy message {what} length {length} at {pos - 4}")
    return buf[pos:pos + length], pos + length


def _read_message(buf: bytes, pos: int, limit: int, verify_crc: bool) -> _Message:
    """The message-set entry at pos, which must end by limit."""
    if limit - pos < LOG_OVERHEAD + 6:
        raise TruncatedRecordError(f"legacy message at {pos}: {limit - pos} bytes left")
    offset, size, crc, magic, attributes = _PREFIX.unpack_from(buf, pos)
    if magic not in (0, 1):
        raise UnsupportedMagicError(f"message at {pos}: magic {magic}, expected 0 or 1")
    if not MIN_MESSAGE_SIZE[magic] <= size <= MAX_BATCH_SIZE:
        raise InvalidLengthError(f"legacy message at {pos}: messageSize {size} out of bounds")
    end = pos + LOG_OVERHEAD + size
    if end > limit:
        raise TruncatedRecordError(
            f"legacy message at {pos}: {limit - pos} bytes left, messageSize says {size}")
    if verify_crc:
        actual = zlib.crc32(memoryview(buf)[pos + _CRC_START:end])
        if actual != crc:
            raise CorruptRecordError(
                f"legacy message at {pos}: CRC-32 {actual:#010x}, message says {crc:#010x}")
    p = pos + _CRC_START + 2
    timestamp = NO_TIMESTAMP
    if magic == 1:
        (timestamp,) = _INT64.unpack_from(buf, p)
        p += 8
    key, p = _read_bytes(buf, p, end, "key")
    if p + 4 > end:
        raise InvalidLengthError(f"legacy message at {pos}: key runs into the value length")
    value, p = _read_bytes(buf, p, end, "value")
    if p != end:
        raise InvalidRecordError(f"legacy message at {pos}: {end - p} bytes after its value")
    return _Message(offset, size, crc, magic, attributes, timestamp, key, value)


def _inner_records(wrapper: _Message, verify_crc: bool, max_decompressed: int) -> list[Record]:
    codec = wrapper.attributes & COMPRESSION_MASK
    if codec > Compression.LZ4:
        raise CompressionError(f"legacy message at offset {wrapper.offset}: codec {codec} "
                               f"is not valid before magic 2")
    if wrapper.value is None:
        raise InvalidRecordError(f"compressed legacy message at offset {wrapper.offset} "
                                 f"has a null value")
    data = decompress(codec, wrapper.value, max_decompressed)
    log_append = wrapper.magic == 1 and wrapper.attributes & TIMESTAMP_TYPE_BIT
    inner: list[_Message] = []
    pos = 0
    while pos < len(data):
        message = _read_message(data, pos, len(data), verify_crc)
        if message.magic != wrapper.magic:
            raise InvalidRecordError(f"inner message magic {message.magic} in a wrapper of "
                                     f"magic {wrapper.magic}")
        if message.attributes & COMPRESSION_MASK:
            raise InvalidRecordError(f"compressed message inside the compressed message at "
                                     f"offset {wrapper.offset}")
        inner.append(message)
        pos += LOG_OVERHEAD + message.size
    if not inner:
        raise InvalidRecordError(f"compressed legacy message at offset {wrapper.offset} "
                                 f"holds no messages")
    # v1 inner offsets count from 0 and the wrapper carries the absolute offset of the last one
    shift = wrapper.offset - inner[-1].offset if wrapper.magic == 1 else 0
    return [Record(m.offset + shift, wrapper.timestamp if log_append else m.timestamp,
                   m.key, m.value) for m in inner]


def decode_legacy(buf: bytes | bytearray | memoryview, pos: int = 0, *, verify_crc: bool = True,
                  max_decompressed: int = MAX_DECOMPRESSED_SIZE) -> RecordBatch:
    """Decode the legacy message (or compressed wrapper) at pos as a RecordBatch of magic 0/1."""
    if type(buf) is not bytes:
        # copy this message only (a bounded size), never the rest of a segment
        view = memoryview(buf)
        size = _INT32.unpack_from(view, pos + 8)[0] if len(view) - pos >= LOG_OVERHEAD else 0
        buf = bytes(view[pos:pos + LOG_OVERHEAD + min(max(size, 0), MAX_BATCH_SIZE)])
        pos = 0
    message = _read_message(buf, pos, len(buf), verify_crc)
    codec = message.attributes & COMPRESSION_MASK
    if codec:
        records = _inner_records(message, verify_crc, max_decompressed)
    else:
        records = [Record(message.offset, message.timestamp, message.key, message.value)]
    log_append = message.magic == 1 and bool(message.attributes & TIMESTAMP_TYPE_BIT)
    first, last = records[0], records[-1]
    return RecordBatch(
        first.offset, -1, message.magic, message.crc, Compression(codec),
        TimestampType(1 if log_append else 0), False, False, last.offset - first.offset,
        first.timestamp, message.timestamp, -1, -1, -1, records, message.size)
