"""Coordinator-driven topic drops as pure logic (coordinator/_drops.py): a delete becomes a
durable pending drop and a `DropPartitions` to the hosting executor; a broker that was down
is told when it registers again; a report forgets the drop and releases the waiting delete;
a topic created again under the name is never the subject of the old drop."""

from __future__ import annotations

from typing import Any

import pytest

from catalog import Catalog, NotOwnerError, SessionKind, TopicBeingDroppedError
from coordinator import CoordinatorState, DropPartitions, Persist
from coordinator._drops import RESEND_S, WAIT_S
from querylib.cluster import messages as m

from ._driver import Driver


def _drops(d: Driver) -> list[DropPartitions]:
    return [i for i in d.out if isinstance(i, DropPartitions)]


def _topic(d: Driver, client: int, name: str, brokers: tuple[int, ...]) -> int:
    info = d.call(m.CreateTopic(session_id=client, name=name, partitions=len(brokers),
                                locations=brokers))
    return info.topic.topic_id


def _deleted_on_one_broker(d: Driver) -> tuple[int, int, Any]:
    """(broker id, topic id, the delete's token) of topic "t" on host-a's broker, deleted by
    a client and committed."""
    _, broker_id, _ = d.host("host-a", lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    topic_id = _topic(d, client, "t", (broker_id,))
    token = d.send(m.DeleteTopic(session_id=client, name="t"))
    d.commit()
    return broker_id, topic_id, token


def test_delete_sends_drops_once_durable_and_answers_once_reported() -> None:
    d = Driver()
    executor_a, broker_a, _ = d.host("host-a")
    executor_b, broker_b, _ = d.host("host-b")
    client = d.session()
    topic_id = _topic(d, client, "t", (broker_a, broker_b, broker_a))

    token = d.send(m.DeleteTopic(session_id=client, name="t"))
    assert not _drops(d)  # nothing leaves before the delete is durable
    assert any(isinstance(i, Persist) for i in d.out)
    d.commit()
    assert sorted((x.session_id, x.broker_id, x.partitions) for x in _drops(d)) == [
        (executor_a, broker_a, (0, 2)), (executor_b, broker_b, (1,))]
    assert {x.topic_id for x in _drops(d)} == {topic_id}
    assert _drops(d)[0].name == "persistent://public/default/t"
    assert token not in d.answers  # the delete waits for the brokers that are up

    d.call(m.ReportPartitionsDropped(session_id=executor_a, topic_id=topic_id,
                                     broker_id=broker_a))
    assert token not in d.answers
    d.call(m.ReportPartitionsDropped(session_id=executor_b, topic_id=topic_id,
                                     broker_id=broker_b))
    assert isinstance(d.answer(token), m.Done)
    assert d.state.catalog.pending_drops() == []
    # A report sent twice (the drop was sent again meanwhile) is harmless.
    d.call(m.ReportPartitionsDropped(session_id=executor_a, topic_id=topic_id,
                                     broker_id=broker_a))


def test_a_broker_down_at_the_delete_is_told_when_it_registers_again() -> None:
    d = Driver()
    executor, broker_id, _ = d.host("host-a", lease_ms=1000)
    client = d.session(lease_ms=60_000)
    topic_id = _topic(d, client, "t", (broker_id,))
    d.tick(1.5)  # host-a stops renewing: its session, broker and executor leave
    assert d.state.catalog.find_topic("t") is not None
    assert all(b.broker_id != broker_id for b in d.state.catalog.brokers)  # type: ignore[union-attr]

    token = d.send(m.DeleteTopic(session_id=client, name="t"))
    d.commit()
    assert not _drops(d)
    assert isinstance(d.answer(token), m.Done)  # nobody up to wait for
    assert [x.broker_id for x in d.state.catalog.pending_drops()] == [broker_id]
    d.tick(RESEND_S + 1)
    assert not _drops(d)  # still down: nothing to send

    session = d.session(SessionKind.EXECUTOR)
    register = d.send(m.RegisterBroker(session_id=session, host="host-a",
                                       address="tcp://host-a:7411", broker_id=broker_id))
    assert not _drops(d)
    d.commit()
    (drop,) = _drops(d)
    assert (drop.session_id, drop.topic_id, drop.partitions) == (session, topic_id, (0,))
    # On the same connection the drop goes first, then the registration's reply.
    kinds = [type(i).__name__ for i in d.out]
    assert kinds.index("DropPartitions") < kinds.index("Respond")
    assert d.answer(register).broker.broker_id == broker_id

    d.call(m.ReportPartitionsDropped(session_id=session, topic_id=topic_id,
                                     broker_id=broker_id))
    assert d.state.catalog.pending_drops() == []
    d.tick(RESEND_S + 1)
    assert not _drops(d)


def test_unreported_drops_are_sent_again_and_a_late_delete_is_answered_anyway() -> None:
    d = Driver()
    broker_id, topic_id, token = _deleted_on_one_broker(d)
    assert len(_drops(d)) == 1
    d.tick(RESEND_S / 2)
    assert not _drops(d)
    d.tick(WAIT_S)  # past both the resend period and the delete's wait
    assert [x.topic_id for x in _drops(d)] == [topic_id]
    assert isinstance(d.answer(token), m.Done)  # deleted; the drop goes on behind
    assert d.state.catalog.pending_drop(topic_id, broker_id) is not None


def test_a_topic_created_again_is_never_the_subject_of_the_old_drop() -> None:
    d = Driver()
    executor_a, broker_a, _ = d.host("host-a", lease_ms=60_000)
    executor_b, broker_b, _ = d.host("host-b", lease_ms=60_000)
    client = d.session(lease_ms=60_000)
    old_id = _topic(d, client, "t", (broker_a,))
    d.send(m.DeleteTopic(session_id=client, name="t"))
    d.commit()

    # While broker a has not dropped the old files, the name cannot come back there...
    with pytest.raises(TopicBeingDroppedError) as refused:
        _topic(d, client, "t", (broker_a,))
    assert refused.value.retriable
    # ... but elsewhere it can: a new incarnation, with its own id.
    new_id = _topic(d, client, "t", (broker_b,))
    assert new_id != old_id
    d.tick(RESEND_S + 1)
    assert [(x.topic_id, x.broker_id) for x in _drops(d)] == [(old_id, broker_a)]

    d.call(m.ReportPartitionsDropped(session_id=executor_a, topic_id=old_id,
                                     broker_id=broker_a))
    assert d.state.catalog.pending_drops() == []
    assert d.state.catalog.topic(new_id).locations == (broker_b,)
    # Reporting the old incarnation on the new one's broker touches nothing.
    d.call(m.ReportPartitionsDropped(session_id=executor_b, topic_id=old_id,
                                     broker_id=broker_b))
    assert d.state.catalog.find_topic("t").topic_id == new_id  # type: ignore[union-attr]

    # Deleting the new incarnation drops only that one, on its own broker.
    d.send(m.DeleteTopic(session_id=client, name="t"))
    d.commit()
    assert [(x.topic_id, x.broker_id) for x in _drops(d)] == [(new_id, broker_b)]


def test_only_the_session_holding_the_broker_may_report_its_drops() -> None:
    d = Driver()
    broker_id, topic_id, _ = _deleted_on_one_broker(d)
    client = d.session(lease_ms=60_000)  # not the session holding the broker
    with pytest.raises(NotOwnerError):
        d.call(m.ReportPartitionsDropped(session_id=client, topic_id=topic_id,
                                         broker_id=broker_id))
    assert d.state.catalog.pending_drop(topic_id, broker_id) is not None


def test_pending_drops_survive_a_restart_through_the_catalog() -> None:
    d = Driver()
    broker_id, topic_id, _ = _deleted_on_one_broker(d)
    updates = [u for p in d.persisted for u in p.updates]
    restarted = Driver(CoordinatorState(Catalog.replay(updates)), bootstrap=False)
    assert [x.topic_id for x in restarted.state.catalog.pending_drops()] == [topic_id]
    restarted.tick(0.1)  # its executor's session was recovered: it is told again
    assert [(x.topic_id, x.broker_id) for x in _drops(restarted)] == [(topic_id, broker_id)]
