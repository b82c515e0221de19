"""Hand-built batches for tests: any records bytes (valid or hostile) under a header with a
correct CRC, so the decoder's record parsing is what gets tested."""

from __future__ import annotations

import struct
import zlib

import crc32c

from querylib.records._header import HEADER, HEADER_SIZE, LOG_OVERHEAD


def raw_batch(records: bytes, count: int, *, attributes: int = 0, base_offset: int = 0,
              base_timestamp: int = 0, max_timestamp: int = 0, last_offset_delta: int | None = None,
              batch_length: int | None = None, magic: int = 2) -> bytes:
    """A RecordBatch header with a correct CRC-32C over attributes..end, then `records`."""
    length = HEADER_SIZE - LOG_OVERHEAD + len(records) if batch_length is None else batch_length
    header = bytearray(HEADER.pack(
        base_offset, length, -1, magic, 0, attributes,
        count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp, max_timestamp, -1, -1, -1, count))
    return recrc(bytes(header) + records)


def recrc(batch: bytes) -> bytes:
    """The batch with its CRC field recomputed (after a deliberate mutation)."""
    crc = crc32c.crc32c(batch[21:])
    return batch[:17] + struct.pack(">I", crc) + batch[21:]


def legacy_message(offset: int, value: bytes | None, *, magic: int = 1, attributes: int = 0,
                   timestamp: int = 0, key: bytes | None = None) -> bytes:
    """One legacy message-set entry (magic 0 or 1) with a correct CRC-32."""
    body = bytes([magic, attributes])
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, len(body) + 4, crc) + body
