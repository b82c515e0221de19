"""Errors the broker answers with, below the querylib hierarchy (querylib/errors.py).

    TqError
    ├── UserError
    │   ├── UnknownPartitionError    no such partition here (create it, or check the name)
    │   ├── PartitionBusyError       a partition to drop still has appends or reads in flight
    │   ├── InvalidTopicError        a topic name the broker cannot host
    │   └── StaleIncarnationError    the partition here belongs to a newer topic of that name
    ├── ProtocolError
    │   └── BrokerProtocolError      the client broke the broker's rules (state, credit, limits)
    │       ├── UnknownSessionError  no live session with that id (lease expired): reopen
    │       ├── CreditExceededError  a producer sent beyond its window / a grant beyond the limit
    │       └── NotProducerError     produce/advance/end without OpenProducer on that partition
    └── StorageError (OffsetOutOfRangeError lives in querylib.errors)

The classes carry traits; clients branch on them (`retriable`), never on message strings.
"""

from __future__ import annotations

from catalog.errors import ProtocolError, UserError

__all__ = [
    "BrokerProtocolError",
    "CreditExceededError",
    "InvalidTopicError",
    "NotProducerError",
    "PartitionBusyError",
    "StaleIncarnationError",
    "UnknownPartitionError",
    "UnknownSessionError",
]


class UnknownPartitionError(UserError):
    """The broker does not host that partition (ask with create=True to create it)."""

    kafka_error_code = 3  # UNKNOWN_TOPIC_OR_PARTITION
    retriable = True


class PartitionBusyError(UserError):
    """A partition cannot be dropped while appends or disk reads on it are in flight; they
    finish within moments, so asking again succeeds."""

    retriable = True


class InvalidTopicError(UserError):
    """A topic name the broker cannot turn into a directory name."""

    kafka_error_code = 17  # INVALID_TOPIC_EXCEPTION


class StaleIncarnationError(UserError):
    """The client asked for a partition of an older topic of that name than the one whose
    directory the broker holds: its view of the catalog is out of date (or the catalog is
    older than the broker's data)."""

    kafka_error_code = 3  # UNKNOWN_TOPIC_OR_PARTITION


class BrokerProtocolError(ProtocolError):
    """The client broke one of the broker's rules."""


class UnknownSessionError(BrokerProtocolError):
    """No live session with this id: it expired or the broker restarted. Open a new one and
    re-establish producers and subscriptions."""

    retriable = True


class CreditExceededError(BrokerProtocolError):
    """A producer sent with its window exhausted, or a subscriber granted beyond the maximum."""

    kafka_error_code = 89  # THROTTLING_QUOTA_EXCEEDED


class NotProducerError(BrokerProtocolError):
    """Produce, advance or end on a partition the session has not opened as a producer."""
