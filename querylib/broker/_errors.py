"""Errors the broker answers with, below the querylib hierarchy (querylib/errors.py). The
Kafka endpoint answers with the same classes where the meaning is the same (querylib.kafka
re-exports the partition, topic and producer-sequence ones).

    TqError
    ├── UserError
    │   ├── UnknownPartitionError    no such partition here (create it, or check the name)
    │   ├── PartitionNotHereError    the directory places the partition on another broker
    │   ├── PartitionBusyError       a partition to drop still has appends or reads in flight
    │   ├── InvalidTopicError        a topic name the broker cannot host
    │   ├── StaleIncarnationError    the partition here belongs to a newer topic of that name
    │   ├── TopicAuthorizationError  the topic's writers rule does not admit the principal
    │   ├── NotLeaderOrFollowerError this broker does not lead the replicated partition (now)
    │   ├── (FencedLeaderEpochError: the catalog's, a ConflictError; re-exported here)
    │   ├── UnknownLeaderEpochError  a leader epoch newer than the broker knows (yet)
    │   ├── NotEnoughReplicasError   fewer in-sync replicas than the topic's min.insync.replicas
    │   └── StreamEndedError         the partition's stream ended; its owner may reopen it
    ├── ProtocolError
    │   └── BrokerProtocolError      the client broke the broker's rules (state, credit, limits)
    │       ├── UnknownBrokerSessionError  no live broker session with that id: reopen
    │       │                        (the coordinator's sessions: catalog's UnknownSessionError)
    │       ├── CreditExceededError  a producer sent beyond its window / a grant beyond the limit
    │       ├── NotProducerError     produce/advance/end without OpenProducer on that partition
    │       ├── BatchTooLargeError   a batch above the broker's maximum size
    │       ├── BrokerClosedError    the broker is shutting down (in-process callers)
    │       ├── PrincipalError       a principal that is malformed, or not for this transport
    │       ├── DuplicateSequenceError   a batch appended before, its offsets forgotten
    │       ├── OutOfOrderSequenceError  an idempotent producer's batch after a gap
    │       └── InvalidProducerEpochError  a producer's batch of an epoch older than one the
    │                                partition saw (a newer epoch or a transaction marker)
    ├── StorageError (OffsetOutOfRangeError lives in querylib.errors)
    └── BrokerUnavailableError       a client gave up reaching its broker (after a bounded time)

The classes carry traits; clients branch on them (`retriable`), never on message strings.
"""

from __future__ import annotations

from catalog.errors import FencedLeaderEpochError, ProtocolError, TqError, UserError

__all__ = [
    "BatchTooLargeError",
    "BrokerClosedError",
    "BrokerProtocolError",
    "BrokerUnavailableError",
    "CreditExceededError",
    "DuplicateSequenceError",
    "FencedLeaderEpochError",
    "InvalidProducerEpochError",
    "InvalidTopicError",
    "NotEnoughReplicasError",
    "NotLeaderOrFollowerError",
    "NotProducerError",
    "OutOfOrderSequenceError",
    "PartitionBusyError",
    "PartitionNotHereError",
    "PrincipalError",
    "StaleIncarnationError",
    "StreamEndedError",
    "TopicAuthorizationError",
    "UnknownBrokerSessionError",
    "UnknownLeaderEpochError",
    "UnknownPartitionError",
]


class UnknownPartitionError(UserError):
    """The broker does not host that partition (ask with create=True to create it)."""

    kafka_error_code = 3  # UNKNOWN_TOPIC_OR_PARTITION
    retriable = True


class PartitionNotHereError(UserError):
    """The broker's directory places the partition on another broker: write it there (Kafka
    clients refresh their metadata and do)."""

    kafka_error_code = 6  # NOT_LEADER_OR_FOLLOWER
    retriable = True


class TopicAuthorizationError(UserError):
    """The topic's writers rule does not admit the session's principal: a query's topic is
    written by that query, a `__` topic by tq itself; ingest topics admit anyone."""

    kafka_error_code = 29  # TOPIC_AUTHORIZATION_FAILED


class NotLeaderOrFollowerError(UserError):
    """The broker is not the leader of the replicated partition at the epoch asked for (or not
    one of its replicas): locate its leader in the catalog again and retry there."""

    kafka_error_code = 6  # NOT_LEADER_OR_FOLLOWER
    retriable = True


class UnknownLeaderEpochError(UserError):
    """A request named a leader epoch newer than this broker's role: the catalog moved on and
    the broker has not heard yet; the client retries (Kafka's UNKNOWN_LEADER_EPOCH)."""

    kafka_error_code = 76  # UNKNOWN_LEADER_EPOCH
    retriable = True


class NotEnoughReplicasError(UserError):
    """The partition has fewer in-sync replicas than the topic's min.insync.replicas, so the
    produce was refused and nothing appended."""

    kafka_error_code = 19  # NOT_ENOUGH_REPLICAS
    retriable = True


class StreamEndedError(UserError):
    """The partition's stream ended (end-of-stream is in its log): nothing more may be written
    unless a writer the topic admits reopens it explicitly (`reopen`). POLICY_VIOLATION is
    Kafka's nearest code: the request is well formed, the topic's state forbids it, and no
    retry can help (Kafka has no code for a closed partition)."""

    kafka_error_code = 44  # POLICY_VIOLATION


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


class UnknownBrokerSessionError(BrokerProtocolError):
    """No live session with this id on this broker: it expired or the broker restarted. Open a
    new one and re-establish producers and subscriptions. (Not the coordinator's
    `catalog.errors.UnknownSessionError`: a broker session is a client's link to one broker.)"""

    retriable = True


class CreditExceededError(BrokerProtocolError):
    """A producer sent with its window exhausted, or a subscriber granted beyond the maximum."""

    kafka_error_code = 89  # THROTTLING_QUOTA_EXCEEDED


class NotProducerError(BrokerProtocolError):
    """Produce, advance or end on a partition the session has not opened as a producer."""


class BatchTooLargeError(BrokerProtocolError):
    """A record batch larger than the broker's maximum (`BrokerLimits.max_batch_bytes`)."""

    kafka_error_code = 10  # MESSAGE_TOO_LARGE


class BrokerClosedError(BrokerProtocolError):
    """The broker was closed: it takes no more requests (its in-process port says so; RPC
    clients find nobody answering)."""

    retriable = True


class PrincipalError(BrokerProtocolError):
    """A session's principal that is not well formed, that changes for a live session, or that
    this transport may not claim ("system" is for tq's writers in the broker's own process)."""


class DuplicateSequenceError(BrokerProtocolError):
    """An idempotent producer sent a batch the partition appended before, too long ago for the
    broker to remember its offsets. Stored once: a producer counts it as acknowledged."""

    kafka_error_code = 46  # DUPLICATE_SEQUENCE_NUMBER


class OutOfOrderSequenceError(BrokerProtocolError):
    """An idempotent producer's batch does not follow its last appended one: batches arrived
    out of order (or records the broker acknowledged were lost with an unsynced disk)."""

    kafka_error_code = 45  # OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(BrokerProtocolError):
    """A producer's batch of an epoch older than one the partition has seen for that producer
    id: an idempotent producer's newer epoch, or (for a transactional batch) the epoch of the
    partition's last transaction marker of that producer; a newer producer of its
    transactional id (or a timeout) fenced it."""

    kafka_error_code = 47  # INVALID_PRODUCER_EPOCH


class BrokerUnavailableError(TqError):
    """A producer or subscriber kept trying to reach its broker (the address it had, and any
    address the catalog gave it since) for its whole reconnect timeout, and gave up."""

    retriable = True
