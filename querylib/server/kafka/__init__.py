"""The Kafka protocol endpoint (DESIGN §8): enough of Kafka's api that kcat, confluent-kafka,
kafka-python and aiokafka list topics, consume, commit offsets in groups, produce (also in
transactions), and administer topics and groups. Its wire is `querylib.kafka`.

    _handlers.py        cluster and data apis (ApiVersions, Metadata, Produce, Fetch, ...)
    _fetch.py           Fetch responses as byte chunks + file slices (sendfile)
    _group.py           the group coordinator state machine (pure, time as input)
    _group_service.py   its async shell and the group apis (JoinGroup ... OffsetFetch,
                        DeleteGroups, OffsetDelete)
    _group_store.py     GroupStore: what `__consumer_offsets` says
    _offsets_format.py  `__consumer_offsets` key/value formats (Kafka's)
    _txn.py             the transaction coordinator;  _txn_service.py its apis
    _admin.py           topic and cluster admin apis (DeleteTopics, CreatePartitions,
                        DeleteRecords, DescribeConfigs, IncrementalAlterConfigs, DescribeCluster)
    _producers.py       idempotent-producer sequence checks of Kafka producers (pure)
    _sasl.py            SASL PLAIN and SCRAM, mapped to tq principals
    _backend.py         KafkaBackend: what the endpoint needs from the broker behind it
    _broker_backend.py  BrokerBackend: a live tq broker's partitions, through its BrokerPort;
                        StateReplica, KafkaCluster, KafkaConfig, StandaloneCluster
    _broker_kafka.py    BrokerKafka: a broker's listener (`--kafka-port`), opened by the broker
    _listener.py        KafkaListener: the asyncio server

Record batches are never decoded on the way: what a producer sent is what the log stores and
what a consumer receives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from ._backend import (
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
        catalog_topic_info,
        kafka_topic_id,
    )
    from ._broker_backend import (
        OFFSETS_TOPIC,
        BrokerBackend,
        KafkaCluster,
        KafkaConfig,
        StandaloneCluster,
        StateReplica,
    )
    from ._broker_kafka import BrokerKafka
    from ._group import GroupConfig, GroupMachine, GroupStatus
    from ._group_store import GroupStore
    from ._listener import KafkaListener, ListenerStats
    from ._offsets_format import decode_offsets_record, encode_group, encode_offset
    from ._producers import ProducerStateTable
    from ._txn import TRANSACTIONS_TOPIC

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
