"""The subscription rules of the broker's core (`Subscriptions`, composed by `BrokerState`;
DESIGN §5): opening
a subscription at an offset, its credit, and where it stands: reading from disk (catch-up),
waiting at the tail, or handed freshly durable batches from memory.

Rules (tests in tests/querylib/server/broker/test_state.py and test_state_properties.py):
- A subscription is sent data only while its credit is positive, so it never receives more than
  its credit plus one batch; deliveries to it are contiguous (each starts where the last ended).
- Only durable batches are visible (`PartitionState.visible_end`, like Kafka's high watermark):
  a batch lost in a crash was never delivered, so a resuming subscriber's offset stays valid.
- Only decided Kafka transactions are read: subscriptions stop at the last stable offset
  (`PartitionState.stable_end`) and the batches of aborted transactions are left out of what
  they are sent (a delivery keeps its offsets [offset, next_offset); its bytes may be fewer
  batches, or none), so every tq reader (`ctx.subscribe`, `tq consume`, Spark) sees committed
  records only, as a read_committed Kafka consumer does.
- Nothing is buffered per subscriber: a subscription is either reading (one `Read` outstanding),
  tailing (in `PartitionState.tailing`) or out of credit; one falling behind the tail reads
  from disk later.
- A one-way message or read result for a subscription already gone is counted
  (`stale_grants`, `stale_reads`), never answered.

It owns the subscriptions (by serial, also indexed in their partition and session); the state
gives it the partitions and sessions maps, the limits, the counters and how the log stores a
batch (`stamp`), hands it a subscriber's requests with the session and partition they named
already checked, and calls `tail` once batches become durable and `retention` once the log
start moves.

Must not: do I/O, or touch the producer side (appends, windows, frontiers), or add and remove
sessions and partitions (the state does).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import Any

from catalog.errors import TqError
from querylib.broker._credit import CreditWindow
from querylib.broker._errors import BrokerProtocolError, CreditExceededError
from querylib.broker.messages import Done, Subscribed
from querylib.errors import OffsetOutOfRangeError, StorageError
from querylib.records._control import without_aborted

from ._bookkeeping import TXN_DATA, BrokerLimits, PartitionState, Pending, Session, Subscription
from ._events import (
    Deliver,
    DropSubscription,
    GrantCredit,
    Instruction,
    PartitionId,
    Read,
    ReadCompleted,
    ReadFailed,
    Reply,
    Subscribe,
    SubscriptionClosed,
    Unsubscribe,
)

__all__ = ["Subscriptions", "aborted_between", "without_aborted_in"]

# Consecutive batches up to this many bytes in all go to a tailing subscriber as one delivery
# (their bytes joined: a copy, made once for every subscription sent that run; a batch this big
# goes alone, uncopied). As a Producer's request group (`_GROUP_BYTES`): the two 100 KB
# batches of one request go as one message, MAC and credit step, not one each.
# On a replicated partition, up to the limits' max_read_bytes (as a read of the log) and
# TAIL_FRAMES batches: there batches become visible in runs, several a follower's fetch, and
# one message and MAC a run rather than a batch saves, on the broker and the subscriber; the
# run is not joined but goes as one payload frame a batch, the very stored bytes the
# followers fetched, so their digests (`DigestCache`) sign it too: no copy and no hash.
_TAIL_MERGE_BYTES = 256 * 1024
# The most batches (payload frames) a delivery of a replicated run carries: well within the
# RPC's max_frames (64 by default, header, body and signature included), as HELD_BATCHES.
TAIL_FRAMES = 32


def aborted_between(part: PartitionState, start: int,
                    end: int) -> list[tuple[int, int, int]]:
    """The aborted transactions with records in [start, end): (producer id, first offset,
    marker offset), in marker order."""
    aborted = part.aborted
    if not aborted or aborted[-1][2] < start:
        return []
    i = bisect.bisect_left(aborted, start, key=lambda a: a[2])
    return [a for a in (aborted[j] for j in range(i, len(aborted))) if a[1] < end]


def without_aborted_in(part: PartitionState, data: bytes, start: int, end: int) -> bytes:
    """`data` (whole batches holding [start, end)) without the batches of aborted
    transactions; `data` itself when it holds none."""
    return without_aborted(data, aborted_between(part, start, end))


class Subscriptions:
    """The broker's subscriptions: opening, credit, catch-up reads and tail delivery."""

    def __init__(self, partitions: Mapping[PartitionId, PartitionState],
                 sessions: Mapping[str, Session], limits: BrokerLimits,
                 counters: dict[str, int], stamp: Callable[[Any, int], bytes]) -> None:
        self._partitions = partitions  # the state's maps: read here, changed by the state
        self._sessions = sessions
        self._limits = limits
        self._counters = counters  # the state's; this adds stale_grants and stale_reads
        self._stamp = stamp
        self.by_serial: dict[int, Subscription] = {}
        self._next_serial = 1

    def __len__(self) -> int:
        return len(self.by_serial)

    def check_invariants(self) -> None:
        """Raise AssertionError unless every subscription is known to its partition and its
        session, and a partition and a session hold only known subscriptions."""
        subs = self.by_serial
        for serial, sub in subs.items():
            part = self._partitions.get(sub.partition)
            assert part is not None and part.subs.get(serial) is sub, \
                f"subscription {serial} unknown to its partition {sub.partition}"
            session = self._sessions.get(sub.session)
            assert session is None or session.subs.get(sub.sub_id) == serial, \
                f"subscription {serial} unknown to its session {sub.session!r}"
        for pid, part in self._partitions.items():
            assert part.subs.keys() <= subs.keys(), f"{pid}: a forgotten subscription"
            assert part.tailing <= part.subs.keys(), f"{pid}: tailing a forgotten subscription"
        for session in self._sessions.values():
            assert set(session.subs.values()) <= subs.keys(), \
                f"session {session.id!r} holds a forgotten subscription"

    # -- requests of a subscriber ------------------------------------------------------------

    def subscribe(self, session: Session, part: PartitionState,
                  ev: Subscribe) -> list[Instruction]:
        """Open `ev` in a live `session` on a partition the broker holds."""
        lim = self._limits
        if ev.sub_id in session.subs:
            raise BrokerProtocolError(f"subscription {ev.sub_id} already exists in this session")
        if len(session.subs) >= lim.max_subscriptions_per_session:
            raise BrokerProtocolError("too many subscriptions for one session")
        if not 0 <= ev.credit <= lim.max_credit:
            raise CreditExceededError(f"initial credit {ev.credit} outside 0..{lim.max_credit}")
        if ev.start == "earliest":
            offset = part.log_start
        elif ev.start == "latest":
            offset = part.stable_end
        elif isinstance(ev.start, int) and part.log_start <= ev.start <= part.log_end:
            # Up to the log end, as Kafka's fetch: above the visible end (a new leader's high
            # watermark may lag its predecessor's, where a reader resumes) it waits there.
            offset = ev.start
        else:
            raise OffsetOutOfRangeError(f"offset {ev.start!r} is outside the partition's range "
                                        f"{part.log_start}..{part.log_end}")
        serial = self._next_serial
        self._next_serial += 1
        sub = Subscription(serial, session.id, ev.sub_id, part.id, offset,
                           CreditWindow(ev.credit))
        self.by_serial[serial] = sub
        part.subs[serial] = sub
        session.subs[ev.sub_id] = serial
        at_end = offset == part.visible_end >= part.known_end
        # The epoch in force at `offset`, when known: the current one from where it is known
        # to hold (DESIGN §5 "Epochs"), up to where it was recovered; elsewhere the reader
        # learns it from the log.
        epoch = part.visible_epoch if offset >= part.epoch_since and (
            part.shown_at < 0 or offset <= part.shown_at) else 0
        reply = Subscribed(offset=offset, log_start=part.log_start, log_end=part.stable_end,
                           frontier=part.visible_frontier if at_end else None,
                           ended=part.visible_ended and at_end, epoch=epoch)
        return [Reply(ev.token, reply), *self._pump(sub)]

    def grant(self, ev: GrantCredit, now: float) -> list[Instruction]:
        """More credit (a one-way message: its session's lease is renewed from `now`)."""
        session = self._sessions.get(ev.session)
        serial = session.subs.get(ev.sub_id) if session is not None else None
        if session is None or serial is None:
            # One-way message racing an unsubscribe or an expiry: nobody to answer, nothing
            # to undo. Counted so a flood of them is visible.
            self._counters["stale_grants"] += 1
            return []
        session.expires_at = now + session.lease
        sub = self.by_serial[serial]
        if ev.nbytes <= 0 or sub.credit.available + ev.nbytes > self._limits.max_credit:
            return self._close_sub(sub, CreditExceededError(
                f"credit grant of {ev.nbytes} bytes: a grant is positive and credit stays "
                f"within {self._limits.max_credit} bytes"))
        sub.credit.grant(ev.nbytes)
        return self._pump(sub)

    def unsubscribe(self, session: Session, ev: Unsubscribe) -> list[Instruction]:
        """Close one of a live `session`'s subscriptions at its request."""
        serial = session.subs.get(ev.sub_id)
        if serial is None:
            raise BrokerProtocolError(f"no subscription {ev.sub_id} in this session")
        self._remove_sub(self.by_serial[serial])
        return [Reply(ev.token, Done())]

    def drop(self, ev: DropSubscription) -> list[Instruction]:
        """The shell could not deliver to a subscription: close it."""
        session = self._sessions.get(ev.session)
        serial = session.subs.get(ev.sub_id) if session is not None else None
        if serial is None:
            return []  # already gone (several deliveries of one round failed)
        error = ev.error if isinstance(ev.error, TqError) else BrokerProtocolError(str(ev.error))
        return self._close_sub(self.by_serial[serial], error)

    def forget_session(self, session: Session) -> None:
        """The session ended: its subscriptions stop, unannounced (its client is gone)."""
        for serial in list(session.subs.values()):
            self._remove_sub(self.by_serial[serial])

    def close_partition(self, part: PartitionState, error: TqError) -> list[Instruction]:
        """The partition is going: close every subscription on it with `error`."""
        out: list[Instruction] = []
        for sub in list(part.subs.values()):
            out += self._close_sub(sub, error)
        return out

    def _remove_sub(self, sub: Subscription) -> None:
        del self.by_serial[sub.serial]
        part = self._partitions[sub.partition]
        del part.subs[sub.serial]
        part.tailing.discard(sub.serial)
        session = self._sessions.get(sub.session)
        if session is not None:
            session.subs.pop(sub.sub_id, None)

    def _close_sub(self, sub: Subscription, error: TqError) -> list[Instruction]:
        self._remove_sub(sub)
        return [SubscriptionClosed(sub.session, sub.sub_id, sub.partition, error)]

    # -- catch-up and tail -------------------------------------------------------------------

    def _pump(self, sub: Subscription) -> list[Instruction]:
        """Move a subscription forward: read from disk if it is behind, else wait at the tail."""
        part = self._partitions[sub.partition]
        if sub.reading or not sub.credit.can_send():
            part.tailing.discard(sub.serial)
            return []
        stable = part.stable_end
        if sub.next_offset < stable:
            part.tailing.discard(sub.serial)
            sub.reading = True
            max_bytes = min(sub.credit.available, self._limits.max_read_bytes)
            return [Read(part.id, sub.serial, sub.next_offset, max_bytes, stable)]
        part.tailing.add(sub.serial)
        return []

    def tail(self, part: PartitionState, newly: list[Pending]) -> list[Instruction]:
        """Hand batches that just became visible to subscriptions waiting at the tail, straight
        from memory; one stored copy is shared by all of them. Consecutive batches go in one
        delivery while they fit the subscription's credit and _TAIL_MERGE_BYTES, on a
        replicated partition max_read_bytes (one message,
        one MAC, rather than one each; their bytes joined once for every subscription sent
        that run). A subscription
        that runs out of credit part way reads the rest from disk later."""
        out: list[Instruction] = []
        stable = part.stable_end
        subs = self.by_serial
        joined: dict[tuple[int, int], Any] = {}  # (first, after last) index in newly -> bytes
        replicated = part.replication is not None
        merge = max(_TAIL_MERGE_BYTES, self._limits.max_read_bytes) if replicated \
            else _TAIL_MERGE_BYTES
        most = TAIL_FRAMES if replicated else len(newly)
        for serial in list(part.tailing):
            sub = subs[serial]
            head = size = room = 0
            run: list[Any] = []
            for i, entry in enumerate(newly):
                if entry.next <= sub.next_offset:
                    continue
                if (not sub.credit.can_send() or entry.base != sub.next_offset
                        or entry.next > stable):
                    break
                if entry.txn is not None and entry.txn[1] == TXN_DATA and any(
                        pid == entry.txn[0] and first <= entry.base < marker
                        for pid, first, marker in aborted_between(part, entry.base,
                                                                  entry.next)):
                    data = b""  # an aborted transaction's: its offsets, none of its records
                else:
                    data = entry.stored_bytes(self._stamp)
                if run and (size + len(data) > room or size + len(data) > merge
                            or len(run) == most):
                    out.append(self._tail_run(sub, part, newly, head, i, run, joined,
                                              replicated))
                    run, size = [], 0
                if not run:
                    # A run stays within the credit it starts with; only a delivery of one
                    # batch may overshoot it (by that batch), as before.
                    head, room = i, sub.credit.available
                run.append(data)
                size += len(data)
                sub.credit.consume(len(data))
                sub.next_offset = entry.next
            if run:
                out.append(self._tail_run(sub, part, newly, head, head + len(run), run,
                                          joined, replicated))
            out += self._pump(sub)
        return out

    @staticmethod
    def _tail_run(sub: Subscription, part: PartitionState, newly: list[Pending], first: int,
                  after: int, run: list[Any], joined: dict[tuple[int, int], Any],
                  framed: bool = False) -> Deliver:
        """One delivery of newly[first:after] (their stored bytes `run`) to `sub`: `framed`,
        a frame a batch (an aborted transaction's empty ones left out), else joined."""
        data: Any
        if len(run) == 1:
            data = run[0]
        elif framed:
            data = tuple(b for b in run if b) or b""
        else:
            data = joined.get((first, after))
            if data is None:
                data = joined[(first, after)] = b"".join(run)
        return Deliver(sub.session, sub.sub_id, part.id, newly[first].base,
                       newly[after - 1].next, data)

    def retention(self, part: PartitionState, log_start: int) -> list[Instruction]:
        """The log deleted old segments: a subscription left below the start cannot go on."""
        if log_start <= part.log_start:
            return []
        part.log_start = log_start
        out: list[Instruction] = []
        for sub in list(part.subs.values()):
            if sub.next_offset < log_start and not sub.reading:
                out += self._close_sub(sub, OffsetOutOfRangeError(
                    f"offset {sub.next_offset} was deleted by retention (log starts at "
                    f"{log_start}): subscribe again from earliest"))
        return out

    # -- results of disk reads ---------------------------------------------------------------

    def read_completed(self, ev: ReadCompleted) -> list[Instruction]:
        sub = self.by_serial.get(ev.serial)
        if sub is None:
            self._counters["stale_reads"] += 1  # unsubscribed or expired while reading
            return []
        if not sub.reading or ev.offset != sub.next_offset:
            raise RuntimeError(f"read for subscription {ev.serial} at {ev.offset} was not asked "
                               f"for (next offset {sub.next_offset})")
        sub.reading = False
        if not ev.data or ev.next_offset <= ev.offset:
            return self._close_sub(sub, StorageError(
                f"the log returned nothing at offset {ev.offset} below its visible end"))
        data = without_aborted_in(self._partitions[sub.partition], ev.data, ev.offset,
                                  ev.next_offset)
        out: list[Instruction] = [Deliver(sub.session, sub.sub_id, sub.partition, ev.offset,
                                          ev.next_offset, data)]
        sub.credit.consume(len(data))
        sub.next_offset = ev.next_offset
        return out + self._pump(sub)

    def read_failed(self, ev: ReadFailed) -> list[Instruction]:
        sub = self.by_serial.get(ev.serial)
        if sub is None:
            self._counters["stale_reads"] += 1
            return []
        sub.reading = False
        error = ev.error if isinstance(ev.error, TqError) else StorageError(
            f"read failed: {ev.error}")
        return self._close_sub(sub, error)
