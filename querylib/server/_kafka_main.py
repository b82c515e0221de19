"""`tq kafka`: a data directory served to Kafka clients by a broker with only its Kafka listener
(a `BrokerServer` that opens no RPC socket, and `BrokerKafka` on its in-process port). So
there is one Kafka backend, the one every tq broker runs: the same admission (a standalone
broker admits anyone to its topics, and only tq itself to `__` topics), durability, frontiers
and group store as `tq up`.

The listener is told its bound address, so Metadata and FindCoordinator send clients back to
it even when the port was chosen by the OS (port 0). The cluster id is made once and kept in
`<data>/.tq-kafka.json` (there is no cluster secret to derive it from).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable

from querylib._pidlock import hold_data_dir
from querylib.kafka._apis import ListenerLimits
from querylib.log import LogConfig
from querylib.server.kafka._broker_backend import KafkaConfig
from querylib.server.kafka._broker_kafka import BrokerKafka
from querylib.server.kafka._group import GroupConfig
from querylib.server.kafka._listener import KafkaListener

from .broker import BrokerLimits, BrokerServer

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
    broker_limits: BrokerLimits | None = None,
    sasl: tuple[str, ...] = (),
) -> AsyncIterator[KafkaListener]:
    """Open the data directory as a broker, listen, and yield the listener (its `backend` is
    a `BrokerBackend`); close both on exit. `sasl`: the mechanisms clients must authenticate
    with (none: every client is anonymous); a principal's password is
    `await listener.backend.password(principal)`, derived from a secret made for this run."""
    # No RPC socket: the secret only keys a server that never binds.
    server = BrokerServer(data_dir, os.urandom(32), log_config=log_config, limits=broker_limits)
    config = KafkaConfig(host=host, port=port, advertised_host=advertised_host,
                         auto_create_topics=auto_create_topics,
                         default_partitions=default_partitions, limits=limits,
                         group_config=group_config, sasl=sasl)
    try:
        await server.start(None)
        kafka = BrokerKafka(server.port, config)
        await kafka.start()
        try:
            assert kafka.listener is not None
            yield kafka.listener
        finally:
            await kafka.close()
    finally:
        await server.close()


def run_kafka(
    data_dir: str,
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    on_ready: Callable[[KafkaListener], None] | None = None,
    **options: object,
) -> int:
    """Serve until SIGINT or SIGTERM (blocking). Returns the exit code. DataDirInUseError,
    naming the holder, when another process runs on `data_dir`."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with serve_local(data_dir, host, port, **options) as listener:  # type: ignore[arg-type]
            if on_ready is not None:
                on_ready(listener)
            await stop.wait()

    with hold_data_dir(data_dir):
        asyncio.run(main())
    return 0
