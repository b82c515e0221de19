"""A broker id follows its host (DESIGN §6 "Executor broker ids"): a broker registering with
no id on the host, principal and slot an id was last registered from, while that id is down,
gets it back, so a host that lost its data dir comes back as the replicas the catalog names.
A live id is never handed out twice, another principal never gets it, and an id that is the
last in-sync replica of a partition is not handed to a broker that lost its data."""

from __future__ import annotations

import pytest

from catalog import (
    AlterPartition,
    Broker,
    Catalog,
    CloseSession,
    CreateTopic,
    InvalidCommandError,
    NotOwnerError,
    PrincipalRef,
    RegisterBroker,
    Session,
    SessionExpired,
    SessionKind,
    Topic,
    TopicKind,
)
from tests.catalog._helpers import add_user, open_session


def _register(catalog: Catalog, session: Session, host: str = "host-a", *,
              slot: int = 0, broker_id: int | None = None) -> int:
    broker = catalog.apply(RegisterBroker(host=host, address=f"tcp://{host}:{7411 + slot}",
                                          session_id=session.session_id, slot=slot,
                                          broker_id=broker_id)).created
    assert isinstance(broker, Broker)
    catalog.check_invariants()
    return broker.broker_id


def _agent(catalog: Catalog, principal: str = "executor:a") -> Session:
    if catalog.user(principal) is None:
        add_user(catalog, principal, "executor")
    return open_session(catalog, SessionKind.EXECUTOR, principal=principal)


def test_a_host_whose_broker_is_down_gets_its_id_back_per_slot() -> None:
    catalog = Catalog()
    first = _agent(catalog)
    own, shard = _register(catalog, first), _register(catalog, first, slot=1)
    catalog.apply(SessionExpired(session_id=first.session_id, at_ms=5))
    again = _agent(catalog)  # the same host, its data dir lost: no id remembered
    assert _register(catalog, again, slot=1) == shard
    assert _register(catalog, again) == own
    assert catalog.counters.next_broker_id == shard + 1
    assert {(h.broker_id, h.host, h.principal, h.slot) for h in catalog.homes} == {
        (own, "host-a", "executor:a", 0), (shard, "host-a", "executor:a", 1)}


def test_a_live_id_is_never_handed_out_again() -> None:
    catalog = Catalog()
    first = _agent(catalog)
    own = _register(catalog, first)
    second = _agent(catalog)  # another executor on the same host, while the first is up
    other = _register(catalog, second)
    assert other != own
    catalog.apply(CloseSession(session_id=first.session_id, at_ms=5))
    third = _agent(catalog)
    assert _register(catalog, third) == own  # down now: the lowest such id


def test_another_principal_or_host_gets_a_new_id() -> None:
    catalog = Catalog()
    first = _agent(catalog)
    own = _register(catalog, first)
    catalog.apply(CloseSession(session_id=first.session_id, at_ms=5))
    stranger = _agent(catalog, "executor:b")
    assert _register(catalog, stranger) != own
    assert _register(catalog, _agent(catalog), "host-b") != own
    assert _register(catalog, _agent(catalog)) == own


def test_an_id_is_claimed_explicitly_only_by_its_principal_or_an_admin() -> None:
    catalog = Catalog()
    first = _agent(catalog)
    own = _register(catalog, first)
    catalog.apply(CloseSession(session_id=first.session_id, at_ms=5))
    stranger = _agent(catalog, "executor:b")
    before = catalog.snapshot()
    with pytest.raises(NotOwnerError, match="belongs to executor:a"):
        _register(catalog, stranger, broker_id=own)
    assert catalog.snapshot() == before
    admin = open_session(catalog, SessionKind.EXECUTOR)
    assert _register(catalog, admin, "host-c", broker_id=own) == own
    home = catalog.find_home(own)
    assert home is not None and (home.host, home.principal) == ("host-c", "admin")


def test_the_last_in_sync_replica_is_not_handed_to_a_broker_without_its_data() -> None:
    catalog = Catalog()
    a, b = _agent(catalog), _agent(catalog, "executor:b")
    broker_a, broker_b = _register(catalog, a), _register(catalog, b, "host-b")
    topic = catalog.apply(CreateTopic(
        name="t", partitions=1, record_type="bytes", kind=TopicKind.STREAM,
        owner=PrincipalRef("admin"), locations=(broker_a,), at_ms=4,
        replicas=((broker_a, broker_b),))).created
    assert isinstance(topic, Topic)
    catalog.apply(AlterPartition(topic_id=topic.topic_id, partition=0, broker_id=broker_a,
                                 leader_epoch=0, expected_isr=(broker_a, broker_b),
                                 isr=(broker_a,), session_id=a.session_id))
    catalog.apply(SessionExpired(session_id=a.session_id, at_ms=5))
    assert catalog.topic(topic.topic_id).isr == ((broker_a,),)  # offline, waiting for a
    assert _register(catalog, _agent(catalog)) != broker_a


def test_a_slot_out_of_range_is_refused() -> None:
    catalog = Catalog()
    with pytest.raises(InvalidCommandError, match="slot"):
        _register(catalog, _agent(catalog), slot=-1)


def test_an_executor_names_only_brokers_its_principal_registered() -> None:
    """An executor record names its host's brokers (its own and its shards): placement puts
    queries beside them, and the connector and Kafka endpoints locate partitions through
    them. Another host's principal must not claim them as its own."""
    from catalog import Executor, RegisterExecutor, Resources

    catalog = Catalog()
    a = _agent(catalog)
    own, shard = _register(catalog, a), _register(catalog, a, slot=1)
    b = _agent(catalog, "executor:b")
    theirs = _register(catalog, b, "host-b")
    resources = Resources(cores=1, memory=1 << 30, disk=1 << 30, slots=4)
    for broker_id, shards in ((own, ()), (theirs, (shard,))):
        before = catalog.snapshot()
        with pytest.raises(NotOwnerError, match="registered by executor:a"):
            catalog.apply(RegisterExecutor(host="host-b", broker_id=broker_id,
                                           resources=resources, session_id=b.session_id,
                                           at_ms=7, shards=shards))
        assert catalog.snapshot() == before
    made = catalog.apply(RegisterExecutor(host="host-a", broker_id=own, resources=resources,
                                          session_id=a.session_id, at_ms=8, shards=(shard,)))
    assert isinstance(made.created, Executor)
    admin = open_session(catalog, SessionKind.EXECUTOR)  # an admin's executor: any
    catalog.apply(RegisterExecutor(host="host-b", broker_id=theirs, resources=resources,
                                   session_id=admin.session_id, at_ms=9))
