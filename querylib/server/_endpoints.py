"""The optional listeners of a broker process (DESIGN §8): the connector endpoint and the Kafka
listener, opened on a running `BrokerServer` and closed before it.

    endpoints = await BrokerEndpoints(server, secret, connector=EndpointConfig(port=7600),
                                      kafka=KafkaConfig(port=9092)).start()
    endpoints.connector_address        # "127.0.0.1:7600"
    endpoints.kafka_address            # "127.0.0.1:9092"
    ...
    await endpoints.close()            # then server.close()

Their packages are imported only when one is asked for, so a broker that opens neither never
loads them. A listener named in `fallback` (what `tq up` does for its default ports, 7600 and
9092) whose port is taken listens on another instead (the previous run's, else any free one),
and `moved` says so. With `required=False` a listener whose port is taken is skipped and said so
in `skipped`, and the broker serves on without it; otherwise the bind failure is a
`ListenError`. A listener asked for "any free port" (0) first tries the port named in
`previous` (what the last run bound, so clients find it where they left it), then any.

Both reach the broker only through its public door, `server.port` (`BrokerPort`): its core
admits their writers as it admits RPC clients.

Must not: decide which topics may be written or created where (the broker's core does, with
its directory), or touch the broker's internals.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from catalog.errors import UserError

if TYPE_CHECKING:
    from querylib.server.broker import BrokerServer

    from .connector import ConnectorEndpoint, EndpointConfig

__all__ = ["BrokerEndpoints", "EndpointUnavailableError"]

logger = logging.getLogger("querylib.broker")


class EndpointUnavailableError(UserError):
    """A listener could not bind its port (taken, or not ours to bind)."""


@dataclass(frozen=True)
class _Skipped:
    name: str
    port: int
    flag: str
    reason: str

    def __str__(self) -> str:
        return (f"port {self.port} for the {self.name} is not available ({self.reason}); "
                f"choose another with {self.flag} PORT (0: any free port, -1: none)")


class BrokerEndpoints:
    """The connector endpoint and the Kafka listener of one in-process broker, each optional."""

    def __init__(self, server: BrokerServer, secret: bytes, *,
                 connector: EndpointConfig | None = None, kafka: Any = None,
                 kafka_cluster: Any = None, required: bool = True,
                 previous: Mapping[str, str] | None = None,
                 fallback: Collection[str] = (), locate: Any = None,
                 credential: Any = None) -> None:
        """`previous`: {"connector": HOST:PORT, "kafka": HOST:PORT} of the last run;
        `fallback`: the names ("connector", "kafka") whose taken port is replaced;
        `locate` and `credential`: the connector endpoint reaches the host's other brokers
        (`querylib.server.connector.Partitions`)."""
        self.server = server
        self.locate = locate
        self.credential = credential
        self.secret = secret
        self.connector_config = connector
        self.kafka_config = kafka
        self.kafka_cluster = kafka_cluster
        self.required = required
        self.previous = dict(previous or {})
        self.connector: ConnectorEndpoint | None = None
        self.kafka: Any = None  # a querylib.kafka.BrokerKafka once started
        self.connector_address: str | None = None
        self.kafka_address: str | None = None
        self.skipped: list[str] = []
        self.fallback = frozenset(fallback)
        self.moved: dict[str, int] = {}  # name -> the port asked for, which was taken

    async def start(self) -> BrokerEndpoints:
        try:
            if self.connector_config is not None:
                await self._start_connector(self.connector_config)
            if self.kafka_config is not None:
                await self._start_kafka(self.kafka_config)
        except BaseException:
            await self.close()
            raise
        return self

    def _candidates(self, config: Any, name: str) -> list[Any]:
        """The configs to try in turn: with any free port (0), the previous run's port first;
        with a fallback, the port asked for, then the previous run's, then any free one."""
        port = self.previous.get(name, "").rpartition(":")[2]
        previous = int(port) if port.isdigit() and 0 < int(port) < 65536 else None
        if config.port != 0 and name in self.fallback:
            ports = [config.port, previous, 0]
        elif config.port == 0:
            ports = [previous, 0]
        else:
            return [config]
        tried = list(dict.fromkeys(p for p in ports if p is not None))
        return [config if p == config.port else dataclasses.replace(config, port=p)
                for p in tried]

    def _bound(self, name: str, config: Any, candidate: Any) -> None:
        if candidate is not config and config.port != 0:
            self.moved[name] = config.port

    async def _start_connector(self, config: EndpointConfig) -> None:
        from .connector import ConnectorEndpoint

        candidates = self._candidates(config, "connector")
        for candidate in candidates:
            endpoint = ConnectorEndpoint(self.server.port, candidate, secret=self.secret,
                                         locate=self.locate, credential=self.credential)
            try:
                host, port = await endpoint.start()
            except OSError as exc:
                await endpoint.close()
                if candidate is not candidates[-1]:
                    continue  # taken: the next candidate
                self._unavailable(_Skipped("connector endpoint", config.port,
                                           "--connector-port", exc.strerror or str(exc)))
                return
            self.connector = endpoint
            self.connector_address = f"{host}:{port}"
            self._bound("connector", config, candidate)
            return

    async def _start_kafka(self, config: Any) -> None:
        from querylib.kafka import ListenError

        from .kafka import BrokerKafka

        candidates = self._candidates(config, "kafka")
        for candidate in candidates:
            kafka = BrokerKafka(self.server.port, candidate, secret=self.secret,
                                cluster=self.kafka_cluster)
            try:
                await kafka.start()
            except ListenError as exc:
                await kafka.close()
                if candidate is not candidates[-1]:
                    continue
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                self._unavailable(_Skipped("Kafka listener", config.port, "--kafka-port",
                                           reason))
                return
            self.kafka = kafka
            self.kafka_address = kafka.address
            self._bound("kafka", config, candidate)
            return

    def _unavailable(self, skipped: _Skipped) -> None:
        if self.required:
            raise EndpointUnavailableError(str(skipped))
        # Info, not a warning: whoever asked for required=False reports `skipped` (tq up
        # prints it), and a warning would say it a second time.
        logger.info("%s", skipped)
        self.skipped.append(str(skipped))

    async def close(self) -> None:
        """Close the listeners (their appends settle). Idempotent; before `server.close()`."""
        kafka, self.kafka = self.kafka, None
        connector, self.connector = self.connector, None
        try:
            if kafka is not None:
                await kafka.close()
        finally:
            if connector is not None:
                await connector.close()
