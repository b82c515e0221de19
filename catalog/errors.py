"""The root of tq's exception hierarchy.

It lives in `catalog` because every other package may import `catalog` and `catalog` imports no
other tq package. Classes carry traits (`retriable`, `kafka_error_code`, `exit_code`) so callers
branch on attributes, never on message strings.

    TqError
    ├── UserError              bad arguments or configuration: one line, non-zero exit
    ├── ProtocolError          a peer sent bytes we cannot accept (subclasses per format)
    ├── StorageError           the local log or its files
    └── CatalogError           a catalog command broke an invariant
"""

from __future__ import annotations


class TqError(Exception):
    """Root of every error tq raises on purpose. A traceback of anything else is a bug."""

    retriable: bool = False
    kafka_error_code: int = -1  # UNKNOWN_SERVER_ERROR
    exit_code: int = 1


class UserError(TqError):
    """The user asked for something that cannot be done; the message says what to do instead."""

    exit_code = 2


class ProtocolError(TqError):
    """The peer broke a protocol (bad bytes, bad lengths, bad state). Not our bug."""

    kafka_error_code = 42  # INVALID_REQUEST


class StorageError(TqError):
    """Local storage failed or holds something we cannot use."""

    kafka_error_code = 56  # KAFKA_STORAGE_ERROR


class CatalogError(TqError):
    """A catalog command was refused because it would break an invariant."""

    exit_code = 2
