"""Fetch responses (v4-17) as scatter lists: encoded fields interleaved with file slices, so
stored record batches reach the socket unchanged, by sendfile where the socket allows.

This is the one response not encoded by kio: kio would need every record byte in memory as a
`records` bytes field. The layout below is Kafka's FetchResponse.json; tests check it byte for
byte against kio's encoding of the same response at every served version.

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

Flexible versions (v12+) encode the same fields compactly: arrays and strings with a uvarint
length + 1 (0: null), the records field as compact bytes (uvarint size + 1), and an empty
tagged-field section (uvarint 0) after each partition, each topic and the whole body. From v13
a topic is named by its 16-byte topic id instead of its name. The tagged fields are always
empty: diverging_epoch (v12; a tq partition has one leader epoch and its log is never cut
below what was served, so there is never a divergence to report), current_leader and
snapshot_id (no leader changes, no KRaft snapshots), node_endpoints (v16, sent with
NOT_LEADER errors: clients refresh metadata instead).

Pure: builds bytes and lists; never reads a file or touches a socket.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from querylib.records._varint import encode_uvarint

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
FLEXIBLE_FROM = 12  # compact encodings and tagged fields
TOPIC_IDS_FROM = 13  # topics named by id
MAX_VERSION = 17


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
    topic_id: bytes = bytes(16)  # the 16 bytes of its Kafka topic id (sent from v13)



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
    if not 4 <= version <= MAX_VERSION:
        raise ValueError(f"Fetch response v{version} is not served")
    flexible = version >= FLEXIBLE_FROM
    chunks: list[Chunk] = []
    pending = bytearray()
    if version >= 7:
        pending += _TOP_V7.pack(throttle_time_ms, error_code, session_id)
    else:
        pending += _TOP_V4.pack(throttle_time_ms)
    pending += encode_uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    size = 0
    for topic in topics:
        if version >= TOPIC_IDS_FROM:
            pending += topic.topic_id
        else:
            name = topic.topic.encode()
            pending += encode_uvarint(len(name) + 1) if flexible else _I16.pack(len(name))
            pending += name
        partitions = topic.partitions
        pending += encode_uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for p in partitions:
            pending += _PARTITION_V4.pack(p.partition_index, p.error_code, p.high_watermark,
                                          p.last_stable_offset)
            if version >= 5:
                pending += _I64.pack(p.log_start_offset)
            if flexible:
                if p.aborted is None:
                    pending += b"\x00"  # aborted_transactions: null
                else:
                    pending += encode_uvarint(len(p.aborted) + 1)
                    for producer_id, first_offset in p.aborted:
                        pending += _ABORTED.pack(producer_id, first_offset)
                        pending += b"\x00"  # no tagged fields
                pending += _NO_REPLICA
                pending += encode_uvarint(p.records_size + 1)
            else:
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
            if flexible:
                pending += b"\x00"  # the partition's tagged fields
        if flexible:
            pending += b"\x00"  # the topic's tagged fields
    if flexible:
        pending += b"\x00"  # the response's tagged fields
    if pending:
        size += len(pending)
        chunks.append(bytes(pending))
    return chunks, size
