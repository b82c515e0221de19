"""Fetch responses (v4-11) as scatter lists: encoded fields interleaved with file slices, so
stored record batches reach the socket unchanged, by sendfile where the socket allows.

This is the one response not encoded by kio: kio would need every record byte in memory as a
`records` bytes field. The layout below is Kafka's FetchResponse.json for the non-flexible
versions; tests check it byte for byte against kio's encoding of the same response.

    throttle_time_ms        int32
    error_code              int16   v7+
    session_id              int32   v7+   (always 0: tq keeps no fetch sessions)
    responses               [FetchableTopicResponse]  int32 count
      topic                 string  (int16 length)
      partitions            [PartitionData]  int32 count
        partition_index     int32
        error_code          int16
        high_watermark      int64
        last_stable_offset  int64
        log_start_offset    int64   v5+
        aborted_transactions  nullable [producer_id int64, first_offset int64]  (null unless
                                read_committed)
        preferred_read_replica  int32   v11+  (always -1)
        records             nullable bytes (int32 length): whole stored batches

Pure: builds bytes and lists; never reads a file or touches a socket.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["FetchedPartition", "FetchedTopic", "SizedChunk", "encode_fetch_response"]

_TOP_V4 = struct.Struct(">i")  # throttle_time_ms
_TOP_V7 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_PARTITION_V4 = struct.Struct(">ihqq")  # index, error_code, high_watermark, last_stable_offset
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_NULL_ARRAY = _I32.pack(-1)
_NO_REPLICA = _I32.pack(-1)


class SizedChunk(Protocol):
    """A run of bytes that is sent without being in memory (a `querylib.log.FileSlice`)."""

    @property
    def length(self) -> int: ...


Chunk = bytes | SizedChunk


@dataclass(slots=True)
class FetchedPartition:
    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: Sequence[Chunk] = field(default_factory=tuple)
    aborted: Sequence[tuple[int, int]] | None = None  # (producer id, first offset)

    @property
    def records_size(self) -> int:
        return sum(len(c) if isinstance(c, bytes) else c.length for c in self.records)


@dataclass(slots=True)
class FetchedTopic:
    topic: str
    partitions: list[FetchedPartition]


def encode_fetch_response(
    version: int,
    topics: Sequence[FetchedTopic],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
) -> tuple[list[Chunk], int]:
    """(chunks, total size): bytes chunks hold the encoded fields, the others are record
    slices to send as they are. Adjacent encoded fields are merged into one bytes chunk."""
    if not 4 <= version <= 11:
        raise ValueError(f"Fetch response v{version} is not served")
    chunks: list[Chunk] = []
    pending = bytearray()
    if version >= 7:
        pending += _TOP_V7.pack(throttle_time_ms, error_code, session_id)
    else:
        pending += _TOP_V4.pack(throttle_time_ms)
    pending += _I32.pack(len(topics))
    size = 0
    for topic in topics:
        name = topic.topic.encode()
        pending += _I16.pack(len(name))
        pending += name
        pending += _I32.pack(len(topic.partitions))
        for p in topic.partitions:
            pending += _PARTITION_V4.pack(p.partition_index, p.error_code, p.high_watermark,
                                          p.last_stable_offset)
            if version >= 5:
                pending += _I64.pack(p.log_start_offset)
            if p.aborted is None:
                pending += _NULL_ARRAY
            else:
                pending += _I32.pack(len(p.aborted))
                for producer_id, first_offset in p.aborted:
                    pending += _ABORTED.pack(producer_id, first_offset)
            if version >= 11:
                pending += _NO_REPLICA
            pending += _I32.pack(p.records_size)
            for chunk in p.records:
                if isinstance(chunk, bytes):
                    pending += chunk
                    continue
                if chunk.length == 0:
                    continue
                size += len(pending) + chunk.length
                chunks.append(bytes(pending))
                chunks.append(chunk)
                pending = bytearray()
    if pending:
        size += len(pending)
        chunks.append(bytes(pending))
    return chunks, size
