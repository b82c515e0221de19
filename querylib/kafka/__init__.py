"""The Kafka protocol endpoint (DESIGN §8): enough of Kafka's api that kcat, confluent-kafka,
kafka-python and aiokafka list topics, consume, commit offsets in groups, produce, and
administer topics and groups.

    _framing.py         sans-I/O framing: size-prefixed frames, request/response headers
    _apis.py            the apis and version ranges served; kio codecs; request bounds
    _fetch.py           Fetch responses as byte chunks + file slices (sendfile)
    _handlers.py        cluster and data apis (ApiVersions, Metadata, Produce, Fetch, ...)
    _group.py           the group coordinator state machine (pure, time as input)
    _group_service.py   its async shell and the group apis (JoinGroup ... OffsetFetch,
                        DeleteGroups, OffsetDelete)
    _admin.py           topic and cluster admin apis (DeleteTopics, CreatePartitions,
                        DeleteRecords, DescribeConfigs, IncrementalAlterConfigs, DescribeCluster)
    _producers.py       idempotent-producer sequence checks (pure)
    _offsets_format.py  `__consumer_offsets` key/value formats (Kafka's)
    _backend.py         KafkaBackend: what the endpoint needs from the broker behind it
    _group_store.py     GroupStore: what `__consumer_offsets` says
    _broker_backend.py  BrokerBackend: a live tq broker's partitions, through its BrokerPort;
                        KafkaCluster, KafkaConfig, StandaloneCluster
    _broker_kafka.py    BrokerKafka: a broker's listener (`--kafka-port`), opened by the broker
    _server.py          KafkaListener: the asyncio server
    _run.py             serve_local / run_kafka: a data dir served by a broker with only its
                        Kafka listener (`tq kafka`)

    async with serve_local(data_dir, "127.0.0.1", 9092) as listener:
        ...   # Kafka clients connect to 127.0.0.1:9092

Record batches are never decoded on the way: what a producer sent is what the log stores and
what a consumer receives.
"""

from querylib.kafka._apis import SUPPORTED_VERSIONS, ApiKey, ListenerLimits
from querylib.kafka._backend import (
    AppendResult,
    BrokerInfo,
    CommittedOffset,
    GroupMemberRecord,
    GroupRecord,
    KafkaBackend,
    PartitionInfo,
    PartitionOffsets,
    PartitionRead,
    TopicInfo,
    kafka_topic_id,
)
from querylib.kafka._broker_backend import (
    OFFSETS_TOPIC,
    BrokerBackend,
    KafkaCluster,
    KafkaConfig,
    StandaloneCluster,
)
from querylib.kafka._broker_kafka import BrokerKafka
from querylib.kafka._errors import (
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
from querylib.kafka._framing import FrameReader, RequestHeader, parse_request_header
from querylib.kafka._group import GroupConfig, GroupMachine, GroupStatus
from querylib.kafka._group_store import GroupStore
from querylib.kafka._offsets_format import decode_offsets_record, encode_group, encode_offset
from querylib.kafka._producers import ProducerStateTable
from querylib.kafka._run import run_kafka, serve_local
from querylib.kafka._server import KafkaListener, ListenerStats

__all__ = [
    "OFFSETS_TOPIC",
    "SUPPORTED_VERSIONS",
    "ApiKey",
    "AppendResult",
    "BrokerBackend",
    "BrokerInfo",
    "BrokerKafka",
    "CommittedOffset",
    "CoordinatorNotAvailableError",
    "DuplicateSequenceError",
    "ErrorCode",
    "FrameReader",
    "GroupConfig",
    "GroupMachine",
    "GroupMemberRecord",
    "GroupRecord",
    "GroupStatus",
    "GroupStore",
    "InvalidProducerEpochError",
    "InvalidRequiredAcksError",
    "InvalidTopicError",
    "KafkaCluster",
    "KafkaConfig",
    "KafkaBackend",
    "KafkaListener",
    "KafkaProtocolError",
    "KafkaRequestError",
    "ListenError",
    "ListenerLimits",
    "ListenerStats",
    "MalformedRequestError",
    "NotLeaderError",
    "OutOfOrderSequenceError",
    "PartitionInfo",
    "PolicyViolationError",
    "PartitionOffsets",
    "PartitionRead",
    "ProducerStateTable",
    "StandaloneCluster",
    "RequestHeader",
    "RequestTooLargeError",
    "TopicInfo",
    "TransactionsNotSupportedError",
    "UnknownPartitionError",
    "UnsupportedApiVersionError",
    "decode_offsets_record",
    "encode_group",
    "encode_offset",
    "kafka_topic_id",
    "parse_request_header",
    "run_kafka",
    "serve_local",
]
