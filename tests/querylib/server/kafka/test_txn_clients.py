"""EndTxn answered before the transaction's markers are written, with real clients
(confluent-kafka, kafka-python, aiokafka) against a listener whose marker writes are held at a
gate: the commit returns while no marker is in the log, the next transaction's
AddPartitionsToTxn gets CONCURRENT_TRANSACTIONS (the coordinator told not to wait) and the
client retries it until the markers are written, and a read_committed reader sees a
transaction's records only once its marker is there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from querylib.kafka._errors import ConcurrentTransactionsError
from querylib.server.kafka._txn import COMPLETE_COMMIT, PREPARE_COMMIT
from tests.conftest import wait_for, wait_for_async
from tests.interop._kafka import read_to_end
from tests.querylib.server.kafka._support import ListenerThread, running_listener

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")


class Gate:
    """Holds the listener's marker writes until opened; counts the AddPartitionsToTxn
    answered CONCURRENT_TRANSACTIONS."""

    def __init__(self, listener: ListenerThread) -> None:
        self.listener = listener
        self.concurrent = 0
        self.event: asyncio.Event = listener.call(self._make())
        backend, coordinator = listener.backend, listener.backend.transactions
        coordinator.completion_wait = 0  # answer CONCURRENT_TRANSACTIONS at once
        write_markers, add_partitions = backend.write_markers, coordinator.add_partitions

        async def gated_markers(*args: Any, **kwargs: Any) -> None:
            await self.event.wait()
            await write_markers(*args, **kwargs)

        async def counted_add(*args: Any, **kwargs: Any) -> None:
            try:
                await add_partitions(*args, **kwargs)
            except ConcurrentTransactionsError:
                self.concurrent += 1
                raise

        backend.write_markers = gated_markers  # type: ignore[method-assign]
        coordinator.add_partitions = counted_add  # type: ignore[method-assign]

    @staticmethod
    async def _make() -> asyncio.Event:
        return asyncio.Event()

    def close(self) -> None:
        self.listener.loop.call_soon_threadsafe(self.event.clear)

    def open(self) -> None:
        self.listener.loop.call_soon_threadsafe(self.event.set)

    def state(self, txn_id: str) -> str:
        return self.listener.backend.transactions.txns[txn_id].state


def check_client(tmp_path: Any, txn_id: str,
                 run: Callable[[str, Gate, Callable[[], None]], None]) -> None:
    """`run(bootstrap, gate, after_first_commit)` commits a transaction of record b"1"
    (the gate closed), calls `after_first_commit`, then sends b"2" in a second transaction,
    opens the gate once that was refused, and commits it."""
    with running_listener(str(tmp_path)) as listener:
        gate = Gate(listener)
        topic = f"topic-{txn_id}"

        def after_first_commit() -> None:
            # Answered while its marker waits: prepared, and nothing committed to read yet.
            assert gate.state(txn_id) == PREPARE_COMMIT
            assert read_to_end(f"127.0.0.1:{listener.port}", topic) == []

        run(f"127.0.0.1:{listener.port}", gate, after_first_commit)
        assert gate.concurrent >= 1
        wait_for(lambda: gate.state(txn_id) == COMPLETE_COMMIT, timeout=30)
        assert read_to_end(f"127.0.0.1:{listener.port}", topic) == [b"1", b"2"]


def first_transaction_open(gate: Gate) -> None:
    """Before the first commit: the gate is closed once the topic and producer exist."""
    gate.close()


def test_confluent_kafka_retries_concurrent_transactions(tmp_path: Any) -> None:
    def run(bootstrap: str, gate: Gate, after_first_commit: Callable[[], None]) -> None:
        p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 1,
                                      "transactional.id": "ck"})
        p.init_transactions(20)
        p.begin_transaction()
        p.produce("topic-ck", value=b"1")
        assert p.flush(20) == 0
        first_transaction_open(gate)
        p.commit_transaction(20)
        after_first_commit()
        p.begin_transaction()
        p.produce("topic-ck", value=b"2")
        wait_for(lambda: gate.concurrent >= 1, timeout=30)
        gate.open()
        p.commit_transaction(30)

    check_client(tmp_path, "ck", run)


def test_kafka_python_retries_concurrent_transactions(tmp_path: Any) -> None:
    def run(bootstrap: str, gate: Gate, after_first_commit: Callable[[], None]) -> None:
        p = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id="kp")
        try:
            p.init_transactions()
            p.begin_transaction()
            p.send("topic-kp", value=b"1")
            p.flush()
            first_transaction_open(gate)
            p.commit_transaction()
            after_first_commit()
            p.begin_transaction()
            p.send("topic-kp", value=b"2")
            wait_for(lambda: gate.concurrent >= 1, timeout=30)
            gate.open()
            p.flush()
            p.commit_transaction()
        finally:
            p.close(timeout=10)

    check_client(tmp_path, "kp", run)


def test_aiokafka_retries_concurrent_transactions(tmp_path: Any) -> None:
    def run(bootstrap: str, gate: Gate, after_first_commit: Callable[[], None]) -> None:
        async def main() -> None:
            p = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="aio")
            await p.start()
            try:
                await p.begin_transaction()
                await p.send_and_wait("topic-aio", b"1")
                first_transaction_open(gate)
                await p.commit_transaction()
                # The checks block (a consumer of their own): off this loop.
                await asyncio.get_running_loop().run_in_executor(None, after_first_commit)
                await p.begin_transaction()
                sent = await p.send("topic-aio", b"2")
                await wait_for_async(lambda: gate.concurrent >= 1, timeout=30,
                                     what="CONCURRENT_TRANSACTIONS")
                gate.open()
                await sent
                await p.commit_transaction()
            finally:
                await p.stop()

        asyncio.run(main())

    check_client(tmp_path, "aio", run)
