import pytest

from catalog.errors import ProtocolError
from querylib.broker._credit import CreditGrant, CreditWindow


def test_window_overshoots_by_at_most_one_batch_then_stops():
    w = CreditWindow(100)
    assert w.can_send()
    w.consume(150)  # a whole batch larger than the remaining credit still goes
    assert not w.can_send()
    w.grant(60)
    assert w.can_send() and w.available == 10


def test_grant_beyond_limit_is_a_protocol_error():
    w = CreditWindow(10)
    with pytest.raises(ProtocolError):
        w.grant(100, limit=50)
    with pytest.raises(ProtocolError):
        w.grant(-1)


def test_receiver_grants_after_half_window():
    g = CreditGrant(1000)
    assert g.initial() == 1000
    assert g.consumed(300) == 0
    assert g.consumed(250) == 550
    assert g.consumed(100) == 0
