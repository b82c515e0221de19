"""Errors raised by querylib, below catalog's `TqError` root.

    TqError (catalog.errors)
    ├── UserError
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
        └── LogClosedError              use of a closed log
"""

from __future__ import annotations

from catalog.errors import CatalogError, ProtocolError, StorageError, TqError, UserError

__all__ = [
    "BadVarintError",
    "CatalogError",
    "CompressionError",
    "CorruptRecordError",
    "InvalidLengthError",
    "InvalidRecordError",
    "LogClosedError",
    "OffsetOutOfRangeError",
    "ProtocolError",
    "RecordError",
    "StorageError",
    "TqError",
    "TruncatedRecordError",
    "UnsupportedMagicError",
    "UserError",
]


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
