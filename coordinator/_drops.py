"""Coordinator-driven drops of deleted topics' partitions (DESIGN §3 "Deleting topics").

The catalog remembers what is left to drop: deleting a topic inserts, in the same change, one
`PendingDrop` per hosting broker, and `PartitionsDropped` (an executor's report) retracts it.
This module decides when to tell whom, from that collection:

- a new pending drop, once durable, goes to the executor holding that broker's session;
- a broker that registers (an executor back after a restart or a lost session) is told its
  pending drops, once the registration is durable (before its reply, on the same connection);
- pending drops of brokers that are up are sent again every `RESEND_S` seconds (a notify lost
  to a full queue, a coordinator restart that resumed the executor's session);
- a `DeleteTopic` reply waits, up to `WAIT_S`, until every broker that is up has reported its
  drop, so a client that deletes and then creates the name again finds the old files gone.

Re-sending is safe because the catalog refuses to create a topic on a broker that still has
a pending drop of the same name (`TopicBeingDroppedError`): no new incarnation ever shares a
partition directory with an old one waiting to be dropped.

Must not: do I/O, read clocks (times come in), or decide anything but when to say what.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from catalog import Broker, Change, PendingDrop

from ._events import DropPartitions

if TYPE_CHECKING:
    from ._state import CoordinatorState

__all__ = ["RESEND_S", "WAIT_S", "DropTracker", "WaitForDrops"]

RESEND_S = 10.0  # pending drops of brokers that are up are sent again this often
WAIT_S = 10.0  # a DeleteTopic reply waits at most this long for the drops of brokers up


class WaitForDrops(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the DeleteTopic handler: answer `reply` once the brokers that are up have
    dropped topic `topic_id`'s partitions (or WAIT_S passed)."""

    def __init__(self, topic_id: int, reply: Any) -> None:
        super().__init__(topic_id)
        self.topic_id = topic_id
        self.reply = reply


@dataclass
class _Waiter:
    token: Any
    reply: Any
    deadline: float


@dataclass
class DropTracker:
    """When to send which drop, and which DeleteTopic replies wait for drops."""

    waiters: dict[int, list[_Waiter]] = field(default_factory=dict)  # topic id -> waiting
    sent_at: dict[tuple[int, int], float] = field(default_factory=dict)  # (topic, broker)

    def wait(self, state: CoordinatorState, wait: WaitForDrops, token: Any, now: float) -> None:
        if not self._outstanding(state, wait.topic_id):
            state.respond(token, wait.reply)
            return
        self.waiters.setdefault(wait.topic_id, []).append(
            _Waiter(token, wait.reply, now + WAIT_S))

    def after(self, state: CoordinatorState, change: Change, now: float) -> None:
        """What follows from a change: new drops and registered brokers are told, reported
        drops may release a waiting delete."""
        for collection, record, diff in change.updates:
            if collection == "drops" and diff > 0:
                assert isinstance(record, PendingDrop)
                self._send(state, record, now)
            elif collection == "drops" and diff < 0:
                assert isinstance(record, PendingDrop)
                self.sent_at.pop((record.topic_id, record.broker_id), None)
                self._release(state, record.topic_id)
            elif collection == "brokers" and diff > 0:
                assert isinstance(record, Broker)
                for drop in state.catalog.pending_drops(record.broker_id):
                    self._send(state, drop, now, broker=record)

    def tick(self, state: CoordinatorState, now: float) -> None:
        for topic_id in list(self.waiters):
            waiting = self.waiters[topic_id]
            late = [w for w in waiting if w.deadline <= now]
            for waiter in late:
                state.respond(waiter.token, waiter.reply)  # deleted; drops go on behind
                waiting.remove(waiter)
            if waiting:
                self._release(state, topic_id)  # a broker that left holds nobody up
            else:
                del self.waiters[topic_id]
        for drop in state.catalog.pending_drops():
            sent = self.sent_at.get((drop.topic_id, drop.broker_id))
            if sent is None or now - sent >= RESEND_S:
                self._send(state, drop, now)

    def _send(self, state: CoordinatorState, drop: PendingDrop, now: float,
              broker: Broker | None = None) -> None:
        if broker is None:
            broker = next((b for b in state.catalog.brokers if isinstance(b, Broker)
                           and b.broker_id == drop.broker_id), None)
        if broker is None or broker.session_id is None:
            return  # down (told when it registers), or the coordinator's own (system topics)
        self.sent_at[(drop.topic_id, drop.broker_id)] = now
        state.when_durable(DropPartitions(broker.session_id, drop.topic_id, drop.name,
                                          drop.broker_id, drop.partitions))

    def _outstanding(self, state: CoordinatorState, topic_id: int) -> bool:
        """Whether a broker that is up still has to drop some of the topic."""
        up = {b.broker_id for b in state.catalog.brokers
              if isinstance(b, Broker) and b.session_id is not None}
        return any(d.topic_id == topic_id and d.broker_id in up
                   for d in state.catalog.pending_drops())

    def _release(self, state: CoordinatorState, topic_id: int) -> None:
        if topic_id in self.waiters and not self._outstanding(state, topic_id):
            for waiter in self.waiters.pop(topic_id):
                state.respond(waiter.token, waiter.reply)
