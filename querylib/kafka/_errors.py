"""Errors of the Kafka endpoint, and the one place a tq exception becomes a Kafka error code.

    TqError (catalog.errors)
    ├── UserError
    │   └── ListenError                the listener cannot bind its address (in use, denied)
    ├── ProtocolError
    │   └── KafkaProtocolError         the client broke the framing: its connection is closed
    │       ├── RequestTooLargeError   a request longer than the listener accepts for its api
    │       ├── MalformedRequestError  a body that does not decode for its api key and version
    │       └── UnsupportedApiVersionError  an api key or version ApiVersions did not advertise
    └── KafkaRequestError              a well-framed request refused with a Kafka error code
        ├── NotLeaderError, InvalidRequiredAcksError, CoordinatorNotAvailableError
        ├── TransactionsNotSupportedError
        ├── ProducerFencedError, InvalidProducerIdMappingError, InvalidTxnStateError,
        │   ConcurrentTransactionsError, InvalidTransactionTimeoutError,
        │   TransactionalIdAuthorizationError     transactions (`_txn`)
        ├── PolicyViolationError       a limit of this endpoint (e.g. the number of topics)
        ├── SaslError                  SASL (DESIGN §12): the connection is closed after the
        │   ├── UnsupportedSaslMechanismError, IllegalSaslStateError  answer
        │   └── SaslAuthenticationFailedError
        └── GroupAuthorizationFailedError  a group another principal uses

The broker's own refusals keep their class here (one class per meaning, querylib.broker's):
UnknownPartitionError, InvalidTopicError, OutOfOrderSequenceError, DuplicateSequenceError and
InvalidProducerEpochError carry the Kafka codes the endpoint answers with, and are exported
from this package too.

A `KafkaProtocolError` ends one connection and nothing else. Every other `TqError` raised while
handling a request becomes its `kafka_error_code` in the response (per partition where the
protocol has a per-partition code); anything that is not a `TqError` is a bug in tq.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from catalog.errors import ProtocolError, TqError, UserError
from querylib.broker import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    InvalidTopicError,
    OutOfOrderSequenceError,
    UnknownPartitionError,
)

__all__ = [
    "ConcurrentTransactionsError",
    "CoordinatorNotAvailableError",
    "DuplicateSequenceError",
    "ErrorCode",
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
    "RequestTooLargeError",
    "SaslAuthenticationFailedError",
    "SaslError",
    "TransactionalIdAuthorizationError",
    "TransactionsNotSupportedError",
    "UnknownPartitionError",
    "UnsupportedApiVersionError",
    "UnsupportedSaslMechanismError",
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


class RequestTooLargeError(KafkaProtocolError):
    """The 4-byte size prefix announces more than the listener's limit for that api."""


class MalformedRequestError(KafkaProtocolError):
    """The request header or body does not decode (short, bad lengths, bad UTF-8, trailing
    bytes) for the api key and version it claims."""


class UnsupportedApiVersionError(KafkaProtocolError):
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


class InvalidRequiredAcksError(KafkaRequestError):
    """acks other than 0, 1 or -1."""

    kafka_error_code = ErrorCode.invalid_required_acks.value


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
    """A transaction timeout above the endpoint's maximum (or not positive)."""
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
    """A SASL mechanism the listener does not offer."""

    kafka_error_code = ErrorCode.unsupported_sasl_mechanism.value


class IllegalSaslStateError(SaslError):
    """A SASL request out of turn: authenticate before handshake, twice, or data first."""

    kafka_error_code = ErrorCode.illegal_sasl_state.value


class SaslAuthenticationFailedError(SaslError):
    """Wrong credentials (or an unknown user)."""

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
