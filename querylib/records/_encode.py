"""Encode a RecordBatch v2 (magic 2): entries in, the exact bytes of one batch out.

Byte layout of one record inside the batch (Kafka's names):
    length          varint   bytes after this field
    attributes      int8     0 (no record attributes are defined)
    timestampDelta  varlong  timestamp - baseTimestamp (int64 arithmetic, as Java)
    offsetDelta     varint   0, 1, 2, ... in entry order
    keyLength       varint   -1 for a null key
    key             bytes
    valueLength     varint   -1 for a null value
    value           bytes
    headersCount    varint
    headers         headerKeyLength varint, headerKey UTF-8, headerValueLength varint
                    (-1 for null), headerValue bytes; repeated headersCount times

The hot loop handles records without headers by table lookups only (no calls per record) and
joins all parts once per batch; anything the tables do not cover goes through `_encode_record`,
the general and reference encoder. This module computes bytes; it writes nothing anywhere.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, cast

import crc32c

from querylib.records._compression import compress
from querylib.records._header import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
)
from querylib.records._types import (
    CONTROL_BIT,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    Compression,
    Header,
    TimestampType,
)
from querylib.records._varint import (
    INT64_MAX,
    INT64_MIN,
    TABLE_SIZE,
    VARINT_OF,
    encode_varint,
    encode_varlong,
    wrap_int64,
)

Entry = tuple[int, bytes | None, bytes | None, Sequence[Header]]

_NULL = b"\x01"  # varint -1: a null key, value or header value
_NO_HEADERS = b"\x00"
_ONE_HEADER = b"\x02"  # varint 1
# b"\x00" (record attributes) + varlong(delta) for timestamp deltas the tables cover
_ATTRS_AND_DELTA: dict[int, bytes] = {
    d: b"\x00" + encode_varlong(d) for d in range(-TABLE_SIZE, TABLE_SIZE)}
# offsetDelta followed by a null key's length, the common producer record
_OFFSET_NULL_KEY: list[bytes] = [v + _NULL for v in VARINT_OF]
# A timestamp at least this far from the int64 bounds plus any table delta stays in int64.
_SAFE_TS_MIN, _SAFE_TS_MAX = INT64_MIN + TABLE_SIZE, INT64_MAX - TABLE_SIZE
_CRC = struct.Struct(">I")
_KEY, _VALUE = itemgetter(1), itemgetter(2)
# encoded header names (see _header_name); bounded, so odd names cannot grow it without end
_HEADER_NAMES: dict[str, bytes] = {}
_HEADER_NAMES_CACHED = 256


def _plain(data: Any) -> Any:
    return bytes(data) if type(data) is memoryview else data


def _bytes_field(data: bytes | bytearray | memoryview | None, what: str) -> list[bytes | Any]:
    if data is None:
        return [_NULL]
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"record {what} must be bytes or None, not {type(data).__name__}")
    data = bytes(data)
    return [encode_varint(len(data)), data]


def _encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None,
                   value: bytes | None, headers: Sequence[Header]) -> bytes:
    """One record, length prefix included; the general path for any field values."""
    parts: list[bytes] = [b"\x00", encode_varlong(timestamp_delta), encode_varint(offset_delta)]
    parts += _bytes_field(key, "key")
    parts += _bytes_field(value, "value")
    parts.append(encode_varint(len(headers)))
    for header in headers:
        name, hvalue = header
        parts.append(_header_name(name))
        parts += _bytes_field(hvalue, f"header {name!r} value")
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def _check_timestamp(ts: int) -> int:
    if not isinstance(ts, int):
        raise TypeError(f"timestamp must be int, not {type(ts).__name__}")
    if not INT64_MIN <= ts <= INT64_MAX:
        raise ValueError(f"timestamp out of int64 range: {ts}")
    return ts


def _header_name(name: str) -> bytes:
    """headerKeyLength + headerKey, cached: tq puts the same few names on every record."""
    try:
        return _HEADER_NAMES[name]
    except KeyError:
        if not isinstance(name, str):
            raise TypeError(f"header key must be str, not {type(name).__name__}") from None
    raw = name.encode()
    encoded = encode_varint(len(raw)) + raw
    if len(_HEADER_NAMES) < _HEADER_NAMES_CACHED:
        _HEADER_NAMES[name] = encoded
    return encoded


def _encode_records(entries: Sequence[Entry], base_ts: int) -> tuple[list[bytes], int]:
    """The records' bytes as parts to join, and the max timestamp."""
    parts: list[bytes] = []
    add = parts.extend
    lengths = VARINT_OF
    offset_null_key = _OFFSET_NULL_KEY
    names = _HEADER_NAMES
    # Outside the safe window a table delta could step past int64; take the general path.
    deltas = _ATTRS_AND_DELTA if _SAFE_TS_MIN <= base_ts <= _SAFE_TS_MAX else {}
    max_ts = base_ts
    i = 0
    # Typed as the fast path below reads them: a None value or header value raises TypeError
    # there (caught: the general encoder takes that record), as a table miss raises KeyError.
    fast = cast("Sequence[tuple[int, bytes | None, bytes, Sequence[tuple[str, bytes]]]]", entries)
    for ts, key, value, headers in fast:
        if ts > max_ts:
            max_ts = ts
        # Any miss (a delta, offset or length beyond the tables, a None value, an uncached
        # header name, a wrong type) raises inside the try; the general encoder then handles or
        # reports it. Parts are added only once the whole record is known.
        try:
            head = deltas[ts - base_ts]
            if not headers:
                if key is None:
                    mid = offset_null_key[i]
                    vlen = lengths[len(value)]
                    add((lengths[len(head) + len(mid) + len(vlen) + len(value) + 1],
                         head, mid, vlen, value, _NO_HEADERS))
                else:
                    mid = lengths[i]
                    klen = lengths[len(key)]
                    vlen = lengths[len(value)]
                    add((lengths[len(head) + len(mid) + len(klen) + len(key) + len(vlen)
                                 + len(value) + 1],
                         head, mid, klen, key, vlen, value, _NO_HEADERS))
            elif len(headers) == 1 and key is None:
                # one header and no key: what tq writes (a TIME_HEADER on every record)
                ((name, hvalue),) = headers
                mid = offset_null_key[i]
                vlen = lengths[len(value)]
                hname = names[name]
                hlen = lengths[len(hvalue)]
                add((lengths[len(head) + len(mid) + len(vlen) + len(value) + 1 + len(hname)
                             + len(hlen) + len(hvalue)],
                     head, mid, vlen, value, _ONE_HEADER, hname, hlen, hvalue))
            else:
                tail = [lengths[len(headers)]]
                more = tail.extend
                for name, hvalue in headers:
                    if hvalue is None:
                        more((names[name], _NULL))
                    else:
                        more((names[name], lengths[len(hvalue)], hvalue))
                if key is None:
                    fields: tuple[bytes, ...] = (head, offset_null_key[i], lengths[len(value)],
                                                 value)
                else:
                    fields = (head, lengths[i], lengths[len(key)], key, lengths[len(value)],
                              value)
                size = sum(map(len, fields)) + sum(map(len, tail))
                add((lengths[size],))
                add(fields)
                add(tail)
            i += 1
            continue
        except (KeyError, IndexError, TypeError):
            pass
        delta = wrap_int64(_check_timestamp(ts) - base_ts)
        parts.append(_encode_record(i, delta, key, value, headers))
        i += 1
    return parts, max_ts


def encode_batch(
    entries: Sequence[Entry],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = -1,
) -> bytes:
    """Encode entries (timestamp_ms, key, value, headers) as one RecordBatch v2.

    Offset deltas are 0..n-1; baseTimestamp is the first entry's timestamp and maxTimestamp the
    largest. Compressed batches are sent compressed even when that is larger (the attributes say
    what the body is, so either is valid; we keep what was asked for).

    Keys, values and header values are bytes or None (a bytearray, or a memoryview of bytes,
    is accepted too). Raises ValueError for no entries, a timestamp or header field out of its
    range, or a batch above MAX_BATCH_SIZE; TypeError for keys, values or header values that are
    not bytes.
    """
    if not entries:
        raise ValueError("a record batch needs at least one record")
    if memoryview in set(map(type, map(_VALUE, entries))) \
            or memoryview in set(map(type, map(_KEY, entries))):
        # The hot loop takes len() as the byte size, which a memoryview of wider items breaks.
        entries = [(ts, _plain(key), _plain(value), headers)
                   for ts, key, value, headers in entries]
    base_ts = _check_timestamp(entries[0][0])
    parts, max_ts = _encode_records(entries, base_ts)
    return _batch(b"".join(parts), len(entries), base_ts, _check_timestamp(max_ts),
                  base_offset=base_offset, compression=compression,
                  timestamp_type=timestamp_type, producer_id=producer_id,
                  producer_epoch=producer_epoch, base_sequence=base_sequence,
                  is_transactional=is_transactional, is_control=is_control,
                  partition_leader_epoch=partition_leader_epoch)


def _batch(records: bytes | list[bytes | bytearray], count: int, base_ts: int, max_ts: int,
           *, base_offset: int = 0,
           compression: Compression = Compression.NONE,
           timestamp_type: TimestampType = TimestampType.CREATE_TIME, producer_id: int = -1,
           producer_epoch: int = -1, base_sequence: int = -1, is_transactional: bool = False,
           is_control: bool = False, partition_leader_epoch: int = -1) -> bytes:
    """The batch header (CRC included) before the records' bytes. Records given as a few large
    parts (the run encoder's) are joined once, with the header: a batch of a megabyte costs one
    copy, not two (fresh megabyte buffers are slow to fill)."""
    codec = Compression(compression)
    parts = records if isinstance(records, list) else [records]
    if codec:
        parts = [compress(codec, b"".join(parts))]
    size = HEADER_SIZE + sum(map(len, parts))
    if size - LOG_OVERHEAD > MAX_BATCH_SIZE:
        raise ValueError(f"batch of {size} bytes exceeds MAX_BATCH_SIZE ({MAX_BATCH_SIZE})")
    attributes = codec | (TIMESTAMP_TYPE_BIT if timestamp_type else 0) \
        | (TRANSACTIONAL_BIT if is_transactional else 0) | (CONTROL_BIT if is_control else 0)
    try:
        header = bytearray(HEADER.pack(
            base_offset, size - LOG_OVERHEAD, partition_leader_epoch, 2, 0, attributes,
            count - 1, base_ts, max_ts, producer_id, producer_epoch, base_sequence, count))
    except struct.error as exc:
        raise ValueError(f"batch header field out of range: {exc}") from exc
    crc = crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:])
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    _CRC.pack_into(header, CRC_OFFSET, crc)
    return b"".join([header, *parts])
