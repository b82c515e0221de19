"""Replicated partitions on three real brokers over real ZeroMQ on loopback (DESIGN §5
"Replication"): a leader and two followers, their roles set through the broker's seam
(`BrokerServer.set_replica_role`), as an executor sets them from the catalog."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from catalog.errors import TqError
from querylib.broker import BrokerLink, OpenProducerRequest, ProduceRequest
from querylib.broker.messages import Produced
from querylib.log import LogConfig
from querylib.records import encode_batch, iter_batches
from querylib.server.broker import BrokerServer
from querylib.server.broker._replication import PartitionRole
from tests.conftest import wait_for_async

SECRET = os.urandom(32)
PID = ("t", 0)


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.servers = [BrokerServer(tmp_path / f"b{i}", SECRET,
                                     log_config=LogConfig(flush="always")) for i in (1, 2, 3)]
        self.addresses: list[str] = []

    async def start(self, *, leader: int = 1, epoch: int = 1) -> None:
        self.addresses = [await s.start() for s in self.servers]
        await self.set_roles(leader=leader, epoch=epoch)

    async def set_roles(self, *, leader: int, epoch: int, isr=(1, 2, 3)) -> None:
        role = PartitionRole(topic_id=1, partition=0, leader_id=leader, leader_epoch=epoch,
                             replicas=(1, 2, 3), isr=tuple(isr),
                             leader_address=self.addresses[leader - 1])
        for broker_id, server in enumerate(self.servers, 1):
            await server.set_replica_role("t", 0, role, broker_id=broker_id)

    def log(self, broker_id: int):
        return self.servers[broker_id - 1].partition_log(PID)

    async def close(self) -> None:
        for server in self.servers:
            await server.close()


async def producer(address: str) -> BrokerLink:
    link = BrokerLink(address, SECRET, timeout=10)
    await link.start()
    await link.request(OpenProducerRequest(session=link.session, topic="t", partition=0))
    return link


def produce(link: BrokerLink, value: bytes) -> asyncio.Task[Produced]:
    return asyncio.ensure_future(link.request(
        ProduceRequest(session=link.session, topic="t", partition=0),
        payload=[encode_batch([(1, None, value, ())])]))


def test_followers_hold_byte_identical_logs_with_the_leader_epoch_stamped(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start(epoch=4)
        try:
            link = await producer(cluster.addresses[0])
            for i in range(5):
                assert (await asyncio.wait_for(produce(link, b"v%d" % i), 30)).base_offset == i
            data = cluster.log(1).read(0, 1 << 20)
            for follower in (2, 3):
                await wait_for_async(lambda f=follower: cluster.log(f).log_end_offset == 5,
                                     timeout=30, what="the follower caught up")
                assert cluster.log(follower).read(0, 1 << 20) == data
            epochs = {b.partition_leader_epoch for b in iter_batches(data)}
            assert epochs == {4}
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_produce_is_answered_only_once_every_follower_fetched_it(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = await producer(cluster.addresses[0])
            cluster.servers[2].hold_replica_fetches(True)
            ack = produce(link, b"held")
            leader = cluster.servers[0].state.partitions[PID].replication
            await wait_for_async(lambda: leader._followers[2].fetched >= 1, timeout=30,
                                 what="follower 2 fetched past the record")
            assert not ack.done()  # follower 3 has not fetched it
            assert cluster.servers[0].state.partition_info(PID).high_watermark == 0
            cluster.servers[2].hold_replica_fetches(False)
            assert (await asyncio.wait_for(ack, 30)).next_offset == 1
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())


def test_a_follower_refuses_a_producer(tmp_path):
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start()
        try:
            link = BrokerLink(cluster.addresses[1], SECRET, timeout=10)
            await link.start()
            with pytest.raises(TqError) as raised:
                await link.request(OpenProducerRequest(session=link.session, topic="t",
                                                       partition=0))
            assert raised.value.kafka_error_code == 6
            await link.close()
        finally:
            await cluster.close()

    asyncio.run(main())
