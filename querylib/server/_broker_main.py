"""Running a standalone broker in the foreground (`tq broker`), with its optional connector
endpoint and Kafka listener, and small blocking helpers the commands use. Signal handling and
the process's event loop live here, nowhere else.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from querylib._pidlock import hold_data_dir
from querylib.log import LogConfig
from querylib.server.broker import BrokerLimits, BrokerServer

from ._endpoints import BrokerEndpoints

if TYPE_CHECKING:
    from .connector import EndpointConfig

__all__ = ["run_broker"]


def run_broker(data_dir: str, listen: str, secret: bytes, *,
               log_config: LogConfig | None = None, limits: BrokerLimits | None = None,
               on_ready: Callable[[str], None] | None = None,
               connector: EndpointConfig | None = None, kafka: Any = None,
               on_endpoints: Callable[[BrokerEndpoints], None] | None = None) -> int:
    """Serve until SIGINT or SIGTERM, then close cleanly (queued appends finish, logs get
    their clean-shutdown marker). `on_ready(endpoint)` runs once listening. `connector` (a
    querylib.connector.EndpointConfig) opens the connector endpoint, `kafka` (a
    querylib.kafka.KafkaConfig) the Kafka listener; `on_endpoints` is told where they bound.
    A standalone broker has no catalog: topics are created as the endpoints' configs allow.
    DataDirInUseError, naming the holder, when another process runs on `data_dir`."""
    with hold_data_dir(data_dir):
        return asyncio.run(_serve(data_dir, listen, secret, log_config, limits, on_ready,
                                  connector, kafka, on_endpoints))


async def _serve(data_dir: str, listen: str, secret: bytes, log_config: LogConfig | None,
                 limits: BrokerLimits | None, on_ready: Callable[[str], None] | None,
                 connector: EndpointConfig | None, kafka: Any,
                 on_endpoints: Callable[[BrokerEndpoints], None] | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = BrokerServer(data_dir, secret, log_config=log_config, limits=limits)
    endpoints: BrokerEndpoints | None = None
    try:
        endpoint = await server.start(listen)
        endpoints = await BrokerEndpoints(server, secret, connector=connector,
                                          kafka=kafka).start()
        if on_ready is not None:
            on_ready(endpoint)
        else:
            print(f"tq broker listening on {endpoint}", file=sys.stderr, flush=True)
        if on_endpoints is not None:
            on_endpoints(endpoints)
        await stop.wait()
    finally:
        try:
            if endpoints is not None:
                await endpoints.close()
        finally:
            await server.close()
    return 0
