"""AlterTopic: a topic grows (new partitions on the brokers given, never fewer) and sets the
Kafka configs tq honours per topic; who may (DESIGN §12): an admin, the owner, an ingest
topic's creator; `__` topics nobody."""

from __future__ import annotations

import pytest

from catalog import (
    INGEST,
    SYSTEM,
    AlterTopic,
    Catalog,
    CreateTopic,
    InvalidConfigError,
    InvalidPartitionsError,
    NotOwnerError,
    PrincipalRef,
    Topic,
    TopicKind,
    UnknownBrokerError,
)
from tests.catalog._helpers import add_user, create_topic, host


def _catalog() -> tuple[Catalog, int, int]:
    catalog = Catalog()
    _, first, _ = host(catalog, "host-a")
    _, second, _ = host(catalog, "host-b")
    return catalog, first.broker_id, second.broker_id


def test_a_topic_grows_onto_the_brokers_given_and_keeps_its_partitions() -> None:
    catalog, a, b = _catalog()
    topic = create_topic(catalog, "grows", PrincipalRef("admin"), a, partitions=2)
    grown = catalog.apply(AlterTopic(topic_id=topic.topic_id, partitions=4, locations=(b, a),
                                     principal="admin")).created
    assert isinstance(grown, Topic)
    assert (grown.partitions, grown.locations) == (4, (a, a, b, a))
    assert catalog.find_topic("grows") == grown
    with pytest.raises(InvalidPartitionsError):  # only grows
        catalog.apply(AlterTopic(topic_id=topic.topic_id, partitions=3, principal="admin"))
    with pytest.raises(InvalidPartitionsError):  # a location for each new partition
        catalog.apply(AlterTopic(topic_id=topic.topic_id, partitions=6, locations=(a,),
                                 principal="admin"))
    with pytest.raises(UnknownBrokerError):
        catalog.apply(AlterTopic(topic_id=topic.topic_id, partitions=5, locations=(99,),
                                 principal="admin"))
    assert catalog.find_topic("grows") == grown


def test_configs_are_set_checked_and_removed() -> None:
    catalog, a, _ = _catalog()
    topic = create_topic(catalog, "kept", PrincipalRef("admin"), a)
    altered = catalog.apply(AlterTopic(
        topic_id=topic.topic_id, principal="admin",
        configs=(("retention.ms", "60000"), ("segment.bytes", "1048576")))).created
    assert isinstance(altered, Topic)
    assert altered.configs == (("retention.ms", "60000"), ("segment.bytes", "1048576"))
    assert altered.config("retention.ms") == "60000"
    assert altered.config("retention.bytes") is None
    again = catalog.apply(AlterTopic(topic_id=topic.topic_id, principal="admin",
                                     configs=(("retention.ms", None),))).created
    assert isinstance(again, Topic) and again.configs == (("segment.bytes", "1048576"),)
    for name, value in [("cleanup.policy", "compact"), ("retention.ms", "soon"),
                        ("segment.bytes", "10"), ("retention.bytes", "-2")]:
        with pytest.raises(InvalidConfigError):
            catalog.apply(AlterTopic(topic_id=topic.topic_id, principal="admin",
                                     configs=((name, value),)))


def test_who_may_alter_a_topic() -> None:
    catalog, a, _ = _catalog()
    add_user(catalog, "user:alice")
    add_user(catalog, "user:bob")
    owned = create_topic(catalog, "alices", PrincipalRef("user:alice"), a)
    ingest = catalog.apply(CreateTopic(
        name="fed", partitions=1, record_type="bytes", kind=TopicKind.STREAM, owner=INGEST,
        locations=(a,), at_ms=4, creator="user:bob")).created
    assert isinstance(ingest, Topic)
    grow = (("retention.ms", "1000"),)
    catalog.apply(AlterTopic(topic_id=owned.topic_id, configs=grow, principal="user:alice"))
    catalog.apply(AlterTopic(topic_id=ingest.topic_id, configs=grow, principal="user:bob"))
    catalog.apply(AlterTopic(topic_id=ingest.topic_id, configs=grow, principal="admin"))
    with pytest.raises(NotOwnerError):
        catalog.apply(AlterTopic(topic_id=owned.topic_id, configs=grow, principal="user:bob"))
    with pytest.raises(NotOwnerError):
        catalog.apply(AlterTopic(topic_id=ingest.topic_id, configs=grow,
                                 principal="user:alice"))
    system = create_topic(catalog, "__own", SYSTEM, a)
    with pytest.raises(NotOwnerError):
        catalog.apply(AlterTopic(topic_id=system.topic_id, configs=grow, principal="admin"))


def test_min_insync_replicas_is_a_topic_config() -> None:
    catalog, a, _ = _catalog()
    topic = create_topic(catalog, "acked", PrincipalRef("admin"), a)
    altered = catalog.apply(AlterTopic(topic_id=topic.topic_id, principal="admin",
                                       configs=(("min.insync.replicas", "2"),))).created
    assert isinstance(altered, Topic) and altered.config("min.insync.replicas") == "2"
    for value in ("0", "-1", str(2**31)):
        with pytest.raises(InvalidConfigError):
            catalog.apply(AlterTopic(topic_id=topic.topic_id, principal="admin",
                                     configs=(("min.insync.replicas", value),)))
