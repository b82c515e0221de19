"""The coordinator's asyncio shell around the pure `CoordinatorState` (DESIGN §2, §3).

    coordinator = Coordinator("/data", secret, listen="tcp://127.0.0.1:7400")
    endpoint = await coordinator.start()      # recover, start the broker, bootstrap, listen
    ...
    await coordinator.close()

One event loop. Every request becomes a `Received` stimulus whose token is the future the RPC
handler awaits; the core's instructions are performed here: `Persist` goes to the catalog
writer, `Respond` resolves the future, `KillProcesses`, `SpawnProcesses` and `DropPartitions`
become notifies to the executors, uploads and fetches of program packs go to the
`ArtifactStore` directly, `SessionEnded` drops the session's transport identity. Commits come
back as `Committed`, time as `Tick`. The shell decides nothing the core decides, and owns every
task it starts: the ticker, the writer's tasks, the embedded broker, the RPC server.

Start-up order: read the catalog topics straight from the broker's data directory (before the
broker opens them), start the broker, append recovery's compensation and wait for it, open the
broker's Kafka listener (the cluster's group coordinator, coordinator/_kafka.py) when asked,
on the previous run's port when "any free port" was asked and that one is free, then
bootstrap (register this broker with the listener's address, create missing catalog topics),
then listen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from catalog import (
    ADMIN,
    SYSTEM_PRINCIPAL,
    Catalog,
    ConflictError,
    NotAuthorizedError,
    StorageError,
    Topic,
    UnknownSessionError,
    Update,
    consolidate_updates,
    is_executor,
    join_principal,
    known_principal,
    may_read_program,
    token_of_principal,
)
from querylib._pidlock import PidLock
from querylib.cluster import hold_data_dir
from querylib.cluster import messages as m
from querylib.driver import Driver
from querylib.log import LogConfig
from querylib.rpc import (
    BROKER,
    AddressError,
    Context,
    InternalServerError,
    Limits,
    MasterKeyring,
    PeerBusyError,
    PeerUnreachableError,
    RpcServer,
    seal,
)
from querylib.server import BrokerEndpoints
from querylib.server.broker import BrokerServer

from ._artifacts import ArtifactStore
from ._directory import CatalogDirectory
from ._etcd_state import EtcdStateTopic
from ._events import (
    Bootstrap,
    Checkpointed,
    Committed,
    DropPartitions,
    KillProcesses,
    Persist,
    Received,
    Respond,
    SessionEnded,
    SpawnProcesses,
    Stimulus,
    Tick,
    WriteCheckpoint,
)
from ._failover import EtcdCatalog, NotActiveError
from ._handlers import HANDLERS, MintToken
from ._journal import Recovered, TimedUpdate, read_catalog
from ._namespace import settle_namespace
from ._standby import WarmStandby
from ._state import CoordinatorConfig, CoordinatorState
from ._writer import CatalogWriter

if TYPE_CHECKING:
    from ._kafka import CatalogView

__all__ = ["Coordinator"]

logger = logging.getLogger("coordinator")

# What the coordinator's ROUTER accepts (DESIGN §2 "Limits"): its requests are small but for
# program uploads, which come a chunk at a time. ZMQ_MAXMSGSIZE refuses a bigger frame from its
# announced size, before buffering it; zmq queues at most 32 messages per client connection.
RPC_LIMITS = Limits(max_receive_bytes=m.ARTIFACT_CHUNK_BYTES + 3 * 1024 * 1024, recv_hwm=32)


# How long an executor's broker may keep a principal key it asked for: a removed user or a
# rotated key stops working at brokers within this (at the coordinator at once).
PRINCIPAL_KEY_TTL_MS = 30_000


def _with_key(reply: m.UserCredential, sealed: bytes) -> m.UserCredential:
    return msgspec.structs.replace(reply, sealed_key=sealed)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class _Token:
    """What the core hands back in a Respond: who asked, and the future its answer resolves.
    A request the core answers while it handles it (a heartbeat) is answered before its RPC
    handler returns, and the RPC server replies at once (a direct handler: no task)."""

    __slots__ = ("future", "peer", "principal")

    def __init__(self, peer: bytes, principal: str, future: asyncio.Future[Any]) -> None:
        self.peer = peer
        self.principal = principal
        self.future = future

    def answer(self, reply: Any, error: BaseException | None) -> None:
        # Done: answered before (the first answer stands: a bug after a Respond answers
        # again), or the handler hit its deadline and the RPC server cancelled it.
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(reply)


class _LocalContext:
    """What `_serve` reads of an RPC context, for a request made inside this process."""

    peer = b""
    principal = ADMIN


class Coordinator:
    """The control-plane server: catalog, sessions, the catalog topics and their broker."""

    def __init__(self, data_dir: str | os.PathLike[str], secret: bytes, *,
                 listen: str = "tcp://127.0.0.1:7400", broker_listen: str | None = None,
                 host: str | None = None, config: CoordinatorConfig | None = None,
                 tick_interval: float = 0.05, kafka: Any = None,
                 fallback: bool = False, advertise: str | None = None,
                 etcd: str | None = None, cluster: str = "tq") -> None:
        self.data_dir = os.fspath(data_dir)
        # Failover (DESIGN §3 "Coordinator failover"): with etcd it serves only once elected.
        self.failover: EtcdCatalog | None = None
        if etcd:
            config = dataclasses.replace(config or CoordinatorConfig(), spare_broker=False)
            self.failover = EtcdCatalog(etcd, cluster, lease=config.active_lease_ms / 1000)
        self._lost: asyncio.Task[None] | None = None
        self.standby: WarmStandby | None = None  # with failover, once started
        self.broker_dir = os.path.join(self.data_dir, "broker")
        self.listen = listen
        self.broker_listen = broker_listen or _next_port(listen)
        self._broker_port_derived = broker_listen is None
        # With `fallback` (tq up on its default ports) a taken port of `listen` or of the
        # broker's is replaced by any free one; `moved` says which: {what: asked endpoint}.
        self.fallback = fallback
        self.moved: dict[str, str] = {}
        self.host = host or socket.gethostname()
        # The host others reach this coordinator and its catalog broker at, when they are
        # bound to a wildcard (default: this host name's address; DESIGN §9 "Starting").
        self.advertise = advertise
        self.config = config or CoordinatorConfig()
        self.tick_interval = tick_interval
        self.kafka_config = kafka  # a querylib.kafka.KafkaConfig: the group coordinator
        self.endpoints: BrokerEndpoints | None = None
        self._secret = secret
        self.state: CoordinatorState | None = None
        self.broker: BrokerServer | None = None
        self.writer: CatalogWriter | None = None
        # Every principal's key derives from the secret; the catalog says which exist now
        # (DESIGN §12). A client with another secret is told so (an executor then stops, not
        # retries).
        self.keys = MasterKeyring(secret, valid=self._generation, principals=self._principals)
        self._broker_keys = MasterKeyring(secret, audience=BROKER,
                                          valid=self._broker_generation,
                                          principals=self._principals)
        self._rpc = RpcServer(self.keys, limits=RPC_LIMITS)
        self.request_stats = self._rpc.stats  # what it served (the metrics read it)
        self._peers: dict[int, bytes] = {}  # session id -> ROUTER identity of its client
        self._driver: Driver | None = None  # once the core exists (start)
        self._ticker: asyncio.Task[None] | None = None
        self.failed = asyncio.Event()  # set when the catalog log cannot be written
        self.failure: BaseException | None = None
        self.endpoint: str | None = None
        self.broker_endpoint: str | None = None
        self.recovered: Recovered | None = None
        self.recovery_seconds = 0.0
        self.takeover_seconds = 0.0  # with failover: elected -> serving
        self.counters = {"notify_failed": 0, "bugs": 0}
        self._kafka_view: CatalogView | None = None
        self._directory: CatalogDirectory | None = None
        self._closed = False
        self._data_lock: PidLock | None = None
        for request_type in HANDLERS:
            self._rpc.register_direct(request_type, self._serve)
        self.artifacts = ArtifactStore(os.path.join(self.data_dir, "artifacts"))
        # One upload's start at a time counts what is held and reserves its room, so uploads
        # that start at once each see the others (their checks await the disk).
        self._upload_room = asyncio.Lock()
        self._rpc.register(m.UploadArtifact, self._upload)
        self._rpc.register(m.FetchArtifact, self._fetch)
        self._rpc.register(m.ResolvePrincipal, self._resolve_principal)
        self._rpc.register_direct(m.CreateToken, self._create_token)
        self._rpc.register(m.GetGroups, self._groups)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def public_key(self) -> str:
        """Its CURVE public key when it is a CURVE server (it listens beyond loopback, or
        TQ_RPC_CURVE=1), else "": what cluster.json and credential files tell clients."""
        return self._rpc.public_key

    async def consumer_groups(self) -> list[dict[str, Any]]:
        """Every consumer group its broker's Kafka listener coordinates (the cluster's group
        coordinator), as an operator sees them; [] without a listener. On its loop."""
        kafka = self.endpoints.kafka if self.endpoints is not None else None
        listener = kafka.listener if kafka is not None else None
        return [] if listener is None else await listener.groups.overview()

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        os.makedirs(self.broker_dir, exist_ok=True)
        # Held until close: a second coordinator on this data would fight over the catalog
        # topics; it is told which process has them.
        self._data_lock = hold_data_dir(self.data_dir)
        # What a bare topic name means, in this process too, before anything parses one.
        self.namespace = settle_namespace(self.data_dir, self.config.namespace)
        self.recovered = recovered = await loop.run_in_executor(None, read_catalog,
                                                                self.broker_dir)
        taken_over: dict[str, list[TimedUpdate]] = {}
        if self.failover is not None:
            await self.failover.connect()
            # A warm standby: it follows the catalog while it waits.
            self.standby = standby = WarmStandby(self.failover)
            await standby.start()
            logger.info("coordinator: following the catalog in etcd from version %d while "
                        "campaigning", standby.catalog.version)
            try:
                await self.failover.campaign(self.listen)  # waits while another is active
            finally:
                await standby.close()
            elected = time.perf_counter()
            recovered, taken_over = await self._take_over(recovered,
                                                          await standby.take_over())
            self.recovered = recovered
        checkpoint = recovered.checkpoint
        self.state = CoordinatorState(
            recovered.catalog, config=self.config, now=loop.time(),
            checkpoint=None if checkpoint is None else Checkpointed(checkpoint.version,
                                                                    dict(checkpoint.offsets)),
            since_checkpoint=recovered.since_checkpoint)
        state = self.state
        self._driver = self._make_driver(state)
        self._directory = CatalogDirectory(lambda: state.catalog,
                                           lambda: state.catalog_broker_id)
        self.broker = BrokerServer(self.broker_dir, self._broker_keys,
                                   log_config=LogConfig(flush="always"),
                                   directory=self._directory)
        self.broker_endpoint = await self._start_broker()
        self.writer = CatalogWriter(self.broker.port, on_committed=self._on_committed,
                                    on_failed=self._on_failed,
                                    on_checkpointed=self._on_checkpointed,
                                    replica=self.failover)
        await self.writer.start(recovered.catalog.version)
        if recovered.compensation:
            logger.warning("coordinator: taking back %d updates of a change that did not "
                           "commit before the crash",
                           sum(len(u) for u in recovered.compensation.values()))
            await self.writer.append_now(recovered.compensation, _wall_ms())
        if taken_over:  # the local catalog topics catch up with etcd's: counters last
            counters = taken_over.pop("counters", [])
            await self.writer.append_now(taken_over, _wall_ms())
            await self.writer.append_now({"counters": counters}, _wall_ms())
        kafka_address = await self._open_kafka()
        self._feed(Bootstrap(self.host, _advertised(self.broker_endpoint, self.advertise),
                             _wall_ms(), kafka_address=kafka_address,
                             curve_key=self.broker.public_key))
        await self.writer.drain()
        if self._kafka_view is not None:
            self._kafka_view.registered()
        if self.failure is not None:
            raise StorageError(f"cannot write the catalog topics: {self.failure}")
        self.endpoint = await self._start_rpc()
        if self.failover is not None:
            await self.failover.announce(_advertised(self.endpoint, self.advertise))
            self._lost = loop.create_task(self._stop_when_deposed(), name="etcd deposed")
        self._ticker = loop.create_task(self._tick_forever(), name="coordinator ticks")
        self.recovery_seconds = time.perf_counter() - started
        if self.failover is not None:
            self.takeover_seconds = time.perf_counter() - elected
            logger.info("coordinator: serving %.3fs after its election", self.takeover_seconds)
        logger.info("coordinator on %s (catalog broker %s, version %d, %d sessions) in %.2fs",
                    self.endpoint, self.broker_endpoint, self.state.catalog.version,
                    len(self.state.catalog.sessions), self.recovery_seconds)
        return self.endpoint

    async def _start_broker(self) -> str:
        assert self.broker is not None
        if self.fallback:
            endpoint = await self.broker.start(_any_port(self.broker_listen),
                                               prefer=self.broker_listen)
            if _port_of(endpoint) != _port_of(self.broker_listen):
                self.moved["catalog broker"] = self.broker_listen
            return endpoint
        try:
            return await self.broker.start(self.broker_listen)
        except AddressError as exc:
            if not self._broker_port_derived:
                raise
            # The user named one port; say which other one we wanted, and why.
            raise AddressError(
                f"cannot listen on {self.broker_listen} for the catalog broker (the "
                f"coordinator's port + 1): {_reason(exc)}; choose another coordinator port, "
                f"or port 0 for any free ones") from exc

    async def _start_rpc(self) -> str:
        try:
            return await self._rpc.start(self.listen)
        except AddressError:
            if not self.fallback:
                raise
        self.moved["coordinator"] = self.listen
        return await self._rpc.start(_any_port(self.listen))

    async def close(self) -> None:
        """Stop serving, commit what is queued, close the broker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        await self._rpc.close()
        if self.endpoints is not None:
            await self.endpoints.close()
        if self.writer is not None:
            await self.writer.close()
        if self.broker is not None:
            await self.broker.close()
        if self._lost is not None:
            self._lost.cancel()
        if self.failover is not None:
            await self.failover.close()  # resigns: a standby takes over at once
        if self._data_lock is not None:
            self._data_lock.release()

    @property
    def kafka_address(self) -> str | None:
        """HOST:PORT of the group coordinator's Kafka listener, if it has one."""
        return None if self.endpoints is None else self.endpoints.kafka_address

    async def _open_kafka(self) -> str:
        if self.kafka_config is None:
            return ""
        from ._kafka import CatalogView  # imports querylib.kafka: only when a listener opens

        state = self.state
        assert state is not None and self.broker is not None
        from querylib.server.kafka import OFFSETS_TOPIC, TRANSACTIONS_TOPIC

        failover = self.failover
        replicas = {} if failover is None else {
            topic: EtcdStateTopic(failover, topic) for topic in (OFFSETS_TOPIC, TRANSACTIONS_TOPIC)}
        self._kafka_view = CatalogView(lambda: state.catalog, lambda: state.catalog_broker_id,
                                       self.create_ingest_topic, self._serve_as_admin,
                                       replicas=replicas)
        rpc_port = self.listen.rpartition(":")[2]
        address = await self._reopen_kafka(rpc_port)
        if address:
            return address
        for _ in range(3):
            self.endpoints = await BrokerEndpoints(
                self.broker, self._secret, kafka=self.kafka_config,
                kafka_cluster=self._kafka_view).start()
            address = self.endpoints.kafka_address or ""
            # Any free port (0) may be the one the RPC server is about to bind (it binds
            # after bootstrap, which needs this address): take another.
            if address.rpartition(":")[2] != rpc_port:
                break
            await self.endpoints.close()
        return address

    async def _reopen_kafka(self, rpc_port: str) -> str:
        """With "any free port", first the port of the previous run: the catalog's record and
        clients that cached the group coordinator stay right across a restart. "" if taken."""
        from ._kafka import previous_port

        assert self.state is not None and self.broker is not None
        config = self.kafka_config
        previous = previous_port(self.state.catalog, config.advertised) \
            if config.port == 0 else None
        if previous is None or str(previous) == rpc_port:
            return ""
        endpoints = await BrokerEndpoints(
            self.broker, self._secret, kafka=dataclasses.replace(config, port=previous),
            kafka_cluster=self._kafka_view, required=False).start()
        if endpoints.kafka_address:
            self.endpoints = endpoints
            return endpoints.kafka_address
        await endpoints.close()
        return ""

    async def __aenter__(self) -> Coordinator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def rpc_counters(self) -> dict[str, int]:
        return self._rpc.counters

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick_interval)
            self._feed(Tick(loop.time(), _wall_ms()))

    # -- requests ------------------------------------------------------------------------------

    def _serve(self, request: Any, ctx: Context | _LocalContext) -> asyncio.Future[Any]:
        """A catalog request, fed to the core at once (a direct handler of the RPC server:
        no task per request); the future resolves to the core's answer."""
        if self.failure is not None:
            raise StorageError("the coordinator cannot write its catalog and is stopping")
        assert self.state is not None  # requests are served once started
        session_id = getattr(request, "session_id", None)
        if (session_id is not None and self._peers.get(session_id) != ctx.peer
                and self._holds(session_id, ctx.principal)):
            self._peers[session_id] = ctx.peer  # the client may reconnect from a new socket
        return self._ask_core(request, ctx.peer, ctx.principal)

    def _holds(self, session_id: int, principal: str) -> bool:
        """Whether `principal` opened session `session_id`, still leased: then its socket is
        where the session's notifies go. The core refuses a request naming another's session
        (`_check_holder`); such a request must not take the session's notifies either (an
        executor's SpawnProcesses carry programs and sealed query keys)."""
        state = self.state
        assert state is not None
        if session_id not in state.leases:
            return False
        session = state.catalog.find_session(session_id)
        return session is not None and session.principal == principal

    async def create_ingest_topic(self, name: str, partitions: int,
                                  replication_factor: int | None = None) -> Topic:
        """Create an ingest topic for a Kafka client of this coordinator's broker (DESIGN §8):
        the core's in-process request, answered once the catalog change is durable. The
        creator is "system": the coordinator's own listener asked."""
        from ._handlers import CreateIngestTopic

        if self.failure is not None:
            raise StorageError("the coordinator cannot write its catalog and is stopping")
        reply = await self._ask_core(CreateIngestTopic(name, partitions, replication_factor),
                                     b"", SYSTEM_PRINCIPAL)
        return reply.topic

    def _ask_core(self, request: Any, peer: bytes, principal: str) -> asyncio.Future[Any]:
        """Hand `request` to the core; the future of its answer (an error is set as the
        future's exception). Answered already when the core answers at once."""
        loop = asyncio.get_running_loop()
        token = _Token(peer, principal, loop.create_future())
        self._feed(Received(token, request, loop.time(), _wall_ms(), peer, principal))
        return token.future

    async def _serve_as_admin(self, request: Any) -> Any:
        """A request of this process's own Kafka listener (`CatalogView`), as the admin."""
        return await self._serve(request, _LocalContext())

    # -- the state machine loop ----------------------------------------------------------------

    def _feed(self, stimulus: Stimulus) -> None:
        """Hand a stimulus to the core and perform its instructions (`querylib.driver`)."""
        assert self._driver is not None  # stimuli come once started
        self._driver.feed(stimulus)

    def _make_driver(self, state: CoordinatorState) -> Driver:
        return Driver("coordinator", state.handle, {
            Persist: self._persist,
            WriteCheckpoint: self._persist,
            Respond: self._respond,
            KillProcesses: self._kill,
            SpawnProcesses: self._spawn,
            DropPartitions: self._drop,
            SessionEnded: self._session_ended,
        }, on_bug=self._bug, invariants=lambda: state.catalog.check_invariants(),
            logger=logger)

    def _bug(self, stimulus: Stimulus, exc: Exception) -> None:
        """A bug (ours) handling `stimulus`: answer its request, keep serving everyone else."""
        self.counters["bugs"] += 1
        token = getattr(stimulus, "token", None)
        if isinstance(token, _Token):
            token.answer(None, InternalServerError(
                "the coordinator hit a bug handling this request; see its log"))

    def _persist(self, instruction: Persist | WriteCheckpoint) -> None:
        assert self.writer is not None  # the core persists once started
        self.writer.submit(instruction)
        if isinstance(instruction, Persist) and self._directory is not None:
            self._directory.changed(instruction.updates)

    def _session_ended(self, instruction: SessionEnded) -> None:
        self._peers.pop(instruction.session_id, None)
        if instruction.expired:
            logger.info("coordinator: session %d expired", instruction.session_id)
        try:  # a `tq submit` that stopped half way: its upload's room and file go with it
            self.artifacts.abandon(str(instruction.session_id))
        except OSError as exc:
            logger.warning("coordinator: cannot remove the unfinished upload of session %d "
                           "(removed within the hour): %s", instruction.session_id, exc)

    def _respond(self, instruction: Respond) -> None:
        token = instruction.token
        if not isinstance(token, _Token):
            return
        reply = instruction.reply
        if isinstance(reply, m.SessionOpened):
            self._peers[reply.session_id] = token.peer
        elif isinstance(reply, m.CatalogInfo) and self.writer is not None:
            # A follower asks this before it subscribes and waits for a snapshot at
            # reply.version (committed by now): untouched collections must get there too.
            self.writer.catch_up()
        elif isinstance(reply, m.UserCredential):
            # The core holds no key: the new one is derived and sealed here, for the asker.
            key = self.keys.key(reply.user.principal, reply.user.generation)
            asker = self.keys.key(token.principal)
            assert key is not None and asker is not None
            reply = msgspec.structs.replace(_with_key(reply, seal(asker, key)),
                                            coordinator_key=self.public_key)
        elif isinstance(reply, m.TokenMinted):
            # The token's secret is the key of join:ID at its salt: derived, never stored.
            key = self.keys.key(join_principal(reply.token.token_id), reply.token.salt)
            asker = self.keys.key(token.principal)
            assert key is not None and asker is not None
            reply = msgspec.structs.replace(reply, sealed_secret=seal(asker, key),
                                            coordinators=self.advertised_endpoints,
                                            coordinator_key=self.public_key)
        elif isinstance(reply, m.JoinBundle):
            # Sealed with the token's key, in a reply signed with it: only the token's holder
            # reads it, and it knows only the holder of the cluster secret could have made it.
            key = self.keys.key(reply.principal, 0)
            asker = self.keys.key(token.principal)
            assert key is not None and asker is not None
            reply = msgspec.structs.replace(reply, sealed_key=seal(asker, key),
                                            coordinators=self.advertised_endpoints,
                                            coordinator_key=self.public_key)
        token.answer(reply, instruction.error)

    def _kill(self, instruction: KillProcesses) -> None:
        by_session: dict[int, list[int]] = {}
        for process, _executor, session_id in instruction.processes:
            if session_id is not None:
                by_session.setdefault(session_id, []).append(process)
        for session_id, processes in by_session.items():
            peer = self._peers.get(session_id)
            if peer is None:
                continue
            try:
                self._rpc.notify(peer, m.KillProcesses(query_id=instruction.query_id,
                                                       processes=processes,
                                                       reason=instruction.reason))
            except (PeerBusyError, PeerUnreachableError) as exc:
                self.counters["notify_failed"] += 1
                logger.warning("coordinator: cannot tell session %d to kill query %d: %s",
                               session_id, instruction.query_id, exc)

    def _spawn(self, instruction: SpawnProcesses) -> None:
        by_executor: dict[tuple[int, int | None], list[int]] = {}
        for process, executor_id, session_id in instruction.processes:
            by_executor.setdefault((executor_id, session_id), []).append(process)
        for (executor_id, session_id), processes in by_executor.items():
            peer = None if session_id is None else self._peers.get(session_id)
            if session_id is None or peer is None:  # it left (the core failed the query) or
                self.counters["notify_failed"] += 1  # never spoke to us
                continue
            try:
                self._rpc.notify(peer, m.SpawnProcesses(
                    query_id=instruction.query_id, program=instruction.program,
                    processes=processes, process_count=instruction.process_count,
                    workers=instruction.workers, args=list(instruction.args),
                    executor_id=executor_id, name=instruction.name,
                    credential=self._query_credential(instruction.query_id, session_id)))
            except (PeerBusyError, PeerUnreachableError) as exc:
                # The query's start timeout fails it and tells the submitter.
                self.counters["notify_failed"] += 1
                logger.warning("coordinator: cannot ask executor %d to spawn query %d: %s",
                               executor_id, instruction.query_id, exc)

    def _query_credential(self, query_id: int, session_id: int) -> bytes:
        """The key of query `query_id`'s processes, sealed for the executor of `session_id`."""
        assert self.state is not None
        executor = self.keys.key(self.state.catalog.session(session_id).principal)
        key = self.keys.key(f"query:{query_id}", 0)
        assert executor is not None and key is not None
        return seal(executor, key)

    def _generation(self, principal: str) -> int | None:
        """The keyrings' view of the catalog: the principal's key generation, or None when it
        may hold no credential now. A join token's holder's is the token's salt."""
        if principal == ADMIN:
            return 0
        if self.state is None:
            return None
        catalog = self.state.catalog
        if not known_principal(catalog, principal):
            return None
        user = catalog.user(principal)
        if user is not None:
            return user.generation
        token_id = token_of_principal(principal)
        token = None if token_id is None else catalog.find_token(token_id)
        return 0 if token is None else token.salt

    def _broker_generation(self, principal: str) -> int | None:
        """As `_generation`, for brokers: a join token's holder is nobody there."""
        return None if principal.startswith("join:") else self._generation(principal)

    def _create_token(self, request: m.CreateToken, ctx: Context) -> asyncio.Future[Any]:
        """An admin mints a join token: the core gets it with the random salt drawn here."""
        return self._serve(MintToken(request.session_id, request.ttl_ms, request.name,
                                     secrets.randbits(62) + 1), ctx)

    @property
    def advertised_endpoints(self) -> list[str]:
        """Where other hosts reach this coordinator (join tokens name them)."""
        return [] if self.endpoint is None else [_advertised(self.endpoint, self.advertise)]

    def _principals(self) -> Iterator[str]:
        """Every principal that may hold a credential now (a CURVE server's keyring derives
        their public keys): the admin, users and executors, queries that have not ended, and
        join tokens (a joining host connects as `join:ID`; one used or expired is admitted to
        be told so, as over PLAIN)."""
        yield ADMIN
        if self.state is None:
            return
        catalog = self.state.catalog
        for user in catalog.users:
            yield user.principal
        for query in catalog.queries:
            if not query.ended:
                yield f"query:{query.query_id}"
        for token in catalog.tokens:
            yield join_principal(token.token_id)

    def _drop(self, instruction: DropPartitions) -> None:
        peer = self._peers.get(instruction.session_id)
        if peer is None:  # it has not spoken since we started: the core sends it again
            self.counters["notify_failed"] += 1
            return
        try:
            self._rpc.notify(peer, m.DropPartitions(
                topic_id=instruction.topic_id, name=instruction.name,
                broker_id=instruction.broker_id, partitions=list(instruction.partitions)))
        except (PeerBusyError, PeerUnreachableError) as exc:
            self.counters["notify_failed"] += 1
            logger.warning("coordinator: cannot ask broker %d to drop topic %d: %s",
                           instruction.broker_id, instruction.topic_id, exc)

    async def _resolve_principal(self, request: m.ResolvePrincipal,
                                 ctx: Context) -> m.PrincipalKey:
        """An executor's broker asks for a principal's broker key (RemoteKeyring)."""
        self._check_session(request.session_id, ctx.principal)
        assert self.state is not None
        if not is_executor(self.state.catalog, ctx.principal):
            raise NotAuthorizedError(f"{ctx.principal} may not learn other principals' keys")
        principal = request.principal[:100]
        if request.curve_key:  # whose CURVE key is it? (an executor's CURVE broker asks)
            principal = await self._broker_keys.principal_of_curve(request.curve_key) or ""
        key = self._broker_keys.key(principal) if principal else None
        asker = self.keys.key(ctx.principal)
        assert asker is not None
        return m.PrincipalKey(principal=principal,
                              sealed_key=b"" if key is None else seal(asker, key),
                              valid_ms=PRINCIPAL_KEY_TTL_MS)

    async def _groups(self, request: m.GetGroups, ctx: Context) -> m.Groups:
        """The consumer groups `ctx.principal` may describe (Kafka's DescribeGroups rule)."""
        kafka = self.endpoints.kafka if self.endpoints is not None else None
        found = []
        for group in await self.consumer_groups():
            if ctx.principal != ADMIN and (kafka is None or not await kafka.backend.authorize_group(
                    group["group_id"], ctx.principal, claim=False)):
                continue
            found.append(m.GroupInfo(
                group_id=group["group_id"], state=group["state"],
                members=len(group["members"]),
                committed=[m.GroupOffset(topic=c["topic"], partition=c["partition"],
                                         offset=c["offset"]) for c in group["committed"]]))
        return m.Groups(groups=found)

    async def _upload(self, request: m.UploadArtifact, ctx: Context) -> m.ArtifactStored:
        self._check_session(request.session_id, ctx.principal)
        loop = asyncio.get_running_loop()
        upload = str(request.session_id)
        if request.offset == 0:
            await self._room_for_upload(request.sha256, upload, request.size, ctx.principal)
        held = await loop.run_in_executor(
            None, self.artifacts.receive, request.sha256, upload,
            request.offset, request.size, ctx.payload)
        if held == request.size and self.state is not None:  # stored whole, digest checked
            # Counted as stored before it stops counting as reserved: no room check between.
            self.state.uploaded(f"sha256:{request.sha256}", ctx.principal)
            self.artifacts.release(upload)
        return m.ArtifactStored(sha256=request.sha256, size=held)

    async def _room_for_upload(self, digest: str, upload: str, size: int,
                               principal: str) -> None:
        """As `upload` (a session of `principal`) starts a pack of `size` bytes: remove the
        stored packs no live query runs an hour after they were stored, then refuse the
        upload if it would take `principal` (not an admin nor an executor) past its room for
        packs no query runs, counting what its other unfinished uploads declared; else
        reserve the room it declared."""
        assert self.state is not None
        catalog, uploads = self.state.catalog, self.state.uploads
        loop = asyncio.get_running_loop()
        async with self._upload_room:
            running = {q.program.removeprefix("sha256:") for q in catalog.queries
                       if not q.ended}
            for gone in await loop.run_in_executor(None, self.artifacts.prune, running):
                uploads.pop(f"sha256:{gone}", None)
            if is_executor(catalog, principal):  # admins too
                self.artifacts.reserve(digest, upload, size, principal)
                return
            # Taken together, with no await between: an upload that completes meanwhile is
            # in one or the other (`_upload` moves it without awaiting).
            unclaimed = [program.removeprefix("sha256:")
                         for program, uploaders in uploads.items()
                         if principal in uploaders and program.removeprefix("sha256:")
                         not in running and program != f"sha256:{digest}"]
            reserved = self.artifacts.reserved(principal, besides=upload)
            held = 0
            for pack in unclaimed:
                stored = await loop.run_in_executor(None, self.artifacts.size_of, pack)
                held += stored or 0
            room = self.state.config.max_unclaimed_upload_bytes
            if held + reserved + size > room:
                raise ConflictError(
                    f"{principal} holds {held} bytes of uploaded program packs no query runs "
                    f"and {reserved} in unfinished uploads; with this one ({size} bytes) that "
                    f"is more than the {room} allowed: submit a query of them, finish the "
                    "uploads, or wait an hour for them to be removed")
            self.artifacts.reserve(digest, upload, size, principal)

    async def _fetch(self, request: m.FetchArtifact, ctx: Context) -> m.ArtifactStored:
        self._check_session(request.session_id, ctx.principal)
        assert self.state is not None
        if not may_read_program(self.state.catalog, ctx.principal, f"sha256:{request.sha256}"):
            raise NotAuthorizedError(f"{ctx.principal} may not read program pack "
                                     f"sha256:{request.sha256[:64]}: only the executors and "
                                     "whoever manages a query of it do")
        loop = asyncio.get_running_loop()
        blob = await loop.run_in_executor(None, self.artifacts.load, request.sha256)
        ctx.attach(blob)
        return m.ArtifactStored(sha256=request.sha256, size=len(blob))

    def _check_session(self, session_id: int, principal: str) -> None:
        if self.state is None or session_id not in self.state.leases:
            raise UnknownSessionError(f"no session {session_id}")
        session = self.state.catalog.find_session(session_id)
        if session is None or session.principal != principal:
            raise NotAuthorizedError(f"session {session_id} belongs to another principal")

    # -- failover -------------------------------------------------------------------------------

    async def _take_over(self, local: Recovered, catalog: Catalog
                         ) -> tuple[Recovered, dict[str, list[TimedUpdate]]]:
        """Elected, with `catalog` as etcd holds it (the warm standby's): that is the catalog.
        Returns it, and what the local catalog topics lack of it (appended at etcd's version
        before anything else). An empty etcd is seeded with the local catalog (the first
        coordinator of a cluster that turns failover on)."""
        assert self.failover is not None
        held = catalog.version
        if held == 0:
            if local.catalog.version:
                await self.failover.checkpoint(local.catalog.version, local.catalog.snapshot())
            return local, {}
        if local.catalog.version > held:
            raise StorageError(
                f"the catalog topics in {self.broker_dir} are at version "
                f"{local.catalog.version}, ahead of etcd's {held} (changes never "
                f"acknowledged): move that directory aside to take over from etcd")
        missing = consolidate_updates([*catalog.snapshot(), *(
            Update(c, r, -d) for c, r, d in local.catalog.snapshot())])
        per: dict[str, list[TimedUpdate]] = {}
        for collection, record, diff in missing:
            per.setdefault(collection, []).append(TimedUpdate(held, record, diff))
        logger.warning("coordinator: taking over at catalog version %d (local topics at %d, "
                       "%d updates behind)", held, local.catalog.version, len(missing))
        return dataclasses.replace(local, catalog=catalog,
                                   since_checkpoint=local.since_checkpoint + len(missing)), per

    async def _stop_when_deposed(self) -> None:
        assert self.failover is not None
        await self.failover.lost.wait()
        self._on_failed(NotActiveError("lost the etcd lease: another coordinator may be "
                                       "active"))

    # -- from the writer -----------------------------------------------------------------------

    def _on_committed(self, version: int) -> None:
        self._feed(Committed(version))

    def _on_checkpointed(self, version: int, offsets: dict[str, int]) -> None:
        self._feed(Checkpointed(version, offsets))

    def _on_failed(self, exc: BaseException) -> None:
        self.failure = exc
        self.failed.set()


def _next_port(listen: str) -> str:
    """The broker's default endpoint: the coordinator's port + 1 (0 stays 0: any free port)."""
    head, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        return "tcp://127.0.0.1:0"
    return f"{head}:{int(port) + 1 if int(port) else 0}"


def _port_of(endpoint: str) -> str:
    return endpoint.rpartition(":")[2]


def _any_port(endpoint: str) -> str:
    """The same host, any free port."""
    head, sep, _ = endpoint.rpartition(":")
    return f"{head}:0" if sep else "tcp://127.0.0.1:0"


def _reason(exc: AddressError) -> str:
    """The OS's reason of a failed bind, without zmq's decoration."""
    cause = exc.__cause__
    return getattr(cause, "strerror", None) or str(cause or exc)


def _advertised(endpoint: str, advertise: str | None = None) -> str:
    """An endpoint others can connect to: a wildcard bind becomes `advertise`, else this
    host's address."""
    for wildcard in ("0.0.0.0", "*"):
        if f"//{wildcard}:" in endpoint:
            address = advertise
            if not address:
                try:
                    address = socket.gethostbyname(socket.gethostname())
                except OSError:
                    address = "127.0.0.1"
            return endpoint.replace(f"//{wildcard}:", f"//{address}:")
    return endpoint
