"""The bookkeeping records of the broker's core (`_state.py`): limits, sessions, partitions,
subscriptions and appends in flight. Plain data; the rules that change them live in `_state`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from querylib.broker._credit import CreditWindow

from ._events import PartitionId
from ._frontier import FrontierEvent, PartitionFrontier
from ._idempotence import BatchMark, ProducerStateTable


class BrokerLimits(msgspec.Struct, frozen=True):
    """Bounds that keep a broker's memory independent of what clients ask for."""

    producer_window: int = 8 * 1024 * 1024      # unacknowledged bytes per producer session
    max_credit: int = 16 * 1024 * 1024          # credit one subscription may hold
    max_read_bytes: int = 1024 * 1024           # bytes per disk read for one subscription
    max_batch_bytes: int = 8 * 1024 * 1024      # largest batch a producer may send
    control_cost: int = 64                      # window bytes an advance/end request costs
    min_lease: float = 1.0
    max_lease: float = 300.0
    max_sessions: int = 10_000
    # Sessions of one principal (not tq's own, nor the admin's): one user, or the connector
    # streams writing as anonymous, leave the rest room.
    max_sessions_per_principal: int = 2_500
    max_subscriptions_per_session: int = 1024
    max_partitions_per_producer: int = 1024
    max_cohorts: int = 64                       # cohorts remembered per partition
    max_query_exits: int = 4096                 # queries whose process exits are remembered
    max_parked: int = 10_000                    # producer opens waiting for the directory
    max_producer_ids: int = 1024                # idempotent producers remembered per partition
    # Bytes of a log's tail read at open to learn its idempotent producers: what producers
    # may send again after a crash is what they had unacknowledged, a window each.
    producer_scan_bytes: int = 32 * 1024 * 1024
    # Aborted Kafka transactions remembered per partition (the oldest forgotten first), for
    # read_committed fetches and to keep their records from tq's readers.
    max_aborted_transactions: int = 100_000
    # A Kafka transaction open here this long (Kafka's largest transaction timeout, 15 min,
    # and a minute for its coordinator) is aborted by the broker itself: a producer id that
    # writes transactional batches no coordinator will end cannot hold the stable end back.
    max_transaction_seconds: float = 960.0
    # A follower whose fetches have not reached its leader's log end for this long is
    # proposed out of the ISR (Kafka's replica.lag.time.max.ms).
    replica_lag_time_max: float = 30.0
    # An ISR proposal answered by no new role this long (refused because the controller saw
    # another ISR, or its reply lost) is proposed again.
    isr_proposal_retry: float = 2.0


class Pending(msgspec.Struct):
    """An append the shell is performing or has performed but not yet made durable. A
    `written` one is answered once the log has it (`AppendCompleted`), its token and waiters
    then cleared; it is shown to subscribers, as every append, only once durable."""

    ticket: int
    batch: Any                  # bytes-like (the shell may pass a view of a received frame)
    token: Any                  # request to answer once durable (None for broker-made controls)
    session: str | None         # whose window the cost came from
    cost: int
    reply: Any                  # "produced", or the reply value for control requests
    control: FrontierEvent | None = None
    base: int = -1
    next: int = -1
    stored: bytes | None = None  # the batch with its base offset stamped, made on first use
    # (producer id, its mark in the partition's ProducerStateTable) of an idempotent batch
    seq: tuple[int, BatchMark] | None = None
    # A Kafka transaction's batch: (producer id, TXN_DATA) for its records, (producer id,
    # ControlType.ABORT or COMMIT) for the marker that ends it here.
    txn: tuple[int, int] | None = None
    # Duplicates of this batch (or of one before it) sent again while it was not yet durable:
    # (token, reply), answered with it; reply None means this batch's own offsets.
    waiters: list[tuple[Any, Any]] = msgspec.field(default_factory=list)
    written: bool = False

    def stored_bytes(self, stamp: Callable[[Any, int], bytes]) -> bytes:
        if self.stored is None:
            self.stored = stamp(self.batch, self.base)
        return self.stored


TXN_DATA = -1  # Pending.txn kind of a transaction's records (markers: their ControlType)


class PartitionState(msgspec.Struct):
    id: PartitionId
    log_start: int
    log_end: int                # end of completed appends (may be ahead of durable)
    visible_end: int            # end of what subscribers may see: durable, whole batches
    frontier: PartitionFrontier
    visible_frontier: int       # the frontier in force at visible_end
    visible_ended: bool
    visible_epoch: int = 0      # the epoch of visible_frontier
    # The log end at open, which visible_end may be below (a durable end, or a promoted
    # follower's high watermark). Opened so, the three above (and epoch_since) are as they
    # stood at `shown_at`, the visible end then (`PartitionOpened.at_visible`), until
    # known_end is visible and the log end's (`known_shown`) take over; else they are the log
    # end's. A reader starting at visible_end is told the frontier only from known_end on.
    known_end: int = 0
    shown_at: int = -1
    known_shown: tuple[int, bool, int, int] | None = None  # (frontier, ended, epoch, since)
    epoch_since: int = 0        # the offset from which visible_epoch is known to hold
    inflight: deque[Pending] = msgspec.field(default_factory=deque)   # Append sent, not completed
    unflushed: deque[Pending] = msgspec.field(default_factory=deque)  # completed, not yet durable
    subs: dict[int, Subscription] = msgspec.field(default_factory=dict)
    tailing: set[int] = msgspec.field(default_factory=set)  # caught up, idle, with credit
    cohorts_asked: int = 0      # latest cohort revision the shell was told to save
    cohorts_saved: int = 0      # latest revision it reported on disk
    # Producer-open replies that changed the cohorts wait for their save: (revision, token,
    # reply). A restarted broker must know every cohort a writer was told it joined.
    save_waits: deque[tuple[int, Any, Any]] = msgspec.field(default_factory=deque)
    producers: ProducerStateTable = msgspec.field(default_factory=ProducerStateTable)
    # Kafka transactions (DESIGN §8 "Transactions"): producer id -> first offset of its
    # transaction open here (its marker not yet durable); the aborted ones as (producer id,
    # first offset, marker offset), in marker order. The first open one bounds the last stable
    # offset, past which tq's readers and read_committed consumers never read.
    open_txns: dict[int, int] = msgspec.field(default_factory=dict)
    aborted: deque[tuple[int, int, int]] = msgspec.field(default_factory=deque)
    # producer id -> epoch of its last marker here: older epochs' batches are fenced
    # (at most max_producer_ids, the least recently marked forgotten first)
    marked_epochs: dict[int, int] = msgspec.field(default_factory=dict)
    # producer id -> (when the broker aborts its open transaction itself, its epoch)
    txn_deadlines: dict[int, tuple[float, int]] = msgspec.field(default_factory=dict)
    # Replication (DESIGN §5 "Replication"): the log's durable end as last reported; on a
    # replicated partition this broker leads, its `LeaderReplication` (the high watermark
    # gates acks and visibility after durability); `follower`: another broker leads it.
    durable_end: int = 0
    replication: Any = None
    follower: bool = False
    min_insync: int = 1
    # Followers' fetches waiting at the log end for its next append: (token, deadline).
    # Followers' fetches waiting at the log end: (token, deadline, fetch offset, max bytes).
    replica_waits: list[tuple[Any, float, int, int]] = msgspec.field(default_factory=list)

    @property
    def stable_end(self) -> int:
        """Kafka's last stable offset: the visible end, or the first open transaction's first
        offset when that is lower."""
        if not self.open_txns:
            return self.visible_end
        return min(self.visible_end, min(self.open_txns.values()))


class Subscription(msgspec.Struct):
    serial: int                 # unique for the broker's lifetime: stale reads are recognised
    session: str
    sub_id: int
    partition: PartitionId
    next_offset: int
    credit: CreditWindow
    reading: bool = False       # a Read instruction is outstanding


class Session(msgspec.Struct):
    id: str
    lease: float
    expires_at: float
    window: CreditWindow
    principal: str = "admin"    # who it writes as (`_access.py`); fixed for its life
    producing: set[PartitionId] = msgspec.field(default_factory=set)
    # Partitions it rejoined after their stream ended with all it sent stored: it may only
    # send that again (answered as the first time), nothing new (`BrokerState._open_producer`).
    resending: set[PartitionId] = msgspec.field(default_factory=set)
    subs: dict[int, int] = msgspec.field(default_factory=dict)  # sub_id -> serial
    # Whether the producer window was open when its last produce request's first batch came:
    # a ProduceBatches' later batches (`Produce.follows`) are judged by it, not by the window
    # their earlier siblings used up (the request may overshoot whole, never more).
    window_open: bool = True
