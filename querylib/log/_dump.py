"""What `tq log dump` shows: the batches and records of a segment file, like kafka-dump-log.

Yields one dict per batch, record, index entry or problem, with kafka-dump-log's field names;
the CLI renders them as text or JSON lines. Reads the file as it is, validating nothing
beyond reporting each batch's CRC as `isvalid` and stopping at bytes that do not parse. The
segment is walked by the log's read-only reader (`_reader.segment_batches`, Spark's local reads
use the same module). Never writes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

from catalog.errors import UserError
from querylib.errors import CorruptRecordError, RecordError
from querylib.log._batch import describe, pread_exact
from querylib.log._config import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, parse_segment_name
from querylib.log._reader import Unreadable, segment_batches
from querylib.records import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    control_of,
    decode_batch,
    verify_batch,
)

_BLOCK = 8 * 1024 * 1024
_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_INDEX_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")

Row = dict[str, Any]


def dump_segment(path: str | os.PathLike[str], *, records: bool = False) -> Iterator[Row]:
    """Rows describing a `.log` segment (its batches, and with `records` every record), an
    `.index` or `.timeindex` file, or every segment of a partition directory. Raises UserError
    for a path that is missing or not one of those."""
    path = os.fspath(path)
    if os.path.isdir(path):
        logs = sorted(
            (p[0], name) for name in os.listdir(path)
            if (p := parse_segment_name(name)) is not None and p[1] == LOG_SUFFIX)
        if not logs:
            raise UserError(f"{path}: no segment files (<20-digit offset>.log) in this directory")
        for _, name in logs:
            yield from _dump_log(os.path.join(path, name), records)
        return
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file")
    if path.endswith(LOG_SUFFIX):
        yield from _dump_log(path, records)
    elif path.endswith(INDEX_SUFFIX):
        yield from _dump_index(path)
    elif path.endswith(TIME_INDEX_SUFFIX):
        yield from _dump_time_index(path)
    else:
        raise UserError(
            f"{path}: not a segment file; pass a .log, .index or .timeindex file or a "
            "partition directory")


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from exc


def _base_offset(path: str) -> int | None:
    parsed = parse_segment_name(os.path.basename(path))
    return parsed[0] if parsed else None


def _dump_log(path: str, records: bool) -> Iterator[Row]:
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        yield {"type": "segment", "path": path, "baseOffset": _base_offset(path), "size": size}
        for item in segment_batches(fd, size):
            if isinstance(item, Unreadable):
                yield _invalid(item.position, size, item.reason)
                return
            try:
                verify_batch(item.data)
                valid = True
            except CorruptRecordError:
                valid = False
            yield _batch_row(item.header, item.position, valid)
            if records:
                yield from _record_rows(bytes(item.data), item.header)
    finally:
        os.close(fd)


def _invalid(pos: int, size: int, reason: str) -> Row:
    return {"type": "invalid", "position": pos, "invalidBytes": size - pos, "reason": reason}


def _timestamp_key(attributes: int) -> str:
    return "LogAppendTime" if attributes & TIMESTAMP_TYPE_BIT else "CreateTime"


def _batch_row(h: BatchHeader, pos: int, valid: bool) -> Row:
    return {
        "type": "batch",
        "baseOffset": h.base_offset,
        "lastOffset": h.base_offset + h.last_offset_delta,
        "count": h.records_count,
        "baseSequence": h.base_sequence,
        "lastSequence": (h.base_sequence + h.last_offset_delta if h.base_sequence >= 0 else -1),
        "producerId": h.producer_id,
        "producerEpoch": h.producer_epoch,
        "partitionLeaderEpoch": h.partition_leader_epoch,
        "isTransactional": bool(h.attributes & TRANSACTIONAL_BIT),
        "isControl": bool(h.attributes & CONTROL_BIT),
        "position": pos,
        _timestamp_key(h.attributes): h.max_timestamp,
        "size": h.size,
        "magic": h.magic,
        "compresscodec": _CODECS.get(h.attributes & COMPRESSION_MASK,
                                    f"unknown({h.attributes & COMPRESSION_MASK})"),
        "crc": h.crc,
        "isvalid": valid,
    }


def render_bytes(data: bytes | None) -> str | None:
    """UTF-8 text when the bytes are printable text, else Python's repr of the bytes."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return repr(data)
    return text if text.isprintable() else repr(data)


def _record_rows(data: bytes, header: BatchHeader) -> Iterator[Row]:
    try:
        batch = decode_batch(data, 0, verify_crc=False)
    except RecordError as exc:
        yield {"type": "invalid", "baseOffset": header.base_offset, "reason": describe(exc)}
        return
    key = _timestamp_key(header.attributes)
    for i, record in enumerate(batch.records):
        row: Row = {
            "type": "record",
            "offset": record.offset,
            key: record.timestamp,
            "keySize": -1 if record.key is None else len(record.key),
            "valueSize": -1 if record.value is None else len(record.value),
            "sequence": header.base_sequence + i if header.base_sequence >= 0 else -1,
            "headerKeys": [k for k, _ in record.headers],
            "key": render_bytes(record.key),
            "payload": render_bytes(record.value),
            "headers": {k: render_bytes(v) for k, v in record.headers},
        }
        if header.attributes & CONTROL_BIT:
            try:
                kind, value = control_of(record)
            except RecordError as exc:
                row["controlType"] = f"invalid: {describe(exc)}"
            else:
                row["controlType"] = getattr(kind, "name", str(kind))
                if value is not None and len(value) == 8:
                    row["controlValue"] = int.from_bytes(value, "big", signed=True)
        yield row


def _entries(path: str, entry: struct.Struct, kind: str) -> Iterator[Row]:
    """A header row, then each whole entry, read a block at a time; a partial last entry is
    reported as invalid."""
    base = _base_offset(path) or 0
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        yield {"type": kind, "path": path, "baseOffset": base, "entries": size // entry.size}
        block = (_BLOCK // entry.size) * entry.size
        whole = size - size % entry.size
        for pos in range(0, whole, block):
            data = pread_exact(fd, min(block, whole - pos), pos)
            for fields in entry.iter_unpack(data[: len(data) - len(data) % entry.size]):
                yield _entry_row(kind, base, fields)
        if size % entry.size:
            yield _invalid(whole, size, "partial entry at the end")
    finally:
        os.close(fd)


def _entry_row(kind: str, base: int, fields: tuple[int, int]) -> Row:
    if kind == "index":
        rel, position = fields
        return {"type": "indexEntry", "offset": base + rel, "position": position}
    timestamp, rel = fields
    return {"type": "timeIndexEntry", "timestamp": timestamp, "offset": base + rel}


def _dump_index(path: str) -> Iterator[Row]:
    return _entries(path, _INDEX_ENTRY, "index")


def _dump_time_index(path: str) -> Iterator[Row]:
    return _entries(path, _TIME_ENTRY, "timeindex")
