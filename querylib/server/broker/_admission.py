"""The admission rules of the broker's core (`Admission`, composed by `BrokerState`; DESIGN §5
"Admission"): who may open a producer on which partition. Decided here, once, for every way
into the broker: RPC clients, the Kafka listener, the connector endpoint and tq's own writers
all arrive as the same `OpenProducer` stimulus.

An OpenProducer is admitted when
1. the topic's writers rule is known: "system" for a `__` topic, by its name; else the latest
   `TopicAccess` the shell fed (learned from its directory: the catalog under an executor,
   "anyone" on a standalone broker). A topic with no rule yet is asked about (`ResolveTopic`)
   and the request waits, parked, until the answer (`TopicResolved`) handles it again;
2. the rule admits the session's principal (else TopicAuthorizationError, Kafka's 29); a
   rule that refuses is asked about once more before the refusal (the catalog may have
   changed the topic's owner since: a re-run taking over a topic), so a refused writer costs
   one directory question;
3. the broker hosts the partition, or may open it: the rule places it here (a directory that
   knows placements), or places nothing and the request may create it (`create`, on a
   standalone broker). The shell opens it (`OpenPartition`) while the request waits; else
   UnknownPartitionError, or PartitionNotHereError when it lives on another broker;
4. the stream has not ended, or the request reopens it (`PartitionFrontier.join` decides:
   StreamEndedError otherwise), or it rejoins an idempotent producer whose end of stream and
   every record the partition holds: that session may only send them again (`BrokerState`,
   `Session.resending`).

Rules change with the directory (a topic deleted and created again under another owner):
`TopicAccess` replaces a rule, `TopicForgotten` drops it. At most `max_parked` requests wait
at once; more are refused.

Its interface: `admit` answers one request; what the directory and the shell report
(`topic_access`, `topic_resolved`, `partition_ready`, ...) hands back the parked requests now
answerable, which `BrokerState` handles again in the order they came. It reads the partitions
map and the limits it is given; it owns the rules, the asks in flight and the parked requests.

Must not: do I/O, know where rules come from, or change sessions or partitions (the state
does, once a request is admitted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from catalog.errors import TqError
from querylib.broker._errors import (
    BrokerProtocolError,
    TopicAuthorizationError,
    UnknownPartitionError,
)

from ._bookkeeping import BrokerLimits, PartitionState, Session
from ._events import (
    Fail,
    Instruction,
    OpenPartition,
    OpenProducer,
    PartitionId,
    PartitionOpenFailed,
    ResolveTopic,
    TopicAccess,
    TopicForgotten,
    TopicResolved,
)
from ._write_access import SYSTEM, admits, internal

__all__ = ["Admission"]


@dataclass
class _Ask:
    topic: str
    create: bool
    parked: list[OpenProducer] = field(default_factory=list)


class Admission:
    """Who may open a producer where: the topics' writers rules and the requests waiting for a
    rule or a partition."""

    def __init__(self, partitions: Mapping[PartitionId, PartitionState],
                 limits: BrokerLimits) -> None:
        self._partitions = partitions  # the state's: read only here
        self._limits = limits
        self.rules: dict[str, TopicAccess] = {}    # topic -> what the directory said last
        self._asks: dict[int, _Ask] = {}          # ResolveTopic in flight, by ask id
        self._asking: dict[tuple[str, bool], int] = {}  # (topic, create) -> its ask
        self._next_ask = 1
        self._opening: dict[PartitionId, list[OpenProducer]] = {}  # OpenPartition in flight
        self._parked = 0

    # -- deciding ---------------------------------------------------------------------------

    def rule_of(self, topic: str) -> TopicAccess | None:
        """The writers rule in force for `topic`, None while it is unknown."""
        if internal(topic):
            return TopicAccess(topic, SYSTEM)
        return self.rules.get(topic)

    def admit(self, session: Session,
              ev: OpenProducer) -> tuple[PartitionState | None, list[Instruction]]:
        """The partition `ev` may join, or None and what to do while the request waits
        (parked: handed back by a later report). Raises the TqError that refuses it."""
        topic, index = ev.partition
        rule = self.rule_of(topic)
        if rule is None:
            return None, self._park_for_topic(ev)
        if not admits(rule.writers, session.principal):
            if rule.writers != SYSTEM and not ev.rechecked:
                # The rule may be stale: the catalog may have given the topic to this writer
                # (a re-run taking over an ended owner's topic, DESIGN §3 "Ownership") before
                # the directory's update reached us. Asked once; the answer decides.
                return None, self._park_for_topic(msgspec.structs.replace(ev, rechecked=True))
            owner = "tq itself" if rule.writers == SYSTEM else rule.writers
            kind = "is internal: " if rule.writers == SYSTEM else ""
            raise TopicAuthorizationError(
                f"topic {topic!r} {kind}only {owner} may write it; {session.principal} may "
                "not write it")
        part = self._partitions.get(ev.partition)
        if part is not None:
            return part, []
        rule.check_placed(index, "write")
        if rule.here is None and not ev.create:
            raise UnknownPartitionError(f"this broker has no partition {index} of topic "
                                        f"{topic!r}")
        return None, self._park_for_partition(ev)

    def _park(self) -> None:
        if self._parked >= self._limits.max_parked:
            raise BrokerProtocolError(f"the broker has {self._parked} producer opens waiting "
                                      "for topics and partitions; retry shortly")
        self._parked += 1

    def _park_for_topic(self, ev: OpenProducer) -> list[Instruction]:
        self._park()
        topic = ev.partition[0]
        key = (topic, ev.create_topic)
        ask = self._asking.get(key)
        if ask is not None:
            self._asks[ask].parked.append(ev)
            return []
        ask = self._next_ask
        self._next_ask += 1
        self._asking[key] = ask
        self._asks[ask] = _Ask(topic, ev.create_topic, [ev])
        return [ResolveTopic(ask, topic, ev.partition[1], ev.create_topic)]

    def _park_for_partition(self, ev: OpenProducer) -> list[Instruction]:
        self._park()
        waiting = self._opening.get(ev.partition)
        if waiting is not None:
            waiting.append(ev)
            return []
        self._opening[ev.partition] = [ev]
        return [OpenPartition(ev.partition, ev.incarnation)]

    def _release(self, parked: list[OpenProducer]) -> list[OpenProducer]:
        """Parked requests to handle again, in the order they came (they may park again)."""
        self._parked -= len(parked)
        return parked

    def _refuse(self, parked: list[OpenProducer], error: Any) -> list[Instruction]:
        self._parked -= len(parked)
        if not isinstance(error, TqError):
            error = BrokerProtocolError(f"the broker's directory failed: {error}")
        return [Fail(ev.token, error) for ev in parked]

    # -- what the directory says ---------------------------------------------------------------

    def topic_access(self, ev: TopicAccess) -> list[OpenProducer]:
        """A rule for the topic: the requests that waited for it, to handle again."""
        self.rules[ev.topic] = ev
        return self._release(self._take_asks(ev.topic))

    def topic_forgotten(self, ev: TopicForgotten) -> list[Instruction]:
        self.rules.pop(ev.topic, None)
        return []

    def topic_resolved(self, ev: TopicResolved) -> tuple[list[OpenProducer], list[Instruction]]:
        """An answer to an ask: the requests to handle again, or the refusals of those it
        leaves without a rule."""
        ask = self._asks.get(ev.ask)
        if ask is None:
            return [], []  # answered already (a TopicAccess for the topic came first)
        if ev.access is None:
            del self._asks[ev.ask]
            del self._asking[(ask.topic, ask.create)]
            return [], self._refuse(ask.parked, ev.error)
        self.rules[ask.topic] = ev.access
        return self._release(self._take_asks(ask.topic)), []

    def _take_asks(self, topic: str) -> list[OpenProducer]:
        """Every request waiting for a rule of `topic` (one is known now)."""
        parked: list[OpenProducer] = []
        for create in (False, True):
            ask = self._asking.pop((topic, create), None)
            if ask is not None:
                parked += self._asks.pop(ask).parked
        return parked

    # -- partitions the shell opened -----------------------------------------------------------

    def partition_ready(self, pid: PartitionId) -> list[OpenProducer]:
        """The partition is open: the requests that waited for it, to handle again."""
        return self._release(self._opening.pop(pid, []))

    def partition_open_failed(self, ev: PartitionOpenFailed) -> list[Instruction]:
        return self._refuse(self._opening.pop(ev.partition, []), ev.error)
