"""A user's topics hold at most MAX_PARTITIONS_PER_USER partitions in all: before, any user
could create topics without end (each partition a directory, files and descriptors on a broker,
and records in every catalog snapshot)."""

from __future__ import annotations

import pytest

from catalog import (
    INGEST,
    MAX_PARTITIONS,
    MAX_PARTITIONS_PER_USER,
    AlterTopic,
    Catalog,
    CreateTopic,
    DeleteTopic,
    PrincipalRef,
    QueryRef,
    QuotaExceededError,
    TopicKind,
)
from tests.catalog._helpers import add_user, create_topic, host, submit


def _create(catalog: Catalog, name: str, owner: object, broker: int, partitions: int,
            creator: str = "") -> None:
    catalog.apply(CreateTopic(name=name, partitions=partitions, record_type="int",
                              kind=TopicKind.STREAM, owner=owner,  # type: ignore[arg-type]
                              locations=(broker,) * partitions, at_ms=4, creator=creator))


def test_a_users_topics_hold_a_bounded_number_of_partitions() -> None:
    assert MAX_PARTITIONS_PER_USER >= MAX_PARTITIONS  # one topic of the most always fits
    catalog = Catalog()
    _, broker, executor = host(catalog)
    b = broker.broker_id
    add_user(catalog, "user:alice")
    add_user(catalog, "user:bob")
    alice = PrincipalRef("user:alice")
    # Hers in every way a topic is hers: owned by her, by a query she (or one of her queries)
    # submitted, or an ingest topic she created.
    query = submit(catalog, (executor.executor_id,), owner="user:alice")
    child = submit(catalog, (executor.executor_id,), owner=f"query:{query.query_id}")
    fill, n = MAX_PARTITIONS_PER_USER - 40, 0
    while fill:
        _create(catalog, f"a{n}", alice, b, min(fill, MAX_PARTITIONS))
        fill, n = fill - min(fill, MAX_PARTITIONS), n + 1
    _create(catalog, "q", QueryRef(query.query_id), b, 10)
    _create(catalog, "c", QueryRef(child.query_id), b, 10)
    _create(catalog, "i", INGEST, b, 10, creator="user:alice")
    last = create_topic(catalog, "last", alice, b, partitions=10)
    with pytest.raises(QuotaExceededError, match=(
            rf"user:alice's topics hold {MAX_PARTITIONS_PER_USER} partitions.*at most "
            rf"{MAX_PARTITIONS_PER_USER}")):
        _create(catalog, "more", QueryRef(child.query_id), b, 1)
    with pytest.raises(QuotaExceededError):
        catalog.apply(AlterTopic(topic_id=last.topic_id, partitions=11, locations=(b,),
                                 principal="user:alice"))
    # Others are not held back by her, nor is an admin.
    _create(catalog, "bobs", PrincipalRef("user:bob"), b, 5)
    _create(catalog, "admins", PrincipalRef("admin"), b, MAX_PARTITIONS)
    # What she deletes she may create again.
    catalog.apply(DeleteTopic(topic_id=last.topic_id, requester=alice,
                              principal="user:alice"))
    _create(catalog, "more", alice, b, 10)
    assert Catalog.replay(catalog.snapshot()) == catalog
