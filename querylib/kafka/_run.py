"""Serving a data directory over the Kafka protocol in one process: `LocalBackend` behind a
`KafkaListener` (what `tq kafka` runs, and what the interop tests start).

The backend is told the listener's bound address, so Metadata and FindCoordinator send
clients back to this listener even when the port was chosen by the OS (port 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable

from querylib.kafka._apis import ListenerLimits
from querylib.kafka._backend import BrokerInfo
from querylib.kafka._group import GroupConfig
from querylib.kafka._local import LocalBackend
from querylib.kafka._server import KafkaListener
from querylib.log import LogConfig

__all__ = ["run_kafka", "serve_local"]


@contextlib.asynccontextmanager
async def serve_local(
    data_dir: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    advertised_host: str | None = None,
    log_config: LogConfig | None = None,
    limits: ListenerLimits | None = None,
    group_config: GroupConfig | None = None,
    auto_create_topics: bool = True,
    default_partitions: int = 1,
) -> AsyncIterator[KafkaListener]:
    """Open the data directory, listen, and yield the listener; close both on exit."""
    backend = await LocalBackend.open(data_dir, log_config=log_config,
                                      auto_create_topics=auto_create_topics,
                                      default_partitions=default_partitions)
    try:
        listener = KafkaListener(backend, host, port, limits=limits, group_config=group_config)
        await listener.start()
        advertised = advertised_host or (host if host not in ("0.0.0.0", "::", "") else
                                         "127.0.0.1")
        backend.advertise(BrokerInfo(0, advertised, listener.port))
        try:
            yield listener
        finally:
            await listener.stop()
    finally:
        await backend.close()


def run_kafka(
    data_dir: str,
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    on_ready: Callable[[KafkaListener], None] | None = None,
    **options: object,
) -> int:
    """Serve until SIGINT or SIGTERM (blocking). Returns the exit code."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with serve_local(data_dir, host, port, **options) as listener:  # type: ignore[arg-type]
            if on_ready is not None:
                on_ready(listener)
            await stop.wait()

    asyncio.run(main())
    return 0
