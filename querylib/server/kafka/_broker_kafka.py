"""BrokerKafka: a broker's Kafka listener, `BrokerBackend` behind a `KafkaListener`, opened on a
running BrokerServer's port by `querylib.broker.BrokerEndpoints` (`--kafka-port`) and by
`tq kafka` (`_run.py`).

    kafka = BrokerKafka(server.port, KafkaConfig(port=9092), secret=secret,
                        cluster=catalog_view)
    await kafka.start()          # ListenError if the port cannot be bound
    kafka.address                # "127.0.0.1:9092", what clients bootstrap from
    await kafka.close()          # before server.close()

Must not: outlive its broker, or bind before the backend has replayed `__consumer_offsets`
(the group coordinator restores its groups from it on start).
"""

from __future__ import annotations

from querylib.server.broker import BrokerPort

from ._broker_backend import BrokerBackend, KafkaCluster, KafkaConfig
from ._listener import KafkaListener

__all__ = ["BrokerKafka"]


class BrokerKafka:
    """The Kafka listener of one in-process broker."""

    def __init__(self, port: BrokerPort, config: KafkaConfig | None = None, *,
                 secret: bytes | None = None, cluster: KafkaCluster | None = None) -> None:
        self.config = config = config or KafkaConfig()
        self.backend = BrokerBackend(port, config, secret=secret, cluster=cluster)
        self.listener: KafkaListener | None = None

    @property
    def address(self) -> str:
        """HOST:PORT Kafka clients are told to connect to."""
        assert self.listener is not None, "start the listener first"
        return f"{self.config.advertised}:{self.listener.port}"

    async def start(self) -> BrokerKafka:
        await self.backend.open()
        listener = KafkaListener(self.backend, self.config.host, self.config.port,
                                 limits=self.config.limits,
                                 group_config=self.config.group_config,
                                 sasl=self.config.sasl, ssl_context=self.config.ssl_context)
        await listener.start()
        self.listener = listener
        self.backend.advertise(listener.port)
        return self

    async def close(self) -> None:
        """Stop the listener (its connections end), then the backend. Idempotent."""
        listener, self.listener = self.listener, None
        try:
            if listener is not None:
                await listener.stop()
        finally:
            await self.backend.close()
