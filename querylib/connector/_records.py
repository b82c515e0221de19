"""How connector messages become records of a tq topic, and how to find them again.

Stream names. A NOTIFY names a topic and, optionally, a partition (default 0):

    name | tenant/ns/name | persistent://tenant/ns/name     the topic (catalog.TopicName forms)
    ...:N                                                  partition N (':' is never in a name)
    name/N | tenant/ns/name/N                              partition N: an odd number of '/'
                                                           after any scheme can only mean this

Records (the field mapping of seed 003, Pulsar -> Kafka, applied to connector messages):

    timestamp   the message's event time when it has one, else the append time (ms)
    key         the released dialect's key (the draft has none): null when absent
    value       the payload
    headers     tq.time   the stream's logical time (int64 BE): the epoch its last BOUNDARY opened
                tq.msgid  the message id (uint64 BE)
                tq.flags  the draft flags (uint16 BE), only when not zero
    producerId  the source id: a stable 63-bit hash of (program, instance, stream id), so the
                records of one connector stream can be told apart in a shared partition

A BOUNDARY with id M advances the stream's frontier to M + 1 (a FRONTIER control batch through the
broker's frontier machinery); records after it carry tq.time M + 1. EOS ends the stream
(END_OF_STREAM once the partition's last producer ended). Ids are the logical times, so a resent
boundary moves nothing, and message ids only ever increase on a stream (the connection drops
any id at or below the last one), so the frontier only moves forward.

`encode_messages` writes a batch for a run of messages directly (Kafka's RecordBatch v2 layout,
see querylib.records); `last_message_id` reads back the last id a source appended. Pure
functions; reading a log is the caller's business.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence

import crc32c

from catalog import TopicName
from catalog.errors import InvalidTopicNameError, UserError
from querylib.records import MAX_BATCH_SIZE, RecordBatch, read_header
from querylib.records._header import ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER, HEADER_SIZE
from querylib.records._types import CONTROL_BIT
from querylib.records._varint import (
    TABLE_SIZE,
    VARINT_OF,
    encode_varint,
    encode_varlong,
    wrap_int64,
)

from ._errors import MalformedFrameError
from ._events import MessageFlags

__all__ = [
    "FLAGS_HEADER",
    "MSGID_HEADER",
    "encode_messages",
    "last_message_id",
    "parse_stream_name",
    "source_id",
]

MSGID_HEADER = "tq.msgid"
FLAGS_HEADER = "tq.flags"

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_EPHEMERAL = int(MessageFlags.EPHEMERAL)
_PARTITION = re.compile(r"[0-9]{1,10}")
_MAX_PARTITION = 2**31 - 1
_MAX_NAME = 1024  # longer stream names are refused before any parsing

# Header parts: count, then (keyLength varint, key, valueLength varint, value) per header.
_TIME_NAME = b"\x0etq.time\x10"  # varint(7) "tq.time" varint(8)
_MSGID_NAME = b"\x10tq.msgid\x10"  # varint(8) "tq.msgid" varint(8)
_FLAGS_NAME = b"\x10tq.flags\x04"  # varint(8) "tq.flags" varint(2)
_TWO, _THREE = b"\x04", b"\x06"  # varint(2), varint(3)
_NULL = b"\x01"  # varint(-1): a null key
# attributes 0, timestampDelta 0, offsetDelta i, null key: the start of most records
_HEADS = [b"\x00\x00" + VARINT_OF[i] + _NULL for i in range(TABLE_SIZE)]


def parse_stream_name(name: str) -> tuple[TopicName, int]:
    """(topic, partition) named by a NOTIFY's stream name; InvalidTopicNameError saying why not."""
    if len(name) > _MAX_NAME:
        raise InvalidTopicNameError(f"stream name of {len(name)} characters is too long")
    text, partition = name, 0
    if ":" in name.replace("://", "", 1):
        text, _, number = name.rpartition(":")
        partition = _partition(name, number)
    else:
        rest = name.split("://", 1)[1] if "://" in name else name
        if rest.count("/") % 2 == 1:
            text, _, number = name.rpartition("/")
            partition = _partition(name, number)
    return TopicName.parse(text), partition


def _partition(name: str, number: str) -> int:
    if not _PARTITION.fullmatch(number) or int(number) > _MAX_PARTITION:
        raise InvalidTopicNameError(
            f"stream name {name[:80]!r}: the partition after the last ':' or '/' must be a "
            f"number in 0..{_MAX_PARTITION}, as in 'events:3' or 'tenant/ns/events/3'")
    return int(number)


def broker_topic(topic: TopicName) -> str:
    """The name a broker knows `topic` by: its short form (`numbers`, `tenant/ns/name`)."""
    return topic.short


def source_id(program: str, instance: str, stream_id: int) -> int:
    """A stable, non-negative 63-bit id of one connector stream (the batches' producerId).
    The worker refuses names holding NUL at HELLO, so the text hashed names one stream only."""
    digest = hashlib.blake2b(f"{program}\0{instance}\0{stream_id}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


def _varint(n: int) -> bytes:
    return VARINT_OF[n] if n < TABLE_SIZE else encode_varint(n)


def encode_messages(
    messages: Sequence[tuple[int, bytes, int | None, bytes | None, int]],
    *,
    time: int,
    now_ms: int,
    producer_id: int,
) -> bytes:
    """One RecordBatch v2 for `messages` (message_id, payload, event_time, key, flags), all at
    logical time `time`; `now_ms` stamps the messages without an event time.

    Raises MalformedFrameError when an event time is outside int64 (the connector's fault) and
    UserError for a batch too large for a record batch's int32 fields.
    """
    if not messages:
        raise ValueError("a record batch needs at least one message")
    first_time = messages[0][2]
    base_ts = now_ms if first_time is None else first_time
    time_part = _TIME_NAME + _U64.pack(time & 0xFFFF_FFFF_FFFF_FFFF) + _MSGID_NAME
    two, three = _TWO + time_part, _THREE + time_part
    zero_delta = b"\x00\x00"  # attributes 0, timestampDelta varlong(0)
    max_ts = base_ts
    pack_id, pack_flags = _U64.pack, _U16.pack
    parts: list[bytes] = []
    add = parts.extend
    tail2 = len(two) + 8
    heads = _HEADS
    for i, (mid, payload, event_time, key, flags) in enumerate(messages):
        plen = len(payload)
        if event_time is None and key is None and not flags and i < TABLE_SIZE \
                and plen < TABLE_SIZE and now_ms == base_ts:
            # The common record: append time, no key, no flags; table lookups only.
            head = heads[i]
            value_len = VARINT_OF[plen]
            add((_varint(len(head) + len(value_len) + plen + tail2), head, value_len, payload,
                 two, pack_id(mid)))
            continue
        if event_time is None:
            ts = now_ms
        else:
            ts = event_time
            if not _INT64_MIN <= ts <= _INT64_MAX:
                raise MalformedFrameError(f"event time {ts} of message {mid} is outside int64")
        if ts > max_ts:
            max_ts = ts
        # Kafka computes deltas in int64 arithmetic (they wrap), as querylib.records does.
        head = zero_delta if ts == base_ts else b"\x00" + encode_varlong(wrap_int64(ts - base_ts))
        offset = VARINT_OF[i] if i < TABLE_SIZE else encode_varint(i)
        key_part = _NULL if key is None else _varint(len(key)) + key
        value_len = _varint(plen)
        if flags:
            tail: tuple[bytes, ...] = (three, pack_id(mid), _FLAGS_NAME, pack_flags(flags))
            tail_size = len(three) + 8 + len(_FLAGS_NAME) + 2
        else:
            tail = (two, pack_id(mid))
            tail_size = tail2
        size = len(head) + len(offset) + len(key_part) + len(value_len) + plen + tail_size
        add((_varint(size), head, offset, key_part, value_len, payload))
        add(tail)
    records = b"".join(parts)
    size = HEADER_SIZE + len(records)
    if size > MAX_BATCH_SIZE:
        raise UserError(f"{len(messages)} messages of {size} bytes do not fit one record batch")
    header = bytearray(HEADER.pack(0, size - 12, -1, 2, 0, 0, len(messages) - 1, base_ts,
                                   max_ts, producer_id, 0, -1, len(messages)))
    crc = crc32c.crc32c(records, crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    struct.pack_into(">I", header, CRC_OFFSET, crc)
    return bytes(header) + records


def header_of(data: bytes | memoryview, pos: int = 0) -> tuple[int, int, int, bool]:
    """(size, producer_id, next_offset, is_control) of the batch at `pos`."""
    header = read_header(data, pos)
    control = bool(data[pos + ATTRIBUTES_OFFSET + 1] & CONTROL_BIT)
    return header.size, header.producer_id, header.next_offset, control


def last_message_id(batch: RecordBatch) -> int | None:
    """The id of the last record of `batch` that is a point of reference (not EPHEMERAL)."""
    for record in reversed(batch.records):
        mid = flags = None
        for name, value in record.headers:
            if name == MSGID_HEADER and value is not None and len(value) == 8:
                mid = _U64.unpack(value)[0]
            elif name == FLAGS_HEADER and value is not None and len(value) == 2:
                flags = _U16.unpack(value)[0]
        if mid is not None and not (flags or 0) & _EPHEMERAL:
            return mid
    return None
