"""The idempotent producers of one partition, as Kafka's broker keeps them (DESIGN §5 "Idempotent
producers"): per producer id, its epoch, the sequence number of the last record it appended and
the sequence ranges and offsets of its last few batches.

A producer that lost its connection (the broker restarted, a reply went missing) sends again
every batch it holds no acknowledgement for. A batch carries producerId, producerEpoch and
baseSequence (its first record's sequence number; lastOffsetDelta gives its last), so the
broker can tell a batch it already appended from a new one and answer the old one with the
offsets it got then instead of appending it twice.

Pure bookkeeping: no I/O, no clocks. The broker core asks `check` before it appends, tells
`appended` when it issues the append (which returns the batch's mark), `stored` when the append
landed (the core sets the offsets on the mark it holds: no search per batch), `failed` when it
did not; a partition opening learns the producers from its log's tail with `learn`.

Rules (Kafka's, with the leniencies that make sense when the broker cannot know more):
- Batches without a producer (producerId or baseSequence -1) are not tracked.
- Sequence numbers count records per producer and partition and wrap from 2^31 - 1 to 0.
- A known producer (same epoch) must send the sequence after its last one; a batch whose
  range was appended before is a duplicate (its offsets are answered, or DuplicateSequenceError
  when they are no longer remembered); a batch further ahead is a gap: OutOfOrderSequenceError
  (a producer resends strictly in order, so a gap means batches arrived out of order).
- An unknown producer (new, or forgotten: evicted, or older than the log tail the partition
  read at open) may start at any sequence: the broker cannot know what it sent before.
- Another epoch starts the producer over (tq's producers always use epoch 0; fencing zombie
  Kafka producers is the Kafka listener's business).
- At most `max_producers` producers are remembered per partition (the least recently written
  is forgotten first) and `max_batches` batches per producer (a tq producer has at most 64
  requests in flight, so 64 covers everything it may send again).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from querylib.broker._errors import DuplicateSequenceError, OutOfOrderSequenceError
from querylib.records import SEQUENCE_MODULUS

__all__ = ["BatchMark", "ProducerStateTable", "last_sequence"]



def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence number of a batch's last record."""
    return (base_sequence + last_offset_delta) % SEQUENCE_MODULUS


def _behind(seq: int, last: int) -> bool:
    """`seq` is at or before `last`, counting across the wrap (half the space each way)."""
    return (last - seq) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2


@dataclass(slots=True)
class BatchMark:
    """One appended batch of a producer: its sequence range and where it landed. `base_offset`
    and `next_offset` are -1 while the append is in flight; `ticket` names that append (-1
    once it landed). Set once it lands (`stored`), never changed after."""

    first_seq: int
    last_seq: int
    base_offset: int = -1
    next_offset: int = -1
    ticket: int = -1


@dataclass(slots=True)
class _Producer:
    epoch: int
    last_seq: int
    batches: deque[BatchMark] = field(default_factory=deque)


class ProducerStateTable:
    """Idempotent producers of one partition (see the module rules)."""

    def __init__(self, *, max_producers: int = 1024, max_batches: int = 64) -> None:
        self.max_producers = max_producers
        self.max_batches = max_batches
        self._producers: dict[int, _Producer] = {}  # least recently written first

    def __len__(self) -> int:
        return len(self._producers)

    def last_sequence(self, producer_id: int) -> int | None:
        state = self._producers.get(producer_id)
        return None if state is None else state.last_seq

    def check(self, producer_id: int, epoch: int, first_seq: int,
              last_seq: int) -> BatchMark | None:
        """None for a batch to append; its earlier BatchMark for a duplicate. Raises
        DuplicateSequenceError (appended before; its offsets are forgotten) or
        OutOfOrderSequenceError (a gap). Changes nothing."""
        state = self._producers.get(producer_id)
        if state is None or state.epoch != epoch:
            return None
        if first_seq == (state.last_seq + 1) % SEQUENCE_MODULUS:
            return None
        for mark in reversed(state.batches):
            if mark.first_seq == first_seq and mark.last_seq == last_seq:
                return mark
        if _behind(first_seq, state.last_seq):
            raise DuplicateSequenceError(
                f"producer {producer_id}: records {first_seq}..{last_seq} were appended before "
                f"(their offsets are no longer remembered)")
        raise OutOfOrderSequenceError(
            f"producer {producer_id}: sequence {first_seq} does not follow "
            f"{state.last_seq}: batches arrived out of order")

    def appended(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
                 ticket: int) -> BatchMark:
        """The batch passed `check` and its append was issued (offsets not known yet): its
        mark, for `landed` once the append lands."""
        mark = BatchMark(first_seq, last_seq, ticket=ticket)
        state = self._producers.pop(producer_id, None)  # `_add`, inlined: once per batch
        if state is None or state.epoch != epoch:
            self._add(producer_id, epoch, mark)
            return mark
        state.last_seq = last_seq
        batches = state.batches
        batches.append(mark)
        if len(batches) > self.max_batches:
            batches.popleft()
        self._producers[producer_id] = state
        return mark

    @staticmethod
    def landed(mark: BatchMark, base_offset: int, next_offset: int) -> None:
        """The append of the batch `appended` returned `mark` for landed at [base_offset,
        next_offset) (a mark forgotten meanwhile, evicted, is set all the same: unread)."""
        mark.base_offset = base_offset
        mark.next_offset = next_offset
        mark.ticket = -1

    def stored(self, producer_id: int, first_seq: int, base_offset: int,
               next_offset: int) -> None:
        """The append of that batch landed at [base_offset, next_offset) (`landed`, for a
        caller that kept no mark)."""
        state = self._producers.get(producer_id)
        if state is None:
            return  # forgotten meanwhile (evicted): nothing to note
        for mark in reversed(state.batches):
            if mark.first_seq == first_seq and mark.base_offset < 0:
                self.landed(mark, base_offset, next_offset)
                return

    def failed(self, producer_id: int, first_seq: int) -> None:
        """The append of that batch failed: it was not stored, so sending it again is new."""
        state = self._producers.get(producer_id)
        if state is None:
            return
        kept = deque(m for m in state.batches
                     if not (m.first_seq == first_seq and m.base_offset < 0))
        if len(kept) == len(state.batches):
            return
        state.batches = kept
        if kept:
            state.last_seq = kept[-1].last_seq
        else:
            del self._producers[producer_id]

    def learn(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
              base_offset: int, next_offset: int) -> None:
        """A batch found in the log (oldest first), when the partition opens."""
        self._add(producer_id, epoch, BatchMark(first_seq, last_seq, base_offset, next_offset))

    def learn_all(self, marks: Iterable[tuple[int, int, int, int, int, int]]) -> None:
        for mark in marks:
            self.learn(*mark)

    def _add(self, producer_id: int, epoch: int, mark: BatchMark) -> None:
        state = self._producers.pop(producer_id, None)  # re-inserted: most recent last
        if state is None or state.epoch != epoch:
            state = _Producer(epoch, mark.last_seq)
            while len(self._producers) >= self.max_producers:
                del self._producers[next(iter(self._producers))]
        state.last_seq = mark.last_seq
        state.batches.append(mark)
        if len(state.batches) > self.max_batches:
            state.batches.popleft()
        self._producers[producer_id] = state
