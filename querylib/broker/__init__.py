"""The broker's clients and its wire (DESIGN §5): what a query process loads to publish and
subscribe. The broker itself is `querylib.server.broker`.

    messages.py     the RPC messages both ends speak (sessions, produce, frontier, subscribe,
                    delivery), StartAt
    _errors.py      the errors a broker answers with, and their codes
    _session.py     a client's session (BrokerLink over RPC; SessionLink, what the in-process
                    door's PortLink is too), reopened (and moved) across broker restarts
    _credit.py      CreditWindow / CreditGrant: credit-based flow
    _producer.py    AsyncProducer: the credit window, acknowledgements, frontiers, cohorts
    _subscriber.py  AsyncSubscriber: credit, resumption, chunks decoded into events
    _stream.py      what a subscriber sees (Data, Progress, EndOfStream) and how records
                    become batches
    _blocking.py    blocking Producer / Subscriber on a loop thread
    _admin.py       list_partitions / delete_records: requests outside a session
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from ._admin import delete_records, list_partitions, list_subscriptions
    from ._blocking import Producer, Subscriber
    from ._credit import CreditGrant, CreditWindow
    from ._errors import (
        BatchTooLargeError,
        BrokerClosedError,
        BrokerProtocolError,
        BrokerUnavailableError,
        CreditExceededError,
        DuplicateSequenceError,
        InvalidProducerEpochError,
        InvalidTopicError,
        NotProducerError,
        OutOfOrderSequenceError,
        PartitionBusyError,
        PartitionNotHereError,
        PrincipalError,
        StaleIncarnationError,
        StreamEndedError,
        TopicAuthorizationError,
        UnknownBrokerSessionError,
        UnknownPartitionError,
    )
    from ._producer import AsyncProducer, Cohort
    from ._session import BrokerLink, SessionLink
    from ._stream import Data, EndOfStream, Event, Progress, Values, encode_records
    from ._subscriber import AsyncSubscriber, Chunk, SubscriberCore
    from .messages import (
        AdvanceRequest,
        CloseSessionRequest,
        EndStreamRequest,
        Incarnation,
        ListSubscriptions,
        MarkersWritten,
        OpenProducerRequest,
        PartitionInfo,
        Produced,
        ProduceRequest,
        ProducerOpened,
        SubscriptionInfo,
        SubscriptionList,
        WriteMarkersRequest,
    )

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
