"""Idempotent-producer bookkeeping for one partition, as Kafka's ProducerStateManager keeps it:
per producer id, its epoch and the sequence ranges of its last five batches.

Rules (Kafka's, for non-transactional producers):

- a batch without a producer id (-1) is not checked;
- a producer id the partition has no state for is accepted at any sequence (its state may
  have been lost with a restart or to retention, as Kafka accepts it then);
- an older epoch is refused (INVALID_PRODUCER_EPOCH); a newer one must start at sequence 0;
- a batch whose sequence range equals one of the last five is a retry: it is not appended
  again and is acknowledged with the original base offset;
- otherwise the first sequence must follow the last one (wrapping after 2**31 - 1); a range
  already passed is DUPLICATE_SEQUENCE_NUMBER, a gap is OUT_OF_ORDER_SEQUENCE_NUMBER.

Pure and single-threaded: the owner calls `check` then, once appended, `record`, with no other
append of the partition in between. State lives in memory only, for at most `max_producers`
producer ids per partition (least recently used forgotten first: producer ids come from
clients, so their number must be bounded; a forgotten producer is accepted as a new one).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from querylib.kafka._errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)
from querylib.records import BatchHeader

__all__ = ["ProducerStateTable"]

MAX_SEQUENCE = 2**31 - 1
REMEMBERED_BATCHES = 5  # Kafka's NUM_BATCHES_TO_RETAIN: the client's max in-flight requests


@dataclass(frozen=True, slots=True)
class _Batch:
    first_sequence: int
    last_sequence: int
    base_offset: int


@dataclass(slots=True)
class _Producer:
    epoch: int
    batches: deque[_Batch] = field(default_factory=lambda: deque(maxlen=REMEMBERED_BATCHES))


def last_sequence(header: BatchHeader) -> int:
    """The sequence of the batch's last record (sequences wrap after 2**31 - 1)."""
    last = header.base_sequence + header.last_offset_delta
    return last - MAX_SEQUENCE - 1 if last > MAX_SEQUENCE else last


def _follows(previous: int, first: int) -> bool:
    return first == previous + 1 or (previous == MAX_SEQUENCE and first == 0)


class ProducerStateTable:
    """Sequence state of the idempotent producers writing one partition."""

    def __init__(self, max_producers: int = 10_000) -> None:
        self._producers: dict[int, _Producer] = {}  # insertion order = least recent first
        self._max_producers = max_producers

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, header: BatchHeader) -> int | None:
        """None when the batch may be appended; the original base offset when it is a retry of
        one of the last five batches. Raises the Kafka errors listed in the module docstring."""
        pid = header.producer_id
        if pid < 0:
            return None
        producer = self._producers.get(pid)
        if producer is None:
            return None
        epoch, first = header.producer_epoch, header.base_sequence
        if epoch < producer.epoch:
            raise InvalidProducerEpochError(
                f"producer {pid} epoch {epoch} is older than {producer.epoch}")
        if epoch > producer.epoch:
            if first != 0:
                raise OutOfOrderSequenceError(
                    f"producer {pid} epoch {epoch} starts at sequence {first}, not 0")
            return None
        last = last_sequence(header)
        for batch in producer.batches:
            if batch.first_sequence == first and batch.last_sequence == last:
                return batch.base_offset
        if not producer.batches:
            return None
        previous = producer.batches[-1].last_sequence
        if _follows(previous, first):
            return None
        if first <= previous:
            raise DuplicateSequenceError(
                f"producer {pid} sequence {first} was appended before (last is {previous})")
        raise OutOfOrderSequenceError(
            f"producer {pid} sequence {first} does not follow {previous}")

    def fence(self, producer_id: int, epoch: int) -> None:
        """A transaction marker of `epoch` was written: batches of older epochs are refused
        from now on (a fenced transactional producer)."""
        producer = self._producers.pop(producer_id, None)
        if producer is None or producer.epoch != epoch:
            producer = _Producer(epoch)
        self._producers[producer_id] = producer
        while len(self._producers) > self._max_producers:
            del self._producers[next(iter(self._producers))]

    def record(self, header: BatchHeader, base_offset: int) -> None:
        """Remember an appended batch."""
        pid = header.producer_id
        if pid < 0:
            return
        producer = self._producers.pop(pid, None)
        if producer is None or header.producer_epoch != producer.epoch:
            producer = _Producer(header.producer_epoch)
        self._producers[pid] = producer  # now the most recent
        while len(self._producers) > self._max_producers:
            del self._producers[next(iter(self._producers))]
        producer.batches.append(
            _Batch(header.base_sequence, last_sequence(header), base_offset))
