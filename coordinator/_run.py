"""Running the coordinator in the foreground (`tq coordinator`): the process's event loop, its
signals, and the connection file. Nothing else lives here.

Before anything else it claims `$TQ_HOME` (`claim_cluster_file`): a second cluster under the
same TQ_HOME is refused, naming the first, and never touches its cluster.json. SIGINT/SIGTERM
close cleanly (queued changes commit, the broker closes its logs); the connection file is
removed if it is still ours. A coordinator that cannot write its catalog topics exits non-zero:
its memory would be ahead of the log, and a restart recovers from the log.

After a restart that recovered sessions of the previous run it says what it waits for (their
recovery lease: executors and clients coming back, and their queries staying as they were
until then), and, once the lease has passed, who came back and which queries failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from catalog import Query, Session, SessionKind, StorageError
from querylib.cluster import (
    ClusterInfo,
    claim_cluster_file,
    remove_cluster_file,
    write_cluster_file,
)

from ._failover import NotActiveError
from ._server import Coordinator
from ._state import CoordinatorConfig

__all__ = ["Attached", "run_coordinator"]

logger = logging.getLogger("coordinator")


def run_coordinator(data_dir: str, listen: str, secret: bytes, secret_file: str, *,
                    broker_listen: str | None = None, config: CoordinatorConfig | None = None,
                    home: str | None = None,
                    on_ready: Callable[[Coordinator], None] | None = None,
                    attach: Attach | None = None,
                    amend: Callable[[ClusterInfo], ClusterInfo] | None = None,
                    kafka: Any = None, fallback: bool = False,
                    name: str = "tq coordinator", advertise: str | None = None,
                    etcd: str | None = None, cluster: str = "tq") -> int:
    """Serve until SIGINT or SIGTERM. Writes `$TQ_HOME/cluster.json` once listening (and once
    `attach` returned: `tq up` starts its executor there; `amend` adds what it opened).
    `attach(coordinator)` returns the coroutine function that stops what it started, run
    before the coordinator closes, or an `Attached` (which may end on its own: then the
    coordinator stops too, with its exit code). `kafka` (a querylib.kafka.KafkaConfig) opens
    the Kafka listener of its broker: the cluster's group coordinator. `fallback`: a taken port of
    `listen` (or the broker's) is replaced by a free one (`Coordinator.moved`). `name` starts
    the lines it prints. `advertise`: the host other hosts reach it at when it listens on a
    wildcard (join tokens name it). `etcd`: failover (the etcd members, `cluster` the key
    prefix): it waits until elected before it serves. ClusterRunningError when a cluster runs
    under this TQ_HOME."""
    claim = claim_cluster_file(home)
    try:
        return asyncio.run(_serve(data_dir, listen, secret, secret_file, broker_listen, config,
                                  home, on_ready, attach, amend, kafka, fallback, name,
                                  advertise, etcd, cluster))
    finally:
        claim.release()


@dataclasses.dataclass
class Attached:
    """What `attach` started (`tq up`'s executor child): `close` stops it; `ended`, when it
    ends on its own, resolves with the exit code the coordinator then stops with."""

    close: Callable[[], Awaitable[None]]
    ended: asyncio.Future[int] | None = None


Attach = Callable[[Coordinator], Awaitable[Callable[[], Awaitable[None]] | Attached]]


async def _serve(data_dir: str, listen: str, secret: bytes, secret_file: str,
                 broker_listen: str | None, config: CoordinatorConfig | None, home: str | None,
                 on_ready: Callable[[Coordinator], None] | None,
                 attach: Attach | None,
                 amend: Callable[[ClusterInfo], ClusterInfo] | None = None,
                 kafka: Any = None, fallback: bool = False,
                 name: str = "tq coordinator", advertise: str | None = None,
                 etcd: str | None = None, cluster: str = "tq") -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    coordinator = Coordinator(data_dir, secret, listen=listen, broker_listen=broker_listen,
                              config=config, kafka=kafka, fallback=fallback,
                              advertise=advertise, etcd=etcd, cluster=cluster)
    wrote = False
    detach: Callable[[], Awaitable[None]] | None = None
    ended: asyncio.Future[int] | None = None
    recovery: asyncio.Task[None] | None = None
    try:
        if etcd:
            print(f"{name}: campaigning in etcd ({etcd}); serves once active, a standby "
                  f"until then", file=sys.stderr, flush=True)
        # A standby waits in start() until elected: SIGINT/SIGTERM stop it there too.
        starting = loop.create_task(coordinator.start(), name="coordinator start")
        stopping = loop.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 0
        endpoint = starting.result()
        recovery = _report_recovery(coordinator, name)
        if attach is not None:
            attached = await attach(coordinator)
            if isinstance(attached, Attached):
                detach, ended = attached.close, attached.ended
            else:
                detach = attached
        assert coordinator.state is not None  # started
        info = ClusterInfo(
            coordinator=endpoint, secret_file=str(Path(secret_file).resolve()),
            catalog_broker=coordinator.state.catalog_broker,
            pid=os.getpid(), host=coordinator.host, data=str(Path(data_dir).resolve()),
            coordinator_key=coordinator.public_key)
        write_cluster_file(amend(info) if amend is not None else info, home)
        wrote = True
        if on_ready is not None:
            on_ready(coordinator)
        failed = loop.create_task(coordinator.failed.wait())
        stopped = loop.create_task(stop.wait())
        waits: set[asyncio.Future[Any]] = {failed, stopped}
        if ended is not None:
            waits.add(ended)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in (failed, stopped):
            task.cancel()
        if ended is not None and ended.done() and not stopped.done():
            return ended.result()
        if isinstance(coordinator.failure, NotActiveError):
            print(f"tq coordinator: stopping: {coordinator.failure}", file=sys.stderr,
                  flush=True)
            return NotActiveError.exit_code
        if coordinator.failure is not None:
            print(f"tq coordinator: stopping: cannot write the catalog: {coordinator.failure}",
                  file=sys.stderr, flush=True)
            return StorageError.exit_code
    finally:
        if recovery is not None:
            recovery.cancel()
        if wrote:
            remove_cluster_file(os.getpid(), home)
        if detach is not None:
            await detach()
        await coordinator.close()
    return 0


def _report_recovery(coordinator: Coordinator, name: str) -> asyncio.Task[None] | None:
    """Say what a restart waits for: the previous run's sessions, which have the recovery lease
    to come back (an executor's broker, and the queries it ran, wait with them). Then a task
    that says, once the lease has passed, who came back and which queries failed."""
    state = coordinator.state
    assert state is not None
    sessions = [s for s in state.catalog.sessions if isinstance(s, Session)]
    if not sessions:
        return None
    lease = state.config.recovery_lease_ms / 1000
    kinds = _count(s.kind.value for s in sessions)
    live = [q for q in state.catalog.queries if isinstance(q, Query) and not q.state.ended]
    queries = f"; queries {_ids(live)} stay as they were until then" if live else ""
    print(f"{name}: restarted with {_n(len(sessions), 'session')} of the previous run "
          f"({kinds}): waiting up to {lease:g}s (the recovery lease) for them to come back, "
          f"an executor to take its broker back{queries}", file=sys.stderr, flush=True)
    waited = {s.session_id for s in sessions}
    watched = {q.query_id for q in live}
    return asyncio.get_running_loop().create_task(
        _recovery_outcome(coordinator, name, lease, waited, watched), name="recovery report")


async def _recovery_outcome(coordinator: Coordinator, name: str, lease: float,
                            waited: set[int], watched: set[int]) -> None:
    # A timer, not a race: the lease is a fixed length from the restart; a tick after it
    # the coordinator has expired whoever did not renew.
    await asyncio.sleep(lease + 1.0)
    state = coordinator.state
    assert state is not None
    sessions = {s.session_id: s for s in state.catalog.sessions if isinstance(s, Session)}
    back = [sessions[i] for i in sorted(waited) if i in sessions]
    gone = len(waited) - len(back)
    failed = [q for q in state.catalog.queries
              if isinstance(q, Query) and q.query_id in watched and q.state.ended]
    ended = f"; queries {_ids(failed)} ended with them" if failed and gone else ""
    executors = sum(1 for s in back if s.kind is SessionKind.EXECUTOR)
    print(f"{name}: recovery lease over: {_n(len(back), 'session')} of the previous run came "
          f"back ({_n(executors, 'executor')}), {gone} gone (expired, or closed by the "
          f"executor that took over its data){ended}", file=sys.stderr, flush=True)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _count(kinds: Any) -> str:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(_n(n, kind) for kind, n in sorted(counts.items()))


def _ids(queries: list[Query]) -> str:
    return ", ".join(str(q.query_id) for q in sorted(queries, key=lambda q: q.query_id))
