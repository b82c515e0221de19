"""A broker's registration is read with its CURVE key's shape checked (querylib/cluster/
messages.py RegisterBroker): clients connect with what the broker's record says, so a
malformed key is refused as the message is decoded, before it reaches the catalog; so is a
slot on its host out of 0..MAX_BROKER_SLOT."""

import msgspec
import pytest

from querylib.cluster import messages as m
from querylib.rpc import coordinator_public_key


def _read(curve_key: str) -> m.RegisterBroker:
    sent = msgspec.msgpack.encode(m.RegisterBroker(session_id=1, host="h",
                                                   address="tcp://h:7411", curve_key=curve_key))
    return msgspec.msgpack.decode(sent, type=m.RegisterBroker)


@pytest.mark.parametrize("bad", ["not-a-key", "x" * 39 + " ", "x" * 41, "x" * 39 + "\n"])
def test_a_malformed_curve_key_is_refused_as_the_registration_is_read(bad: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="curve_key"):
        _read(bad)


def test_a_public_key_or_none_is_read() -> None:
    key = coordinator_public_key(b"k" * 32)
    assert _read(key).curve_key == key
    assert _read("").curve_key == ""


@pytest.mark.parametrize(("slot", "ok"), [(0, True), (1023, True), (-1, False), (1024, False)])
def test_a_brokers_slot_on_its_host_is_bounded_as_the_registration_is_read(slot: int,
                                                                            ok: bool) -> None:
    sent = msgspec.msgpack.encode(m.RegisterBroker(session_id=1, host="h",
                                                   address="tcp://h:7411", slot=slot))
    if ok:
        assert msgspec.msgpack.decode(sent, type=m.RegisterBroker).slot == slot
    else:
        with pytest.raises(msgspec.ValidationError, match="slot"):
            msgspec.msgpack.decode(sent, type=m.RegisterBroker)
