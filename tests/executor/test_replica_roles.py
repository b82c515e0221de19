"""The executor's catalog view tells its broker the roles of its replicas (DESIGN §5
"Replication"): a role the broker could not take (an error while opening the partition, say) is
told again, not dropped: no later change of the catalog may come to retry it."""

from __future__ import annotations

import asyncio

import pytest

import executor._endpoints as endpoints
from catalog import INGEST, Broker, Topic, TopicKind
from catalog.errors import TqError
from executor._endpoints import CatalogTopics
from querylib.server.broker import PartitionRole


def _view() -> CatalogTopics:
    topics = CatalogTopics()
    topics.broker_id = 2
    leader = Broker(broker_id=1, host="a", address="tcp://10.0.0.1:7000", session_id=5)
    topic = Topic(topic_id=9, name="persistent://public/default/t", partitions=1,
                  record_type="bytes", kind=TopicKind.STREAM, owner=INGEST, locations=(1,),
                  internal=False, created_at_ms=0, replicas=((1, 2, 3),), isr=((1, 2, 3),),
                  leader_epochs=(4,))
    topics._views["brokers"][leader] = 1
    topics._views["topics"][topic] = 1
    return topics


def test_a_role_the_broker_failed_to_take_is_told_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoints, "_RETRY_ROLE", 0.01)
    asyncio.run(_told_again())


async def _told_again() -> None:
    topics = _view()
    told: list[PartitionRole | None] = []
    done = asyncio.Event()

    async def set_role(topic: str, partition: int, role: PartitionRole | None,
                       min_insync: int) -> None:
        told.append(role)
        if len(told) == 1:
            raise TqError("the partition could not be opened")
        done.set()

    topics.watch_replicas(set_role)
    topics._replica_roles()
    await asyncio.wait_for(done.wait(), 10)
    assert len(told) == 2 and told[0] == told[1]
    assert told[1] is not None and told[1].leader_address == "tcp://10.0.0.1:7000"
    await topics.close()



def test_only_the_principal_that_registered_a_broker_may_fetch_as_it() -> None:
    from catalog import BrokerHome

    topics = CatalogTopics()
    for home in (BrokerHome(broker_id=1, host="a", principal="executor:a", slot=0),
                 BrokerHome(broker_id=2, host="b", principal="executor:b", slot=0)):
        topics._views["homes"][home] = 1
    topics._index_holders()
    assert topics.may_replicate("executor:a", 1)
    assert not topics.may_replicate("executor:a", 2)  # another host's broker
    assert not topics.may_replicate("executor:a", 3)  # no such broker
    assert topics.may_replicate("admin", 2)
    assert not topics.may_replicate("user:alice", 1)
    assert not topics.may_replicate("not a principal", 1)


def test_a_broker_taken_out_of_the_replicas_is_told_a_role_that_does_not_name_it() -> None:
    """Decommissioned while up (DESIGN §5 "Decommissioning a broker"): the broker must hear
    that it neither leads nor follows any more, not keep its last role (a leader would keep
    its producers waiting for followers that fetch elsewhere now)."""
    asyncio.run(_drained())


async def _drained() -> None:
    import msgspec

    topics = _view()
    topics.broker_id = 1  # the leader
    told: list[PartitionRole | None] = []
    changed = asyncio.Event()

    async def set_role(topic: str, partition: int, role: PartitionRole | None,
                       min_insync: int) -> None:
        told.append(role)
        changed.set()

    topics.watch_replicas(set_role)
    topics._replica_roles()
    await asyncio.wait_for(changed.wait(), 10)
    changed.clear()
    (topic,) = [t for t in topics._views["topics"] if isinstance(t, Topic)]
    other = Broker(broker_id=2, host="b", address="tcp://10.0.0.2:7000", session_id=6)
    topics._views["brokers"][other] = 1
    del topics._views["topics"][topic]
    topics._views["topics"][msgspec.structs.replace(
        topic, locations=(2,), replicas=((2, 3, 4),), isr=((2, 3),), leader_epochs=(5,))] = 1
    topics._replica_roles()
    await asyncio.wait_for(changed.wait(), 10)
    last = told[-1]
    assert last is not None and 1 not in last.replicas and last.leader_id == 2
    assert last.leader_epoch == 5
    await topics.close()


def test_a_partition_on_disk_the_catalog_no_longer_names_this_broker_for_is_told_its_role(
        ) -> None:
    """Restarted after it was drained (or back under a new id), the broker finds on disk a
    copy of a partition whose replicas no longer name it: it must hear that role too, so it
    drops the copy once the replicas named are in sync, not keep it for ever."""
    asyncio.run(_stray())


async def _stray() -> None:
    topics = _view()
    topics.broker_id = 7  # named by no replica set; nothing told yet
    told: list[tuple[str, int, PartitionRole | None]] = []
    changed = asyncio.Event()

    async def set_role(topic: str, partition: int, role: PartitionRole | None,
                       min_insync: int) -> None:
        told.append((topic, partition, role))
        changed.set()

    topics.watch_replicas(set_role, holds=lambda topic, partition: (topic, partition)
                          == ("t", 0))
    topics._replica_roles()
    await asyncio.wait_for(changed.wait(), 10)
    ((topic, partition, role),) = told
    assert (topic, partition) == ("t", 0)
    assert role is not None and 7 not in role.replicas and role.isr == (1, 2, 3)
    await topics.close()
