"""Errors raised by querylib, below catalog's `TqError` root.

    TqError (catalog.errors)
    ├── UserError
    │   └── DataDirInUseError           another running process holds this data directory
    ├── ProtocolError
    │   └── RecordError                 a record batch or message set we cannot accept
    │       ├── CorruptRecordError      CRC mismatch                    (Kafka CORRUPT_MESSAGE)
    │       ├── TruncatedRecordError    fewer bytes than the format says
    │       ├── InvalidLengthError      a length outside its bounds
    │       ├── UnsupportedMagicError   magic other than 0, 1, 2
    │       ├── BadVarintError          a varint longer than its type or cut short
    │       ├── CompressionError        compressed payload that does not decompress
    │       └── InvalidRecordError      readable fields that together make no valid record
    └── StorageError
        ├── OffsetOutOfRangeError       read below log start or above log end
        ├── LogClosedError              use of a closed log
        ├── LogLockedError              the log is open elsewhere (a running broker)
        └── CorruptDataError            offsets whose stored bytes are damaged (CORRUPT_MESSAGE)
            └── QuarantinedDataError    ... whose bytes `tq log repair` moved aside
"""

from __future__ import annotations

from catalog.errors import CatalogError, ProtocolError, StorageError, TqError, UserError

__all__ = [
    "BadVarintError",
    "CatalogError",
    "CompressionError",
    "CorruptDataError",
    "CorruptRecordError",
    "DataDirInUseError",
    "InvalidLengthError",
    "InvalidRecordError",
    "LogClosedError",
    "LogLockedError",
    "OffsetOutOfRangeError",
    "ProtocolError",
    "QuarantinedDataError",
    "RecordError",
    "StorageError",
    "TqError",
    "TruncatedRecordError",
    "UnsupportedMagicError",
    "UserError",
]


class DataDirInUseError(UserError):
    """Another running process holds this data directory; the message names it (pid and
    command line) and says what to do."""


class RecordError(ProtocolError):
    """Bytes that claim to be a record batch (or legacy message set) but cannot be accepted."""

    kafka_error_code = 2  # CORRUPT_MESSAGE


class CorruptRecordError(RecordError):
    """The stored CRC does not match the bytes."""


class TruncatedRecordError(RecordError):
    """The buffer ends before the length the format declares."""


class InvalidLengthError(RecordError):
    """A length field is negative or larger than any batch we accept."""

    kafka_error_code = 87  # INVALID_RECORD


class UnsupportedMagicError(RecordError):
    """A magic byte other than 0, 1 or 2."""

    kafka_error_code = 2


class BadVarintError(RecordError):
    """A varint that runs past its maximum width or past the end of the buffer."""


class CompressionError(RecordError):
    """A compressed payload that does not decompress, or an unknown codec id."""


class InvalidRecordError(RecordError):
    """Fields that each parse but together are not a valid record: bytes left over in a record,
    a header key that is not UTF-8, a compressed message inside a compressed message, a control
    record whose key is not Kafka's 4-byte (version, type)."""

    kafka_error_code = 87  # INVALID_RECORD


class OffsetOutOfRangeError(StorageError):
    """An offset below the log start offset or beyond the log end offset."""

    kafka_error_code = 1  # OFFSET_OUT_OF_RANGE


class LogClosedError(StorageError):
    """The log was closed."""


class LogLockedError(StorageError):
    """The partition's log is open in another PartitionLog or process (a running broker
    holds its lock): stop that first."""

    exit_code = 2


class CorruptDataError(StorageError):
    """Offsets of a partition whose stored bytes failed their checks (a CRC mismatch, bytes
    that are no batch, offsets missing): reads of them fail until `tq log repair`, while the
    offsets before and after stay readable. `start_offset`..`end_offset - 1` is the damaged
    range; a reader that gives those records up goes on from `end_offset`."""

    kafka_error_code = 2  # CORRUPT_MESSAGE
    # Sent with RPC error replies (querylib.rpc error_body); the defaults stand for what a
    # reply did not carry.
    wire_attributes = ("topic", "partition", "start_offset", "end_offset", "path")
    topic: str = ""
    partition: int = -1
    start_offset: int = -1
    end_offset: int = -1
    path: str = ""

    def __init__(self, message: str, *, topic: str = "", partition: int = -1,
                 start_offset: int = -1, end_offset: int = -1, path: str = "") -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.path = path


class QuarantinedDataError(CorruptDataError):
    """Damaged offsets that `tq log repair` quarantined: their bytes left the segment (for a
    `.corrupt-*` file beside it), so the offsets are a gap. Kafka clients step over it (they
    tolerate offset gaps, as after compaction); tq readers, which expect gapless offsets, get
    this error and must be told to go on from `end_offset`."""
