"""A coordinator session given several coordinators (failover, DESIGN §3) keeps renewing
when another caller's `find_active` switches coordinators under a heartbeat in flight: the
heartbeat goes to the active one. Two real RPC servers stand for the coordinators: the first
opens the session and then holds heartbeats (it stopped answering), the second answers."""

from __future__ import annotations

import asyncio
from typing import Any

from querylib.cluster import AsyncCluster
from querylib.cluster import messages as m
from querylib.rpc import Context, RpcServer
from tests.conftest import free_port, wait_for_async
from tests.querylib.rpc._support import SECRET


class _Coordinator:
    """A stand-in answering what a session needs; `holding`: heartbeats are never answered
    and it no longer tells it is there."""

    def __init__(self) -> None:
        self.server = RpcServer(SECRET)
        self.renewals = 0
        self.holding = False
        self.server.register(m.GetCatalogInfo, self.info)
        self.server.register(m.OpenSession, self.open)
        self.server.register(m.Heartbeat, self.heartbeat)

    async def info(self, request: m.GetCatalogInfo, ctx: Context) -> m.CatalogInfo:
        if self.holding:
            await asyncio.Event().wait()
        return m.CatalogInfo(version=1, catalog_broker="", collections={})

    async def open(self, request: m.OpenSession, ctx: Context) -> m.SessionOpened:
        return m.SessionOpened(session_id=7, lease_ms=request.lease_ms, version=1,
                               resumed=False, catalog_broker="")

    async def heartbeat(self, request: m.Heartbeat, ctx: Context) -> Any:
        if self.holding:
            await asyncio.Event().wait()
        self.renewals += 1
        return m.Renewed(lease_ms=request.lease_ms or 3000, version=1)


def test_a_heartbeat_in_flight_when_failover_switches_coordinators_goes_to_the_new_one(
) -> None:
    async def test() -> None:
        first, second = _Coordinator(), _Coordinator()
        a = await first.server.start("tcp://127.0.0.1:0")
        b = f"tcp://127.0.0.1:{free_port()}"
        # Heartbeats a second apart, each waiting a second for its answer.
        cluster = AsyncCluster(f"{a},{b}", SECRET, lease=3.0, timeout=30.0)
        await cluster.start()  # on the first: the second does not listen yet
        try:
            assert cluster.address == a and cluster.session_id == 7
            await wait_for_async(lambda: first.renewals >= 1, what="a renewal at the first")
            first.holding = True
            # A heartbeat is held there (its deadline far off) when another caller finds
            # the second active and switches to it, closing the client the heartbeat is on.
            await wait_for_async(lambda: cluster.client.in_flight >= 1,
                                 what="a heartbeat held at the first")
            await second.server.start(b)
            await cluster.find_active()
            assert cluster.address == b
            await wait_for_async(lambda: second.renewals >= 3, timeout=30,
                                 what="the session renewed at the second")
        finally:
            await cluster.close()
            await first.server.close()
            await second.server.close()

    asyncio.run(asyncio.wait_for(test(), 60))
