"""The broker's pure core: `BrokerState.handle(stimulus) -> list[Instruction]` (DESIGN §5).

What it decides: which sessions are alive (leases against `Tick` time), how many unacknowledged
bytes each producer has in flight (its credit window), when an append is acknowledged (once the
log reports it durable; a produce marked `written`, once the log has it, without an fsync of
its own: the next synced append of the partition makes it durable with itself), and which
frontier/end-of-stream control batches to append (the minimum over a partition's live
producers, held while a cohort waits for writers, via `PartitionFrontier`). It owns the
sessions and partitions and composes three rule objects, each owning its own records behind a
narrow interface: `Admission` (`_admission.py`: who may open a producer where; topic rules,
principals, partitions to open), `Subscriptions` (`_subscriptions.py`: credit, catch-up from
disk, tail delivery, retention) and `Cohorts` (`_cohorts.py`: process exits, saving pending
cohorts). Dispatch on the stimulus type is one table, in `handle`.

What it must not do: I/O, clocks, threads, logging. The shell (`_server.py`) performs Append and
Read instructions and feeds the results back (AppendCompleted, ReadCompleted, ...). The shell
must perform the appends of one partition in instruction order; everything else may complete in
any order.

Rules it enforces (tests in tests/querylib/server/broker/test_state.py):
- Acknowledgements depend only on durability (or, for a `written` produce, on the append
  having landed): no subscriber state is on the ack path, so a stopped subscriber never delays
  a producer.
- Only durable batches are made visible to subscribers (`_make_durable` moves `visible_end`, then
  hands the new batches to `Subscriptions.tail`).
- Batches stay referenced only while an append is in flight or not yet durable (bounded by the
  producers' windows, and for `written` ones, answered, by the log's next fsync: a synced
  append or the flush flush_interval_ms later); nothing is buffered per subscriber.
- An idempotent producer's batch that was appended before (it sent it again after losing its
  connection) is answered with its first offsets, never appended twice (`_producer_state`),
  also after the stream ended; a producer whose end of stream was stored rejoins to send
  again only (`Session.resending`), so its end is not appended twice.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from catalog.errors import FencedLeaderEpochError, TqError
from querylib.broker._credit import CreditWindow
from querylib.broker._errors import (
    BatchTooLargeError,
    BrokerProtocolError,
    CreditExceededError,
    InvalidProducerEpochError,
    NotLeaderOrFollowerError,
    NotProducerError,
    PartitionBusyError,
    PrincipalError,
    StreamEndedError,
    UnknownBrokerSessionError,
    UnknownLeaderEpochError,
    UnknownPartitionError,
)
from querylib.broker.messages import Done, PartitionInfo, Produced, ProducerOpened, SessionOpened
from querylib.errors import InvalidLengthError, StorageError
from querylib.records._control import ControlType, control_of
from querylib.records._decode import decode_batch
from querylib.records._header import (
    ATTRIBUTES_OFFSET,
    SplitBatch,
    batch_head,
    read_header,
    stamp_base_offset,
)
from querylib.records._types import CONTROL_BIT, TRANSACTIONAL_BIT

from ._admission import Admission
from ._bookkeeping import TXN_DATA, BrokerLimits, PartitionState, Pending, Session
from ._cohorts import Cohorts
from ._events import (
    AdvanceFrontier,
    Append,
    AppendCompleted,
    AppendFailed,
    CloseSession,
    CohortsSaved,
    CohortsSaveFailed,
    DropPartition,
    DropSubscription,
    DurableAdvanced,
    EndStream,
    Fail,
    GrantCredit,
    Heartbeat,
    Instruction,
    LogStartAdvanced,
    OpenProducer,
    OpenSession,
    PartitionId,
    PartitionOpened,
    PartitionOpenFailed,
    Produce,
    ProposeIsr,
    QueryExits,
    ReadCompleted,
    ReadFailed,
    ReplicaAnswer,
    ReplicaAppended,
    ReplicaFetched,
    Reply,
    SessionExpired,
    SetReplicaRole,
    Stimulus,
    Subscribe,
    Tick,
    TopicAccess,
    TopicForgotten,
    TopicResolved,
    Unsubscribe,
)
from ._frontier import (
    FrontierAdvanced,
    FrontierEvent,
    PartitionFrontier,
    StreamEnded,
    StreamReopened,
)
from ._idempotence import BatchMark, ProducerStateTable, last_sequence
from ._replication import LeaderReplication
from ._subscriptions import Subscriptions
from ._write_access import ADMIN, SYSTEM, check_principal

# The most batches a replica fetch is answered with from memory: one payload frame each, well
# within the RPC's max_frames (64 by default, its header, body and signature included).
HELD_BATCHES = 32


def _encode_frontier(frontier: int, timestamp: int, epoch: int = 0) -> bytes:
    from querylib.records import frontier_batch

    return frontier_batch(frontier, timestamp=timestamp, epoch=epoch)


def _encode_end(timestamp: int) -> bytes:
    from querylib.records import end_of_stream_batch

    return end_of_stream_batch(timestamp=timestamp)


def _encode_abort(producer_id: int, epoch: int, timestamp: int) -> bytes:
    from querylib.records import transaction_marker_batch

    return transaction_marker_batch(producer_id, epoch, False, timestamp=timestamp)


def _encode_reopen(timestamp: int, epoch: int = 0) -> bytes:
    from querylib.records import reopen_batch

    return reopen_batch(timestamp=timestamp, epoch=epoch)


class BrokerState:
    """Sessions, producers, subscriptions and partitions of one broker; no I/O. It answers
    producers itself and delegates to `admission`, `subscriptions` and `cohorts`."""

    def __init__(self, limits: BrokerLimits | None = None, *,
                 encode_frontier: Callable[[int, int, int], bytes] = _encode_frontier,
                 encode_end: Callable[[int], bytes] = _encode_end,
                 encode_reopen: Callable[[int, int], bytes] = _encode_reopen,
                 encode_abort: Callable[[int, int, int], bytes] = _encode_abort,
                 stamp: Callable[..., bytes] = stamp_base_offset) -> None:
        """`stamp(batch, base_offset[, leader_epoch])` must return a batch exactly as the log
        stores it (the log may rewrite more than the base offset, e.g. the leader epoch; a
        replicated partition's leader passes its epoch): tail deliveries and followers'
        fetches hand out those bytes instead of reading them back."""
        self.limits = limits = limits or BrokerLimits()
        self._encode_frontier = encode_frontier
        self._encode_end = encode_end
        self._encode_reopen = encode_reopen
        self._encode_abort = encode_abort
        self._txn_partitions: set[PartitionId] = set()  # with a transaction open
        self.now = 0.0
        self.wall_ms = 0
        self.partitions: dict[PartitionId, PartitionState] = {}
        self.sessions: dict[str, Session] = {}
        self._sessions_of: Counter[str] = Counter()  # live sessions per principal
        self._next_ticket = 1
        self.counters: dict[str, int] = {"stale_grants": 0, "stale_reads": 0}
        self.admission = Admission(self.partitions, limits)
        self._stamp = stamp
        self.subscriptions = subs = Subscriptions(self.partitions, self.sessions, limits,
                                                  self.counters, stamp)
        self.cohorts = cohorts = Cohorts(self.partitions, limits, self._released)
        self._handlers: dict[type, Callable[[Any], list[Instruction]]] = {
            Tick: self._tick,
            OpenSession: self._open_session,
            Heartbeat: self._heartbeat,
            CloseSession: self._close_session,
            OpenProducer: self._open_producer,
            Produce: self._produce,
            AdvanceFrontier: self._advance,
            EndStream: self._end_stream,
            Subscribe: self._subscribe,
            GrantCredit: self._grant,
            Unsubscribe: self._unsubscribe,
            DropSubscription: subs.drop,
            DropPartition: self._drop_partition,
            QueryExits: cohorts.query_exits,
            TopicAccess: self._topic_access,
            TopicForgotten: self.admission.topic_forgotten,
            TopicResolved: self._topic_resolved,
            PartitionOpened: self._partition_opened,
            PartitionOpenFailed: self.admission.partition_open_failed,
            CohortsSaved: cohorts.saved,
            CohortsSaveFailed: cohorts.save_failed,
            AppendCompleted: self._append_completed,
            AppendFailed: self._append_failed,
            DurableAdvanced: self._durable_advanced,
            LogStartAdvanced: self._log_start_advanced,
            ReadCompleted: subs.read_completed,
            ReadFailed: subs.read_failed,
            SetReplicaRole: self._set_replica_role,
            ReplicaFetched: self._replica_fetched,
            ReplicaAppended: self._replica_appended,
        }
        # Replication: the roles the shell set (kept for partitions not open yet), the
        # partitions this broker leads, and the ISR last proposed for each with when (not
        # again until a new role or `isr_proposal_retry` later).
        self._roles: dict[PartitionId, SetReplicaRole] = {}
        self._led: set[PartitionId] = set()
        # The high watermark a follower knew when its partition was dropped to be opened
        # again (a promoted follower's reopen): its log end is not what readers may see.
        self._follower_marks: dict[PartitionId, int] = {}
        self._proposed: dict[PartitionId, tuple[tuple[int, ...], float]] = {}

    # ------------------------------------------------------------------ entry point

    def handle(self, stimulus: Stimulus) -> list[Instruction]:
        """Apply one stimulus; return what the shell must do, in order.

        A request that breaks a rule is answered with Fail and changes nothing. An unknown
        stimulus type or an I/O result that contradicts the instructions given is a bug in the
        shell and raises.
        """
        handler = self._handlers.get(type(stimulus))
        if handler is None:
            raise TypeError(f"BrokerState cannot handle {type(stimulus).__name__}")
        token = getattr(stimulus, "token", None)
        try:
            return handler(stimulus)
        except TqError as exc:
            if token is None:
                raise
            return [Fail(token, exc)]

    def rule_of(self, topic: str) -> TopicAccess | None:
        """The writers rule in force for `topic`, None while it is unknown."""
        return self.admission.rule_of(topic)

    def follower_mark(self, pid: PartitionId) -> int | None:
        """The high watermark `pid` had here as a follower, when it was dropped as one: the
        visible end it is opened at again, if it leads now."""
        return self._follower_marks.get(pid)

    def partition_info(self, pid: PartitionId) -> PartitionInfo:
        """What a client may know of a partition: its range visible to subscribers and the
        frontier in force at its end."""
        part = self._partition(pid)
        return PartitionInfo(topic=pid[0], partition=pid[1], log_start=part.log_start,
                             log_end=part.stable_end, frontier=part.visible_frontier,
                             ended=part.visible_ended, epoch=part.visible_epoch,
                             high_watermark=part.visible_end)

    def leader_epoch(self, pid: PartitionId, current_leader_epoch: int = -1) -> int:
        """The leader epoch this broker leads `pid` at (-1: a partition of one replica),
        checked against a Kafka client's `current_leader_epoch` (-1: none): NotLeaderOrFollower
        on a follower, FencedLeaderEpoch for an older epoch, UnknownLeaderEpoch for a newer."""
        self._partition(pid)
        role_set = self._roles.get(pid)
        if role_set is None:
            return -1
        role = role_set.role
        if not role.is_leader(role_set.broker_id):
            raise NotLeaderOrFollowerError(
                f"partition {pid[1]} of {pid[0]!r} is led by broker {role.leader_id}")
        epoch: int = role.leader_epoch
        if 0 <= current_leader_epoch < epoch:
            raise FencedLeaderEpochError(f"partition {pid[1]} of {pid[0]!r} is at leader epoch "
                                         f"{epoch}, not {current_leader_epoch}")
        if current_leader_epoch > epoch:
            raise UnknownLeaderEpochError(f"partition {pid[1]} of {pid[0]!r} is at leader "
                                          f"epoch {epoch} here, not yet "
                                          f"{current_leader_epoch}")
        return epoch

    def statistics(self) -> dict[str, int]:
        return {
            "sessions": len(self.sessions),
            "partitions": len(self.partitions),
            "subscriptions": len(self.subscriptions),
            "pending_appends": sum(len(p.inflight) + len(p.unflushed)
                                   for p in self.partitions.values()),
            "pending_bytes": sum(len(e.batch) for p in self.partitions.values()
                                 for e in (*p.inflight, *p.unflushed)),
            **self.counters,
        }

    def check_invariants(self) -> None:
        """Raise AssertionError unless the bookkeeping agrees with itself: every subscription
        is known to its partition and its session, every partition's ranges are ordered. Run
        after every step in the tests (`querylib.driver`); O(partitions + subscriptions)."""
        self.subscriptions.check_invariants()
        for pid, part in self.partitions.items():
            assert part.visible_end <= part.log_end, \
                f"{pid}: visible end {part.visible_end} beyond the log end {part.log_end}"

    # ------------------------------------------------------------------ time and sessions

    def _tick(self, ev: Tick) -> list[Instruction]:
        self.now = max(self.now, ev.now)
        self.wall_ms = max(self.wall_ms, ev.wall_ms)
        # O(sessions) per tick; fine for the 10k sessions the limits allow at ~10 ticks/s.
        expired = [s for s in self.sessions.values() if s.expires_at <= self.now]
        out: list[Instruction] = []
        for session in expired:
            out += self._end_session(session)
        for pid in list(self._txn_partitions):
            out += self._abort_stale_transactions(pid)
        for pid in self._led:
            part = self.partitions[pid]
            out += self._answer_replica_waits(part, self.now)
            out += self._propose_isr(part)
        return out

    def _abort_stale_transactions(self, pid: PartitionId) -> list[Instruction]:
        """Abort the transactions open past `max_transaction_seconds` (no coordinator ended
        them: the broker writes their ABORT marker itself)."""
        part = self.partitions.get(pid)
        if part is None or not part.txn_deadlines:
            self._txn_partitions.discard(pid)
            return []
        if part.follower:
            # Its log is its leader's, which aborts them (a marker here would be a record the
            # leader lacks); what it knew of them as leader or at its opening may not even be
            # in its log any more (truncated). Promoted, it opens the partition again and
            # learns them from its log.
            return []
        out: list[Instruction] = []
        for producer_id, (deadline, epoch) in list(part.txn_deadlines.items()):
            if deadline <= self.now:
                part.txn_deadlines[producer_id] = (float("inf"), epoch)  # being aborted
                out.append(self._append(part, self._encode_abort(producer_id, epoch,
                                                                 self.wall_ms),
                                        None, None, 0, None))
                part.inflight[-1].txn = (producer_id, int(ControlType.ABORT))
        return out

    def _open_session(self, ev: OpenSession) -> list[Instruction]:
        lim = self.limits
        if not ev.session or len(ev.session) > 128:
            raise BrokerProtocolError("a session id is 1 to 128 characters")
        lease = min(max(float(ev.lease), lim.min_lease), lim.max_lease)
        principal = check_principal(ev.principal)
        session = self.sessions.get(ev.session)
        if session is None:
            if len(self.sessions) >= lim.max_sessions:
                raise BrokerProtocolError(f"the broker holds its maximum of {lim.max_sessions} "
                                          "sessions")
            if principal not in (SYSTEM, ADMIN) and \
                    self._sessions_of[principal] >= lim.max_sessions_per_principal:
                raise BrokerProtocolError(
                    f"the broker holds its maximum of {lim.max_sessions_per_principal} "
                    f"sessions of {principal}")
            session = Session(ev.session, lease, self.now + lease,
                               CreditWindow(lim.producer_window), principal=principal)
            self.sessions[ev.session] = session
            self._sessions_of[principal] += 1
        elif session.principal != principal:
            raise PrincipalError(f"session {ev.session!r} writes as {session.principal}; a live "
                                 "session keeps its principal")
        session.lease = lease
        session.expires_at = self.now + lease
        return [Reply(ev.token, SessionOpened(session=session.id, lease=lease,
                                              producer_window=lim.producer_window,
                                              max_credit=lim.max_credit,
                                              max_batch_bytes=lim.max_batch_bytes,
                                              control_cost=lim.control_cost))]

    def _live(self, session_id: str) -> Session:
        """The live session with this id, its lease renewed by the request that named it."""
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownBrokerSessionError(f"no live session {session_id!r} (lease expired or "
                                            "broker restarted): open a new session")
        session.expires_at = self.now + session.lease
        return session

    def _heartbeat(self, ev: Heartbeat) -> list[Instruction]:
        self._live(ev.session)
        return [Reply(ev.token, Done())]

    def _close_session(self, ev: CloseSession) -> list[Instruction]:
        session = self._live(ev.session)
        return [Reply(ev.token, Done()), *self._end_session(session)]

    def _end_session(self, session: Session) -> list[Instruction]:
        """The session is gone: its producers stop holding frontiers back (without ending the
        streams) and its subscriptions stop."""
        del self.sessions[session.id]
        self._sessions_of[session.principal] -= 1
        if not self._sessions_of[session.principal]:
            del self._sessions_of[session.principal]
        out: list[Instruction] = []
        for pid in sorted(session.producing):
            part = self.partitions[pid]
            out += self._released(part, part.frontier.drop(session.id))
            out += self.cohorts.save(part)
        self.subscriptions.forget_session(session)
        out.append(SessionExpired(session.id))
        return out

    # ------------------------------------------------------------------ partitions

    def _partition(self, pid: PartitionId) -> PartitionState:
        part = self.partitions.get(pid)
        if part is None:
            raise UnknownPartitionError(f"this broker has no partition {pid[1]} of topic "
                                        f"{pid[0]!r}")
        return part

    def _partition_opened(self, ev: PartitionOpened) -> list[Instruction]:
        if ev.partition in self.partitions:
            raise RuntimeError(f"partition {ev.partition} opened twice")
        end = min(ev.durable_end, ev.log_end)
        # A replica shows readers what its high watermark covers, not its log end: a promoted
        # follower holds records its old leader never acknowledged, which the rest of its ISR
        # may lack (its high watermark moves past them once they hold them).
        mark = self._follower_marks.pop(ev.partition, None)
        role = self._roles.get(ev.partition)
        visible = end if mark is None or role is None or role.role is None else min(end, mark)
        # What readers are told of the partition holds at the visible end: as it stood there
        # when the shell could tell (`at_visible`), the log end's once that is visible.
        shown = (ev.frontier, ev.ended, ev.epoch, ev.epoch_since)
        pending = None
        if ev.at_visible is not None and ev.at_visible[0] == visible:
            shown, pending = ev.at_visible[1:], shown
        self.partitions[ev.partition] = PartitionState(
            id=ev.partition, log_start=ev.log_start, log_end=ev.log_end, visible_end=visible,
            known_end=ev.log_end, known_shown=pending,
            shown_at=-1 if pending is None else visible,
            frontier=PartitionFrontier(ev.frontier, ended=ev.ended,
                                       max_cohorts=self.limits.max_cohorts,
                                       cohorts=ev.cohorts, epoch=ev.epoch),
            visible_frontier=shown[0], visible_ended=shown[1], visible_epoch=shown[2],
            epoch_since=shown[3],
            producers=ProducerStateTable(max_producers=self.limits.max_producer_ids))
        part = self.partitions[ev.partition]
        part.producers.learn_all(ev.producers)
        part.open_txns.update(ev.open_transactions)
        part.aborted.extend(ev.aborted_transactions)
        part.marked_epochs.update(ev.marked_epochs[-self.limits.max_producer_ids:])
        for producer_id, _ in ev.open_transactions:
            # Its epoch is not known here: 0 never fences a producer.
            part.txn_deadlines[producer_id] = (self.now + self.limits.max_transaction_seconds, 0)
        if part.txn_deadlines:
            self._txn_partitions.add(ev.partition)
        part.durable_end = end
        out: list[Instruction] = []
        if role is not None:
            out += self._set_replica_role(role)
        return out + self._again(self.admission.partition_ready(ev.partition))

    def _drop_partition(self, ev: DropPartition) -> list[Instruction]:
        """Forget the partition (its topic was deleted). Refused while an append or a disk
        read is in flight, so the shell never closes a log under a thread using it; dropping
        a partition this broker does not hold is done already."""
        part = self.partitions.get(ev.partition)
        if part is None:
            return [Reply(ev.token, Done())]
        if (part.inflight or part.unflushed or any(s.reading for s in part.subs.values())
                or part.cohorts_asked != part.cohorts_saved):
            raise PartitionBusyError(f"partition {ev.partition[1]} of {ev.partition[0]!r} has "
                                     "appends or reads in flight; ask again")
        gone = UnknownPartitionError(f"partition {ev.partition[1]} of topic "
                                     f"{ev.partition[0]!r} was deleted")
        out = self.subscriptions.close_partition(part, gone)
        out += [Fail(wait[0], gone) for wait in part.replica_waits]
        if part.follower:
            self._follower_marks[ev.partition] = part.visible_end
        else:
            self._follower_marks.pop(ev.partition, None)
        for session in self.sessions.values():
            session.producing.discard(ev.partition)  # their next produce: unknown partition
            session.resending.discard(ev.partition)
        del self.partitions[ev.partition]
        out.append(Reply(ev.token, Done()))
        return out

    # ------------------------------------------------------------------ admission

    def _topic_access(self, ev: TopicAccess) -> list[Instruction]:
        return self._again(self.admission.topic_access(ev))

    def _topic_resolved(self, ev: TopicResolved) -> list[Instruction]:
        again, refused = self.admission.topic_resolved(ev)
        return [*refused, *self._again(again)]

    def _again(self, parked: list[OpenProducer]) -> list[Instruction]:
        """Handle requests admission parked again, in the order they came."""
        out: list[Instruction] = []
        for ev in parked:
            out += self.handle(ev)
        return out

    # ------------------------------------------------------------------ subscribers

    def _subscribe(self, ev: Subscribe) -> list[Instruction]:
        session = self._live(ev.session)
        part = self._partition(ev.partition)
        if part.follower:
            raise NotLeaderOrFollowerError(
                f"partition {ev.partition[1]} of {ev.partition[0]!r} is led by another broker")
        return self.subscriptions.subscribe(session, part, ev)

    def _grant(self, ev: GrantCredit) -> list[Instruction]:
        return self.subscriptions.grant(ev, self.now)

    def _unsubscribe(self, ev: Unsubscribe) -> list[Instruction]:
        return self.subscriptions.unsubscribe(self._live(ev.session), ev)

    # ------------------------------------------------------------------ producers

    def _producer(self, session_id: str, pid: PartitionId) -> tuple[Session, PartitionState]:
        session = self._live(session_id)
        part = self._partition(pid)
        if pid not in session.producing:
            raise NotProducerError(f"session {session_id!r} has not opened a producer on "
                                   f"partition {pid[1]} of {pid[0]!r}")
        if part.follower or part.replication is not None:
            self._check_leader(part)
        if part.frontier.ended:  # never with a producer joined; checked all the same
            raise StreamEndedError(f"the stream of partition {pid[1]} of {pid[0]!r} ended")
        return session, part

    def _open_producer(self, ev: OpenProducer) -> list[Instruction]:
        session = self._live(ev.session)
        if (ev.partition not in session.producing
                and len(session.producing) + len(session.resending)
                >= self.limits.max_partitions_per_producer):
            raise BrokerProtocolError("too many partitions for one producer session")
        part, waiting = self.admission.admit(session, ev)
        if part is None:
            return waiting
        if part.follower or part.replication is not None:
            self._check_leader(part)
        if part.frontier.ended and self._stored_before_end(part, ev):
            # Its end of stream was stored, its answer lost (a reconnect): it may send again
            # what it has no answer for, and is answered as the first time. Not a writer of
            # the stream (not joined, nothing reopened), so its end is not appended twice.
            session.resending.add(ev.partition)
            return [Reply(ev.token, ProducerOpened(log_end=part.log_end,
                                                   frontier=part.frontier.frontier,
                                                   window=self.limits.producer_window,
                                                   epoch=part.frontier.epoch))]
        session.resending.discard(ev.partition)
        before = part.frontier.revision
        try:
            released = part.frontier.join(session.id, ev.cohort, ev.writer, ev.writers,
                                          rejoin=ev.rejoin, reopen=ev.reopen,
                                          epoch=ev.epoch)
        except StreamEndedError:
            raise StreamEndedError(
                f"the stream of partition {ev.partition[1]} of {ev.partition[0]!r} ended: "
                "nothing more may be written unless a writer of the topic reopens it "
                "explicitly") from None
        session.producing.add(ev.partition)
        reply = ProducerOpened(log_end=part.log_end, frontier=part.frontier.producers[session.id],
                               window=self.limits.producer_window, epoch=part.frontier.epoch)
        out = self._released(part, released)
        if ev.cohort:
            out += self.cohorts.settle_known(part, ev.cohort)
        if part.frontier.revision == before:
            return [Reply(ev.token, reply), *out]
        return [*self.cohorts.save(part, ev.token, reply), *out]

    @staticmethod
    def _stored_before_end(part: PartitionState, ev: OpenProducer) -> bool:
        """Whether `ev` rejoins an idempotent producer that sent its end of stream and whose
        every record the partition holds (or is appending): all it may send again is a
        duplicate, or its end."""
        if not (ev.rejoin and ev.ending and ev.producer_id >= 0):
            return False
        return ev.last_sequence < 0 or \
            part.producers.last_sequence(ev.producer_id) == ev.last_sequence

    def _resends(self, session_id: str, pid: PartitionId) -> PartitionState | None:
        """The partition, if the session rejoined it only to send again what it stored."""
        session = self._live(session_id)
        return self.partitions[pid] if pid in session.resending else None

    def _produce(self, ev: Produce) -> list[Instruction]:
        session = self._live(ev.session)
        if not ev.follows:  # a request's first batch: its siblings are judged with it
            session.window_open = session.window.can_send()
        part = self._partition(ev.partition)
        if part.follower or part.replication is not None:
            self._check_leader(part)
        resending = ev.partition in session.resending
        if not resending and ev.partition not in session.producing:
            raise NotProducerError(f"session {ev.session!r} has not opened a producer on "
                                   f"partition {ev.partition[1]} of {ev.partition[0]!r}")
        batch = ev.batch
        size = len(batch)  # once: a SplitBatch's len() is a Python call
        if size > self.limits.max_batch_bytes:
            raise BatchTooLargeError(f"batch of {size} bytes exceeds the broker's maximum "
                                     f"of {self.limits.max_batch_bytes}")
        head = batch_head(batch)
        header = read_header(head)
        if header.size != size:
            raise InvalidLengthError(f"a produce frame holds one batch of {header.size} bytes, "
                                     f"got {size} bytes")
        attributes = head[ATTRIBUTES_OFFSET + 1]
        txn = None
        if attributes & CONTROL_BIT:
            txn = self._marker(session, header.producer_id, attributes, batch)
            marked = part.marked_epochs.pop(header.producer_id, -1)
            part.marked_epochs[header.producer_id] = max(marked, header.producer_epoch)
            while len(part.marked_epochs) > self.limits.max_producer_ids:
                del part.marked_epochs[next(iter(part.marked_epochs))]
        elif attributes & TRANSACTIONAL_BIT:
            if header.producer_id < 0:
                raise BrokerProtocolError("a transactional batch needs a producer id")
            ended = part.marked_epochs.get(header.producer_id)
            if ended is not None and header.producer_epoch < ended:
                raise InvalidProducerEpochError(
                    f"producer {header.producer_id} epoch {header.producer_epoch} was fenced: "
                    f"its transactions here ended at epoch {ended}")
            txn = (header.producer_id, TXN_DATA)
        producer_id, first_seq = header.producer_id, header.base_sequence
        idempotent = producer_id >= 0 and first_seq >= 0
        if idempotent:
            last_seq = last_sequence(first_seq, header.last_offset_delta)
            # Before the stream's state is looked at: a batch sent again is answered as the
            # first time, even once the stream ended after it.
            mark = part.producers.check(producer_id, header.producer_epoch, first_seq, last_seq)
            if mark is not None:
                return self._duplicate(part, mark, ev.token)
        if resending or part.frontier.ended:
            raise StreamEndedError(
                f"the stream of partition {ev.partition[1]} of {ev.partition[0]!r} ended: "
                "nothing more may be written unless a writer of the topic reopens it "
                "explicitly")
        self._charge(session, size, session.window_open)
        append = self._append(part, batch, ev.token, session.id, size, "produced",
                              written=ev.written)
        entry = part.inflight[-1]
        if idempotent:
            entry.seq = (producer_id, part.producers.appended(
                producer_id, header.producer_epoch, first_seq, last_seq, append.ticket))
        entry.txn = txn
        return [append]

    @staticmethod
    def _marker(session: Session, producer_id: int, attributes: int,
                batch: Any) -> tuple[int, int]:
        """(producer id, ABORT or COMMIT) of a Kafka transaction marker: a transactional
        control batch of one record, which only tq's transaction coordinator writes
        ("system" in the broker's process, "admin" from the coordinator's broker over RPC).
        Any other control batch is the broker's own to write."""
        if session.principal not in (SYSTEM, ADMIN) or not attributes & TRANSACTIONAL_BIT \
                or producer_id < 0:
            raise BrokerProtocolError("control batches are written by the broker, not producers")
        if isinstance(batch, SplitBatch):
            batch = bytes(batch)
        records = decode_batch(batch).records
        kind = control_of(records[0])[0] if len(records) == 1 else None
        if kind not in (ControlType.ABORT, ControlType.COMMIT):
            raise BrokerProtocolError("a transaction marker holds one ABORT or COMMIT record")
        return producer_id, int(kind)

    def _duplicate(self, part: PartitionState, mark: BatchMark, token: Any) -> list[Instruction]:
        """Answer a batch sent again with the offsets it got the first time, once durable:
        at once if it is, else with its own append (or, for one found in the log at open,
        the last append in flight: durability comes in order)."""
        done = Produced(base_offset=mark.base_offset, next_offset=mark.next_offset)
        if 0 <= mark.next_offset <= part.visible_end:
            return [Reply(token, done)]
        pending = [*part.inflight, *part.unflushed]
        own = [e for e in pending if mark.ticket >= 0 and e.ticket == mark.ticket]
        if own:
            own[0].waiters.append((token, None))
            return []
        return self._when_durable(part, token, done)

    @staticmethod
    def _when_durable(part: PartitionState, token: Any, value: Any) -> list[Instruction]:
        """Answer `value` once every append of the partition issued so far is durable (now,
        if none is pending): durability comes in order."""
        pending = part.inflight or part.unflushed  # the newest appends are in flight
        if not pending:
            return [Reply(token, value)]
        pending[-1].waiters.append((token, value))
        return []

    def _advance(self, ev: AdvanceFrontier) -> list[Instruction]:
        if (part := self._resends(ev.session, ev.partition)) is not None:
            return self._when_durable(part, ev.token, Done())  # the stream ended after it
        session, part = self._producer(ev.session, ev.partition)
        self._check_can_send(session)
        events = part.frontier.advance(session.id, ev.frontier)
        return self._control_request(session, part, events, ev.token)

    def _end_stream(self, ev: EndStream) -> list[Instruction]:
        if (part := self._resends(ev.session, ev.partition)) is not None:
            self.sessions[ev.session].resending.discard(ev.partition)
            return self._when_durable(part, ev.token, Done())  # its end is the one stored
        session, part = self._producer(ev.session, ev.partition)
        self._check_can_send(session)
        events = part.frontier.end(session.id)
        session.producing.discard(part.id)
        return [*self._control_request(session, part, events, ev.token),
                *self.cohorts.save(part)]

    def _control_request(self, session: Session, part: PartitionState,
                         events: list[FrontierEvent], token: Any) -> list[Instruction]:
        """Append what a frontier change caused; answer once it is durable (or now, if the
        partition's frontier did not move)."""
        if not events:
            return [Reply(token, Done())]
        self._charge(session, self.limits.control_cost)
        return self._controls(part, events, token, session.id, Done())

    def _controls(self, part: PartitionState, events: list[FrontierEvent], token: Any,
                  session: str | None, reply: Any) -> list[Instruction]:
        out: list[Instruction] = []
        for event in events:
            if isinstance(event, FrontierAdvanced):
                batch = self._encode_frontier(event.frontier, self.wall_ms, event.epoch)
            elif isinstance(event, StreamReopened):
                batch = self._encode_reopen(self.wall_ms, event.epoch)
            else:
                batch = self._encode_end(self.wall_ms)
            cost = self.limits.control_cost if session is not None else 0
            out.append(self._append(part, batch, token, session, cost, reply, control=event))
            token, session = None, None  # one answer per request
        return out

    def _released(self, part: PartitionState, events: list[FrontierEvent]) -> list[Instruction]:
        """Append what a frontier change no request asked for caused (a producer joined or
        left, a cohort settled); nobody is answered."""
        return self._controls(part, events, None, None, None)

    def _transaction_ended(self, part: PartitionState, producer_id: int, kind: int,
                           marker: int) -> None:
        """A transaction's marker is durable: it no longer holds back the stable end; an
        aborted one is remembered so its records are never read as committed."""
        first = part.open_txns.pop(producer_id, None)
        part.txn_deadlines.pop(producer_id, None)
        if kind == ControlType.ABORT and first is not None:
            part.aborted.append((producer_id, first, marker))
            while len(part.aborted) > self.limits.max_aborted_transactions:
                part.aborted.popleft()

    def _check_can_send(self, session: Session, window_open: bool | None = None) -> None:
        """CreditExceededError unless the producer window is open (now, or as `window_open`
        says it was at the first batch of the request being judged)."""
        if not (session.window.can_send() if window_open is None else window_open):
            raise CreditExceededError(f"session {session.id!r} sent with its producer window of "
                                      f"{self.limits.producer_window} bytes exhausted")

    def _charge(self, session: Session, cost: int, window_open: bool | None = None) -> None:
        # The window may overshoot by the one request that found it positive (all of its
        # batches, as its producer counts it: `Session.window_open`), as a subscription's
        # credit does; then nothing more until acknowledgements return credit.
        self._check_can_send(session, window_open)
        session.window.consume(cost)

    def _refund(self, entry: Pending) -> None:
        session = self.sessions.get(entry.session) if entry.session is not None else None
        if session is not None and entry.cost:
            session.window.grant(entry.cost)

    def _append(self, part: PartitionState, batch: bytes, token: Any, session: str | None,
                cost: int, reply: Any, control: FrontierEvent | None = None, *,
                written: bool = False) -> Append:
        ticket = self._next_ticket
        self._next_ticket += 1
        part.inflight.append(Pending(ticket, batch, token, session, cost, reply, control,
                                     written=written))
        if written:
            return Append(part.id, ticket, batch, sync=False)
        return Append(part.id, ticket, batch)

    def _take_inflight(self, pid: PartitionId, ticket: int) -> tuple[PartitionState, Pending]:
        part = self.partitions[pid]
        if not part.inflight or part.inflight[0].ticket != ticket:
            expected = part.inflight[0].ticket if part.inflight else None
            raise RuntimeError(f"append {ticket} on {pid} completed out of order "
                               f"(expected {expected})")
        return part, part.inflight.popleft()

    def _append_completed(self, ev: AppendCompleted) -> list[Instruction]:
        part, entry = self._take_inflight(ev.partition, ev.ticket)
        entry.base, entry.next = ev.base_offset, ev.next_offset
        if entry.seq is not None:
            ProducerStateTable.landed(entry.seq[1], ev.base_offset, ev.next_offset)
        if entry.txn is not None and entry.txn[1] == TXN_DATA \
                and entry.txn[0] not in part.open_txns:
            part.open_txns[entry.txn[0]] = ev.base_offset
            part.txn_deadlines[entry.txn[0]] = (
                self.now + self.limits.max_transaction_seconds, read_header(entry.batch)
                .producer_epoch)
            self._txn_partitions.add(part.id)
        part.log_end = ev.next_offset
        part.unflushed.append(entry)
        out = self.subscriptions.retention(part, ev.log_start)
        part.durable_end = ev.durable_end
        if part.replication is not None:
            if entry.written:  # on a replicated partition, answered at the high watermark
                entry.written = False
            # Tail deliveries and followers' fetches hand out the bytes as the log stores
            # them: base offset and the leader's epoch, stamped in one copy of the batch.
            entry.stored = self._stamp(entry.batch, entry.base,
                                       part.replication.role.leader_epoch)
            if not ev.more:  # the followers' waiting fetches take the whole commit at once
                out += self._answer_replica_waits(part)
            return out + self._make_durable(part, self._high_watermark(part))
        if entry.written:
            out += self._answer_written(entry)
        return out + self._make_durable(part, ev.durable_end)

    def _answer_written(self, entry: Pending) -> list[Instruction]:
        """Answer a `written` append now that the log has it (and return its window: its
        producer was answered); it stays pending until durable, for its subscribers."""
        self._refund(entry)
        entry.cost = 0
        done = Produced(base_offset=entry.base, next_offset=entry.next)
        out: list[Instruction] = []
        if entry.token is not None:
            out.append(Reply(entry.token, done))
        out += [Reply(token, value or done) for token, value in entry.waiters]
        entry.token, entry.waiters = None, []
        return out

    def _append_failed(self, ev: AppendFailed) -> list[Instruction]:
        part, entry = self._take_inflight(ev.partition, ev.ticket)
        self._refund(entry)
        if entry.seq is not None:
            part.producers.failed(entry.seq[0], entry.seq[1].first_seq)
        error = ev.error if isinstance(ev.error, TqError) else StorageError(
            f"append failed: {ev.error}")
        tokens = [t for t, _ in entry.waiters]
        if entry.token is not None:
            tokens.insert(0, entry.token)
        return [Fail(token, error) for token in tokens]

    def _log_start_advanced(self, ev: LogStartAdvanced) -> list[Instruction]:
        part = self.partitions.get(ev.partition)
        return [] if part is None else self.subscriptions.retention(part, ev.log_start)

    def _durable_advanced(self, ev: DurableAdvanced) -> list[Instruction]:
        part = self.partitions[ev.partition]
        part.durable_end = ev.durable_end
        if part.replication is not None:
            return self._make_durable(part, self._high_watermark(part))
        return self._make_durable(part, ev.durable_end)

    # ------------------------------------------------------------------ replication

    @staticmethod
    def _high_watermark(part: PartitionState) -> int:
        """The end acks and readers wait for on a partition this broker leads: the high
        watermark over the ISR, the leader's own durable end included."""
        leader: LeaderReplication = part.replication
        leader.durable(part.durable_end)
        return leader.high_watermark

    @staticmethod
    def _check_leader(part: PartitionState) -> None:
        pid = part.id
        if part.follower:
            raise NotLeaderOrFollowerError(
                f"partition {pid[1]} of {pid[0]!r} is led by another broker")
        part.replication.check_min_insync(part.min_insync)

    def _set_replica_role(self, ev: SetReplicaRole) -> list[Instruction]:
        pid = ev.partition
        self._roles[pid] = ev
        part = self.partitions.get(pid)
        if part is None:
            return []  # applied when it opens
        part.min_insync = ev.min_insync
        self._proposed.pop(pid, None)
        role = ev.role
        now_ms = int(self.now * 1000)
        if role is None or not role.is_leader(ev.broker_id):
            deposed = part.replication is not None
            part.replication = None
            part.follower = role is not None
            self._led.discard(pid)
            if role is None:
                del self._roles[pid]
                waits = self._answer_replica_waits(part)
                return waits + self._make_durable(part, part.durable_end)
            return self._deposed(part) if deposed else []
        part.follower = False
        leader = part.replication
        if leader is not None and leader.role.leader_epoch == role.leader_epoch:
            leader.set_role(role, now_ms=now_ms)
        else:
            part.replication = LeaderReplication(
                role, own_id=ev.broker_id, now_ms=now_ms, epoch_start=part.log_end,
                first_ticket=self._next_ticket,
                lag_max_ms=int(self.limits.replica_lag_time_max * 1000))
        self._led.add(pid)
        return self._make_durable(part, self._high_watermark(part))

    def _deposed(self, part: PartitionState) -> list[Instruction]:
        """This broker no longer leads `part`: what waits for its high watermark may never be
        acknowledged (the new leader may truncate it away), so its writers hear so now and
        write to the new leader; its subscribers too, and resume there after their last
        record."""
        error = NotLeaderOrFollowerError(
            f"partition {part.id[1]} of {part.id[0]!r} has a new leader; write there")
        out: list[Instruction] = [Fail(wait[0], error) for wait in part.replica_waits]
        part.replica_waits = []
        out += self.subscriptions.close_partition(part, NotLeaderOrFollowerError(
            f"partition {part.id[1]} of {part.id[0]!r} has a new leader; read there"))
        for entry in (*part.unflushed, *part.inflight):
            self._refund(entry)
            entry.cost = 0
            if entry.token is not None:
                out.append(Fail(entry.token, error))
            out += [Fail(token, error) for token, _ in entry.waiters]
            entry.token, entry.waiters = None, []
        return out

    def _replica_fetched(self, ev: ReplicaFetched) -> list[Instruction]:
        part = self.partitions.get(ev.partition)
        if part is None or part.replication is None:
            raise NotLeaderOrFollowerError(
                f"this broker does not lead partition {ev.partition[1]} of {ev.partition[0]!r}")
        leader: LeaderReplication = part.replication
        leader.follower_fetch(ev.replica, fetch_offset=ev.fetch_offset,
                              leader_epoch=ev.leader_epoch, leader_end=part.log_end,
                              now_ms=int(self.now * 1000))
        out = self._make_durable(part, leader.high_watermark)
        if ev.max_wait > 0 and ev.fetch_offset >= part.log_end:
            part.replica_waits.append((ev.token, self.now + ev.max_wait, ev.fetch_offset,
                                       ev.max_bytes))
            return out
        answer = ReplicaAnswer(leader.high_watermark,
                               self._held_batches(part, ev.fetch_offset, ev.max_bytes))
        return [Reply(ev.token, answer), *out]

    @classmethod
    def _answer_replica_waits(cls, part: PartitionState, now: float | None = None
                              ) -> list[Instruction]:
        """Answer the followers' fetches waiting on `part` (with `now`: those whose wait is
        over) with the high watermark and the batches appended since, when held."""
        if not part.replica_waits:
            return []
        hw = part.replication.high_watermark if part.replication is not None else 0
        if now is None:
            due, part.replica_waits = part.replica_waits, []
        else:
            due = [w for w in part.replica_waits if w[1] <= now]
            part.replica_waits = [w for w in part.replica_waits if w[1] > now]
        return [Reply(token, ReplicaAnswer(hw, cls._held_batches(part, offset, max_bytes)))
                for token, _, offset, max_bytes in due]

    @staticmethod
    def _held_batches(part: PartitionState, offset: int, max_bytes: int
                      ) -> tuple[bytes, ...] | None:
        """The appended batches from `offset` as the log stores them, while this leader still
        holds them (`unflushed`: everything above the high watermark, where an in-sync
        follower fetches), at most `max_bytes` and HELD_BATCHES (a frame each in the reply,
        within the RPC's max_frames) but at least one, so the fetch needs no read
        of the log; None when they are not all held back to back from `offset` (a lagging
        or rejoining follower: the shell reads the log). O(batches held) at worst; a caught-up
        follower's offset is found within the last few."""
        if part.replication is None or offset >= part.log_end:
            return ()
        first_ticket = part.replication.first_ticket
        held = part.unflushed
        if not held or offset < held[0].base:
            return None
        start = len(held) - 1
        while start > 0 and held[start].base > offset:
            start -= 1
        if held[start].base != offset:
            return None
        batches: list[bytes] = []
        size, expected = 0, offset
        for i in range(start, len(held)):
            entry = held[i]
            stored = entry.stored
            if stored is None or entry.base != expected or entry.ticket < first_ticket:
                return None
            if batches and (size + len(stored) > max_bytes or len(batches) == HELD_BATCHES):
                break
            batches.append(stored)
            size += len(stored)
            expected = entry.next
        return tuple(batches)

    def _replica_appended(self, ev: ReplicaAppended) -> list[Instruction]:
        part = self.partitions.get(ev.partition)
        if part is None or not part.follower:
            return []  # its role changed meanwhile: the next role's fetches tell
        part.log_end = ev.log_end  # lower after a truncation (KIP-279)
        part.durable_end = ev.durable_end
        part.visible_end = min(part.visible_end, ev.log_end)
        # Its own high watermark: the leader's, never past what it holds durably.
        part.visible_end = max(part.visible_end, min(ev.high_watermark, ev.durable_end,
                                                     ev.log_end))
        return []

    def _propose_isr(self, part: PartitionState) -> list[Instruction]:
        leader: LeaderReplication = part.replication
        before = leader.high_watermark
        isr = leader.isr_proposal(now_ms=int(self.now * 1000))
        # A replica proposed before and proposed no more is waited for no more.
        out = [] if leader.high_watermark == before else \
            self._make_durable(part, leader.high_watermark)
        if isr is None:
            return out
        last = self._proposed.get(part.id)
        if last is not None and last[0] == isr \
                and self.now - last[1] < self.limits.isr_proposal_retry:
            return out
        self._proposed[part.id] = (isr, self.now)
        return [*out, ProposeIsr(part.id, leader.role.leader_epoch, leader.role.isr, isr)]

    def _make_durable(self, part: PartitionState, durable_end: int) -> list[Instruction]:
        """Acknowledge every append now durable, then show those batches to subscribers."""
        out: list[Instruction] = []
        newly: list[Pending] = []
        if part.known_shown is not None and durable_end >= part.known_end:
            # The log as opened is visible whole now (what was appended since comes after it).
            (part.visible_frontier, part.visible_ended, part.visible_epoch,
             part.epoch_since) = part.known_shown
            part.known_shown, part.shown_at = None, -1
        while part.unflushed and part.unflushed[0].next <= durable_end:
            entry = part.unflushed.popleft()
            newly.append(entry)
            self._refund(entry)
            if entry.token is not None:
                value = (Produced(base_offset=entry.base, next_offset=entry.next)
                         if entry.reply == "produced" else entry.reply)
                out.append(Reply(entry.token, value))
            for token, done in entry.waiters:  # duplicates sent meanwhile
                out.append(Reply(token, done or Produced(base_offset=entry.base,
                                                         next_offset=entry.next)))
            control = entry.control
            if control is None:  # data (the usual case first: no isinstance per batch)
                part.visible_ended = False  # a new producer wrote after an end-of-stream
            elif isinstance(control, FrontierAdvanced):
                part.visible_frontier, part.visible_ended = control.frontier, False
                part.visible_epoch = control.epoch
            elif isinstance(control, StreamEnded):
                part.visible_ended = True
            elif isinstance(control, StreamReopened):
                part.visible_ended = False
                if control.epoch:  # a new epoch: its frontier starts at 0
                    part.visible_frontier, part.visible_epoch = 0, control.epoch
                    part.epoch_since = entry.base
            if entry.txn is not None and entry.txn[1] != TXN_DATA:
                self._transaction_ended(part, entry.txn[0], entry.txn[1], entry.base)
        # Durable data is visible up to the first append not yet durable. (At open, the log
        # may report a durable end below its end; a later flush then uncovers that data.)
        bound = part.unflushed[0].base if part.unflushed else part.log_end
        visible = max(part.visible_end, min(durable_end, bound))
        if visible == part.visible_end:
            return out
        part.visible_end = visible
        return out + self.subscriptions.tail(part, newly)
