"""Kafka's wire and tq's small Kafka client: what a consumer-group member and the tools load.
The Kafka listener and everything behind it is `querylib.server.kafka`.

    _framing.py   sans-I/O framing: size-prefixed frames, request/response headers
    _apis.py      the apis and version ranges served; kio codecs; request bounds
    _errors.py    Kafka's error codes, and the one place a tq error becomes one
    _client.py    KafkaClient: one blocking connection, one request at a time
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from ._apis import SUPPORTED_VERSIONS, ApiKey, ListenerLimits
    from ._errors import (
        CoordinatorNotAvailableError,
        DuplicateSequenceError,
        ErrorCode,
        InvalidProducerEpochError,
        InvalidRequiredAcksError,
        InvalidTopicError,
        KafkaProtocolError,
        KafkaRequestError,
        ListenError,
        MalformedRequestError,
        NotLeaderError,
        OutOfOrderSequenceError,
        PolicyViolationError,
        RequestTooLargeError,
        TransactionsNotSupportedError,
        UnknownPartitionError,
        UnsupportedApiVersionError,
    )
    from ._framing import FrameReader, RequestHeader, parse_request_header

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
