"""One of this host's brokers as an executor runs it (DESIGN §5, §6): the broker, its optional
endpoints, its catalog view, its keyring, its exit feed and its remembered id and ports. The
agent runs one in its own process (broker 0, on `<data>`); each shard process (`_shard.py`,
`tq executor --brokers N`) runs one on `<data>/broker-<k>`. The same piece both ways.

    host = await HostBroker(data_dir, credential, listen=..., kafka=...).start()
    broker_id = await host.attach(cluster, hostname)   # a session: register, follow the catalog
    ...
    await host.detach()                                # the session is gone: stop following
    await host.stop_serving()                          # endpoints and catalog view
    await host.close()                                 # then the broker

Bound to a wildcard (0.0.0.0), it registers `advertise` (a host: the agent's `--advertise`, by
default the address this host reaches the coordinator from) with the bound port, never the
wildcard (DESIGN §6 "Advertised addresses"); `address` is what it registers.

On start it opens the broker on `<dir>/broker`, on the address it had in the last run where
"any free port" was asked and that address is free (`_broker_id.py`), and its endpoints
(connector endpoint, Kafka listener) likewise. `attach` registers the broker under its
remembered id with the session it is given and follows the catalog through it (the topics'
rules, the brokers for Kafka Metadata, query exits for cohorts); its keyring asks that session
for its clients' keys.

Must not: register an executor, spawn processes, or decide placement (the agent and the
coordinator do).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalog import TqError
from querylib.cluster import AsyncCluster, advertise_endpoint, advertised_host, is_wildcard
from querylib.rpc import BROKER, Credential, PeerUnreachableError, RemoteKeyring
from querylib.server import BrokerEndpoints
from querylib.server.broker import BrokerServer, PartitionRole, ProposeIsr

from ._broker_id import (
    Endpoints,
    follow_remembered_namespace,
    preferred_listen,
    register_remembered,
    remember_endpoints,
    remember_namespace,
    remembered_endpoints,
)
from ._endpoints import CatalogTopics
from ._query_exits import QueryExitFeed

if TYPE_CHECKING:
    from querylib.server.connector import EndpointConfig

__all__ = ["HostBroker"]

logger = logging.getLogger("executor")

_KEY_WAIT = 30.0  # seconds a key request waits for a session with the coordinator


class HostBroker:
    """A broker of this host, with what it needs from the catalog (see the module docstring).

    `connector` (EndpointConfig) and `kafka` (KafkaConfig) open its endpoints; one named in
    `fallback` ("connector", "kafka") whose port is taken opens on another (`endpoints.moved`);
    with `required=False` one whose port is taken is skipped (`endpoints.skipped`)."""

    def __init__(self, data_dir: str | os.PathLike[str], secret: Credential, *,
                 listen: str = "tcp://127.0.0.1:0", connector: EndpointConfig | None = None,
                 kafka: Any = None, required: bool = True,
                 fallback: Collection[str] = (), advertise: str | None = None,
                 slot: int = 0, broker_id: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        # Which of the host's brokers (0: the agent's, k: shard k) and the id it must take
        # (`tq executor --broker-id`, else remembered, else the catalog's: DESIGN §6).
        self.slot = slot
        self.claim = broker_id
        self.secret = secret
        self.listen = listen
        self.advertise = advertise
        self.connector_config = connector
        self.kafka_config = kafka
        self.required = required
        self.fallback = tuple(fallback)
        # The broker checks its clients' keys; the coordinator tells it each principal's
        # (ResolvePrincipal) through the attached session. It knows its own.
        self.keys = RemoteKeyring(self._fetch_key, fetch_curve=self._fetch_curve,
                                  audience=BROKER)
        self.keys.pin(secret.principal, secret.for_audience(BROKER).key)
        self.topics = CatalogTopics()
        self.broker: BrokerServer | None = None
        self.endpoints: BrokerEndpoints | None = None
        self.exit_feed: QueryExitFeed | None = None
        self.address = ""  # what others connect to (registered in the catalog)
        self.bound = ""  # what the broker is bound to
        self.broker_id: int | None = None
        self.cluster: AsyncCluster | None = None
        self._attached = asyncio.Event()
        self._closed = False
        self._proposals: set[asyncio.Task[None]] = set()

    async def start(self) -> HostBroker:
        """Open the broker and its endpoints (on failure, what opened is closed)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            previous = await asyncio.to_thread(remembered_endpoints, self.data_dir)
            await asyncio.to_thread(follow_remembered_namespace, self.data_dir)
            # Its CURVE keypair (when it listens beyond loopback) derives from our key.
            self.broker = BrokerServer(self.data_dir / "broker", self.keys,
                                       directory=self.topics, server_key=self.secret.key)
            self.bound = await self.broker.start(
                self.listen, prefer=preferred_listen(self.listen, previous.broker))
            host, _, _ = self.bound.removeprefix("tcp://").rpartition(":")
            if self.advertise or is_wildcard(host):
                self.address = advertise_endpoint(self.bound, advertised_host(
                    host, advertise=self.advertise))
            else:
                self.address = self.bound
            self.exit_feed = QueryExitFeed(self.broker)
            # Replication (DESIGN §5 "Replication"): a follower fetches with our credential;
            # only the cluster's brokers may fetch from us, each as the replica it is (the
            # principal that registered it, or an admin's); the roles come from the catalog
            # and ISR proposals go back to it.
            self.broker.replication.credential = self.secret
            self.broker.replication.may_replicate = self.topics.may_replicate
            self.broker.replication.on_isr_proposal = self._propose_isr
            port = self.broker.port
            self.topics.watch_replicas(self._set_role,
                                       holds=lambda topic, partition: port.hosts(
                                           (topic, partition)))
            # The endpoints outlive sessions: `CatalogTopics` answers once a session attaches.
            # The connector cookie and the Kafka cluster id derive from the key we hold (the
            # cluster secret for an admin's executor, as in tq up).
            self.endpoints = await BrokerEndpoints(
                self.broker, self.secret.key, connector=self.connector_config,
                kafka=self.kafka_config, kafka_cluster=self.topics, required=self.required,
                fallback=self.fallback, locate=self.topics.locate, credential=self.secret,
                previous={"connector": previous.connector, "kafka": previous.kafka}).start()
            await asyncio.to_thread(remember_endpoints, self.data_dir, Endpoints(
                self.bound, self.connector_address or "", self.kafka_address or ""))
        except BaseException:
            await self.close()
            raise
        return self

    @property
    def connector_address(self) -> str | None:
        """HOST:PORT of the connector endpoint, if it has one."""
        return None if self.endpoints is None else self.endpoints.connector_address

    @property
    def kafka_address(self) -> str | None:
        """HOST:PORT of the Kafka listener, if it has one."""
        return None if self.endpoints is None else self.endpoints.kafka_address

    async def attach(self, cluster: AsyncCluster, host: str) -> int:
        """Register the broker (its remembered id) through `cluster`, a started session, and
        follow the catalog through it; its broker id."""
        await asyncio.to_thread(remember_namespace, self.data_dir)
        broker = await register_remembered(cluster, self.data_dir, host, self.address,
                                           kafka_address=self.kafka_address or "",
                                           curve_key=self.broker.public_key
                                           if self.broker is not None else "",
                                           slot=self.slot, claim=self.claim)
        self.broker_id = broker.broker_id
        await self.topics.close()  # a previous session's catalog view
        self.topics.attach(cluster, broker.broker_id,
                           follow=self.endpoints is not None and (
                               self.endpoints.kafka is not None
                               or self.endpoints.connector is not None))
        if self.exit_feed is not None:
            self.exit_feed.attach(cluster)
        self.cluster = cluster
        self._attached.set()
        return broker.broker_id

    async def _set_role(self, topic: str, partition: int, role: PartitionRole | None,
                        min_insync: int) -> None:
        if self.broker is not None and self.broker_id is not None:
            await self.broker.replication.set_role(topic, partition, role,
                                               broker_id=self.broker_id,
                                               min_insync=min_insync)

    def _propose_isr(self, proposal: ProposeIsr) -> None:
        """Send a leader's ISR proposal to the controller (AlterPartition). Refused or lost,
        it changes nothing: the leader proposes again from the role the catalog gives it, or
        the same again `BrokerLimits.isr_proposal_retry` later."""
        topic = self.topics.topic_named(proposal.partition[0])
        cluster, broker_id = self.cluster, self.broker_id
        if topic is None or cluster is None or broker_id is None:
            return

        async def send() -> None:
            try:
                await cluster.alter_partition(
                    topic.topic_id, proposal.partition[1], broker_id, proposal.leader_epoch,
                    proposal.expected_isr, proposal.isr)
            except TqError as exc:
                logger.info("ISR of %s-%d not changed: %s", *proposal.partition, exc)

        task = asyncio.get_running_loop().create_task(send(), name="AlterPartition")
        self._proposals.add(task)
        task.add_done_callback(self._proposals.discard)

    async def detach(self) -> None:
        """The session is gone: key requests wait for the next one; stop following."""
        self._attached.clear()
        self.cluster = None
        await self.topics.close()
        if self.exit_feed is not None:
            await self.exit_feed.close()

    async def _fetch_key(self, principal: str) -> bytes | None:
        """A principal's broker key, from the coordinator (waits for a session, bounded); None
        when the coordinator says it does not exist."""
        return await (await self._session()).resolve_principal(principal)

    async def _fetch_curve(self, public: bytes) -> tuple[str, bytes] | None:
        """Whose CURVE key `public` is, and that principal's broker key, from the coordinator
        (waits for a session, bounded)."""
        return await (await self._session()).resolve_curve_key(public)

    async def _session(self) -> AsyncCluster:
        """The coordinator session keys are asked through, once attached (waiting at most
        _KEY_WAIT). PeerUnreachableError without a live one: not knowing whether a principal
        exists, the broker must not refuse it."""
        try:
            await asyncio.wait_for(self._attached.wait(), _KEY_WAIT)
        except TimeoutError:
            raise PeerUnreachableError("no coordinator session to ask for keys yet") from None
        cluster = self.cluster
        if cluster is None or cluster.lost:
            raise PeerUnreachableError("the coordinator session to ask for keys was lost")
        return cluster

    async def stop_serving(self) -> None:
        """Close the endpoints and the catalog view (the broker still runs). Idempotent."""
        if self.endpoints is not None:
            await self.endpoints.close()
        await self.topics.close()
        if self.exit_feed is not None:
            await self.exit_feed.close()

    async def close(self) -> None:
        """Close everything, the broker last. Idempotent."""
        await self.stop_serving()
        if self.broker is not None and not self._closed:
            self._closed = True
            await self.broker.close()
