"""An exited process holds no publication (DESIGN §3 "Publications are held per process"):
a process that exits, closed publishers or not, leaves every publication it held; the
publication leaves the catalog with its last process, and the query ending retracts the
rest as before."""

from __future__ import annotations

from catalog import Catalog, ProcessExited, Publication, Publish, QueryRef, QueryState
from tests.catalog._helpers import create_topic, host, submit


def _setup(processes: int = 3):
    catalog = Catalog()
    _, broker, executor = host(catalog)
    query = submit(catalog, (executor.executor_id,) * processes)
    owner = QueryRef(query.query_id)
    topics = [create_topic(catalog, name, owner, broker.broker_id) for name in ("a", "b")]
    return catalog, query, owner, topics


def _held(catalog: Catalog) -> dict[int, tuple[int, ...]]:
    return {p.topic_id: p.processes for p in catalog.publications
            if isinstance(p, Publication)}


def test_an_exit_with_code_0_leaves_every_publication_of_the_process() -> None:
    catalog, query, owner, (a, b) = _setup()
    for process in (0, 1, 2):
        catalog.apply(Publish(topic_id=a.topic_id, publisher=owner, process=process))
    catalog.apply(Publish(topic_id=b.topic_id, publisher=owner, process=1))
    catalog.apply(ProcessExited(query_id=query.query_id, process=1, exit_code=0, at_ms=10))
    assert _held(catalog) == {a.topic_id: (0, 2)}  # b had only process 1: it left
    assert catalog.query(query.query_id).state == QueryState.SUBMITTED
    catalog.apply(ProcessExited(query_id=query.query_id, process=2, exit_code=0, at_ms=11))
    assert _held(catalog) == {a.topic_id: (0,)}
    catalog.apply(ProcessExited(query_id=query.query_id, process=0, exit_code=0, at_ms=12))
    assert _held(catalog) == {}
    assert catalog.query(query.query_id).state == QueryState.FINISHED


def test_a_process_that_published_nothing_changes_no_publication() -> None:
    catalog, query, owner, (a, _) = _setup()
    catalog.apply(Publish(topic_id=a.topic_id, publisher=owner, process=0))
    change = catalog.apply(ProcessExited(query_id=query.query_id, process=2, exit_code=0,
                                         at_ms=10))
    assert [u.collection for u in change.updates].count("publications") == 0
    assert _held(catalog) == {a.topic_id: (0,)}


def test_a_failing_exit_retracts_the_query_s_publications_once() -> None:
    catalog, query, owner, (a, b) = _setup()
    catalog.apply(Publish(topic_id=a.topic_id, publisher=owner, process=0))
    catalog.apply(Publish(topic_id=a.topic_id, publisher=owner, process=1))
    catalog.apply(Publish(topic_id=b.topic_id, publisher=owner, process=1))
    change = catalog.apply(ProcessExited(query_id=query.query_id, process=1, exit_code=3,
                                         at_ms=10))
    retracted = [u for u in change.updates if u.collection == "publications"]
    assert len(retracted) == 2 and all(u.diff == -1 for u in retracted)
    assert _held(catalog) == {}
    assert catalog.query(query.query_id).state == QueryState.FAILED
