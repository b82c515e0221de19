"""Tells this host's broker which processes of a query have ended, from the catalog (DESIGN §5
"Collective publishing"): a cohort waits for every process of its query, and one whose
missing writer exited (0 without publishing, or crashed before joining) must stop waiting.

The agent follows the catalog's `queries` through its session and hands the broker each
query's exit codes and whether it failed or was killed (`BrokerServer.query_exits`). Because
it follows the catalog rather than listening for instructions, a broker that restarted, or an
agent that rejoined, learns everything again from the snapshot: queries that ended while it
was away settle the cohorts it saved. The snapshot holds every query ever run; only those with
something to say (a process exited, or the query failed) reach the broker, and of the ended
ones only those some cohort on this broker waits for.

Must not: decide what an exit means for a cohort (the broker's core does), or write to the
catalog.
"""

from __future__ import annotations

import asyncio
import logging

from catalog import Query, QueryState, TqError
from querylib.cluster import AsyncCluster, Snapshot
from querylib.server.broker import BrokerServer

__all__ = ["QueryExitFeed"]

logger = logging.getLogger("executor")

_RETRY_FOLLOW = 1.0  # seconds before following again after an error


class QueryExitFeed:
    """Follows `queries` through a cluster session and feeds process exits to `broker`."""

    def __init__(self, broker: BrokerServer) -> None:
        self.broker = broker
        self._task: asyncio.Task[None] | None = None

    def attach(self, cluster: AsyncCluster) -> None:
        """Follow through `cluster` from now on (a new session replaces the old one)."""
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(
            self._follow(cluster), name="query exits for the broker")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _follow(self, cluster: AsyncCluster) -> None:
        while True:
            try:
                async with cluster.follow("queries") as follower:
                    async for event in follower:
                        if isinstance(event, Snapshot):
                            waited = self.broker.cohort_queries()
                            for record, count in event.records:
                                if count > 0 and isinstance(record, Query):
                                    self._feed(record, waited)
                        else:
                            for record, diff in event.updates:
                                if diff > 0 and isinstance(record, Query):
                                    self._feed(record, None)
            except TqError as exc:  # the coordinator is away or restarting: follow again
                logger.warning("query exits for the broker: %s; following again", exc)
                await asyncio.sleep(_RETRY_FOLLOW)

    def _feed(self, query: Query, waited: set[int] | None) -> None:
        """Hand one query's exits to the broker if they can matter: `waited` (at a snapshot)
        are the queries some cohort here waits for; an ended query outside it cannot."""
        failed = query.state in (QueryState.FAILED, QueryState.KILLED)
        if not failed and all(code is None for code in query.exit_codes):
            return  # nothing has ended
        if waited is not None and query.ended and query.query_id not in waited:
            return
        self.broker.query_exits(query.query_id, query.exit_codes, failed)
