"""Kafka's transaction coordinator (KIP-98) for the transactional ids of one broker, and its
transaction log (DESIGN §8 "Transactions").

A transactional producer calls InitProducerId with its transactional.id (a producer id kept per
transactional id, its epoch bumped on every call, so an older producer with the same id is
fenced: its requests get PRODUCER_FENCED, its batches INVALID_PRODUCER_EPOCH), then per
transaction AddPartitionsToTxn / AddOffsetsToTxn, produces, TxnOffsetCommit (pending offsets of
a group, applied at commit), and EndTxn. Ending writes a COMMIT or ABORT marker (a
transactional control batch of the producer, `records.transaction_marker_batch`) into every
partition of the transaction, then, on commit, the pending offsets into `__consumer_offsets`.
A transaction left open past its timeout is aborted (`expire`), its epoch bumped.

Every change of a transaction's state is recorded before it takes effect (but one), in
`__transaction_state` partition 0 of this broker (as Kafka's `__transaction_state`, in tq's
log format: key the transactional id, value the JSON of `Txn`), so a restarted broker
(`replay`, then `recover`) completes the transactions it was ending and aborts the open ones
once their timeout passed: a SIGKILLed producer's transaction is aborted, and a producer
restarted with the same transactional.id fences the old and goes on. The one exception:
CompleteCommit/CompleteAbort, written by the completion task once the markers are durable,
takes effect at once and is recorded with the id's next record (one batch, it first) or by
the next `recover` round, whichever comes first: what it records is already true, and a
coordinator restarted on the Prepare state before it writes the markers again (harmless), so
the producer's next transaction does not wait for one more append.

How durable a record is when it takes effect: InitProducerId's (the epoch that fences) and
PrepareCommit/PrepareAbort (the decision markers follow) are durable first. The records of an
Ongoing transaction (AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit) and the recorded
ends are answered once written (the OS has them, no fsync of their own): the log is one file
written in order, so the next durable record (at the latest the PrepareCommit the markers wait
for) makes them durable with it. A power loss may thus lose the last Ongoing records: a
coordinator whose log was not closed cleanly ends the transactions it finds and moves every
transactional id to a new producer id (`replay`), rather than commit a transaction without a
partition its producer added.

The coordinator is the group coordinator's broker (FindCoordinator key type 1 names the same
broker as for groups), so TxnOffsetCommit meets the transaction it belongs to here. Markers are
written through the broker's port into partitions it hosts, and over RPC (as the admin) into
partitions of other brokers (`TxnLog.write_markers`).

Must not: append to a log itself (the `TxnLog` it is given does, through the broker's door), or
decide who may write a topic (the broker's core admits every write).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from catalog.errors import TqError
from querylib._keyed_lock import KeyedLock
from querylib.kafka._errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    PolicyViolationError,
    ProducerFencedError,
    TransactionalIdAuthorizationError,
    UnknownPartitionError,
)

from ._backend import CommittedOffset

__all__ = ["TRANSACTIONS_TOPIC", "Txn", "TxnLog", "TransactionCoordinator"]

logger = logging.getLogger("querylib.kafka")

TRANSACTIONS_TOPIC = "__transaction_state"
MAX_TRANSACTIONAL_IDS = 100_000
MAX_TXN_PARTITIONS = 10_000      # partitions in one transaction
MAX_TXN_GROUPS = 100             # groups whose offsets one transaction commits
MAX_TXN_OFFSETS = 10_000         # pending offsets of one group in one transaction
MAX_TIMEOUT_MS = 900_000         # Kafka's transaction.max.timeout.ms
MAX_EPOCH = 32_767
# How long a request of a producer's next transaction waits for the completion of its last one
# (markers, CompleteCommit) before answering CONCURRENT_TRANSACTIONS. Clients retry the first
# AddPartitionsToTxn of a transaction after 20 ms (librdkafka, kafka-python, aiokafka, as the
# Java client), the rest after their retry backoff: longer than a completion takes, and the
# next AddPartitionsToTxn comes at once, so without this wait answering EndTxn early would
# cost every transaction 20 ms.
COMPLETION_WAIT = 0.5

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"


@dataclass
class Txn:
    """One transactional id's producer and its current (or last) transaction."""

    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    principal: str
    state: str = EMPTY
    partitions: list[tuple[str, int]] = field(default_factory=list)
    # group -> pending offsets [(topic, partition, offset, leader epoch, metadata)]
    offsets: dict[str, list[tuple[str, int, int, int, str]]] = field(default_factory=dict)
    started_ms: int = 0

    def encode(self) -> tuple[bytes, bytes]:
        return self.transactional_id.encode(), json.dumps(asdict(self)).encode()

    def copy(self) -> Txn:
        """A copy to change: the coordinator's state changes only once recorded."""
        return Txn.decode(self.encode()[1])

    @classmethod
    def decode(cls, value: bytes) -> Txn:
        data = json.loads(value)
        data["partitions"] = [tuple(p) for p in data["partitions"]]
        data["offsets"] = {g: [tuple(o) for o in found] for g, found in data["offsets"].items()}
        return cls(**data)


class TxnLog(Protocol):
    """What the coordinator needs of its broker (`BrokerBackend`)."""

    async def write_txn(self, *txns: Txn, durable: bool = True) -> None:
        """Record the transactions' states in `__transaction_state`, in this order, in one
        append; durable when it returns, or with `durable=False` written (the OS has it; a
        power loss may lose it) and durable with the next durable record."""
        ...

    async def write_markers(self, partitions: Sequence[tuple[str, int]], producer_id: int,
                            epoch: int, commit: bool) -> None:
        """Append the marker to every partition (one request per broker holding some);
        all durable when it returns. A partition that is gone needs none (skipped); any
        other failure raises once the rest are written."""
        ...

    async def commit_offsets(self, group_id: str, offsets: Sequence[CommittedOffset]) -> None:
        ...

    async def allocate_producer_id(self) -> int: ...

    async def marks_partition(self, topic: str, partition: int) -> bool:
        """Whether this coordinator can write markers into the partition (hosted here, or
        on a broker it can reach)."""
        ...


class TransactionCoordinator:
    """The transactions of this broker's transactional ids (see the module docstring)."""

    def __init__(self, log: TxnLog, *, now_ms: Callable[[], int] | None = None,
                 completion_wait: float = COMPLETION_WAIT) -> None:
        self.log = log
        self.txns: dict[str, Txn] = {}
        self._locks: KeyedLock[str] = KeyedLock()  # held or waited for: per id
        self._completions: dict[str, asyncio.Task[None]] = {}
        # Completed transactions whose CompleteCommit/CompleteAbort is not recorded yet
        # (written before the id's next record, or by `recover`).
        self._unrecorded: dict[str, Txn] = {}
        self._now = now_ms or (lambda: int(time.time() * 1000))
        self.completion_wait = completion_wait
        # The ids replayed from a log that may have lost its last records: ended and given
        # new producer ids by the first `recover` (see `replay`).
        self._suspect: dict[str, Txn] = {}

    async def close(self) -> None:
        """Stop the completions under way (what they had not recorded, `recover` finishes),
        and record the completed ends not recorded yet (best effort: a restarted coordinator
        that does not find one writes its markers again)."""
        tasks = list(self._completions.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self._record_completed()
        except TqError as exc:
            logger.warning("transaction ends not recorded at close: %s", exc)

    # ---- replay and recovery ----------------------------------------------------------------

    def replay(self, records: Iterable[tuple[bytes | None, bytes | None]], *,
               complete: bool = True) -> None:
        """Apply `__transaction_state` records in log order (the last one per id wins).

        `complete=False`: the log's broker stopped uncleanly and the machine restarted since
        (a process that only died lost nothing: `PartitionLog.writes_kept`), so records
        answered once written (the Ongoing transitions, `_record`) may be missing from its
        end: a transaction found
        Ongoing may lack a partition its producer was told was added (committing what is
        known would leave it out), and one found ended or being ended may have had a next
        one begun since (its producer told so, and writing; its EndTxn would be taken for a
        retry of the last). So the first `recover` ends every transaction found (aborts the
        Ongoing ones in the partitions it knows, completes the prepared ones), then moves
        every transactional id to a new producer id: its producer's next request is refused
        (INVALID_PRODUCER_ID_MAPPING; until then CONCURRENT_TRANSACTIONS) and it starts again
        with InitProducerId, and whatever it wrote where no marker went stays open under the
        old producer id, which nothing extends any more, until that partition's broker aborts
        it (`BrokerLimits.max_transaction_seconds`)."""
        for key, value in records:
            if key is None or value is None:
                continue
            try:
                txn = Txn.decode(value)
            except (ValueError, TypeError, KeyError) as exc:
                logger.warning("__transaction_state: skipping a record: %s", exc)
                continue
            self.txns[txn.transactional_id] = txn
        if not complete:
            self._suspect = dict(self.txns)

    async def recover(self) -> None:
        """Complete the transactions being ended whose markers are not all written (a broker
        stopped, or one holding a partition did not answer; writing a marker twice is
        harmless), and wait for them; record the completed ends no later record carried.
        Called on start and then every round, with `expire`. The first call deals with the
        transactional ids `replay` found suspect."""
        for transactional_id, replayed in list(self._suspect.items()):
            async with self._locks.hold(transactional_id):
                txn = self.txns.get(transactional_id)
                if txn is not None and txn.epoch == replayed.epoch \
                        and txn.producer_id == replayed.producer_id:
                    await self._renew(txn)
                del self._suspect[transactional_id]
        await self._record_completed()
        tasks = [self._completing(transactional_id)
                 for transactional_id, txn in list(self.txns.items())
                 if txn.state in (PREPARE_COMMIT, PREPARE_ABORT)]
        if tasks:
            await asyncio.wait(tasks)
            await self._record_completed()

    async def _renew(self, txn: Txn) -> None:
        """End `txn` (abort it if Ongoing, complete it if being ended), then give its
        transactional id a new producer id (see `replay`). Under the id's lock."""
        logger.info("transactional id %r: a new producer id (its coordinator stopped "
                    "uncleanly before a reboot and may have lost records of it)",
                    txn.transactional_id)
        if txn.state == ONGOING:
            txn = await self._abort(txn, bump=True)
        elif txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            txn = await self._complete(txn)
        txn = txn.copy()
        txn.producer_id, txn.epoch = await self.log.allocate_producer_id(), 0
        txn.state, txn.partitions, txn.offsets = EMPTY, [], {}
        # Written: what depends on it (the id's InitProducerId) is durable and covers it; if
        # it is lost, the recovery after that reboot renews the id again.
        await self._record(txn, durable=False)

    async def _record_completed(self) -> None:
        for transactional_id in list(self._unrecorded):
            async with self._locks.hold(transactional_id):
                if transactional_id in self._unrecorded:  # harmless if lost: written
                    await self._record(self._unrecorded[transactional_id], durable=False)

    def _completing(self, transactional_id: str) -> asyncio.Task[None]:
        """The task completing the transaction of `transactional_id` (started if none is)."""
        task = self._completions.get(transactional_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._finish(transactional_id))
            self._completions[transactional_id] = task
            task.add_done_callback(lambda done: self._finished(transactional_id, done))
        return task

    async def _finish(self, transactional_id: str) -> None:
        async with self._locks.hold(transactional_id):
            txn = self.txns[transactional_id]
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                await self._complete(txn, defer=True)

    def _finished(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        if self._completions.get(transactional_id) is task:
            del self._completions[transactional_id]
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, TqError):  # left prepared: `recover` tries again
            logger.warning("transaction %r: not completed yet: %s", transactional_id, exc)
        elif exc is not None:  # a bug: reported as asyncio reports a failed task
            task.get_loop().call_exception_handler({
                "message": f"completing transaction {transactional_id!r}",
                "exception": exc, "task": task})

    async def _settled(self, transactional_id: str) -> bool:
        """Whether the transaction of `transactional_id` is not being completed, after
        waiting up to `completion_wait` for it. A request that finds it still completing
        answers without the id's lock (the completion holds it): CONCURRENT_TRANSACTIONS."""
        txn = self.txns.get(transactional_id)
        if txn is None or txn.state not in (PREPARE_COMMIT, PREPARE_ABORT):
            return True
        task = self._completing(transactional_id)
        if self.completion_wait > 0:
            await asyncio.wait([task], timeout=self.completion_wait)
        return self.txns[transactional_id].state not in (PREPARE_COMMIT, PREPARE_ABORT)

    # ---- requests ---------------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               principal: str) -> tuple[int, int]:
        """(producer id, epoch) for the producer of `transactional_id`: the id it had, with
        the epoch bumped (fencing any older producer), its open transaction aborted first."""
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise InvalidTransactionTimeoutError(
                f"transaction timeout {timeout_ms} ms outside 1..{MAX_TIMEOUT_MS}")
        if not await self._settled(transactional_id):
            self._authorize(self.txns[transactional_id], principal)
            raise ConcurrentTransactionsError(f"transaction {transactional_id!r} is being ended")
        if transactional_id in self._suspect:  # the first `recover` is about to renew it
            raise ConcurrentTransactionsError(f"transactional id {transactional_id!r} is being "
                                              "recovered")
        async with self._locks.hold(transactional_id):
            txn = self.txns.get(transactional_id)
            if txn is None:
                if len(self.txns) >= MAX_TRANSACTIONAL_IDS:
                    raise PolicyViolationError(
                        f"this broker coordinates {MAX_TRANSACTIONAL_IDS} transactional ids")
                txn = Txn(transactional_id, await self.log.allocate_producer_id(), 0,
                          timeout_ms, principal)
            else:
                self._authorize(txn, principal)
                if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    raise ConcurrentTransactionsError(
                        f"transaction {transactional_id!r} is being ended")
                if txn.state == ONGOING:
                    txn = await self._abort(txn, bump=True)  # the new producer's epoch fences
                txn = txn.copy()
                if txn.epoch >= MAX_EPOCH - 1:
                    txn.producer_id, txn.epoch = await self.log.allocate_producer_id(), 0
                else:
                    txn.epoch += 1
                txn.timeout_ms = timeout_ms
            txn.state, txn.partitions, txn.offsets = EMPTY, [], {}
            await self._record(txn)
            return txn.producer_id, txn.epoch

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: Sequence[tuple[str, int]], principal: str) -> None:
        if not await self._settled(transactional_id):
            self._current(transactional_id, producer_id, epoch, principal)  # raises
        async with self._locks.hold(transactional_id):
            txn = self._current(transactional_id, producer_id, epoch, principal).copy()
            added = [p for p in partitions if p not in txn.partitions]
            if not added and txn.state == ONGOING:
                return
            for topic, partition in added:
                if not await self.log.marks_partition(topic, partition):
                    raise UnknownPartitionError(
                        f"{topic}-{partition}: no such partition the transaction coordinator "
                        "can reach")
            if len(txn.partitions) + len(added) > MAX_TXN_PARTITIONS:
                raise PolicyViolationError(
                    f"a transaction spans at most {MAX_TXN_PARTITIONS} partitions")
            self._begin(txn)
            txn.partitions.extend(added)
            await self._record(txn, durable=False)

    async def check(self, transactional_id: str, producer_id: int, epoch: int,
                    principal: str) -> None:
        """Raise what a request of this producer for its transaction is refused with now
        (e.g. InvalidProducerIdMappingError, ProducerFencedError), changing nothing."""
        await self._settled(transactional_id)
        self._current(transactional_id, producer_id, epoch, principal)

    async def add_offsets(self, transactional_id: str, producer_id: int, epoch: int,
                          group_id: str, principal: str) -> None:
        if not await self._settled(transactional_id):
            self._current(transactional_id, producer_id, epoch, principal)  # raises
        async with self._locks.hold(transactional_id):
            txn = self._current(transactional_id, producer_id, epoch, principal).copy()
            if group_id in txn.offsets and txn.state == ONGOING:
                return
            if len(txn.offsets) >= MAX_TXN_GROUPS:
                raise PolicyViolationError(
                    f"a transaction commits the offsets of at most {MAX_TXN_GROUPS} groups")
            self._begin(txn)
            txn.offsets.setdefault(group_id, [])
            await self._record(txn, durable=False)

    async def txn_offset_commit(self, transactional_id: str, producer_id: int, epoch: int,
                                group_id: str, offsets: Sequence[CommittedOffset],
                                principal: str) -> None:
        async with self._locks.hold(transactional_id):
            txn = self._current(transactional_id, producer_id, epoch, principal).copy()
            if txn.state != ONGOING or group_id not in txn.offsets:
                raise InvalidTxnStateError(
                    f"group {group_id!r} was not added to the transaction (AddOffsetsToTxn)")
            pending = {(o[0], o[1]): o for o in txn.offsets[group_id]}
            for o in offsets:
                pending[(o.topic, o.partition)] = (o.topic, o.partition, o.offset,
                                                   o.leader_epoch, o.metadata)
            if len(pending) > MAX_TXN_OFFSETS:
                raise PolicyViolationError(
                    f"a transaction commits at most {MAX_TXN_OFFSETS} offsets of a group")
            txn.offsets[group_id] = list(pending.values())
            await self._record(txn, durable=False)

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int,
                      commit: bool, principal: str) -> None:
        """Answered once the transaction's end is decided (PrepareCommit/PrepareAbort
        durable); its markers and CompleteCommit/CompleteAbort follow (`_completing`)."""
        prepare = PREPARE_COMMIT if commit else PREPARE_ABORT
        if not await self._settled(transactional_id):
            txn = self._known(transactional_id, producer_id, epoch, principal)
            if txn.state == prepare:
                return  # a retry of the EndTxn being completed: decided
            raise ConcurrentTransactionsError(f"transaction {transactional_id!r} is being ended")
        async with self._locks.hold(transactional_id):
            txn = self._known(transactional_id, producer_id, epoch, principal)
            done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
            if txn.state == done or (txn.state == EMPTY and not commit):
                return  # a retry of an EndTxn that completed, or nothing to abort
            if txn.state == prepare:  # a retry of one whose markers are not all written
                self._completing(transactional_id)
                return
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                raise ConcurrentTransactionsError(
                    f"transaction {transactional_id!r} is being ended")
            if txn.state != ONGOING:
                raise InvalidTxnStateError(
                    f"transaction {transactional_id!r} is {txn.state}, cannot "
                    f"{'commit' if commit else 'abort'}")
            txn = txn.copy()
            txn.state = prepare
            await self._record(txn)
            self._completing(transactional_id)  # runs once this lock is let go

    async def expire(self) -> None:
        """Abort the transactions open longer than their timeout (their epoch bumped, so
        their producer is fenced)."""
        now = self._now()
        for transactional_id, txn in list(self.txns.items()):
            if txn.state == ONGOING and now - txn.started_ms > txn.timeout_ms:
                async with self._locks.hold(transactional_id):
                    txn = self.txns[transactional_id]
                    if txn.state == ONGOING and now - txn.started_ms > txn.timeout_ms:
                        logger.info("transaction of %r timed out after %d ms: aborting",
                                    txn.transactional_id, txn.timeout_ms)
                        await self._abort(txn, bump=True)

    # ---- rules ------------------------------------------------------------------------------

    @staticmethod
    def _authorize(txn: Txn, principal: str) -> None:
        """A transactional id belongs to the principal that first initialized it (Kafka's
        TransactionalId WRITE); "admin" may use any; the ids of anonymous clients (a listener
        without SASL) are shared by them."""
        if principal not in (txn.principal, "admin"):
            raise TransactionalIdAuthorizationError(
                f"transactional id {txn.transactional_id!r} belongs to another principal")

    def _known(self, transactional_id: str, producer_id: int, epoch: int,
               principal: str) -> Txn:
        txn = self.txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise InvalidProducerIdMappingError(
                f"producer {producer_id} does not hold transactional id {transactional_id!r}")
        self._authorize(txn, principal)
        if epoch < txn.epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {epoch} was fenced by epoch {txn.epoch}")
        if epoch > txn.epoch:
            raise InvalidTxnStateError(f"producer {producer_id} epoch {epoch} is unknown")
        if transactional_id in self._suspect:  # the first `recover` is about to renew it
            raise ConcurrentTransactionsError(f"transaction {transactional_id!r} is being "
                                              "recovered")
        return txn

    def _current(self, transactional_id: str, producer_id: int, epoch: int,
                 principal: str) -> Txn:
        txn = self._known(transactional_id, producer_id, epoch, principal)
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise ConcurrentTransactionsError(
                f"transaction {transactional_id!r} is being ended")
        return txn

    def _begin(self, txn: Txn) -> None:
        if txn.state != ONGOING:
            txn.state, txn.partitions, txn.offsets = ONGOING, [], {}
            txn.started_ms = self._now()

    async def _abort(self, txn: Txn, *, bump: bool) -> Txn:
        txn = txn.copy()
        if bump:
            if txn.epoch >= MAX_EPOCH - 1:
                raise InvalidTxnStateError(f"producer {txn.producer_id} ran out of epochs")
            txn.epoch += 1
        txn.state = PREPARE_ABORT
        await self._record(txn)
        return await self._complete(txn)

    async def _complete(self, txn: Txn, *, defer: bool = False) -> Txn:
        """Write the markers (and, on commit, the offsets), then record the end (`defer`:
        the end takes effect now and is recorded with the id's next record, see the module
        docstring). A marker that cannot be written now raises, the transaction left
        prepared (`recover` and the client's retry finish it); a partition that is gone
        needs none. Under the id's lock."""
        commit = txn.state == PREPARE_COMMIT
        if txn.partitions:
            await self.log.write_markers(txn.partitions, txn.producer_id, txn.epoch, commit)
        if commit:
            for group_id, pending in txn.offsets.items():
                await self.log.commit_offsets(group_id, [
                    CommittedOffset(t, p, o, e, m, self._now()) for t, p, o, e, m in pending])
        done = txn.copy()
        done.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        done.partitions, done.offsets = [], {}
        if defer:
            self._unrecorded[done.transactional_id] = self.txns[done.transactional_id] = done
        else:
            await self._record(done)
        return done

    async def _record(self, txn: Txn, *, durable: bool = True) -> None:
        """Record `txn` (after the id's completed end not recorded yet, in one append), then
        let it take effect: once durable, or (`durable=False`, an Ongoing transition) once
        written. Under the id's lock."""
        before = self._unrecorded.get(txn.transactional_id)
        if before is None or before is txn:
            await self.log.write_txn(txn, durable=durable)
        else:
            await self.log.write_txn(before, txn, durable=durable)
        if self._unrecorded.get(txn.transactional_id) is before:
            self._unrecorded.pop(txn.transactional_id, None)
        self.txns[txn.transactional_id] = txn
