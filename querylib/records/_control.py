"""tq's conventions on top of Kafka's record format: control records and header names.

Control batches (attributes bit 5) hold records whose key is Kafka's control key:
    version  int16  0
    type     int16  0 ABORT, 1 COMMIT (Kafka transactions); 2-4 Kafka's KRaft markers;
                    100 FRONTIER, 101 END_OF_STREAM, 102 REOPEN (tq's; Kafka clients skip
                    control batches)
tq's control batches have producerId -1 and are not transactional, so Kafka consumers in
read_committed mode never take them for transaction markers. Transaction markers (ABORT,
COMMIT) are Kafka's: transactional control batches of the transaction's producer. A FRONTIER
record's value is the new frontier as int64 big-endian, followed by the stream's epoch as int64
when that is not 0; END_OF_STREAM records have a null value. A REOPEN record says the stream
goes on after an END_OF_STREAM (that end is superseded): with a null value it goes on from its
frontier, with an int64 value E a new epoch E starts there, its frontier back at 0 (a run of
the stream's publisher after an earlier one, DESIGN §5 "Epochs").

tq's own per-record fields travel as headers with 8-byte big-endian int64 values: TIME_HEADER
(the logical timestamp) and DIFF_HEADER (the multiplicity, for collection topics). A record
whose only header is TIME_HEADER ends with the bytes TIME_HEADER_PREFIX and the 8 value bytes.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from querylib.errors import InvalidRecordError
from querylib.records._encode import encode_batch
from querylib.records._header import read_header
from querylib.records._types import CONTROL_BIT, TRANSACTIONAL_BIT, Record

TIME_HEADER = "tq.time"
DIFF_HEADER = "tq.diff"
# A record's headers when they are exactly the TIME_HEADER, as tq writes them on every record:
# headersCount 1, headerKeyLength 7, "tq.time", headerValueLength 8; the 8 value bytes follow
# and end the record (TIME_HEADER_SIZE bytes in all). Readers recognise it by one comparison.
TIME_HEADER_PREFIX = b"\x02\x0e" + TIME_HEADER.encode() + b"\x10"
TIME_HEADER_SIZE = len(TIME_HEADER_PREFIX) + 8

CONTROL_KEY_VERSION = 0
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_INT64 = struct.Struct(">q")
_INT64_PAIR = struct.Struct(">qq")  # a FRONTIER value with its epoch


class ControlType(IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    FRONTIER = 100
    END_OF_STREAM = 101
    REOPEN = 102


def encode_int64(n: int) -> bytes:
    """The 8-byte big-endian form tq uses for int64 header and control values."""
    try:
        return _INT64.pack(n)
    except struct.error as exc:
        raise ValueError(f"not an int64: {n!r}") from exc


def decode_int64(value: bytes | None) -> int:
    """Inverse of encode_int64; InvalidRecordError unless value is exactly 8 bytes."""
    if value is None or len(value) != 8:
        raise InvalidRecordError(f"expected an 8-byte int64, got {value!r:.40}")
    return _INT64.unpack(value)[0]


def control_key(kind: ControlType) -> bytes:
    return _CONTROL_KEY.pack(CONTROL_KEY_VERSION, kind)


def frontier_batch(frontier: int, *, timestamp: int, epoch: int = 0) -> bytes:
    """A control batch of one FRONTIER record: the partition's frontier is now `frontier`,
    in epoch `epoch`."""
    value = encode_int64(frontier) + (encode_int64(epoch) if epoch else b"")
    return encode_batch([(timestamp, control_key(ControlType.FRONTIER), value, ())],
                        is_control=True)


def end_of_stream_batch(*, timestamp: int) -> bytes:
    """A control batch of one END_OF_STREAM record: no more data will follow."""
    return encode_batch([(timestamp, control_key(ControlType.END_OF_STREAM), None, ())],
                        is_control=True)


def reopen_batch(*, timestamp: int, epoch: int = 0) -> bytes:
    """A control batch of one REOPEN record: the stream that ended goes on from its frontier,
    or with `epoch`, a new epoch starts (frontier 0)."""
    value = encode_int64(epoch) if epoch else None
    return encode_batch([(timestamp, control_key(ControlType.REOPEN), value, ())],
                        is_control=True)


_MARKER_VALUE = struct.Struct(">hi")  # EndTransactionMarker: version 0, coordinator epoch


def transaction_marker_batch(producer_id: int, epoch: int, commit: bool, *,
                             timestamp: int) -> bytes:
    """A Kafka transaction marker: a transactional control batch of the producer holding one
    COMMIT or ABORT record (Kafka's EndTransactionMarker value: version 0, coordinator
    epoch 0)."""
    kind = ControlType.COMMIT if commit else ControlType.ABORT
    return encode_batch([(timestamp, control_key(kind), _MARKER_VALUE.pack(0, 0), ())],
                        producer_id=producer_id, producer_epoch=epoch, is_transactional=True,
                        is_control=True)


def without_aborted(data: bytes, aborted: list[tuple[int, int, int]]) -> bytes:
    """`data` (whole batches) without the batches of the aborted Kafka transactions in
    `aborted`, (producer id, first offset, marker offset) each: the transactional data
    batches of that producer from its first offset up to its marker. `data` itself when none
    is there."""
    if not aborted:
        return data
    kept: list[bytes] = []
    pos = taken = 0
    view = memoryview(data)
    while pos < len(data):
        header = read_header(data, pos)
        following = pos + header.size
        attributes = header.attributes
        if (attributes & TRANSACTIONAL_BIT and not attributes & CONTROL_BIT
                and any(pid == header.producer_id and first <= header.base_offset < marker
                        for pid, first, marker in aborted)):
            kept.append(bytes(view[taken:pos]))
            taken = following
        pos = following
    if taken == 0:
        return data
    kept.append(bytes(view[taken:]))
    return b"".join(kept)


def control_of(record: Record) -> tuple[ControlType, bytes | None]:
    """The control type and raw value of a record from a control batch.

    As Java's ControlRecordType.parse: the key holds at least version and type; a version above
    0 is read with the same layout. Raises InvalidRecordError for a short key, a negative version
    or a type this code does not know.
    """
    key = record.key
    if key is None or len(key) < _CONTROL_KEY.size:
        raise InvalidRecordError(f"control record at offset {record.offset}: key {key!r:.40} "
                                 f"is not a 4-byte (version, type)")
    version, kind = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise InvalidRecordError(f"control record at offset {record.offset}: version {version}")
    try:
        return ControlType(kind), record.value
    except ValueError as exc:
        raise InvalidRecordError(
            f"control record at offset {record.offset}: unknown type {kind}") from exc


def frontier_of(record: Record) -> int:
    """The frontier a FRONTIER control record announces."""
    kind, value = control_of(record)
    if kind != ControlType.FRONTIER:
        raise InvalidRecordError(f"record at offset {record.offset} is {kind.name}, not FRONTIER")
    return decode_frontier(value)[0]


def decode_frontier(value: bytes | None) -> tuple[int, int]:
    """(frontier, epoch) of a FRONTIER record's value: 8 bytes (epoch 0) or 16."""
    if value is not None and len(value) == 16:
        frontier, epoch = _INT64_PAIR.unpack(value)
        if epoch < 0:
            raise InvalidRecordError(f"FRONTIER record with epoch {epoch}")
        return frontier, epoch
    return decode_int64(value), 0


def decode_reopen(value: bytes | None) -> int:
    """The epoch a REOPEN record's value starts: 0 (null: the stream goes on) or E > 0."""
    if value is None:
        return 0
    epoch = decode_int64(value)
    if epoch <= 0:
        raise InvalidRecordError(f"REOPEN record with epoch {epoch}")
    return epoch
