"""The transaction coordinator's rules (`querylib.server.kafka._txn`) over an in-memory transaction
log: epochs fence older producers, every change is recorded before it counts, EndTxn is
answered once the transaction is prepared and its markers follow (one call for all its
partitions), the next transaction's requests meanwhile wait or get CONCURRENT_TRANSACTIONS, a
marker that cannot be written leaves the transaction prepared until it can, a restarted
coordinator finishes what it was ending, and transactional ids belong to their first
principal. Ongoing transitions are recorded written (no fsync of their own), the rest durable,
and a coordinator restarted after an unclean stop aborts the transactions it finds Ongoing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from querylib.broker import BrokerUnavailableError
from querylib.kafka._errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    ProducerFencedError,
    TransactionalIdAuthorizationError,
)
from querylib.server.kafka._backend import CommittedOffset
from querylib.server.kafka._txn import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    TransactionCoordinator,
    Txn,
)
from tests.conftest import wait_for_async


class MemoryLog:
    """The coordinator's TxnLog in memory: records, markers and offsets written, the
    partitions whose broker does not answer, and a gate markers wait at (open unless a test
    closes it)."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.durable: list[bool] = []  # per record: written durable, or only written
        self.markers: list[tuple[str, int, int, int, bool]] = []
        self.marker_calls: list[list[tuple[str, int]]] = []
        self.offsets: list[tuple[str, list[CommittedOffset]]] = []
        self.down: set[tuple[str, int]] = set()
        self.gate: asyncio.Event | None = None
        self.next_id = 100

    async def write_txn(self, *txns: Txn, durable: bool = True) -> None:
        self.records.extend(txn.encode() for txn in txns)
        self.durable.extend([durable] * len(txns))

    async def write_markers(self, partitions: Sequence[tuple[str, int]], producer_id: int,
                            epoch: int, commit: bool) -> None:
        self.marker_calls.append(list(partitions))
        if self.gate is not None:
            await self.gate.wait()
        for topic, partition in partitions:
            if (topic, partition) not in self.down:
                self.markers.append((topic, partition, producer_id, epoch, commit))
        for topic, partition in partitions:
            if (topic, partition) in self.down:
                raise BrokerUnavailableError(f"{topic}-{partition}: its broker does not answer")

    def states(self) -> list[str]:
        return [Txn.decode(value).state for _, value in self.records]

    async def commit_offsets(self, group_id: str, offsets: Sequence[CommittedOffset]) -> None:
        self.offsets.append((group_id, list(offsets)))

    async def allocate_producer_id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def marks_partition(self, topic: str, partition: int) -> bool:
        return True


def run(coro):
    return asyncio.run(coro)


def test_init_bumps_the_epoch_and_fences_the_older_producer() -> None:
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0), ("b", 1)], "anonymous")
        again, newer = await coordinator.init_producer_id("t", 60_000, "anonymous")
        assert (again, newer) == (pid, epoch + 2)  # one bump to abort, one for the new one
        # The open transaction was aborted with the bumped epoch, in both partitions.
        assert log.markers == [("a", 0, pid, epoch + 1, False), ("b", 1, pid, epoch + 1, False)]
        with pytest.raises(ProducerFencedError):
            await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        with pytest.raises(InvalidProducerIdMappingError):
            await coordinator.end_txn("t", pid + 1, newer, True, "anonymous")
    run(main())


def test_a_commit_whose_marker_fails_stays_prepared_until_it_can_finish() -> None:
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log, completion_wait=0)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        await coordinator.add_offsets("t", pid, epoch, "g", "anonymous")
        await coordinator.txn_offset_commit("t", pid, epoch, "g", [CommittedOffset("in", 0, 7)],
                                            "anonymous")
        log.down.add(("a", 0))
        await coordinator.end_txn("t", pid, epoch, True, "anonymous")  # decided: answered
        await coordinator.recover()  # the completion fails: left prepared
        assert coordinator.txns["t"].state == PREPARE_COMMIT and log.offsets == []
        with pytest.raises(ConcurrentTransactionsError):
            await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        await coordinator.close()
        # A coordinator restarted from the log finishes it once the broker answers.
        restarted = TransactionCoordinator(log)
        restarted.replay(log.records)
        assert restarted.txns["t"].state == PREPARE_COMMIT
        log.down.clear()
        await restarted.recover()
        assert restarted.txns["t"].state == COMPLETE_COMMIT
        assert log.markers == [("a", 0, pid, epoch, True)]
        assert [(g, [o.offset for o in offsets]) for g, offsets in log.offsets] == [("g", [7])]
        await restarted.end_txn("t", pid, epoch, True, "anonymous")  # a retry: answered
    run(main())


def test_end_txn_is_answered_once_prepared_and_the_markers_follow() -> None:
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0), ("b", 1), ("a", 2)],
                                         "anonymous")
        log.gate = asyncio.Event()  # no marker can be written yet
        await asyncio.wait_for(coordinator.end_txn("t", pid, epoch, True, "anonymous"), 30)
        assert log.states()[-1] == PREPARE_COMMIT and log.markers == []
        await wait_for_async(lambda: log.marker_calls, timeout=30, what="the marker write")
        # One call for all the transaction's partitions (one request per broker in it).
        assert log.marker_calls == [[("a", 0), ("b", 1), ("a", 2)]]
        log.gate.set()
        await coordinator.recover()
        assert coordinator.txns["t"].state == COMPLETE_COMMIT
        assert log.states()[-2:] == [PREPARE_COMMIT, COMPLETE_COMMIT]
        assert [m[:2] for m in log.markers] == [("a", 0), ("b", 1), ("a", 2)]
    run(main())


def test_the_next_transaction_gets_concurrent_transactions_while_one_completes() -> None:
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log, completion_wait=0)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        log.gate = asyncio.Event()
        await asyncio.wait_for(coordinator.end_txn("t", pid, epoch, True, "anonymous"), 30)
        for request in (
                coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous"),
                coordinator.add_offsets("t", pid, epoch, "g", "anonymous"),
                coordinator.init_producer_id("t", 60_000, "anonymous"),
                coordinator.end_txn("t", pid, epoch, False, "anonymous")):
            with pytest.raises(ConcurrentTransactionsError):
                await request
        # A retry of the EndTxn being completed is answered (its outcome is decided).
        await coordinator.end_txn("t", pid, epoch, True, "anonymous")
        assert coordinator.txns["t"].state == PREPARE_COMMIT
        log.gate.set()
        await coordinator.recover()
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        assert coordinator.txns["t"].state == ONGOING
        # Waiting (the default): a request of the next transaction meets the completion done.
        coordinator.completion_wait = 30
        log.gate.clear()
        await coordinator.end_txn("t", pid, epoch, False, "anonymous")
        waiting = asyncio.ensure_future(
            coordinator.add_partitions("t", pid, epoch, [("b", 0)], "anonymous"))
        await wait_for_async(lambda: len(log.marker_calls) == 2, timeout=30,
                             what="the second marker write")
        assert not waiting.done()
        log.gate.set()
        await asyncio.wait_for(waiting, 30)
        assert log.states()[-3:] == [PREPARE_ABORT, COMPLETE_ABORT, ONGOING]
        assert coordinator.txns["t"].partitions == [("b", 0)]
    run(main())


def test_a_coordinator_restarted_after_answering_end_txn_writes_the_markers() -> None:
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0), ("b", 0)], "anonymous")
        log.gate = asyncio.Event()
        await asyncio.wait_for(coordinator.end_txn("t", pid, epoch, True, "anonymous"), 30)
        await coordinator.close()  # stopped before any marker was written
        assert log.markers == [] and log.states()[-1] == PREPARE_COMMIT
        log.gate = None
        restarted = TransactionCoordinator(log)
        restarted.replay(log.records)
        # The producer's next InitProducerId meets the transaction completed first.
        again, newer = await restarted.init_producer_id("t", 60_000, "anonymous")
        assert (again, newer) == (pid, epoch + 1)
        assert log.markers == [("a", 0, pid, epoch, True), ("b", 0, pid, epoch, True)]
        assert log.states()[-2:] == [COMPLETE_COMMIT, EMPTY]
    run(main())


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    async def main() -> None:
        clock = [0]
        log = MemoryLog()
        coordinator = TransactionCoordinator(log, now_ms=lambda: clock[0])
        pid, epoch = await coordinator.init_producer_id("t", 1000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        clock[0] = 1000
        await coordinator.expire()
        assert log.markers == []
        clock[0] = 1001
        await coordinator.expire()
        assert log.markers == [("a", 0, pid, epoch + 1, False)]
        assert coordinator.txns["t"].state == COMPLETE_ABORT
        with pytest.raises(ProducerFencedError):
            await coordinator.end_txn("t", pid, epoch, True, "anonymous")
    run(main())


def test_a_transactional_id_belongs_to_its_first_principal() -> None:
    async def main() -> None:
        coordinator = TransactionCoordinator(MemoryLog())
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "user:alice")
        for other in ("user:bob", "anonymous"):
            with pytest.raises(TransactionalIdAuthorizationError):
                await coordinator.init_producer_id("t", 60_000, other)
        await coordinator.init_producer_id("t", 60_000, "admin")
        await coordinator.init_producer_id("t", 60_000, "user:alice")
    run(main())


def test_the_next_transaction_does_not_wait_for_the_end_to_be_recorded() -> None:
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        await coordinator.end_txn("t", pid, epoch, True, "anonymous")
        await wait_for_async(lambda: coordinator.txns["t"].state == COMPLETE_COMMIT,
                             timeout=30, what="the completion")
        # The markers are durable; the end is not recorded yet: a coordinator restarted now
        # would write the markers again.
        assert log.markers == [("a", 0, pid, epoch, True)]
        assert log.states()[-1] == PREPARE_COMMIT
        replayed = TransactionCoordinator(log)
        replayed.replay(log.records)
        assert replayed.txns["t"].state == PREPARE_COMMIT
        # The next transaction's first record carries it, first.
        await coordinator.add_partitions("t", pid, epoch, [("b", 0)], "anonymous")
        assert log.states()[-3:] == [PREPARE_COMMIT, COMPLETE_COMMIT, ONGOING]
        replayed = TransactionCoordinator(log)
        replayed.replay(log.records)
        assert replayed.txns["t"].state == ONGOING
        assert replayed.txns["t"].partitions == [("b", 0)]
        # Without a next record, the next round of `recover` records it.
        await coordinator.end_txn("t", pid, epoch, False, "anonymous")
        await wait_for_async(lambda: coordinator.txns["t"].state == COMPLETE_ABORT,
                             timeout=30, what="the completion")
        assert log.states()[-1] == PREPARE_ABORT
        await coordinator.recover()
        assert log.states()[-2:] == [PREPARE_ABORT, COMPLETE_ABORT]
        await coordinator.recover()
        assert log.states()[-2:] == [PREPARE_ABORT, COMPLETE_ABORT]  # once
    run(main())


def test_ongoing_transitions_are_recorded_written_and_the_rest_durable() -> None:
    """AddPartitionsToTxn, AddOffsetsToTxn and TxnOffsetCommit are answered once their record
    is written; InitProducerId and PrepareCommit/PrepareAbort (what markers depend on) only
    once durable, before any marker."""
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        await coordinator.add_offsets("t", pid, epoch, "g", "anonymous")
        await coordinator.txn_offset_commit("t", pid, epoch, "g", [CommittedOffset("in", 0, 7)],
                                            "anonymous")
        log.gate = asyncio.Event()
        await coordinator.end_txn("t", pid, epoch, True, "anonymous")
        assert log.markers == []
        assert list(zip(log.states(), log.durable, strict=True)) == [
            (EMPTY, True), (ONGOING, False), (ONGOING, False), (ONGOING, False),
            (PREPARE_COMMIT, True)]
        log.gate.set()
        await coordinator.recover()
        # The next transaction's first record carries the recorded end: written.
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        assert list(zip(log.states(), log.durable, strict=True))[-2:] == [
            (COMPLETE_COMMIT, False), (ONGOING, False)]
    run(main())


def test_a_coordinator_restarted_uncleanly_ends_its_transactions_under_new_producer_ids(
        ) -> None:
    """The last Ongoing record (partition b added) was only written and is lost: the restarted
    coordinator must not commit the transaction without b. It aborts it in a, and gives the
    transactional id a new producer id, so the producer's commit is refused and what it wrote
    in b is never extended by a later transaction of the same producer id. The same for an id
    whose last transaction ended: its next one may have begun in a record lost too."""
    async def main() -> None:
        log = MemoryLog()
        coordinator = TransactionCoordinator(log)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("b", 0)], "anonymous")
        other, other_epoch = await coordinator.init_producer_id("u", 60_000, "anonymous")
        await coordinator.add_partitions("u", other, other_epoch, [("c", 0)], "anonymous")
        await coordinator.end_txn("u", other, other_epoch, True, "anonymous")
        await wait_for_async(lambda: coordinator.txns["u"].state == COMPLETE_COMMIT,
                             timeout=30, what="the completion")
        records = [r for r in log.records if Txn.decode(r[1]).transactional_id == "t"]
        assert log.durable[log.records.index(records[-1])] is False
        lost = records[-1]  # a power loss takes the record not yet fsynced
        log.records.remove(lost)
        assert Txn.decode(lost[1]).partitions == [("a", 0), ("b", 0)]
        log.markers.clear()
        restarted = TransactionCoordinator(log)
        restarted.replay(log.records, complete=False)
        assert restarted.txns["t"].state == ONGOING
        with pytest.raises(ConcurrentTransactionsError):  # until it is dealt with
            await restarted.end_txn("t", pid, epoch, True, "anonymous")
        await restarted.recover()
        # u's end was recorded only as prepared: its markers are written again.
        assert sorted(log.markers) == [("a", 0, pid, epoch + 1, False),
                                       ("c", 0, other, other_epoch, True)]
        for transactional_id in ("t", "u"):
            txn = restarted.txns[transactional_id]
            assert txn.state == EMPTY and txn.producer_id not in (pid, other)
        with pytest.raises(InvalidProducerIdMappingError):
            await restarted.end_txn("t", pid, epoch, True, "anonymous")
        with pytest.raises(InvalidProducerIdMappingError):
            await restarted.add_partitions("u", other, other_epoch, [("c", 0)], "anonymous")
        assert await restarted.init_producer_id("t", 60_000, "anonymous") == (
            restarted.txns["t"].producer_id, 1)
        # After a clean stop nothing was lost: an Ongoing transaction goes on.
        clean = TransactionCoordinator(log)
        clean.replay(records[:-1], complete=True)
        assert clean.txns["t"].state == ONGOING
        await clean.recover()
        assert clean.txns["t"].state == ONGOING and clean.txns["t"].producer_id == pid
    run(main())


def test_requests_for_transactional_ids_nobody_holds_leave_nothing_behind() -> None:
    """Refused requests naming made-up transactional ids (a stranger's) keep no per-id state:
    what the coordinator holds is bounded by the ids that exist, not by what clients send."""
    async def main() -> None:
        coordinator = TransactionCoordinator(MemoryLog())
        await coordinator.init_producer_id("real", 60_000, "user:alice")
        for i in range(50):
            made_up = f"made-up-{i}"
            with pytest.raises(InvalidProducerIdMappingError):
                await coordinator.add_partitions(made_up, 7, 0, [("t", 0)], "user:bob")
            with pytest.raises(InvalidProducerIdMappingError):
                await coordinator.add_offsets(made_up, 7, 0, "g", "user:bob")
            with pytest.raises(InvalidProducerIdMappingError):
                await coordinator.txn_offset_commit(made_up, 7, 0, "g", [], "user:bob")
            with pytest.raises(InvalidProducerIdMappingError):
                await coordinator.end_txn(made_up, 7, 0, True, "user:bob")
        assert list(coordinator.txns) == ["real"]
        assert len(coordinator._locks) == 0  # noqa: SLF001 (nothing held now)
    run(main())
