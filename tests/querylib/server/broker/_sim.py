"""A deterministic in-memory shell for BrokerState: performs Append/Read instructions against a
list of stored batches, and checks the delivery invariants on every instruction it sees.

Not a fake of the real shell's I/O (that is tested with real files and sockets in
tests/integration); this drives the pure core through every interleaving hypothesis finds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

from querylib.records._header import HEADER, HEADER_SIZE, LOG_OVERHEAD, read_header
from querylib.server.broker._events import (
    Append,
    AppendCompleted,
    CohortsSaved,
    Deliver,
    DurableAdvanced,
    Fail,
    OpenPartition,
    PartitionId,
    PartitionOpened,
    ProposeIsr,
    Read,
    ReadCompleted,
    Reply,
    ResolveTopic,
    SaveCohorts,
    SessionExpired,
    SubscriptionClosed,
    TopicAccess,
)
from querylib.server.broker._state import BrokerLimits, BrokerState

CONTROL = 0x20
TRANSACTIONAL = 0x10


def fake_batch(n_records: int = 1, payload: bytes = b"", *, control: bool = False) -> bytes:
    """A batch whose header is well formed (the core reads headers, never CRCs or records)."""
    attributes = CONTROL if control else 0
    length = HEADER_SIZE - LOG_OVERHEAD + len(payload)
    return HEADER.pack(0, length, -1, 2, 0, attributes, n_records - 1, 0, 0, -1, -1, -1,
                       n_records) + payload


def fake_frontier(frontier: int, timestamp: int, epoch: int = 0) -> bytes:
    return fake_batch(1, b"F" + frontier.to_bytes(8, "big", signed=True), control=True)


def fake_end(timestamp: int) -> bytes:
    return fake_batch(1, b"E", control=True)


def fake_reopen(timestamp: int, epoch: int = 0) -> bytes:
    return fake_batch(1, b"R", control=True)


def control_of(stored: bytes) -> tuple[str, int | None] | None:
    """('F', frontier) / ('E', None) / ('R', None) for the fake control batches, None for
    data."""
    if not stored[22] & CONTROL:
        return None
    kind = stored[HEADER_SIZE:HEADER_SIZE + 1]
    if kind == b"F":
        return "F", int.from_bytes(stored[HEADER_SIZE + 1:HEADER_SIZE + 9], "big", signed=True)
    return kind.decode(), None


@dataclass
class SubTrack:
    granted: int
    next_offset: int | None = None
    delivered: int = 0
    batches: list[tuple[int, int]] = field(default_factory=list)
    closed: bool = False


class Sim:
    def __init__(self, limits: BrokerLimits | None = None, *, auto_durable: bool = True,
                 auto_save: bool = True) -> None:
        self.state = BrokerState(limits, encode_frontier=fake_frontier, encode_end=fake_end,
                                 encode_reopen=fake_reopen)
        self.auto_durable = auto_durable
        self.auto_save = auto_save  # answer SaveCohorts at once (else they wait in `saves`)
        self.saves: list[SaveCohorts] = []
        self.saved: dict[PartitionId, SaveCohorts] = {}
        self.logs: dict[PartitionId, list[tuple[int, int, bytes]]] = {}
        self.durable: dict[PartitionId, int] = {}
        self.appends: dict[PartitionId, deque[Append]] = {}
        self.reads: dict[int, Read] = {}
        self.replies: dict[object, object] = {}
        self.subs: dict[tuple[str, int], SubTrack] = {}
        self.expired: list[str] = []
        self.asks: list[ResolveTopic] = []     # questions for the directory, unanswered
        self.opens: list[OpenPartition] = []   # partitions to open, not opened yet
        self.proposals: list[ProposeIsr] = []  # ISR changes the core asked for
        self.max_batch = 0
        self.now = 0.0

    # ----------------------------------------------------------------- driving

    def open_partition(self, pid: PartitionId, *, writers: str | None = "*", **kwargs) -> list:
        """Open `pid`, its topic open to `writers` (anyone, unless a test says otherwise;
        None: the state has no rule for it yet)."""
        self.logs[pid] = []
        self.durable[pid] = 0
        self.appends[pid] = deque()
        out = self.feed(PartitionOpened(pid, 0, 0, 0, **kwargs))
        if writers is not None:
            out += self.feed(TopicAccess(pid[0], writers))
        return out

    def complete_open(self) -> list:
        """The shell opened the first partition the state asked for: a new, empty log."""
        return self.open_partition(self.opens.pop(0).partition, writers=None)

    def complete_save(self) -> list:
        save = self.saves.pop(0)
        self.saved[save.partition] = save
        return self.feed(CohortsSaved(save.partition, save.revision))

    def feed(self, stimulus) -> list:
        out = self.state.handle(stimulus)
        for instr in out:
            self._see(instr)
        return out

    def log_end(self, pid: PartitionId) -> int:
        log = self.logs[pid]
        return log[-1][1] if log else 0

    def complete_append(self, pid: PartitionId, *, more: bool = False) -> list:
        queue = self.appends[pid]
        if not queue:
            return []
        instr = queue.popleft()
        base = self.log_end(pid)
        header = read_header(instr.batch)
        nxt = base + header.last_offset_delta + 1
        stored = base.to_bytes(8, "big", signed=True) + instr.batch[8:]
        leader = self.state.partitions[pid].replication
        if leader is not None:  # the lane of a replicated partition's leader stamps its epoch
            stored = (stored[:12] + leader.role.leader_epoch.to_bytes(4, "big", signed=True)
                      + stored[16:])
        self.logs[pid].append((base, nxt, stored))
        if self.auto_durable:
            self.durable[pid] = nxt
        return self.feed(AppendCompleted(pid, instr.ticket, base, nxt, 0, self.durable[pid],
                                         more))

    def controls(self, pid: PartitionId) -> list:
        """Complete every append asked on `pid`, then its control marks in log order
        (`control_of`; None for data)."""
        while self.appends[pid]:
            self.complete_append(pid)
        return [control_of(stored) for _, _, stored in self.logs[pid]]

    def flush(self, pid: PartitionId) -> list:
        self.durable[pid] = self.log_end(pid)
        return self.feed(DurableAdvanced(pid, self.durable[pid]))

    def complete_read(self, serial: int) -> list:
        instr = self.reads.pop(serial)
        chunks, total, nxt = [], 0, instr.offset
        for base, end, stored in self.logs[instr.partition]:
            if end <= instr.offset or base >= instr.end_offset:
                continue
            if chunks and total + len(stored) > instr.max_bytes:
                break
            chunks.append(stored)
            total += len(stored)
            nxt = end
        return self.feed(ReadCompleted(serial, instr.offset, b"".join(chunks), nxt))

    # ----------------------------------------------------------------- checking

    def track(self, session: str, sub_id: int, credit: int) -> None:
        self.subs[(session, sub_id)] = SubTrack(granted=credit)

    def _see(self, instr) -> None:
        if isinstance(instr, Reply | Fail):
            assert instr.token not in self.replies, "a request was answered twice"
            self.replies[instr.token] = instr.value if isinstance(instr, Reply) else instr.error
        elif isinstance(instr, Append):
            self.max_batch = max(self.max_batch, len(instr.batch))
            self.appends[instr.partition].append(instr)
        elif isinstance(instr, Read):
            assert instr.serial not in self.reads, "two reads outstanding for one subscription"
            assert instr.end_offset <= self.durable[instr.partition], "read beyond durable end"
            assert instr.max_bytes > 0
            self.reads[instr.serial] = instr
        elif isinstance(instr, Deliver):
            self._check_delivery(instr)
        elif isinstance(instr, SubscriptionClosed):
            self.subs[(instr.session, instr.sub_id)].closed = True
        elif isinstance(instr, SessionExpired):
            self.expired.append(instr.session)
        elif isinstance(instr, SaveCohorts):
            self.saves.append(instr)
            if self.auto_save:
                self.complete_save()
        elif isinstance(instr, ResolveTopic):
            self.asks.append(instr)
        elif isinstance(instr, OpenPartition):
            assert instr.partition not in self.state.partitions, "opening an open partition"
            assert all(o.partition != instr.partition for o in self.opens), "opened twice"
            self.opens.append(instr)
        elif isinstance(instr, ProposeIsr):
            self.proposals.append(instr)
        else:  # pragma: no cover
            raise AssertionError(f"unexpected instruction {instr}")

    def _check_delivery(self, d: Deliver) -> None:
        if type(d.data) is tuple:  # a frame a batch: each a whole one, none empty
            for frame in d.data:
                assert frame and read_header(frame).size == len(frame), "a frame not one batch"
            d = msgspec.structs.replace(d, data=b"".join(d.data))
        assert type(d.data) is not tuple
        track = self.subs[(d.session, d.sub_id)]
        assert not track.closed
        if track.next_offset is not None:
            assert d.offset == track.next_offset, "gap or duplicate in a subscription"
        # Credit was positive when this was sent: overshoot is at most this one delivery, and
        # a delivery larger than the credit holds exactly one batch.
        assert track.delivered < track.granted, "delivered with no credit left"
        if track.delivered + len(d.data) > track.granted:
            assert read_header(d.data).size == len(d.data), "overshoot by more than one batch"
        assert d.next_offset <= self.durable[d.partition], "delivered data that is not durable"
        expected = [s for b, e, s in self.logs[d.partition] if e > d.offset and b < d.next_offset]
        # The stored batches in order; only those of aborted Kafka transactions may be left out.
        kept = [s for s in expected if d.data.find(s) >= 0]
        assert d.data == b"".join(kept), "delivered bytes differ from the stored batches"
        assert all(read_header(s).attributes & TRANSACTIONAL for s in expected if s not in kept), \
            "a batch outside a transaction was left out"
        track.delivered += len(d.data)
        track.next_offset = d.next_offset
        pos = 0
        while pos < len(d.data):
            h = read_header(d.data, pos)
            track.batches.append((h.base_offset, h.next_offset))
            pos += h.size
