"""Re-running: a publisher takes over a topic whose owner has ended (DESIGN §3 "Ownership").

The rule: a party may take over a topic whose owner is no longer active (a query that ended, a
session that closed, a principal none of whose sessions publishes it) when it acts for the same
principal at the root of its chain of submitters; the topic's owner changes in the same catalog
change that records the publication, so the brokers learn one change.
"""

from __future__ import annotations

import pytest

from catalog import (
    INGEST,
    Catalog,
    NotOwnerError,
    PrincipalRef,
    ProcessExited,
    Publish,
    QueryRef,
    SessionRef,
    StartQuery,
    Subscribe,
    Subscription,
    Unpublish,
    Update,
)
from tests.catalog._helpers import add_user, create_topic, host, open_session, submit


def _ended(catalog: Catalog, query_id: int) -> None:
    catalog.apply(ProcessExited(query_id=query_id, process=0, exit_code=0, at_ms=50))


def test_a_query_run_again_takes_over_its_ended_predecessors_topic() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    add_user(catalog, "user:alice")
    first = QueryRef(submit(catalog, (executor.executor_id,), owner="user:alice").query_id)
    nums = create_topic(catalog, "nums", first, broker.broker_id)
    published = catalog.apply(Publish(topic_id=nums.topic_id, publisher=first, process=0))
    # The first publication of a topic writes epoch 0, and marks the topic published.
    assert published.created.epoch == 0
    nums = catalog.topic(nums.topic_id)
    assert nums.published
    reader = SessionRef(open_session(catalog, principal="user:alice").session_id)
    catalog.apply(Subscribe(topic_id=nums.topic_id, subscriber=reader))
    _ended(catalog, first.query_id)

    again = QueryRef(submit(catalog, (executor.executor_id,), owner="user:alice").query_id)
    change = catalog.apply(Publish(topic_id=nums.topic_id, publisher=again, process=0))
    taken = catalog.topic(nums.topic_id)
    assert taken.owner == again
    # A later run starts an epoch numbered by its change, above every earlier one; the
    # query's other processes join its publication, and its epoch.
    assert change.created.epoch == change.version > published.version
    # One change: the topic under its new owner and the publication, nothing else of it.
    assert Update("topics", nums, -1) in change.updates
    assert Update("topics", taken, 1) in change.updates
    assert taken == nums.__class__(**{**{f: getattr(nums, f) for f in nums.__struct_fields__},
                                     "owner": again, "epoch": change.version})
    assert [p.publisher for p in catalog.publications_on(nums.topic_id)] == [again]
    # Its readers stay subscribed.
    assert catalog.subscriptions_on(nums.topic_id) == [
        Subscription(topic_id=nums.topic_id, subscriber=reader)]
    catalog.check_invariants()
    # The other processes of the new query publish as its owner now.
    catalog.apply(Unpublish(topic_id=nums.topic_id, publisher=again, process=0))


def test_a_live_owners_topic_stays_refused_and_says_what_to_do() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    first = QueryRef(submit(catalog, (executor.executor_id,)).query_id)
    catalog.apply(StartQuery(query_id=first.query_id, at_ms=20))
    nums = create_topic(catalog, "nums", first, broker.broker_id)
    again = QueryRef(submit(catalog, (executor.executor_id,)).query_id)
    with pytest.raises(NotOwnerError, match=r"topic 'nums' is owned by query 1, which is "
                       r"still running: stop it first \(tq kill 1\) or publish to another "
                       r"topic"):
        catalog.apply(Publish(topic_id=nums.topic_id, publisher=again))
    assert catalog.topic(nums.topic_id).owner == first


def test_another_principals_ended_topic_is_not_taken_over() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    add_user(catalog, "user:alice")
    add_user(catalog, "user:bob")
    first = QueryRef(submit(catalog, (executor.executor_id,), owner="user:alice").query_id)
    nums = create_topic(catalog, "nums", first, broker.broker_id)
    _ended(catalog, first.query_id)
    bobs = QueryRef(submit(catalog, (executor.executor_id,), owner="user:bob").query_id)
    with pytest.raises(NotOwnerError, match=r"topic 'nums' belongs to query 1 of user:alice; "
                       r"only user:alice may publish to it again: publish to another topic, "
                       r"or have user:alice or an admin delete it \(tq topic delete nums\)"):
        catalog.apply(Publish(topic_id=nums.topic_id, publisher=bobs))
    # An admin is no owner of anyone's topic either: it deletes an ended owner's topic instead.
    admins = QueryRef(submit(catalog, (executor.executor_id,), owner="admin").query_id)
    with pytest.raises(NotOwnerError):
        catalog.apply(Publish(topic_id=nums.topic_id, publisher=admins))
    assert catalog.topic(nums.topic_id).owner == first


def test_a_live_owner_of_another_principal_needs_force_to_delete() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    add_user(catalog, "user:alice")
    add_user(catalog, "user:bob")
    first = QueryRef(submit(catalog, (executor.executor_id,), owner="user:alice").query_id)
    catalog.apply(StartQuery(query_id=first.query_id, at_ms=20))
    nums = create_topic(catalog, "nums", first, broker.broker_id)
    bobs = QueryRef(submit(catalog, (executor.executor_id,), owner="user:bob").query_id)
    with pytest.raises(NotOwnerError, match=r"topic 'nums' is owned by query 1 of user:alice, "
                       r"which is still running: publish to another topic, or have an admin "
                       r"delete it \(tq topic delete --force nums\)"):
        catalog.apply(Publish(topic_id=nums.topic_id, publisher=bobs))


def test_queries_submitted_by_queries_act_for_the_user_at_the_root() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    add_user(catalog, "user:alice")
    parent = submit(catalog, (executor.executor_id,), owner="user:alice")
    child = QueryRef(submit(catalog, (executor.executor_id,),
                            owner=f"query:{parent.query_id}").query_id)
    nums = create_topic(catalog, "nums", child, broker.broker_id)
    _ended(catalog, child.query_id)
    _ended(catalog, parent.query_id)
    again = QueryRef(submit(catalog, (executor.executor_id,), owner="user:alice").query_id)
    catalog.apply(Publish(topic_id=nums.topic_id, publisher=again))
    assert catalog.topic(nums.topic_id).owner == again


def test_a_script_and_a_query_of_one_principal_take_turns() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    add_user(catalog, "user:alice")
    script = SessionRef(open_session(catalog, principal="user:alice").session_id)
    nums = create_topic(catalog, "nums", PrincipalRef("user:alice"), broker.broker_id)
    catalog.apply(Publish(topic_id=nums.topic_id, publisher=script))
    query = QueryRef(submit(catalog, (executor.executor_id,), owner="user:alice").query_id)
    # While the script publishes it, the principal is active: no takeover.
    with pytest.raises(NotOwnerError, match="user:alice, which is still publishing it"):
        catalog.apply(Publish(topic_id=nums.topic_id, publisher=query))
    catalog.apply(Unpublish(topic_id=nums.topic_id, publisher=script))
    catalog.apply(Publish(topic_id=nums.topic_id, publisher=query))
    assert catalog.topic(nums.topic_id).owner == query
    _ended(catalog, query.query_id)
    # A script run again takes it back, as its principal.
    later = SessionRef(open_session(catalog, principal="user:alice").session_id)
    catalog.apply(Publish(topic_id=nums.topic_id, publisher=later))
    assert catalog.topic(nums.topic_id).owner == PrincipalRef("user:alice")
    catalog.check_invariants()


def test_ingest_topics_change_no_owner() -> None:
    catalog = Catalog()
    _, broker, executor = host(catalog)
    feed = create_topic(catalog, "feed", INGEST, broker.broker_id)
    query = QueryRef(submit(catalog, (executor.executor_id,)).query_id)
    catalog.apply(Publish(topic_id=feed.topic_id, publisher=query))
    assert catalog.topic(feed.topic_id).owner == INGEST


def test_another_principals_topic_says_who_owns_it() -> None:
    catalog = Catalog()
    _, broker, _ = host(catalog)
    add_user(catalog, "user:alice")
    add_user(catalog, "user:bob")
    feed = create_topic(catalog, "feed", PrincipalRef("user:alice"), broker.broker_id)
    bob = SessionRef(open_session(catalog, principal="user:bob").session_id)
    with pytest.raises(NotOwnerError, match=r"topic 'feed' is owned by user:alice; only "
                       r"user:alice publishes to it: publish to another topic, or have "
                       r"user:alice or an admin delete it \(tq topic delete feed\)"):
        catalog.apply(Publish(topic_id=feed.topic_id, publisher=bob))


def test_a_runs_processes_share_its_epoch_even_after_its_publication_lapsed() -> None:
    """Each later run gets one epoch for all its processes: a process publishing after the
    others had closed (the publication lapsed) joins the run's epoch, not a new one."""
    catalog = Catalog()
    _, broker, executor = host(catalog)
    both = (executor.executor_id, executor.executor_id)
    first = QueryRef(submit(catalog, both).query_id)
    nums = create_topic(catalog, "nums", first, broker.broker_id)
    for process in (0, 1):
        assert catalog.apply(Publish(topic_id=nums.topic_id, publisher=first,
                                     process=process)).created.epoch == 0
    for process in (0, 1):
        catalog.apply(ProcessExited(query_id=first.query_id, process=process, exit_code=0,
                                    at_ms=50))
    again = QueryRef(submit(catalog, both).query_id)
    run = catalog.apply(Publish(topic_id=nums.topic_id, publisher=again, process=0))
    assert run.created.epoch == run.version
    catalog.apply(Unpublish(topic_id=nums.topic_id, publisher=again, process=0))
    late = catalog.apply(Publish(topic_id=nums.topic_id, publisher=again, process=1))
    assert late.created.epoch == run.created.epoch
    assert catalog.topic(nums.topic_id).epoch == run.created.epoch
    catalog.check_invariants()
