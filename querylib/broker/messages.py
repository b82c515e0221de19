"""The broker's RPC messages (DESIGN §5): sessions, produce, frontier, subscribe, delivery.

Declarations only: each request names its reply type; record batches never sit in a body but
travel as raw payload frames next to it (Produce carries exactly one batch, ProduceBatches several
of one partition in order, Delivery carries the
stored bytes of one or more whole batches, unchanged). Offsets and credits are Kafka's: int64
offsets, byte counts. Requests keep the default error type (any TqError): the client rebuilds
broker, storage and record errors as their own classes. Topic names are validated by the
server, not here.

Client -> broker requests (reply in brackets):
    broker.session.open     OpenSessionRequest   [SessionOpened]   open or renew a lease
    broker.session.renew    HeartbeatRequest     [Done]
    broker.session.close    CloseSessionRequest  [Done]
    broker.partitions       ListPartitions       [PartitionList]
    broker.partition.ensure EnsurePartition      [PartitionInfo]   create=True creates it
    broker.partition.drop   DropPartitionRequest [Done]            delete it and its files
    broker.producer.open    OpenProducerRequest  [ProducerOpened]  join the partition's frontier
                                                                   (optionally in a cohort)
    broker.produce          ProduceRequest       [Produced]        + one payload frame: a batch
    broker.produce.batches  ProduceBatchesRequest [ProducedBatches] + one payload frame:
                                                                   several batches of one
                                                                   partition, back to back
    broker.markers          WriteMarkersRequest  [MarkersWritten]  + one payload frame: a
                                                                   transaction marker, for
                                                                   several partitions
    broker.frontier         AdvanceRequest       [Done]
    broker.end              EndStreamRequest     [Done]
    broker.subscribe        SubscribeRequest     [Subscribed]
    broker.unsubscribe      UnsubscribeRequest   [Done]
Follower broker -> leader broker (only a broker of the cluster, for a replica it holds):
    broker.replica.fetch    ReplicaFetchRequest  [ReplicaData]     + one payload frame: the
                                                                   leader's stored batches from
                                                                   fetch_offset, unchanged
    broker.replica.epoch_end EpochEndRequest     [EpochEnd]        OffsetForLeaderEpoch: where
                                                                   an epoch ended on the leader
Client -> broker notify:
    broker.credit           CreditNotify                           more bytes for a subscription
Broker -> client notifies:
    broker.delivery         Delivery                               + payload frames: batches
    broker.sub.closed       SubscriptionEnded                      the subscription stopped
"""

from __future__ import annotations

from typing import Literal

import msgspec

from querylib.rpc._messages import ErrorBody, Notify, Reply, Request

__all__ = [
    "EpochEnd",
    "EpochEndRequest",
    "ReplicaData",
    "ReplicaFetchRequest",
    "StartAt",
    "AdvanceRequest",
    "DeleteRecordsRequest",
    "Incarnation",
    "MarkersWritten",
    "CloseSessionRequest",
    "CreditNotify",
    "Delivery",
    "Done",
    "DropPartitionRequest",
    "EndStreamRequest",
    "EnsurePartition",
    "HeartbeatRequest",
    "ListPartitions",
    "ListSubscriptions",
    "OpenProducerRequest",
    "OpenSessionRequest",
    "PartitionInfo",
    "PartitionList",
    "ProduceBatchesRequest",
    "ProduceRequest",
    "Produced",
    "ProducedBatches",
    "ProducerOpened",
    "SessionOpened",
    "SubscribeRequest",
    "Subscribed",
    "SubscriptionEnded",
    "SubscriptionInfo",
    "SubscriptionList",
    "UnsubscribeRequest",
    "WriteMarkersRequest",
]

StartAt = int | Literal["earliest", "latest"]  # where a subscription starts: an offset, or an end


class Incarnation(msgspec.Struct, frozen=True, order=True):
    """Which topic of a name a partition belongs to: the catalog's topic id and the topic's
    creation time (requests carry them as `topic_id`, `topic_created_ms`). Ids alone are not
    enough: a catalog restored from a backup, or started afresh, hands out the same ids
    again. Ordered by creation (then id): the later topic of a name is the newer one."""

    created_ms: int
    topic_id: int


# --------------------------------------------------------------------------- replies


class Done(Reply, tag="broker.done"):
    """The request took effect (heartbeat, close, advance, end, unsubscribe)."""


class SessionOpened(Reply, tag="broker.session.opened"):
    session: str
    lease: float            # seconds granted (the broker clamps the request)
    producer_window: int    # bytes of unacknowledged batches a producer may have in flight
    max_credit: int         # most bytes a subscription may hold as credit
    max_batch_bytes: int    # largest batch a Produce may carry
    control_cost: int       # window bytes an advance or end-of-stream request takes


class PartitionInfo(Reply, tag="broker.partition.info"):
    topic: str
    partition: int
    log_start: int          # first offset still stored
    log_end: int            # next offset visible to subscribers (durable; Kafka's last
                            # stable offset: no undecided transaction below it)
    frontier: int           # last published frontier
    ended: bool             # the last control record is end-of-stream
    size: int = 0           # bytes of its log on disk (set by broker.partitions; 0 elsewhere)
    epoch: int = 0          # the epoch of `frontier` (DESIGN §5 "Epochs")
    high_watermark: int = -1  # durable end, open transactions included (-1: = log_end)


class PartitionList(Reply, tag="broker.partition.list"):
    partitions: list[PartitionInfo]


class SubscriptionInfo(msgspec.Struct, frozen=True):
    """One subscription as its broker sees it: whose, where it stands, and the partition's
    visible end and frontier then (its lag is `log_end - next_offset` records)."""

    topic: str
    partition: int
    principal: str          # of the session that holds it
    next_offset: int        # the next offset the broker delivers to it
    log_end: int            # the partition's visible end
    frontier: int           # the partition's frontier at that end


class SubscriptionList(Reply, tag="broker.subscription.list"):
    subscriptions: list[SubscriptionInfo]


class ProducerOpened(Reply, tag="broker.producer.opened"):
    log_end: int
    frontier: int           # the producer starts here; it may not advance below it
    window: int
    epoch: int = 0          # the epoch of `frontier` (DESIGN §5 "Epochs")


class Produced(Reply, tag="broker.produced"):
    base_offset: int        # offset the broker stamped on the batch
    next_offset: int


class ProducedBatches(Reply, tag="broker.produced.batches"):
    """The answer to a ProduceBatchesRequest: each batch's (base offset, next offset), in the
    order sent; a batch refused has (-1, -1) there and its error in `errors`, by its index
    (a batch stored before and answered as such is not an error: it has its offsets, or
    (-1, -1) with a DuplicateSequenceError when the broker no longer remembers them)."""

    offsets: list[tuple[int, int]]
    errors: list[tuple[int, ErrorBody]] = []


class MarkersWritten(Reply, tag="broker.markers.written"):
    gone: list[tuple[str, int]] = []  # partitions that do not exist here: no marker needed


class Subscribed(Reply, tag="broker.subscribed"):
    offset: int             # where delivery starts
    log_start: int
    log_end: int
    frontier: int | None    # the frontier in force at `offset` when the broker knows it
    ended: bool             # end-of-stream is in force at `offset`
    epoch: int = 0          # the epoch of `frontier`


# --------------------------------------------------------------------------- requests


class OpenSessionRequest(Request[SessionOpened], tag="broker.session.open"):
    session: str            # chosen by the client (a uuid); reopening a live id renews it
    lease: float = 10.0
    # Who the session writes as (`_access.py`): stated by the client until credentials
    # authenticate it; "system" only in the broker's own process.
    principal: str = "admin"


class HeartbeatRequest(Request[Done], tag="broker.session.renew"):
    session: str


class CloseSessionRequest(Request[Done], tag="broker.session.close"):
    session: str


class ListPartitions(Request[PartitionList], tag="broker.partitions"):
    topic: str = ""         # "" lists every partition the broker hosts


class ListSubscriptions(Request[SubscriptionList], tag="broker.subscriptions"):
    """The broker's subscriptions (of `topic`, or all). Over RPC a principal other than the
    admin sees its own only."""

    topic: str = ""
    principal: str = ""     # only this principal's ("" every principal's)


class EnsurePartition(Request[PartitionInfo], tag="broker.partition.ensure"):
    topic: str
    partition: int
    create: bool = True
    # The catalog's topic (id and creation time; 0: no catalog): the partition must belong
    # to it (DESIGN §4 "Topic incarnations"). Also on OpenProducerRequest, SubscribeRequest.
    topic_id: int = 0
    topic_created_ms: int = 0


class DropPartitionRequest(Request[Done], tag="broker.partition.drop"):
    """Forget the partition and delete its directory (the catalog deleted its topic): its
    subscriptions end with UnknownPartitionError, its producers' next request fails. Done
    also when the broker does not host it."""

    topic: str
    partition: int


class DeleteRecordsRequest(Request[PartitionInfo], tag="broker.partition.delete_records"):
    """Move the partition's log start up to `offset` (-1: its visible end), Kafka's
    DeleteRecords: whole segments below it go. The topic's writers and the admin may (DESIGN
    §12). OffsetOutOfRangeError past the visible end."""

    topic: str
    partition: int
    offset: int


class OpenProducerRequest(Request[ProducerOpened], tag="broker.producer.open"):
    session: str
    topic: str
    partition: int
    create: bool = True
    # A collective publication: this producer is `writer` of `cohort`, which expects
    # `writers` distinct writers; the partition's frontier waits for all of them. On the
    # wire as "group", its name before cohorts had theirs: old and new peers agree.
    cohort: str = msgspec.field(default="", name="group")
    writer: str = ""
    writers: int = 0
    rejoin: bool = False     # the broker forgot our session; we were counted before
    topic_id: int = 0        # the catalog's topic, as on EnsurePartition
    topic_created_ms: int = 0
    create_topic: bool = False  # the broker's directory may register an unknown topic (ingest)
    reopen: bool = False     # go on writing a partition whose stream ended
    epoch: int = 0           # with reopen: the run this writes for; a higher one starts an epoch
    # With `rejoin`, an idempotent producer says what it may send again: its id, the
    # sequence of the last record it sent (-1: none), whether it sent its end of stream.
    producer_id: int = -1
    last_sequence: int = -1
    ending: bool = False


class ProduceRequest(Request[Produced], tag="broker.produce"):
    """Followed by one RecordBatch v2 (data, not control): in one payload frame, or in two,
    its 61-byte header and then its records (how a producer sends a batch it stamped without
    copying it: `SplitBatch`). Answered once durable by the broker's flush policy; `written`:
    once the log has it (the OS does; durable with the partition's next synced append)."""

    session: str
    topic: str
    partition: int
    written: bool = False


class ProduceBatchesRequest(Request[ProducedBatches], tag="broker.produce.batches"):
    """Followed by one payload frame: `batches` RecordBatches of one partition back to back
    (each framed by its own batchLength), appended in that order. Kafka's ProduceRequest
    amortises a request over batches as this does: each batch is judged as if it came alone
    (idempotence, admission, CRC), but the request costs one decode, one MAC check, one write
    of the log and one reply for all of them."""

    session: str
    topic: str
    partition: int
    batches: int


class WriteMarkersRequest(Request[MarkersWritten], tag="broker.markers"):
    """Followed by one transaction marker (`records.transaction_marker_batch`), appended to
    every partition listed as the session's producer there (opened if it is not): the markers
    one transaction's completion writes on this broker, in one request (Kafka's
    WriteTxnMarkers). Answered once all are durable; only `system` and `admin` write markers."""

    session: str
    partitions: list[tuple[str, int]]


class AdvanceRequest(Request[Done], tag="broker.frontier"):
    session: str
    topic: str
    partition: int
    frontier: int


class EndStreamRequest(Request[Done], tag="broker.end"):
    session: str
    topic: str
    partition: int


class SubscribeRequest(Request[Subscribed], tag="broker.subscribe"):
    session: str
    sub_id: int             # chosen by the client, unique within its session
    topic: str
    partition: int
    start: int | Literal["earliest", "latest"] = "earliest"
    credit: int = 0         # initial credit in bytes
    create: bool = False
    topic_id: int = 0       # the catalog's topic, as on EnsurePartition
    topic_created_ms: int = 0


class UnsubscribeRequest(Request[Done], tag="broker.unsubscribe"):
    session: str
    sub_id: int


# --------------------------------------------------------------------------- notifies


class CreditNotify(Notify, tag="broker.credit"):
    session: str
    sub_id: int
    nbytes: int


class Delivery(Notify, tag="broker.delivery"):
    """Followed by one payload frame or more: the stored bytes of whole batches, starting with
    the batch that holds `offset`; `next_offset` is the offset after the last of them. A
    later frame (a replicated partition's leader sends a run that way: a batch a frame, the
    bytes its followers fetched, hashed once) starts with a whole batch at its base offset."""

    sub_id: int
    topic: str
    partition: int
    offset: int
    next_offset: int


class SubscriptionEnded(Notify, tag="broker.sub.closed"):
    sub_id: int
    topic: str
    partition: int
    error: ErrorBody


class ReplicaData(Reply, tag="broker.replica.data"):
    """The leader's answer to a follower's fetch: its high watermark, log start and log end;
    the batches travel as one payload frame (empty when the follower is at the end)."""

    high_watermark: int
    log_start: int
    log_end: int


class ReplicaFetchRequest(Request[ReplicaData], tag="broker.replica.fetch"):
    """Follower `replica` of a replicated partition, which it follows at `leader_epoch`, asks
    its leader for the batches from `fetch_offset` (its log end: the leader records it as the
    follower's), at most `max_bytes` (but at least one batch). At the leader's log end the
    leader answers after its next append, or `max_wait_ms` later (0: at once)."""

    topic: str
    partition: int
    fetch_offset: int
    leader_epoch: int
    replica: int
    max_bytes: int = 1024 * 1024
    max_wait_ms: int = 0


class EpochEnd(Reply, tag="broker.replica.epoch_end.reply"):
    """The largest leader epoch <= the one asked for in the leader's log, and the offset where
    it ended (the next epoch's start, or the log end); (-1, -1) when the log has none."""

    leader_epoch: int
    end_offset: int


class EpochEndRequest(Request[EpochEnd], tag="broker.replica.epoch_end"):
    """A (re)joining follower asks its leader where `leader_epoch` (its log's latest) ended,
    and truncates its log there (KIP-101/279) before fetching."""

    topic: str
    partition: int
    leader_epoch: int
    replica: int
