"""The topic broker and its clients (DESIGN §5): partitions stored as Kafka logs, produce with
credit windows, subscriptions pushed from disk then live, frontiers as control batches.

    _state.py       BrokerState: the pure core, handle(stimulus) -> [instructions]
    _events.py      its stimuli and instructions;  _model.py its bookkeeping records
    _frontier.py    PartitionFrontier: minimum over live producers, writer groups
    _state_groups.py  the core's writer-group rules: process exits, saving pending groups
    _state_subscriptions.py  the core's subscription rules: credit, catch-up, tail
    _group_store.py   pending writer groups on disk beside the log
    _credit.py      CreditWindow / CreditGrant
    _messages.py    the RPC messages
    _server.py      BrokerServer: the asyncio shell (RPC, append lanes, reads, clock)
    _host.py        partitions on disk, recovery of frontiers;  _lane.py ordered appends
    _link.py        a client's session, reopened (and moved) across broker restarts
    _producer.py / _subscriber.py  async clients;  _producer_state.py the core's table of
                    idempotent producers (a batch sent again is stored once)
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
    "AsyncProducer": "_producer",
    "AsyncSubscriber": "_subscriber",
    "BrokerEndpoints": "_endpoints",
    "BrokerLimits": "_model",
    "BrokerProtocolError": "_errors",
    "BrokerServer": "_server",
    "BrokerState": "_state",
    "BrokerUnavailableError": "_errors",
    "DuplicateSequenceError": "_errors",
    "OutOfOrderSequenceError": "_errors",
    "Chunk": "_subscriber",
    "CreditExceededError": "_errors",
    "CreditGrant": "_credit",
    "CreditWindow": "_credit",
    "Data": "_stream",
    "EndOfStream": "_stream",
    "EndpointUnavailableError": "_endpoints",
    "Event": "_stream",
    "InvalidTopicError": "_errors",
    "NotProducerError": "_errors",
    "PartitionBusyError": "_errors",
    "PartitionFrontier": "_frontier",
    "Producer": "_blocking",
    "Progress": "_stream",
    "Subscriber": "_blocking",
    "UnknownPartitionError": "_errors",
    "UnknownSessionError": "_errors",
    "Values": "_stream",
    "WriterGroup": "_producer",
    "drop_hosted": "_drop",
    "drop_partitions": "_drop",
    "list_partitions": "_run",
    "run_broker": "_run",
}

__all__ = [
    "AsyncProducer",
    "AsyncSubscriber",
    "BrokerEndpoints",
    "BrokerLimits",
    "BrokerProtocolError",
    "BrokerServer",
    "BrokerState",
    "BrokerUnavailableError",
    "DuplicateSequenceError",
    "OutOfOrderSequenceError",
    "Chunk",
    "CreditExceededError",
    "CreditGrant",
    "CreditWindow",
    "Data",
    "EndOfStream",
    "EndpointUnavailableError",
    "Event",
    "InvalidTopicError",
    "NotProducerError",
    "PartitionBusyError",
    "PartitionFrontier",
    "Producer",
    "Progress",
    "Subscriber",
    "UnknownPartitionError",
    "UnknownSessionError",
    "Values",
    "WriterGroup",
    "drop_hosted",
    "drop_partitions",
    "list_partitions",
    "run_broker",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
