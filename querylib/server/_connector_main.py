"""A broker with its connector endpoint, as `python -m querylib.connector` and the connector
benchmark run it (`tq broker --connector-port` goes through `querylib.broker.run_broker`,
which opens the same endpoint through `BrokerEndpoints`).

Signal handling and the event loop of the process live here; nothing else does.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from querylib.log import LogConfig
from querylib.server.connector._endpoint import ConnectorEndpoint, EndpointConfig

from .broker import BrokerLimits, BrokerServer

__all__ = ["run_connector_broker", "serve_connector_broker"]


async def serve_connector_broker(data_dir: str, listen: str, secret: bytes,
                                 config: EndpointConfig, *, log_config: LogConfig | None = None,
                                 limits: BrokerLimits | None = None,
                                 on_ready: Callable[[str, tuple[str, int]], None] | None = None,
                                 stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set; close the endpoint, then the broker."""
    stop = stop or asyncio.Event()
    server = BrokerServer(data_dir, secret, log_config=log_config, limits=limits)
    endpoint: ConnectorEndpoint | None = None
    try:
        address = await server.start(listen)
        endpoint = ConnectorEndpoint(server.port, config, secret=secret)
        bound = await endpoint.start()
        if on_ready is not None:
            on_ready(address, bound)
        await stop.wait()
    finally:
        try:
            if endpoint is not None:
                await endpoint.close()
        finally:
            await server.close()


def run_connector_broker(data_dir: str, listen: str, secret: bytes, config: EndpointConfig, *,
                         log_config: LogConfig | None = None,
                         on_ready: Callable[[str, tuple[str, int]], None] | None = None) -> int:
    """Serve until SIGINT or SIGTERM, then close cleanly."""

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_connector_broker(data_dir, listen, secret, config, log_config=log_config,
                                     on_ready=on_ready, stop=stop)

    asyncio.run(serve())
    return 0
