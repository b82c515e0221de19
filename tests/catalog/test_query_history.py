"""The catalog keeps a bounded history of ended queries (a coordinator that ran for months
held every query ever submitted: memory, snapshots and `tq status` grew without end)."""

from __future__ import annotations

import pytest

from catalog import (
    ENDED_QUERIES_KEPT,
    Catalog,
    DeleteTopic,
    KillQuery,
    PrincipalRef,
    Query,
    QueryRef,
    UnknownQueryError,
)
from tests.catalog._helpers import add_user, create_topic, host, submit


def _run(catalog: Catalog, owner: str, at_ms: int) -> Query:
    """A query submitted by `owner` (pending: no executor) and killed by it: ended."""
    query = submit(catalog, (), owner=owner, processes=1)
    catalog.apply(KillQuery(query_id=query.query_id, at_ms=at_ms, requester=owner))
    return catalog.query(query.query_id)


def _ended_of(catalog: Catalog, owner: str) -> list[int]:
    return sorted(q.query_id for q in catalog.queries
                  if isinstance(q, Query) and q.owner == owner and q.ended)


def test_each_submitter_keeps_its_newest_ended_queries() -> None:
    catalog = Catalog()
    add_user(catalog, "user:alice")
    add_user(catalog, "user:bob")
    bobs = _run(catalog, "user:bob", 10)
    alices = [_run(catalog, "user:alice", 10 + i).query_id
              for i in range(ENDED_QUERIES_KEPT + 5)]
    assert _ended_of(catalog, "user:alice") == alices[5:]  # the oldest five are forgotten
    with pytest.raises(UnknownQueryError):
        catalog.query(alices[0])
    assert catalog.query(bobs.query_id) == bobs  # another submitter's history is its own
    assert Catalog.replay(catalog.snapshot()) == catalog
    # A live query is never counted nor forgotten.
    live = submit(catalog, (), owner="user:alice", processes=1)
    _run(catalog, "user:alice", 99_999)
    assert catalog.query(live.query_id) == live
    assert len(_ended_of(catalog, "user:alice")) == ENDED_QUERIES_KEPT


def test_an_ended_query_a_topic_or_a_live_query_leads_back_through_is_kept() -> None:
    """A topic a query owns, or a live query it submitted, leads back to its submitter through
    it (who may delete the topic, kill the query, take them over by running again): forgetting
    it would leave them to an admin."""
    catalog = Catalog()
    _, broker, _ = host(catalog)
    add_user(catalog, "user:alice")
    owner = submit(catalog, (), owner="user:alice", processes=1)
    topic = create_topic(catalog, "out", QueryRef(owner.query_id), broker.broker_id)
    catalog.apply(KillQuery(query_id=owner.query_id, at_ms=10, requester="user:alice"))
    parent = submit(catalog, (), owner="user:alice", processes=1)
    child = submit(catalog, (), owner=f"query:{parent.query_id}", processes=1)
    catalog.apply(KillQuery(query_id=parent.query_id, at_ms=11, requester="user:alice"))
    for i in range(ENDED_QUERIES_KEPT + 5):
        _run(catalog, "user:alice", 20 + i)
    assert catalog.query(owner.query_id).ended and catalog.query(parent.query_id).ended
    # alice still manages the child through its ended submitter, and deletes the topic.
    catalog.apply(KillQuery(query_id=child.query_id, at_ms=5000, requester="user:alice"))
    catalog.apply(DeleteTopic(topic_id=topic.topic_id, requester=PrincipalRef("user:alice"),
                              principal="user:alice"))
    # Named by nothing now: the next two queries alice ends let them go.
    _run(catalog, "user:alice", 6000)
    _run(catalog, "user:alice", 6001)
    for gone in (owner, parent):
        with pytest.raises(UnknownQueryError):
            catalog.query(gone.query_id)
    assert len(_ended_of(catalog, "user:alice")) == ENDED_QUERIES_KEPT
    assert Catalog.replay(catalog.snapshot()) == catalog
