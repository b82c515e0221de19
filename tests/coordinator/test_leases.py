"""Leases and waiters: pure bookkeeping against a model, time as input."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from catalog import Session, SessionKind
from coordinator import Leases, Waiter, Waiters, binding_of, bound_peer


def test_lease_expires_after_its_length_unless_renewed() -> None:
    leases = Leases()
    leases.grant(1, 1.0, now=0.0)
    leases.grant(2, 3.0, now=0.0)
    assert leases.expired(0.99) == []
    leases.renew(1, now=0.5)
    assert leases.expired(1.2) == []
    assert leases.expired(1.5) == [1]
    assert 1 not in leases and 2 in leases
    leases.forget(2)
    assert leases.expired(10.0) == []
    assert len(leases) == 0


def test_renewing_an_unknown_lease_is_a_key_error() -> None:
    leases = Leases()
    try:
        leases.renew(7, 0.0)
    except KeyError:
        pass
    else:
        raise AssertionError("expected KeyError")


@given(st.lists(st.tuples(st.sampled_from(["grant", "renew", "forget", "expire"]),
                          st.integers(1, 5), st.floats(0.05, 3.0), st.floats(0.0, 1.0)),
                max_size=80))
def test_leases_match_a_model(ops: list[tuple[str, int, float, float]]) -> None:
    leases = Leases()
    model: dict[int, float] = {}
    now = 0.0
    for op, session, length, step in ops:
        now += step
        if op == "grant":
            leases.grant(session, length, now)
            model[session] = now + length
        elif op == "renew" and session in model:
            leases.renew(session, now, length)
            model[session] = max(model[session], now + length)
        elif op == "forget":
            leases.forget(session)
            model.pop(session, None)
        elif op == "expire":
            gone = leases.expired(now)
            expected = sorted(s for s, t in model.items() if t <= now)
            assert sorted(gone) == expected
            for s in gone:
                del model[s]
        assert set(model) == {s for s in range(1, 6) if s in leases}


def test_waiters_leave_every_index_at_once() -> None:
    waiters = Waiters()
    a = Waiter("a", None, "x", deadline=1.0, session_id=1)
    b = Waiter("b", None, "x", deadline=2.0, session_id=2)
    c = Waiter("c", None, "y", deadline=3.0, session_id=1)
    for w in (a, b, c):
        waiters.add(w)
    assert waiters.expired(1.5) == [a]
    assert waiters.take_session(1) == [c]
    assert waiters.take("x") == [b]
    assert len(waiters) == 0 and waiters.expired(10.0) == []


def test_a_binding_round_trips_through_the_session_peer() -> None:
    peer = bound_peer(12, 3, "python job.py root@host pid 9")
    session = Session(session_id=1, kind=SessionKind.QUERY, peer=peer, opened_at_ms=0)
    assert binding_of(session) == (12, 3)
    client = Session(session_id=2, kind=SessionKind.CLIENT, peer=peer, opened_at_ms=0)
    assert binding_of(client) is None
    odd = Session(session_id=3, kind=SessionKind.QUERY, peer="query x", opened_at_ms=0)
    assert binding_of(odd) is None
