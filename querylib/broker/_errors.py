"""Errors the broker answers with, below the querylib hierarchy (querylib/errors.py).

    TqError
    ├── UserError
    │   ├── UnknownPartitionError    no such partition here (create it, or check the name)
    │   ├── PartitionBusyError       a partition to drop still has appends or reads in flight
    │   └── InvalidTopicError        a topic name the broker cannot host
    ├── ProtocolError
    │   └── BrokerProtocolError      the client broke the broker's rules (state, credit, limits)
    │       ├── UnknownSessionError  no live session with that id (lease expired): reopen
    │       ├── CreditExceededError  a producer sent beyond its window / a grant beyond the limit
    │       ├── NotProducerError     produce/advance/end without OpenProducer on that partition
    │       ├── DuplicateSequenceError   a batch appended before, its offsets forgotten
    │       └── OutOfOrderSequenceError  an idempotent producer's batch after a gap
    ├── StorageError (OffsetOutOfRangeError lives in querylib.errors)
    └── BrokerUnavailableError       a client gave up reaching its broker (after a bounded time)

The classes carry traits; clients branch on them (`retriable`), never on message strings.
"""

from __future__ import annotations

from catalog.errors import ProtocolError, TqError, UserError

__all__ = [
    "BrokerProtocolError",
    "BrokerUnavailableError",
    "CreditExceededError",
    "DuplicateSequenceError",
    "InvalidTopicError",
    "NotProducerError",
    "OutOfOrderSequenceError",
    "PartitionBusyError",
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


class DuplicateSequenceError(BrokerProtocolError):
    """An idempotent producer sent a batch the partition appended before, too long ago for the
    broker to remember its offsets. Stored once: a producer counts it as acknowledged."""

    kafka_error_code = 46  # DUPLICATE_SEQUENCE_NUMBER


class OutOfOrderSequenceError(BrokerProtocolError):
    """An idempotent producer's batch does not follow its last appended one: batches arrived
    out of order (or records the broker acknowledged were lost with an unsynced disk)."""

    kafka_error_code = 45  # OUT_OF_ORDER_SEQUENCE_NUMBER


class BrokerUnavailableError(TqError):
    """A producer or subscriber kept trying to reach its broker (the address it had, and any
    address the catalog gave it since) for its whole reconnect timeout, and gave up."""

    retriable = True
