"""BrokerState with cohorts: producers of a collective publication open as writers of a
cohort; the partition's frontier control batches and end-of-stream wait for every writer."""

from __future__ import annotations

from querylib.broker.messages import Done, ProducerOpened, Subscribed
from querylib.server.broker._events import (
    AdvanceFrontier,
    EndStream,
    Heartbeat,
    OpenProducer,
    OpenSession,
    Subscribe,
    Tick,
)
from querylib.server.broker._frontier import CohortError
from querylib.server.broker._state import BrokerLimits

from ._sim import Sim

P = ("t", 0)
G = "q7/merged#1"


def writer(sim: Sim, session: str, name: str, writers: int = 2, lease: float = 10.0) -> None:
    sim.feed(OpenSession(f"os-{session}", session, lease))
    sim.feed(OpenProducer(f"op-{session}", session, P, G, name, writers))
    reply = sim.replies[f"op-{session}"]
    assert isinstance(reply, ProducerOpened), reply


def test_a_late_writer_joins_below_everything_published():
    sim = Sim()
    sim.open_partition(P)
    writer(sim, "a", "0")
    sim.feed(AdvanceFrontier("a1", "a", P, 5))
    sim.feed(EndStream("a2", "a", P))
    assert sim.replies["a1"] == Done() and sim.replies["a2"] == Done()
    assert sim.controls(P) == []  # neither the frontier nor the end: writer 1 may still send
    sim.feed(OpenSession("os-r", "r", 10.0))
    sim.track("r", 1, 10_000)
    sim.feed(Subscribe("s", "r", 1, P, "latest", 10_000))
    assert sim.replies["s"] == Subscribed(offset=0, log_start=0, log_end=0, frontier=0,
                                          ended=False)
    writer(sim, "b", "1")
    assert sim.replies["op-b"].frontier == 0
    sim.feed(AdvanceFrontier("b1", "b", P, 3))
    sim.feed(EndStream("b2", "b", P))
    assert sim.controls(P) == [("F", 3), ("E", None)]


def test_the_cohort_is_released_when_its_producers_vanish():
    sim = Sim(BrokerLimits(min_lease=1.0))
    sim.open_partition(P)
    sim.feed(OpenSession("os-p", "plain", 10.0))
    sim.feed(OpenProducer("op-p", "plain", P))
    writer(sim, "a", "0", lease=2.0)
    sim.feed(AdvanceFrontier("p1", "plain", P, 4))
    sim.feed(AdvanceFrontier("a1", "a", P, 9))
    assert sim.controls(P) == []
    sim.feed(Tick(1.5))
    sim.feed(Heartbeat("hb", "plain"))
    sim.feed(Tick(3.0))  # writer a's lease ran out: its query is failing
    assert "a" not in sim.state.sessions
    assert sim.controls(P) == [("F", 4)]


def test_a_cohort_of_another_size_is_refused():
    sim = Sim()
    sim.open_partition(P)
    writer(sim, "a", "0")
    sim.feed(OpenSession("os-b", "b", 10.0))
    sim.feed(OpenProducer("op-b", "b", P, G, "1", 3))
    assert isinstance(sim.replies["op-b"], CohortError)
    assert P not in sim.state.sessions["b"].producing
    sim.feed(AdvanceFrontier("b1", "b", P, 1))
    assert not isinstance(sim.replies["b1"], Done)

