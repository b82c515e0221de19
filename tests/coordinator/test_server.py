"""The coordinator's shell in this process with real sockets and a real broker: the async client
API end to end, a restart at a new broker address, and the connection file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from catalog import ConflictError, SessionRef, UnknownTopicError
from coordinator import Coordinator, CoordinatorConfig
from querylib.cluster import AsyncCluster, Diff, SessionLostError, Snapshot, read_collections
from tests.conftest import wait_for_async

SECRET = b"0123456789abcdef0123456789abcdef"


async def _start(data: Path, **options: object) -> Coordinator:
    coordinator = Coordinator(data, SECRET, listen="tcp://127.0.0.1:0",
                              broker_listen="tcp://127.0.0.1:0", **options)  # type: ignore[arg-type]
    await coordinator.start()
    return coordinator


def test_the_async_client_end_to_end(tmp_path: Path) -> None:
    async def main() -> None:
        coordinator = await _start(tmp_path)
        try:
            assert coordinator.endpoint is not None
            async with AsyncCluster(coordinator.endpoint, SECRET, lease=5.0) as owner, \
                    AsyncCluster(coordinator.endpoint, SECRET, lease=5.0) as reader:
                follower = await reader.follow("publications").start()
                first = await follower.next_event(timeout=10)
                assert isinstance(first, Snapshot) and first.records == []
                waiting = asyncio.ensure_future(reader.subscribe("numbers", wait=10))
                info = await owner.create_topic("numbers", 3)
                assert info.topic.partitions == 3 and set(info.brokers) == {1}
                assert (await waiting).topic == info.topic
                await owner.publish("numbers")
                event = await follower.next_event(timeout=10)
                assert isinstance(event, Diff)
                assert [(p.publisher, d) for p, d in event.updates] == [
                    (SessionRef(owner.session_id), 1)]  # type: ignore[arg-type]
                with pytest.raises(UnknownTopicError):
                    await reader.lookup_topic("nothing", wait=0.2)
                snaps = await read_collections(reader, ["subscriptions", "topics"])
                assert len(snaps["subscriptions"].records) == 1
                assert owner.version >= snaps["topics"].version >= info.version
                await follower.close()
        finally:
            await coordinator.close()

    asyncio.run(main())


def test_a_session_that_missed_its_lease_is_lost(tmp_path: Path) -> None:
    async def main() -> None:
        coordinator = await _start(tmp_path, config=CoordinatorConfig(min_lease_ms=100))
        try:
            cluster = await AsyncCluster(coordinator.endpoint, SECRET, lease=0.2).start()
            assert cluster.keeper.task is not None
            cluster.keeper.task.cancel()  # a stalled client: nobody renews
            assert coordinator.state is not None
            leases = coordinator.state.leases
            deadline = asyncio.get_running_loop().time() + 10
            while cluster.session_id in leases:  # wait for the coordinator to expire it
                assert asyncio.get_running_loop().time() < deadline, "the lease never expired"
                await asyncio.sleep(0.01)
            with pytest.raises(SessionLostError):
                await cluster.create_topic("t")
            assert cluster.lost
            with pytest.raises(SessionLostError):  # and stays lost, without asking again
                await cluster.publish("t")
            await cluster.close()
        finally:
            await coordinator.close()

    asyncio.run(main())


def test_a_restart_at_a_new_broker_address_keeps_the_catalog_readable(tmp_path: Path) -> None:
    async def main() -> None:
        first = await _start(tmp_path)
        async with AsyncCluster(first.endpoint, SECRET, lease=30.0) as cluster:  # type: ignore[arg-type]
            await cluster.create_topic("kept", 2)
            session = cluster.session_id
        old_broker = first.broker_endpoint
        await first.close()
        second = await _start(tmp_path)
        try:
            assert second.broker_endpoint != old_broker
            assert second.state is not None
            broker_id = second.state.catalog_broker_id
            assert second.state.catalog.broker(broker_id).address == second.broker_endpoint
            async with AsyncCluster(second.endpoint, SECRET, session=False) as reader:  # type: ignore[arg-type]
                assert reader.catalog_broker == second.broker_endpoint
                snaps = await read_collections(reader, ["topics", "sessions"])
                names = {t.short_name for t, _ in snaps["topics"].records}
                assert "kept" in names and "__catalog.topics" in names
                assert snaps["sessions"].records == []  # closed cleanly before the restart
                assert session is not None
        finally:
            await second.close()

    asyncio.run(main())


def test_a_session_found_through_a_coordinator_list_gets_its_notifies(tmp_path: Path) -> None:
    """An executor given several coordinator addresses (failover, DESIGN §3) listens for its
    notifies before it starts; whichever address answers, SpawnProcesses reaches it."""
    from catalog import Resources, SessionKind
    from querylib.cluster import SpawnProcesses
    from tests.conftest import free_port

    async def main() -> None:
        coordinator = await _start(tmp_path)
        try:
            assert coordinator.endpoint is not None
            silent = f"tcp://127.0.0.1:{free_port()}"  # a standby: binds nothing yet
            spawns: list[SpawnProcesses] = []
            agent = AsyncCluster(f"{silent},{coordinator.endpoint}", SECRET, lease=10.0,
                                 kind=SessionKind.EXECUTOR, connect_timeout=5.0)
            agent.on_notify(SpawnProcesses, lambda note: spawns.append(note.message))
            async with agent:
                assert agent.address == coordinator.endpoint
                broker = await agent.register_broker("host-a", "tcp://127.0.0.1:1")
                executor = await agent.register_executor(
                    "host-a", broker.broker_id,
                    Resources(cores=1, memory=1 << 30, disk=1 << 30, slots=4))
                async with AsyncCluster(coordinator.endpoint, SECRET, lease=10.0) as client:
                    query = await client.submit_query("job", "file:///job.py")
                    await wait_for_async(lambda: spawns, what="a spawn")
                    assert [(s.query_id, s.executor_id) for s in spawns] == [
                        (query.query_id, executor.executor_id)]
        finally:
            await coordinator.close()

    asyncio.run(main())


def test_one_users_sessions_leave_room_for_the_rest(tmp_path: Path) -> None:
    """Over real sockets, as users connect: past its own bound a user is refused a session
    in one line naming the bound, while another user and the admin still get theirs; closing
    one gives its place back."""
    async def main() -> None:
        coordinator = await _start(tmp_path, config=CoordinatorConfig(
            max_sessions_per_principal=2))
        address = coordinator.endpoint
        assert address is not None
        opened: list[AsyncCluster] = []
        try:
            async with AsyncCluster(address, SECRET) as admin:
                bob = await admin.add_user("user:bob")
                alice = await admin.add_user("user:alice")
                for _ in range(2):
                    opened.append(await AsyncCluster(address, bob).start())
                with pytest.raises(ConflictError, match=r"user:bob holds 2 sessions, the most "
                                   r"one principal may \(max_sessions_per_principal 2\)"):
                    await AsyncCluster(address, bob).start()
                opened.append(await AsyncCluster(address, alice).start())
                opened.append(await AsyncCluster(address, SECRET).start())
                await opened.pop(0).close()
                opened.append(await AsyncCluster(address, bob).start())
        finally:
            for cluster in opened:
                await cluster.close()
            await coordinator.close()

    asyncio.run(main())
