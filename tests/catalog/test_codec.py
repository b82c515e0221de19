"""MessagePack encoding of catalog updates: golden bytes, round trips, refusals."""

from __future__ import annotations

import msgspec
import pytest

from catalog import (
    COLLECTIONS,
    SYSTEM,
    Catalog,
    CatalogDecodeError,
    CorruptCatalogError,
    CreateToken,
    DeleteTopic,
    PrincipalRef,
    Publication,
    Publish,
    QueryRef,
    SessionRef,
    Subscribe,
    TopicKind,
    Update,
    decode_record,
    decode_update,
    decode_updates,
    encode_record,
    encode_update,
    encode_updates,
)
from tests.catalog._helpers import add_user, create_topic, host, open_session, submit

# [collection, record, diff]; the record is a map whose `type` tag names the record type.
GOLDEN = [
    (
        Update("publications", Publication(topic_id=1, publisher=QueryRef(2)), 1),
        b"\x93\xacpublications\x83\xa4type\xabpublication\xa8topic_id\x01"
        b"\xa9publisher\x82\xa4type\xa5query\xa8query_id\x02\x01",
    ),
    (
        Update("publications", Publication(topic_id=3, publisher=SYSTEM), -1),
        b"\x93\xacpublications\x83\xa4type\xabpublication\xa8topic_id\x03"
        b"\xa9publisher\x81\xa4type\xa6system\xff",
    ),
]


@pytest.mark.parametrize(("update", "data"), GOLDEN)
def test_golden_bytes(update: Update, data: bytes) -> None:
    assert encode_update(update) == data
    assert decode_update(data) == update


def full_catalog() -> Catalog:
    """A catalog holding at least one record of every collection."""
    catalog = Catalog()
    _, broker, executor = host(catalog)
    client = open_session(catalog)
    query = submit(catalog, (executor.executor_id, executor.executor_id))
    topic = create_topic(
        catalog, "acme/prod/orders", QueryRef(query.query_id), broker.broker_id, partitions=2
    )
    create_topic(
        catalog, "__logs", SYSTEM, broker.broker_id, kind=TopicKind.COLLECTION, record_type="log"
    )
    catalog.apply(Publish(topic_id=topic.topic_id, publisher=QueryRef(query.query_id)))
    catalog.apply(Subscribe(topic_id=topic.topic_id, subscriber=SessionRef(client.session_id)))
    gone = create_topic(catalog, "gone", SessionRef(client.session_id), broker.broker_id)
    catalog.apply(DeleteTopic(topic_id=gone.topic_id, requester=SessionRef(client.session_id)))
    add_user(catalog, "user:alice")
    create_topic(catalog, "alices", PrincipalRef("user:alice"), broker.broker_id)
    catalog.apply(CreateToken(salt=7, name="", ttl_ms=60_000, requester="admin", at_ms=1))
    assert all(len(catalog.collection(name)) for name in COLLECTIONS)
    return catalog


def test_every_record_type_round_trips() -> None:
    catalog = full_catalog()
    snapshot = catalog.snapshot()
    for update in snapshot:
        assert decode_update(encode_update(update)) == update
        assert decode_record(update.collection, encode_record(update.record)) == update.record
    assert decode_updates(encode_updates(snapshot)) == snapshot
    assert Catalog.replay(decode_updates(encode_updates(snapshot))) == catalog


def test_decoded_records_are_hashable_and_typed() -> None:
    for update in decode_updates(encode_updates(full_catalog().snapshot())):
        hash(update.record)
        assert type(update.record) is COLLECTIONS[update.collection]


_encode = msgspec.msgpack.encode


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not a catalog update"),
        (b"\xc1", "not a catalog update"),
        (_encode(["topics"]), "not a catalog update"),
        (_encode(["nope", {"type": "publication", "topic_id": 1}, 1]), "not a catalog update"),
        (
            _encode(["publications", {"type": "publication", "topic_id": "x"}, 1]),
            "not a catalog update",
        ),
        (
            _encode(
                [
                    "publications",
                    {"type": "publication", "topic_id": 1, "publisher": {"type": "ingest"}},
                    1,
                ]
            ),
            "not a catalog update",  # ingest is an owner, never a publisher
        ),
        (
            _encode(
                [
                    "topics",
                    {"type": "publication", "topic_id": 1, "publisher": {"type": "system"}},
                    1,
                ]
            ),
            "cannot belong to 'topics'",
        ),
        (
            _encode(
                [
                    "publications",
                    {"type": "publication", "topic_id": 1, "publisher": {"type": "system"}},
                    "1",
                ]
            ),
            "not a catalog update",
        ),
    ],
)
def test_decode_refuses(data: bytes, why: str) -> None:
    with pytest.raises(CatalogDecodeError, match=why):
        decode_update(data)


def test_decode_record_checks_the_collection() -> None:
    record = Publication(topic_id=1, publisher=SYSTEM)
    with pytest.raises(CatalogDecodeError, match="not a topics record"):
        decode_record("topics", encode_record(record))
    with pytest.raises(CatalogDecodeError, match="unknown catalog collection"):
        decode_record("nope", encode_record(record))
    with pytest.raises(CatalogDecodeError):
        decode_updates(b"\x91\xc1")


def test_encoding_a_mismatched_update_is_a_bug() -> None:
    record = Publication(topic_id=1, publisher=SYSTEM)
    with pytest.raises(CorruptCatalogError):
        encode_update(Update("topics", record, 1))  # type: ignore[arg-type]
    with pytest.raises(CorruptCatalogError):
        encode_updates([("nope", record, 1)])  # type: ignore[list-item]
