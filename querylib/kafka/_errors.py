"""Errors of the Kafka endpoint, and the one place a tq exception becomes a Kafka error code.

    TqError (catalog.errors)
    ├── UserError
    │   └── ListenError                the listener cannot bind its address (in use, denied)
    ├── ProtocolError
    │   └── KafkaProtocolError         the client broke the framing: its connection is closed
    │       ├── FrameTooLargeError     a frame longer than the listener accepts
    │       ├── MalformedRequestError  a body that does not decode for its api key and version
    │       └── UnsupportedRequestError  an api key or version the listener did not advertise
    └── KafkaRequestError              a well-framed request refused with a Kafka error code
        ├── NotLeaderError, UnknownPartitionError, InvalidTopicError, InvalidRequiredAcksError
        ├── OutOfOrderSequenceError, DuplicateSequenceError, InvalidProducerEpochError
        ├── TransactionsNotSupportedError
        ├── ProducerFencedError, InvalidProducerIdMappingError, InvalidTxnStateError,
        │   ConcurrentTransactionsError, InvalidTransactionTimeoutError,
        │   TransactionalIdAuthorizationError     transactions (`_txn`)
        ├── PolicyViolationError       a limit of this endpoint (e.g. the number of topics)
        ├── SaslError                  SASL (DESIGN §12): the connection is closed after the
        │   ├── UnsupportedSaslMechanismError, IllegalSaslStateError  answer
        │   └── SaslAuthenticationFailedError
        └── GroupAuthorizationFailedError  a group another principal uses

A `KafkaProtocolError` ends one connection and nothing else. Every other `TqError` raised while
handling a request becomes its `kafka_error_code` in the response (per partition where the
protocol has a per-partition code); anything that is not a `TqError` is a bug in tq.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from catalog.errors import ProtocolError, TqError, UserError

__all__ = [
    "ConcurrentTransactionsError",
    "CoordinatorNotAvailableError",
    "DuplicateSequenceError",
    "ErrorCode",
    "FrameTooLargeError",
    "GroupAuthorizationFailedError",
    "IllegalSaslStateError",
    "InvalidProducerEpochError",
    "InvalidProducerIdMappingError",
    "InvalidRequiredAcksError",
    "InvalidTopicError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "KafkaProtocolError",
    "KafkaRequestError",
    "ListenError",
    "MalformedRequestError",
    "NotLeaderError",
    "OutOfOrderSequenceError",
    "PolicyViolationError",
    "ProducerFencedError",
    "SaslAuthenticationFailedError",
    "SaslError",
    "TransactionalIdAuthorizationError",
    "TransactionsNotSupportedError",
    "UnknownPartitionError",
    "UnsupportedSaslMechanismError",
    "UnsupportedRequestError",
    "error_code_of",
]


class ListenError(UserError):
    """The Kafka listener cannot bind host:port; `errno` says why (EADDRINUSE: in use)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class KafkaProtocolError(ProtocolError):
    """The client sent bytes that are not a Kafka request we can answer: close its connection
    (as Kafka does), keep serving everyone else."""


class FrameTooLargeError(KafkaProtocolError):
    """The 4-byte size prefix announces more than the listener's limit for that api."""


class MalformedRequestError(KafkaProtocolError):
    """The request header or body does not decode (short, bad lengths, bad UTF-8, trailing
    bytes) for the api key and version it claims."""


class UnsupportedRequestError(KafkaProtocolError):
    """An api key or version outside what ApiVersions advertised; clients only send those, so
    Kafka closes the connection too."""


class KafkaRequestError(TqError):
    """A well-framed request refused with a Kafka error code (in the response, never by closing
    the connection)."""

    kafka_error_code = ErrorCode.invalid_request.value


class NotLeaderError(KafkaRequestError):
    """This broker does not host the partition; the client refreshes metadata and retries."""

    retriable = True
    kafka_error_code = ErrorCode.not_leader_or_follower.value


class UnknownPartitionError(KafkaRequestError):
    """The topic exists but not this partition, or the topic does not exist."""

    retriable = True
    kafka_error_code = ErrorCode.unknown_topic_or_partition.value


class InvalidTopicError(KafkaRequestError):
    """A topic name that cannot exist, or an internal topic a client may not write to."""

    kafka_error_code = ErrorCode.invalid_topic_exception.value


class InvalidRequiredAcksError(KafkaRequestError):
    """acks other than 0, 1 or -1."""

    kafka_error_code = ErrorCode.invalid_required_acks.value


class OutOfOrderSequenceError(KafkaRequestError):
    """An idempotent producer's batch does not continue its last sequence on this partition."""

    kafka_error_code = ErrorCode.out_of_order_sequence_number.value


class DuplicateSequenceError(KafkaRequestError):
    """A batch the partition has appended already, older than the last five it remembers."""

    kafka_error_code = ErrorCode.duplicate_sequence_number.value


class InvalidProducerEpochError(KafkaRequestError):
    """A producer epoch older than the one the partition has seen for this producer id."""

    kafka_error_code = ErrorCode.invalid_producer_epoch.value


class TransactionsNotSupportedError(KafkaRequestError):
    """tq has no transaction coordinator: transactional ids and batches are refused."""

    kafka_error_code = ErrorCode.transactional_id_authorization_failed.value


class ProducerFencedError(KafkaRequestError):
    """A transactional producer whose epoch a newer producer of its transactional id (or a
    timeout) superseded."""
    kafka_error_code = ErrorCode.producer_fenced.value


class InvalidProducerIdMappingError(KafkaRequestError):
    """The producer id does not hold the transactional id it names."""
    kafka_error_code = ErrorCode.invalid_producer_id_mapping.value


class InvalidTxnStateError(KafkaRequestError):
    """A transaction request out of turn (EndTxn with nothing open, offsets of a group not
    added, a partition the coordinator cannot mark)."""
    kafka_error_code = ErrorCode.invalid_txn_state.value


class ConcurrentTransactionsError(KafkaRequestError):
    """The transaction is being ended; the client retries."""
    retriable = True
    kafka_error_code = ErrorCode.concurrent_transactions.value


class InvalidTransactionTimeoutError(KafkaRequestError):
    kafka_error_code = ErrorCode.invalid_transaction_timeout.value


class TransactionalIdAuthorizationError(KafkaRequestError):
    """The transactional id belongs to another principal."""
    kafka_error_code = ErrorCode.transactional_id_authorization_failed.value


class PolicyViolationError(KafkaRequestError):
    """A request that would pass one of the endpoint's bounds (topics, partitions)."""

    kafka_error_code = ErrorCode.policy_violation.value


class CoordinatorNotAvailableError(KafkaRequestError):
    """No broker with a Kafka listener coordinates groups now (the coordinator's broker has
    none, or is not registered yet); clients retry FindCoordinator."""

    retriable = True
    kafka_error_code = ErrorCode.coordinator_not_available.value


class SaslError(KafkaRequestError):
    """Authentication did not succeed; Kafka answers, then closes the connection."""


class UnsupportedSaslMechanismError(SaslError):
    kafka_error_code = ErrorCode.unsupported_sasl_mechanism.value


class IllegalSaslStateError(SaslError):
    """A SASL request out of turn: authenticate before handshake, twice, or data first."""

    kafka_error_code = ErrorCode.illegal_sasl_state.value


class SaslAuthenticationFailedError(SaslError):
    kafka_error_code = ErrorCode.sasl_authentication_failed.value


class GroupAuthorizationFailedError(KafkaRequestError):
    """The group is used by another principal (the first one to commit or join owns it)."""

    kafka_error_code = ErrorCode.group_authorization_failed.value


def error_code_of(exc: TqError) -> ErrorCode:
    """The Kafka error code a tq error maps to; UNKNOWN_SERVER_ERROR for codes kio lacks."""
    try:
        return ErrorCode(exc.kafka_error_code)
    except ValueError:
        return ErrorCode.unknown_server_error
