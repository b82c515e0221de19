"""The topic broker and its clients (DESIGN §5): partitions stored as Kafka logs, produce with
credit windows, subscriptions pushed from disk then live, frontiers as control batches.

    _state.py       BrokerState: the pure core, handle(stimulus) -> [instructions]
    _events.py      its stimuli and instructions;  _model.py its bookkeeping records
    _state_admission.py  the core's admission rules: writers rules, partitions, ended streams
    _access.py      principals and topics' writers rules (who may write what)
    _frontier.py    PartitionFrontier: minimum over live producers, writer groups
    _state_groups.py  the core's writer-group rules: process exits, saving pending groups
    _state_subscriptions.py  the core's subscription rules: credit, catch-up, tail
    _group_store.py   pending writer groups on disk beside the log
    _credit.py      CreditWindow / CreditGrant
    _messages.py    the RPC messages
    _server.py      BrokerServer: the asyncio shell (RPC, append lanes, reads, clock)
    _port.py        BrokerPort: the in-process door (PortLink sessions, reads), directories
    _host.py        partitions on disk, recovery of frontiers;  _lane.py ordered appends
    _link.py        a client's session (BrokerLink over RPC), the principal it states;
                    reopened (and moved) across broker restarts
    _producer.py / _subscriber.py async clients (over either link);  _producer_state.py
                    the core's table of idempotent producers (a batch sent again is stored
                    once)
    _blocking.py    blocking Producer / Subscriber;  _stream.py what a subscriber sees
    _drop.py        drop_hosted / drop_partitions: a deleted topic's partitions leave
                    their broker
    _endpoints.py   BrokerEndpoints: the optional connector endpoint and Kafka listener
    _run.py         running a standalone broker (tq broker)
"""

from __future__ import annotations

from querylib._lazy import lazy_exports as _lazy_exports

# Names are loaded on first use (PEP 562): a query process needs the clients
# (Producer, Subscriber) and must not pay for the server, its state machine and the log
# storage, about a third of its import time. Every name below is still a public export.
_EXPORTS = {
    "AdvanceRequest": "_messages",
    "AsyncProducer": "_producer",
    "AsyncSubscriber": "_subscriber",
    "BatchTooLargeError": "_errors",
    "BrokerClosedError": "_errors",
    "BrokerEndpoints": "_endpoints",
    "BrokerLimits": "_model",
    "BrokerLink": "_link",
    "BrokerPort": "_port",
    "BrokerProtocolError": "_errors",
    "BrokerServer": "_server",
    "BrokerState": "_state",
    "BrokerUnavailableError": "_errors",
    "DuplicateSequenceError": "_errors",
    "OutOfOrderSequenceError": "_errors",
    "Chunk": "_subscriber",
    "CloseSessionRequest": "_messages",
    "CreditExceededError": "_errors",
    "CreditGrant": "_credit",
    "CreditWindow": "_credit",
    "Data": "_stream",
    "EndOfStream": "_stream",
    "EndStreamRequest": "_messages",
    "EndpointUnavailableError": "_endpoints",
    "Event": "_stream",
    "Incarnation": "_messages",
    "InvalidProducerEpochError": "_errors",
    "MarkersWritten": "_messages",
    "InvalidTopicError": "_errors",
    "NotProducerError": "_errors",
    "OpenDirectory": "_port",
    "OpenProducerRequest": "_messages",
    "PartitionBusyError": "_errors",
    "PartitionFrontier": "_frontier",
    "PartitionInfo": "_messages",
    "PartitionNotHereError": "_errors",
    "PortLink": "_port",
    "PrincipalError": "_errors",
    "ProduceRequest": "_messages",
    "Produced": "_messages",
    "Producer": "_blocking",
    "ProducerOpened": "_messages",
    "Progress": "_stream",
    "SessionLink": "_link",
    "StaleIncarnationError": "_errors",
    "StreamEndedError": "_errors",
    "Subscriber": "_blocking",
    "SubscriberCore": "_subscriber",
    "TopicAccess": "_events",
    "TopicAuthorizationError": "_errors",
    "TopicDirectory": "_port",
    "UnknownBrokerSessionError": "_errors",
    "UnknownPartitionError": "_errors",
    "Values": "_stream",
    "WriteMarkersRequest": "_messages",
    "WriterGroup": "_producer",
    "catalog_access": "_access",
    "delete_records": "_run",
    "drop_hosted": "_drop",
    "drop_partitions": "_drop",
    "encode_records": "_stream",
    "list_partitions": "_run",
    "run_broker": "_run",
    "writers_of": "_access",
}

__all__ = [
    "AdvanceRequest",
    "AsyncProducer",
    "AsyncSubscriber",
    "BatchTooLargeError",
    "BrokerClosedError",
    "BrokerEndpoints",
    "BrokerLimits",
    "BrokerLink",
    "BrokerPort",
    "BrokerProtocolError",
    "BrokerServer",
    "BrokerState",
    "BrokerUnavailableError",
    "DuplicateSequenceError",
    "OutOfOrderSequenceError",
    "Chunk",
    "CloseSessionRequest",
    "CreditExceededError",
    "CreditGrant",
    "CreditWindow",
    "Data",
    "EndOfStream",
    "EndStreamRequest",
    "EndpointUnavailableError",
    "Event",
    "Incarnation",
    "InvalidProducerEpochError",
    "InvalidTopicError",
    "NotProducerError",
    "MarkersWritten",
    "OpenDirectory",
    "OpenProducerRequest",
    "PartitionBusyError",
    "PartitionFrontier",
    "PartitionInfo",
    "PartitionNotHereError",
    "PortLink",
    "PrincipalError",
    "ProduceRequest",
    "Produced",
    "Producer",
    "ProducerOpened",
    "Progress",
    "SessionLink",
    "StaleIncarnationError",
    "StreamEndedError",
    "Subscriber",
    "SubscriberCore",
    "TopicAccess",
    "TopicAuthorizationError",
    "TopicDirectory",
    "UnknownBrokerSessionError",
    "UnknownPartitionError",
    "Values",
    "WriteMarkersRequest",
    "WriterGroup",
    "catalog_access",
    "delete_records",
    "drop_hosted",
    "drop_partitions",
    "encode_records",
    "list_partitions",
    "run_broker",
    "writers_of",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
