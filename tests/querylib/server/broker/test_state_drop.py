"""BrokerState forgets a partition whose topic was deleted (DropPartition): its
subscriptions end, its producers are detached, and it refuses while I/O is in flight."""

from __future__ import annotations

from querylib.broker._errors import PartitionBusyError, UnknownPartitionError
from querylib.broker.messages import Done
from querylib.server.broker._events import (
    CloseSession,
    DropPartition,
    OpenProducer,
    OpenSession,
    Produce,
    Subscribe,
    SubscriptionClosed,
)

from ._sim import Sim, fake_batch

P = ("t", 0)
OTHER = ("t", 1)


def _started() -> Sim:
    sim = Sim()
    sim.open_partition(P)
    sim.open_partition(OTHER)
    sim.feed(OpenSession("o-p", "p", 10.0))
    sim.feed(OpenProducer("op-p", "p", P))
    sim.feed(OpenProducer("op-p1", "p", OTHER))
    sim.feed(OpenSession("o-s", "s", 10.0))
    return sim


def test_drop_ends_subscriptions_and_detaches_producers():
    sim = _started()
    sim.track("s", 1, 1000)
    sim.feed(Subscribe("sub", "s", 1, P, "latest", 1000))
    out = sim.feed(DropPartition("drop", P))
    (closed,) = [i for i in out if isinstance(i, SubscriptionClosed)]
    assert isinstance(closed.error, UnknownPartitionError) and "deleted" in str(closed.error)
    assert sim.replies["drop"] == Done()
    assert P not in sim.state.partitions and OTHER in sim.state.partitions
    sim.feed(Produce("late", "p", P, fake_batch(1, b"x")))
    assert isinstance(sim.replies["late"], UnknownPartitionError)
    sim.feed(Produce("other", "p", OTHER, fake_batch(1, b"y")))  # the rest is untouched
    sim.complete_append(OTHER)
    assert sim.replies["other"].next_offset == 1
    sim.feed(CloseSession("close", "p"))  # a session that produced to it ends cleanly
    assert sim.replies["close"] == Done()


def test_drop_is_refused_while_an_append_or_a_read_is_in_flight():
    sim = _started()
    sim.feed(Produce("a", "p", P, fake_batch(1, b"x")))
    sim.feed(DropPartition("busy", P))
    assert isinstance(sim.replies["busy"], PartitionBusyError)
    assert sim.replies["busy"].retriable
    sim.complete_append(P)
    sim.track("s", 1, 1000)
    sim.feed(Subscribe("sub", "s", 1, P, "earliest", 1000))
    (serial,) = sim.reads
    sim.feed(DropPartition("reading", P))
    assert isinstance(sim.replies["reading"], PartitionBusyError)
    sim.complete_read(serial)
    sim.feed(DropPartition("now", P))
    assert sim.replies["now"] == Done()


def test_dropping_a_partition_not_hosted_is_done():
    sim = Sim()
    sim.feed(DropPartition("none", P))
    assert sim.replies["none"] == Done()
