"""The vocabulary of the broker's state machine: stimuli in, instructions out (DESIGN §5).

`BrokerState.handle(stimulus) -> list[Instruction]` is the whole contract between the pure core
(`_state.py`) and the I/O shell (`_server.py`). Stimuli are either client requests (carrying an
opaque `token` the shell uses to route the reply) or results of I/O the shell performed for an
earlier instruction (appends, reads, flushes) or the passing of time (`Tick`). Nothing here does
I/O or reads a clock; these are plain frozen records (msgspec structs: cheap to create).

Partitions are named by `PartitionId = (topic, partition)`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from querylib.broker._errors import PartitionNotHereError, UnknownPartitionError
from querylib.broker.messages import StartAt

from ._frontier import SavedCohort

PartitionId = tuple[str, int]

# --------------------------------------------------------------------------- stimuli: time


class Tick(msgspec.Struct, frozen=True):
    """The shell's clocks: `now` (seconds, monotonic) for leases; `wall_ms` (milliseconds since
    the epoch) for the timestamps of the control batches the broker writes."""

    now: float
    wall_ms: int = 0


# --------------------------------------------------------------------------- stimuli: requests


class OpenSession(msgspec.Struct, frozen=True):
    """Open (or, with a known id, renew) a session. `lease` is the requested lease in seconds;
    `principal` is who the session writes as (`_access.py`), fixed for its life."""

    token: Any
    session: str
    lease: float
    principal: str = "admin"


class Heartbeat(msgspec.Struct, frozen=True):
    token: Any
    session: str


class CloseSession(msgspec.Struct, frozen=True):
    """Leave cleanly: producers drop out of their partitions' frontiers, subscriptions end."""

    token: Any
    session: str


class OpenProducer(msgspec.Struct, frozen=True):
    """The session starts producing into `partition` (joins its frontier), as `writer` of
    cohort `cohort` expecting `writers` distinct writers when `cohort` is not empty
    (`_frontier.py`); `rejoin` after the broker forgot the session. Admitted by the topic's
    writers rule (`_admission.py`): `create` lets the broker open a partition it may
    host but does not yet, `create_topic` lets its directory register an unknown topic as an
    ingest topic, `reopen` goes on writing a partition whose stream ended. A rejoining
    idempotent producer states its `producer_id`, the sequence of the last record it sent
    (`last_sequence`, -1 for none) and whether its end of stream was sent (`ending`): if the
    stream ended after all of that was stored, it may only send it again (`_state.py`)."""

    token: Any
    session: str
    partition: PartitionId
    cohort: str = ""
    writer: str = ""
    writers: int = 0
    rejoin: bool = False
    create: bool = True
    create_topic: bool = False
    reopen: bool = False
    epoch: int = 0  # with `reopen`: the run it writes for, a new epoch if above the partition's
    # The catalog's topic incarnation the writer named (an opaque `Incarnation`, or None):
    # only carried to the OpenPartition it may cause (DESIGN §4 "Topic incarnations").
    incarnation: Any = None
    producer_id: int = -1
    last_sequence: int = -1
    ending: bool = False
    # Set by the core when a rule refused it and the directory was asked again (the rule may
    # have been stale): the answer decides, no further asking.
    rechecked: bool = False


class Produce(msgspec.Struct, frozen=True):
    """One record batch (magic 2, base offset not yet assigned) for `partition`. `written`:
    answer once the log has it (the OS does), not once durable by the flush policy.
    `follows`: a later batch of one request (ProduceBatches), judged against the producer
    window as its first batch found it: the request overshoots whole or is refused whole."""

    token: Any
    session: str
    partition: PartitionId
    batch: bytes
    written: bool = False
    follows: bool = False


class AdvanceFrontier(msgspec.Struct, frozen=True):
    token: Any
    session: str
    partition: PartitionId
    frontier: int


class EndStream(msgspec.Struct, frozen=True):
    """The producer will send nothing more to `partition` (end-of-stream for it)."""

    token: Any
    session: str
    partition: PartitionId


class Subscribe(msgspec.Struct, frozen=True):
    """Start pushing `partition` from `start` to subscription `sub_id` of the session."""

    token: Any
    session: str
    sub_id: int
    partition: PartitionId
    start: StartAt
    credit: int


class GrantCredit(msgspec.Struct, frozen=True):
    """One-way: the subscriber processed data and allows `nbytes` more."""

    session: str
    sub_id: int
    nbytes: int


class Unsubscribe(msgspec.Struct, frozen=True):
    token: Any
    session: str
    sub_id: int


class DropPartition(msgspec.Struct, frozen=True):
    """Forget `partition`: end its subscriptions, detach its producers. The shell then closes
    its log and deletes its files (the catalog deleted the topic)."""

    token: Any
    partition: PartitionId


class DropSubscription(msgspec.Struct, frozen=True):
    """The shell could not deliver to the subscription (its client is gone or not reading):
    end it, so the client resumes from its own last offset instead of seeing a gap."""

    session: str
    sub_id: int
    error: Exception


class QueryExits(msgspec.Struct, frozen=True):
    """What the catalog says of query `query_id`'s processes: each one's exit code (None while
    it runs, or never started), and whether the query failed or was killed. One-way, from the
    shell (the executor follows the catalog); cohorts of the query settle by it."""

    query_id: int
    exit_codes: tuple[int | None, ...]
    failed: bool = False


class TopicAccess(msgspec.Struct, frozen=True):
    """What the broker's directory says of a topic (one-way, or inside TopicResolved): who may
    write it (`writers`: "*" anyone, "system" tq itself, else one principal, its owner), how
    many partitions it has (None: no bound) and which of them this broker may host (None:
    any). The core keeps the latest one per topic; it replaces what was known."""

    topic: str
    writers: str
    partitions: int | None = None
    here: tuple[int, ...] | None = None
    # Kafka topic configs set for the topic in the catalog (retention.ms, retention.bytes,
    # segment.bytes), over the broker's own log config; the shell applies them to its logs.
    configs: tuple[tuple[str, str], ...] = ()

    def check_placed(self, index: int, use: str) -> None:
        """UnknownPartitionError when the topic has no partition `index`, PartitionNotHereError
        when another broker hosts it (`use`: what the caller should do there, "read"/"write")."""
        if self.partitions is not None and not 0 <= index < self.partitions:
            raise UnknownPartitionError(f"topic {self.topic!r} has {self.partitions} "
                                        f"partition(s); there is no partition {index}")
        if self.here is not None and index not in self.here:
            raise PartitionNotHereError(f"partition {index} of {self.topic!r} lives on another "
                                        f"broker: {use} it there")


class TopicForgotten(msgspec.Struct, frozen=True):
    """The directory no longer knows `topic` (deleted): ask again before admitting a writer."""

    topic: str


# --------------------------------------------------------------------------- stimuli: I/O results


class TopicResolved(msgspec.Struct, frozen=True):
    """The answer to ResolveTopic `ask`: the topic's access, or the error refusing it."""

    ask: int
    access: TopicAccess | None = None
    error: Exception | None = None


class PartitionOpenFailed(msgspec.Struct, frozen=True):
    """The shell could not open a partition the state asked for (OpenPartition)."""

    partition: PartitionId
    error: Exception


class PartitionOpened(msgspec.Struct, frozen=True):
    """The shell opened (or created, or recovered) a partition log."""

    partition: PartitionId
    log_start: int
    log_end: int
    durable_end: int
    frontier: int = 0
    ended: bool = False
    cohorts: tuple[SavedCohort, ...] = ()  # pending cohorts saved beside the log
    # Idempotent batches of the log's tail, oldest first: (producer id, epoch, first sequence,
    # last sequence, base offset, next offset); see _producer_state.
    producers: tuple[tuple[int, int, int, int, int, int], ...] = ()
    epoch: int = 0  # of `frontier`
    epoch_since: int = 0  # the offset from which `epoch` is known to hold
    # Kafka transactions of the log's tail: open ((producer id, first offset), ...) and
    # aborted ((producer id, first offset, marker offset), ...); see _host._scan_tail.
    open_transactions: tuple[tuple[int, int], ...] = ()
    aborted_transactions: tuple[tuple[int, int, int], ...] = ()
    # (producer id, epoch of its last transaction marker): older epochs are fenced.
    marked_epochs: tuple[tuple[int, int], ...] = ()
    # (offset, frontier, ended, epoch, epoch_since) as they stood at `offset`, below the log
    # end, up to which readers may see (the durable end, a promoted follower's high
    # watermark); None when that is the log end.
    at_visible: tuple[int, int, bool, int, int] | None = None


class CohortsSaved(msgspec.Struct, frozen=True):
    """The partition's pending cohorts as of `revision` are on disk."""

    partition: PartitionId
    revision: int


class CohortsSaveFailed(msgspec.Struct, frozen=True):
    partition: PartitionId
    revision: int
    error: Exception


class AppendCompleted(msgspec.Struct, frozen=True):
    """The append for `ticket` landed at [base_offset, next_offset). The log's start and durable
    end are reported as they stood right after it (retention and flushes move them). `more`:
    another completion of the same commit (one write) follows at once, so a replicated
    partition's leader answers its followers' waiting fetches after the last, with them all."""

    partition: PartitionId
    ticket: int
    base_offset: int
    next_offset: int
    log_start: int
    durable_end: int
    more: bool = False


class AppendFailed(msgspec.Struct, frozen=True):
    partition: PartitionId
    ticket: int
    error: Exception


class LogStartAdvanced(msgspec.Struct, frozen=True):
    """DeleteRecords moved the log start to `log_start`: subscribers below it are told, as
    after retention."""

    partition: PartitionId
    log_start: int


class DurableAdvanced(msgspec.Struct, frozen=True):
    """A flush made the log durable up to `durable_end` (exclusive)."""

    partition: PartitionId
    durable_end: int


class ReadCompleted(msgspec.Struct, frozen=True):
    """Whole batches read for subscription `serial` from `offset`; `next_offset` is the offset
    after the last of them."""

    serial: int
    offset: int
    data: bytes
    next_offset: int


class ReadFailed(msgspec.Struct, frozen=True):
    serial: int
    offset: int
    error: BaseException  # what the read raised (an executor future's exception())


class SetReplicaRole(msgspec.Struct, frozen=True):
    """This broker's role on a replicated partition (`role`: a `PartitionRole`; None: the
    partition has one replica, as before), as the catalog says; `broker_id` is this broker's
    id; `min_insync`: the topic's min.insync.replicas. Sent again whenever the role changes."""

    partition: PartitionId
    role: Any
    broker_id: int
    min_insync: int = 1


class ReplicaFetched(msgspec.Struct, frozen=True):
    """Follower `replica`, at leader epoch `leader_epoch`, fetches the partition from
    `fetch_offset` (its log end), at most `max_bytes` (at least one batch). Answered with a
    `ReplicaAnswer` after it, or NotLeaderOrFollower / FencedLeaderEpoch. At the log end, after
    the next append, or `max_wait` seconds later (0: at once)."""

    token: Any
    partition: PartitionId
    replica: int
    fetch_offset: int
    leader_epoch: int
    max_wait: float = 0.0
    max_bytes: int = 1024 * 1024


class ReplicaAnswer(msgspec.Struct, frozen=True):
    """The answer to a `ReplicaFetched`: the leader's high watermark after it and, when the
    batches from its offset are still held in memory (appended, above the high watermark:
    the usual case for an in-sync follower), those batches as the log stores them, whole,
    at most the fetch's max_bytes but at least one; None: the shell reads them from the
    log."""

    high_watermark: int
    batches: tuple[bytes, ...] | None


class ReplicaAppended(msgspec.Struct, frozen=True):
    """A follower appended its leader's batches: its log now ends at `log_end`, durable to
    `durable_end`, and the leader's high watermark was `high_watermark` (the follower's own is
    never past its log end)."""

    partition: PartitionId
    log_end: int
    durable_end: int
    high_watermark: int


Stimulus = (
    Tick | OpenSession | Heartbeat | CloseSession | OpenProducer | Produce | AdvanceFrontier
    | EndStream | Subscribe | GrantCredit | Unsubscribe | DropSubscription | DropPartition
    | QueryExits | TopicAccess | TopicForgotten | TopicResolved | PartitionOpened
    | PartitionOpenFailed | CohortsSaved | CohortsSaveFailed | AppendCompleted
    | AppendFailed | DurableAdvanced | LogStartAdvanced | ReadCompleted | ReadFailed
    | SetReplicaRole | ReplicaFetched | ReplicaAppended
)

# --------------------------------------------------------------------------- instructions


class Reply(msgspec.Struct, frozen=True):
    """Answer the request that carried `token` with `value` (a reply message)."""

    token: Any
    value: Any


class Fail(msgspec.Struct, frozen=True):
    """Answer the request that carried `token` with an error (a TqError)."""

    token: Any
    error: Exception


class Append(msgspec.Struct, frozen=True):
    """Append `batch` to `partition`. The shell performs appends of one partition strictly in the
    order of these instructions and answers each with AppendCompleted or AppendFailed. `sync`
    False: the flush policy need not fsync for this one (a later synced append covers it)."""

    partition: PartitionId
    ticket: int
    batch: bytes
    sync: bool = True


class Read(msgspec.Struct, frozen=True):
    """Read whole batches of `partition` from `offset`: at most `max_bytes` (but at least one
    batch) and none at or beyond `end_offset`. Answer with ReadCompleted or ReadFailed."""

    partition: PartitionId
    serial: int
    offset: int
    max_bytes: int
    end_offset: int


class Deliver(msgspec.Struct, frozen=True):
    """Push stored batch bytes [offset, next_offset) to subscription `sub_id` of `session`:
    `data` is one payload frame, or a tuple of them (a replicated partition's run: each
    batch's stored bytes as its own frame, in offset order, none empty)."""

    session: str
    sub_id: int
    partition: PartitionId
    offset: int
    next_offset: int
    data: bytes | tuple[bytes, ...]


class SubscriptionClosed(msgspec.Struct, frozen=True):
    """Tell the session its subscription ended for a reason (the error says which)."""

    session: str
    sub_id: int
    partition: PartitionId
    error: Exception


class SaveCohorts(msgspec.Struct, frozen=True):
    """Replace the saved pending cohorts of `partition` with `cohorts` (atomically, on
    disk, beside its log); answer with CohortsSaved or CohortsSaveFailed for `revision`. Saves
    of one partition may be coalesced: only the latest revision matters."""

    partition: PartitionId
    revision: int
    cohorts: tuple[SavedCohort, ...]


class SessionExpired(msgspec.Struct, frozen=True):
    """The session's lease ran out (or it closed): the shell may forget how to reach it."""

    session: str


class ResolveTopic(msgspec.Struct, frozen=True):
    """Ask the broker's directory about `topic` (a writer wants `partition` of it; with
    `create`, the directory may register it as an ingest topic). Answer with TopicResolved for
    `ask`; the requests waiting on it are handled again then."""

    ask: int
    topic: str
    partition: int
    create: bool


class OpenPartition(msgspec.Struct, frozen=True):
    """Open (creating) the log of `partition`: the directory places it on this broker. Answer
    with PartitionOpened or PartitionOpenFailed. `incarnation`: the topic incarnation the
    writer that caused it named (None: none)."""

    partition: PartitionId
    incarnation: Any = None


class ProposeIsr(msgspec.Struct, frozen=True):
    """Ask the coordinator to set the ISR of `partition` (led at `leader_epoch`, whose ISR is
    now `expected_isr`) to `isr` (AlterPartition). Only the role that comes back changes it."""

    partition: PartitionId
    leader_epoch: int
    expected_isr: tuple[int, ...]
    isr: tuple[int, ...]


Instruction = (
    Reply | Fail | Append | Read | Deliver | SubscriptionClosed | SaveCohorts | SessionExpired
    | ResolveTopic | OpenPartition | ProposeIsr
)
