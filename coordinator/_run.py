"""Running the coordinator in the foreground (`tq coordinator`): the process's event loop, its
signals, and the connection file. Nothing else lives here.

SIGINT/SIGTERM close cleanly (queued changes commit, the broker closes its logs); the
connection file is removed if it is still ours. A coordinator that cannot write its catalog
topics exits non-zero: its memory would be ahead of the log, and a restart recovers from the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from catalog import StorageError
from querylib.cluster import ClusterInfo, remove_cluster_file, write_cluster_file

from ._server import Coordinator
from ._state import CoordinatorConfig

__all__ = ["run_coordinator"]

logger = logging.getLogger("coordinator")


def run_coordinator(data_dir: str, listen: str, secret: bytes, secret_file: str, *,
                    broker_listen: str | None = None, config: CoordinatorConfig | None = None,
                    home: str | None = None,
                    on_ready: Callable[[Coordinator], None] | None = None,
                    attach: Attach | None = None,
                    amend: Callable[[ClusterInfo], ClusterInfo] | None = None,
                    kafka: Any = None) -> int:
    """Serve until SIGINT or SIGTERM. Writes `$TQ_HOME/cluster.json` once listening (and once
    `attach` returned: `tq up` starts its executor there; `amend` adds what it opened).
    `attach(coordinator)` returns the coroutine function that stops what it started, run
    before the coordinator closes. `kafka` (a querylib.kafka.KafkaConfig) opens the Kafka
    listener of its broker: the cluster's group coordinator."""
    return asyncio.run(_serve(data_dir, listen, secret, secret_file, broker_listen, config,
                              home, on_ready, attach, amend, kafka))


Attach = Callable[[Coordinator], Awaitable[Callable[[], Awaitable[None]]]]


async def _serve(data_dir: str, listen: str, secret: bytes, secret_file: str,
                 broker_listen: str | None, config: CoordinatorConfig | None, home: str | None,
                 on_ready: Callable[[Coordinator], None] | None,
                 attach: Attach | None,
                 amend: Callable[[ClusterInfo], ClusterInfo] | None = None,
                 kafka: Any = None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    coordinator = Coordinator(data_dir, secret, listen=listen, broker_listen=broker_listen,
                              config=config, kafka=kafka)
    wrote = False
    detach: Callable[[], Awaitable[None]] | None = None
    try:
        endpoint = await coordinator.start()
        if attach is not None:
            detach = await attach(coordinator)
        info = ClusterInfo(
            coordinator=endpoint, secret_file=str(Path(secret_file).resolve()),
            catalog_broker=coordinator.state.catalog_broker,  # type: ignore[union-attr]
            pid=os.getpid(), host=coordinator.host, data=str(Path(data_dir).resolve()))
        write_cluster_file(amend(info) if amend is not None else info, home)
        wrote = True
        if on_ready is not None:
            on_ready(coordinator)
        failed = loop.create_task(coordinator.failed.wait())
        stopped = loop.create_task(stop.wait())
        await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (failed, stopped):
            task.cancel()
        if coordinator.failure is not None:
            print(f"tq coordinator: stopping: cannot write the catalog: {coordinator.failure}",
                  file=sys.stderr, flush=True)
            return StorageError.exit_code
    finally:
        if wrote:
            remove_cluster_file(os.getpid(), home)
        if detach is not None:
            await detach()
        await coordinator.close()
    return 0
