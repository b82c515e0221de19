"""The topic broker and its clients (DESIGN §5): partitions stored as Kafka logs, produce with
credit windows, subscriptions pushed from disk then live, frontiers as control batches.

    _state.py       BrokerState: the pure core, handle(stimulus) -> [instructions]
    _events.py      its stimuli and instructions;  _model.py its bookkeeping records
    _frontier.py    PartitionFrontier: minimum over live producers
    _credit.py      CreditWindow / CreditGrant
    _messages.py    the RPC messages
    _server.py      BrokerServer: the asyncio shell (RPC, append lanes, reads, clock)
    _host.py        partitions on disk, recovery of frontiers;  _lane.py ordered appends
    _link.py        a client's session;  _producer.py / _subscriber.py async clients
    _blocking.py    blocking Producer / Subscriber;  _stream.py what a subscriber sees
    _endpoints.py   BrokerEndpoints: the optional connector endpoint and Kafka listener
    _run.py         running a standalone broker (tq broker)
"""

from querylib.broker._blocking import Producer, Subscriber
from querylib.broker._credit import CreditGrant, CreditWindow
from querylib.broker._endpoints import BrokerEndpoints, EndpointUnavailableError
from querylib.broker._errors import (
    BrokerProtocolError,
    CreditExceededError,
    InvalidTopicError,
    NotProducerError,
    UnknownPartitionError,
    UnknownSessionError,
)
from querylib.broker._frontier import PartitionFrontier
from querylib.broker._model import BrokerLimits
from querylib.broker._producer import AsyncProducer
from querylib.broker._run import list_partitions, run_broker
from querylib.broker._server import BrokerServer
from querylib.broker._state import BrokerState
from querylib.broker._stream import Data, EndOfStream, Event, Progress
from querylib.broker._subscriber import AsyncSubscriber, Chunk

__all__ = [
    "AsyncProducer",
    "AsyncSubscriber",
    "BrokerEndpoints",
    "BrokerLimits",
    "BrokerProtocolError",
    "BrokerServer",
    "BrokerState",
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
    "PartitionFrontier",
    "Producer",
    "Progress",
    "Subscriber",
    "UnknownPartitionError",
    "UnknownSessionError",
    "list_partitions",
    "run_broker",
]
