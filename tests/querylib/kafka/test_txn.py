"""The transaction coordinator's rules (`querylib.kafka._txn`) over an in-memory transaction
log: epochs fence older producers, every change is recorded before it counts, a marker that
cannot be written leaves the transaction prepared until it can, a restarted coordinator
finishes what it was ending, and transactional ids belong to their first principal."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from querylib.broker import BrokerUnavailableError
from querylib.kafka._backend import CommittedOffset
from querylib.kafka._errors import (
    InvalidProducerIdMappingError,
    ProducerFencedError,
    TransactionalIdAuthorizationError,
)
from querylib.kafka._txn import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    PREPARE_COMMIT,
    TransactionCoordinator,
    Txn,
)


class MemoryLog:
    """The coordinator's TxnLog in memory: records, markers and offsets written, and the
    partitions whose broker does not answer."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.markers: list[tuple[str, int, int, int, bool]] = []
        self.offsets: list[tuple[str, list[CommittedOffset]]] = []
        self.down: set[tuple[str, int]] = set()
        self.next_id = 100

    async def write_txn(self, txn: Txn) -> None:
        self.records.append(txn.encode())

    async def write_marker(self, topic: str, partition: int, producer_id: int, epoch: int,
                           commit: bool) -> None:
        if (topic, partition) in self.down:
            raise BrokerUnavailableError(f"{topic}-{partition}: its broker does not answer")
        self.markers.append((topic, partition, producer_id, epoch, commit))

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
        coordinator = TransactionCoordinator(log)
        pid, epoch = await coordinator.init_producer_id("t", 60_000, "anonymous")
        await coordinator.add_partitions("t", pid, epoch, [("a", 0)], "anonymous")
        await coordinator.add_offsets("t", pid, epoch, "g", "anonymous")
        await coordinator.txn_offset_commit("t", pid, epoch, "g", [CommittedOffset("in", 0, 7)],
                                            "anonymous")
        log.down.add(("a", 0))
        with pytest.raises(BrokerUnavailableError):
            await coordinator.end_txn("t", pid, epoch, True, "anonymous")
        assert coordinator.txns["t"].state == PREPARE_COMMIT and log.offsets == []
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
