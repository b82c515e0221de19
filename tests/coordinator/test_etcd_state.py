"""The group coordinator's state kept in etcd (coordinator/_etcd_state.py, DESIGN §3
"Coordinator failover"): on a real etcd and real brokers in this process, what one group
coordinator committed is what the next one starts from, its own `__consumer_offsets` is made
to say the same, a write is answered only once etcd has it, and a deposed coordinator's is
refused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from coordinator._etcd_state import EtcdStateTopic
from coordinator._failover import EtcdCatalog
from querylib.kafka import CoordinatorNotAvailableError, PolicyViolationError
from querylib.log import LogConfig
from querylib.server.broker import BrokerServer
from querylib.server.kafka import (
    OFFSETS_TOPIC,
    TRANSACTIONS_TOPIC,
    BrokerBackend,
    CommittedOffset,
    GroupMemberRecord,
    GroupRecord,
    KafkaConfig,
    StandaloneCluster,
    StateReplica,
)

from ._etcd import etcd_server, needs_etcd

pytestmark = [needs_etcd, pytest.mark.timeout(90)]

T = TypeVar("T")
SECRET = b"0123456789abcdef0123456789abcdef"
MEMBER = GroupMemberRecord("m", None, "c", "/h", 300, 100, b"sub", b"asg")
GROUP = GroupRecord("g", "consumer", 3, "range", "m", 42, (MEMBER,))


class _Replicated(StandaloneCluster):
    def __init__(self, server: BrokerServer, replica: StateReplica | None,
                 txns: StateReplica | None) -> None:
        super().__init__(server.port, KafkaConfig(port=0))
        self._replicas = {OFFSETS_TOPIC: replica, TRANSACTIONS_TOPIC: txns}

    def state_replica(self, topic: str) -> StateReplica | None:
        return self._replicas[topic]


async def _backend(data: Path, replica: StateReplica | None,
                   body: Callable[[BrokerBackend], Awaitable[T]], *,
                   txns: StateReplica | None = None) -> T:
    server = BrokerServer(data, SECRET, log_config=LogConfig(flush="always"))
    await server.start(None)
    await server.port.ensure("t", 0, create=True)
    backend = BrokerBackend(server.port, KafkaConfig(port=0), secret=SECRET,
                            cluster=_Replicated(server, replica, txns))
    try:
        await backend.open()
        return await body(backend)
    finally:
        await backend.close()
        await server.close()


async def _active(address: str, name: str, lease: float = 2.0) -> EtcdCatalog:
    etcd = EtcdCatalog(address, "test", lease=lease)
    await etcd.connect()
    await etcd.campaign(name)
    return etcd


async def _state(backend: BrokerBackend) -> tuple[dict, list, list[bool]]:
    return ({k: v.offset for k, v in (await backend.committed_offsets("g")).items()},
            list(await backend.stored_groups()),
            [await backend.authorize_group("g", who, claim=False) for who in ("alice", "eve")])


def test_the_next_group_coordinator_starts_from_what_the_last_one_kept(tmp_path: Path) -> None:
    async def first(backend: BrokerBackend) -> None:
        assert await backend.authorize_group("g", "alice", claim=True)
        await backend.store_offsets("g", [CommittedOffset("t", 0, 10, -1, "", 1),
                                          CommittedOffset("t", 1, 5, -1, "", 1)])
        await backend.store_offsets("g", [CommittedOffset("t", 0, 12, -1, "m", 2)])
        await backend.delete_offsets("g", [("t", 1)])
        await backend.store_group(GROUP)

    async def stale(backend: BrokerBackend) -> None:  # what the other host's own log says
        assert await backend.authorize_group("g", "eve", claim=True)
        await backend.store_offsets("g", [CommittedOffset("t", 0, 3, -1, "", 1),
                                          CommittedOffset("t", 9, 1, -1, "", 1)])
        await backend.store_group(GroupRecord("h", "consumer", 1, "range", None, 7))

    async def run(address: str) -> None:
        a = await _active(address, "a:1")
        await _backend(tmp_path / "a", EtcdStateTopic(a, OFFSETS_TOPIC), first)
        await a.close()  # resigns: b is elected at once
        await _backend(tmp_path / "b", None, stale)
        b = await _active(address, "b:1")
        taken = await _backend(tmp_path / "b", EtcdStateTopic(b, OFFSETS_TOPIC), _state)
        assert taken == ({("t", 0): 12}, [GROUP], [True, False])
        await b.close()
        # and b's own `__consumer_offsets` now says the same, read alone
        assert await _backend(tmp_path / "b", None, _state) == taken

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_the_first_coordinator_with_etcd_keeps_its_own_groups_there(tmp_path: Path) -> None:
    async def before(backend: BrokerBackend) -> None:
        await backend.store_offsets("g", [CommittedOffset("t", 0, 7, -1, "", 1)])
        await backend.store_group(GROUP)

    async def run(address: str) -> None:
        await _backend(tmp_path / "a", None, before)  # groups from before failover was on
        a = await _active(address, "a:1")
        groups = EtcdStateTopic(a, OFFSETS_TOPIC)
        assert await groups.read() is None
        mine = await _backend(tmp_path / "a", groups, _state)
        assert mine == ({("t", 0): 7}, [GROUP], [True, True])  # no owner: anyone
        assert len(await groups.read() or {}) == 2
        await a.close()
        b = await _active(address, "b:1")
        assert await _backend(tmp_path / "b", EtcdStateTopic(b, OFFSETS_TOPIC), _state) == mine
        await b.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_deposed_coordinator_cannot_commit(tmp_path: Path) -> None:
    """Its lease gone and another active: the commit is refused with a retriable Kafka error
    (the client finds the coordinator again), its group store keeps the last one etcd has."""
    async def run(address: str) -> None:
        a = await _active(address, "a:1", lease=1)

        async def body(backend: BrokerBackend) -> None:
            await backend.store_offsets("g", [CommittedOffset("t", 0, 10, -1, "", 1)])
            assert a._keeper is not None
            a._keeper.cancel()  # stops renewing, as a stalled process would
            await asyncio.gather(a._keeper, return_exceptions=True)
            a.lost.clear()
            b = await asyncio.wait_for(_active(address, "b:1", lease=1), 20)
            with pytest.raises(CoordinatorNotAvailableError):
                await backend.store_offsets("g", [CommittedOffset("t", 0, 20, -1, "", 2)])
            assert {k: v.offset for k, v in (await backend.committed_offsets("g")).items()} \
                == {("t", 0): 10}
            assert await _backend(tmp_path / "b", EtcdStateTopic(b, OFFSETS_TOPIC), _state) == \
                ({("t", 0): 10}, [], [True, True])
            await b.close()

        await _backend(tmp_path / "a", EtcdStateTopic(a, OFFSETS_TOPIC), body)
        await a.close(resign=False)

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_many_and_large_records_are_split_and_one_too_large_is_refused(tmp_path: Path) -> None:
    async def run(address: str) -> None:
        a = await _active(address, "a:1")
        groups = EtcdStateTopic(a, OFFSETS_TOPIC)
        await groups.seed([])
        records = [(b"k%04d" % i, b"v" * (200_000 if i % 50 == 0 else 10)) for i in range(350)]
        await groups.write(records)  # more operations and bytes than one etcd Txn takes
        await groups.write([(b"k0001", None), (b"k0002", b"again")])
        kept = await groups.read()
        assert kept is not None and len(kept) == 349
        assert kept[b"k0002"] == b"again" and kept[b"k0050"] == b"v" * 200_000
        with pytest.raises(PolicyViolationError):
            await groups.write([(b"big", b"x" * (2 << 20))])
        await a.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_transaction_open_at_a_takeover_is_known_to_the_next_coordinator(
        tmp_path: Path) -> None:
    """Its producer id, epoch and partitions: the producer's next InitProducerId there fences
    it with the next epoch of the same id, and the open transaction is aborted (not left open
    under an id nobody knows, holding read_committed consumers back until the broker's own
    limit)."""
    async def begin(backend: BrokerBackend) -> tuple[int, int]:
        txns = backend.transactions
        producer, epoch = await txns.init_producer_id("tx", 60_000, "alice")
        await txns.add_partitions("tx", producer, epoch, [("t", 0)], "alice")
        return producer, epoch

    async def run(address: str) -> None:
        a = await _active(address, "a:1")
        producer, epoch = await _backend(tmp_path / "a", None, begin,
                                         txns=EtcdStateTopic(a, TRANSACTIONS_TOPIC))
        await a.close()
        b = await _active(address, "b:1")

        async def taken(backend: BrokerBackend) -> tuple[str, list, tuple[int, int]]:
            txn = backend.transactions.txns["tx"]
            known = (txn.state, list(txn.partitions))
            return (*known, await backend.transactions.init_producer_id("tx", 60_000, "alice"))

        state, partitions, renewed = await _backend(
            tmp_path / "b", None, taken, txns=EtcdStateTopic(b, TRANSACTIONS_TOPIC))
        assert (state, partitions) == ("Ongoing", [("t", 0)])
        assert renewed == (producer, epoch + 2)  # the abort's bump, then the new producer's
        await b.close()

        async def alone(backend: BrokerBackend) -> tuple[int, int, str]:
            txn = backend.transactions.txns["tx"]
            return txn.producer_id, txn.epoch, txn.state

        # b's own `__transaction_state` says the same, read alone
        assert await _backend(tmp_path / "b", None, alone) == (producer, epoch + 2, "Empty")

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))
