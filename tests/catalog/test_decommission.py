"""Decommissioning a broker in the catalog (DESIGN §5 "Decommissioning a broker"): each move
puts a live broker in place of the leaving one in a partition's replicas, takes the leaving one
out of the ISR (electing a leader from the rest of the ISR at the next epoch when it led), and
once it holds nothing its home is retired: placement never uses it, its id is never handed out
or taken again. Only an admin may; a live broker only with `force`; never an unclean election.
"""

from __future__ import annotations

import msgspec
import pytest

from catalog import (
    BrokerInUseError,
    BrokerRetiredError,
    Catalog,
    CloseSession,
    CorruptCatalogError,
    DecommissionBroker,
    InvalidCommandError,
    NotAuthorizedError,
    PrincipalRef,
    RegisterBroker,
    UnknownBrokerError,
    Update,
)
from tests.catalog._helpers import add_user, create_replicated, hosts, open_session

OWNER = PrincipalRef("admin")


def _decommission(catalog: Catalog, broker: int, moves: tuple[tuple[int, int, int], ...],
                  *, force: bool = False) -> None:
    catalog.apply(DecommissionBroker(broker_id=broker, requester="admin", force=force,
                                     moves=moves))
    catalog.check_invariants()


def test_a_dead_brokers_replicas_move_and_it_is_retired() -> None:
    catalog, sessions, (a, b, c, d) = hosts(4)
    topic = create_replicated(catalog, ((a, b, c), (b, c, a)))
    catalog.apply(CloseSession(session_id=sessions[2].session_id, at_ms=5))  # c's host dies
    assert catalog.topic(topic.topic_id).isr == ((a, b), (b, a))
    _decommission(catalog, c, ((topic.topic_id, 0, d), (topic.topic_id, 1, d)))
    moved = catalog.topic(topic.topic_id)
    # The new replica is last; it joins the ISR only once the leader says it caught up.
    assert moved.replicas == ((a, b, d), (b, a, d))
    assert moved.isr == ((a, b), (b, a))
    assert moved.locations == (a, b) and moved.leader_epochs == (0, 0)
    home = catalog.find_home(c)
    assert home is not None and home.retired
    assert Catalog.replay(catalog.snapshot()) == catalog


def test_a_live_leader_is_decommissioned_only_with_force_and_a_leader_is_elected_first() -> None:
    catalog, _, (a, b, c, d) = hosts(4)
    topic = create_replicated(catalog, ((a, b, c),))
    with pytest.raises(BrokerInUseError, match="--force"):
        catalog.apply(DecommissionBroker(broker_id=a, requester="admin",
                                         moves=((topic.topic_id, 0, d),)))
    _decommission(catalog, a, ((topic.topic_id, 0, d),), force=True)
    moved = catalog.topic(topic.topic_id)
    assert moved.replicas == ((b, c, d),) and moved.isr == ((b, c),)
    assert moved.locations == (b,) and moved.leader_epochs == (1,)
    home = catalog.find_home(a)
    assert home is not None and home.retired


def test_the_only_in_sync_replica_does_not_move_and_the_broker_is_not_retired() -> None:
    catalog, sessions, (a, b, c, d) = hosts(4)
    topic = create_replicated(catalog, ((a, b),), "offline")
    kept = create_replicated(catalog, ((c, a),), "kept")
    catalog.apply(CloseSession(session_id=sessions[1].session_id, at_ms=5))  # b leaves the ISR
    catalog.apply(CloseSession(session_id=sessions[0].session_id, at_ms=5))  # a: last in sync
    assert catalog.topic(topic.topic_id).isr == ((a,),)
    with pytest.raises(InvalidCommandError, match="only in-sync replica"):
        catalog.apply(DecommissionBroker(broker_id=a, requester="admin",
                                         moves=((topic.topic_id, 0, d),)))
    # What can move moves; `offline` stays on a, so a is not retired.
    _decommission(catalog, a, ((kept.topic_id, 0, d),))
    assert catalog.topic(kept.topic_id).replicas == ((c, d),)
    assert catalog.topic(topic.topic_id).replicas == ((a, b),)
    home = catalog.find_home(a)
    assert home is not None and not home.retired


@pytest.mark.parametrize("why", ["not a replica", "no such partition", "already a replica",
                                 "not registered", "twice"])
def test_a_move_that_does_not_fit_is_refused_and_changes_nothing(why: str) -> None:
    catalog, sessions, (a, b, c, d) = hosts(4)
    topic = create_replicated(catalog, ((a, b), (c, a)))
    catalog.apply(CloseSession(session_id=sessions[1].session_id, at_ms=5))
    moves = {"not a replica": ((topic.topic_id, 1, d),),
             "no such partition": ((topic.topic_id, 5, d),),
             "already a replica": ((topic.topic_id, 0, a),),
             "not registered": ((topic.topic_id, 0, 99),),
             "twice": ((topic.topic_id, 0, c), (topic.topic_id, 0, d))}[why]
    before = catalog.snapshot()
    with pytest.raises((InvalidCommandError, UnknownBrokerError)):
        catalog.apply(DecommissionBroker(broker_id=b, requester="admin", moves=moves))
    assert catalog.snapshot() == before


def test_bad_requests_get_clear_errors() -> None:
    catalog, sessions, (a, b, _c, _d) = hosts(4)
    add_user(catalog, "user:alice")
    catalog.apply(CloseSession(session_id=sessions[1].session_id, at_ms=5))
    with pytest.raises(NotAuthorizedError, match="admin"):
        catalog.apply(DecommissionBroker(broker_id=b, requester="user:alice"))
    with pytest.raises(UnknownBrokerError, match="no broker 99"):
        catalog.apply(DecommissionBroker(broker_id=99, requester="admin"))
    coordinator = catalog.apply(RegisterBroker(host="coord", address="tcp://c:7401",
                                               session_id=None)).created
    assert coordinator is not None
    with pytest.raises(InvalidCommandError, match="coordinator's own broker"):
        catalog.apply(DecommissionBroker(broker_id=coordinator.broker_id,  # type: ignore[attr-defined]
                                         requester="admin", force=True))
    _decommission(catalog, b, ())
    with pytest.raises(BrokerRetiredError, match="decommissioned already"):
        catalog.apply(DecommissionBroker(broker_id=b, requester="admin"))
    assert a


def test_a_retired_id_is_never_registered_again_nor_handed_out() -> None:
    catalog, sessions, (_a, b, _c, _d) = hosts(4)
    catalog.apply(CloseSession(session_id=sessions[1].session_id, at_ms=5))
    _decommission(catalog, b, ())
    session = open_session(catalog, principal="admin")
    with pytest.raises(BrokerRetiredError):  # an UnknownBrokerError: the executor drops it
        catalog.apply(RegisterBroker(host="host-1", address="tcp://h:1", broker_id=b,
                                     session_id=session.session_id))
    assert issubclass(BrokerRetiredError, UnknownBrokerError)
    again = catalog.apply(RegisterBroker(host="host-1", address="tcp://h:1",
                                         session_id=session.session_id)).created
    assert again is not None and again.broker_id != b  # type: ignore[attr-defined]
    catalog.check_invariants()


def test_the_invariants_refuse_a_retired_broker_holding_a_replica() -> None:
    catalog, sessions, (a, b, c, _d) = hosts(4)
    topic = create_replicated(catalog, ((a, c),))
    catalog.apply(CloseSession(session_id=sessions[1].session_id, at_ms=5))
    _decommission(catalog, b, ())
    stored = catalog.topic(topic.topic_id)
    bad = msgspec.structs.replace(stored, replicas=((a, b),), isr=((a,),))
    with pytest.raises(CorruptCatalogError):
        Catalog.replay([u for u in catalog.snapshot() if u.collection != "topics"]
                       + [Update("topics", bad, 1)])
