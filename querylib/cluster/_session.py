"""A client's session with the coordinator, on asyncio: `AsyncCluster`.

    cluster = await AsyncCluster.connect()                  # discovery as in DESIGN §9
    info = await cluster.create_topic("numbers", partitions=4)
    await cluster.publish("numbers")
    sub = await cluster.subscribe("primes", wait=30)        # waits for the topic to exist
    async with cluster.follow("topics") as follower:        # the catalog, as a collection
        async for event in follower: ...
    await cluster.close()

The session holds a lease, renewed by a heartbeat every third of the lease (any request renews
it too), kept by a `querylib._lease.LeaseKeeper`. While the coordinator is away (restarting)
heartbeats fail and are retried; a coordinator that comes back within the lease hands the
session back unchanged, since it recovers its sessions from the catalog. If the lease ran out
meanwhile, the coordinator retracted everything the session owned: the next call raises
SessionLostError. An executor's session (`presume_lost`) is given up as lost once no heartbeat
was answered for a lease (`wait_lapsed`).

A cluster opened with `session=False` has no session (read-only tools: `tq status`, `tq
catalog`), so it leaves no trace in the catalog. Either way the coordinator's first answer
says the cluster's default tenant/namespace, which this process then follows (a bare topic
name means it: `catalog.set_default_namespace`). Owns its RpcClient and lease keeper.
Must not: decide what the coordinator decides (who acts as whom, who owns what); it asks.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from catalog import (
    Broker,
    Executor,
    Query,
    Resources,
    SessionKind,
    TopicKind,
    TqError,
    UnknownSessionError,
    set_default_namespace,
)
from querylib._lease import LeaseKeeper, Renewal
from querylib.rpc import (
    ClientClosedError,
    Credential,
    DeadlineExceededError,
    Notify,
    Reply,
    Request,
    RpcClient,
    RpcError,
    SecretRejectedError,
    remember_server_key,
    unseal,
)

from . import messages as m
from ._connection import COORDINATOR_KEY_ENV, discover
from ._errors import START_HINT, NoCoordinatorError, QueryTimeoutError, SessionLostError

if TYPE_CHECKING:
    from ._leaders import LeaderWatch

__all__ = ["AsyncCluster", "default_peer"]

logger = logging.getLogger("querylib.cluster")

R = TypeVar("R", bound=Reply)

# A waiting submit allows the coordinator its start timeout plus this, in seconds: the
# coordinator answers at the deadline, and the answer needs a moment to arrive.
START_MARGIN = 10.0


def _follow_namespace(namespace: str) -> None:
    """Resolve bare topic names as the cluster does (its default tenant/namespace)."""
    tenant, _, rest = namespace.partition("/")
    set_default_namespace(tenant, rest)


def _verdict(exc: TqError) -> Renewal:
    """What a failed heartbeat means: dropped, away (retried), closed, or refused."""
    if isinstance(exc, UnknownSessionError):
        return Renewal.LAPSED
    if isinstance(exc, ClientClosedError):
        return Renewal.CLOSED
    if isinstance(exc, RpcError):  # the coordinator is slow or away: keep trying
        return Renewal.AWAY
    return Renewal.REFUSED


def default_peer() -> str:
    """Who we are, for people reading `tq catalog sessions`: program, user@host, pid."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{program} {user}@{socket.gethostname()} pid {os.getpid()}"


def _learn_server_keys(reply: object) -> None:
    """Remember the CURVE keys of the brokers a reply names (DESIGN §2 "Handshake"): their
    clients in this process then connect with CURVE; a broker named without one is PLAIN."""
    if isinstance(reply, m.TopicInfo):
        for broker_id, address in reply.brokers.items():
            remember_server_key(address, reply.broker_keys.get(broker_id, ""))
    elif isinstance(reply, (m.SessionOpened, m.CatalogInfo)) and reply.catalog_broker:
        remember_server_key(reply.catalog_broker, reply.catalog_broker_key)


class AsyncCluster:
    """A connection to the coordinator, with a session unless `session=False`."""

    def __init__(self, address: str, secret: bytes | Credential, *, session: bool = True,
                 kind: SessionKind = SessionKind.CLIENT, peer: str | None = None,
                 lease: float = 10.0, timeout: float = 30.0, connect_timeout: float = 10.0,
                 resume: int | None = None, query_id: int | None = None,
                 process: int | None = None, source: str = "",
                 presume_lost: bool = False, coordinator_key: str = "") -> None:
        # Several coordinators (failover, DESIGN §3): "a,b,c"; `start` finds the active one.
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
        self.address = self.addresses[0]
        self.secret = Credential.of(secret)  # who we are (a bare secret: the admin)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        # The lease: heartbeats every third of it; lost when the coordinator says it dropped
        # us, or (`presume_lost`, an executor's) once no heartbeat was answered for a lease.
        # Never reopened: the coordinator retracted what the session owned.
        self.keeper = LeaseKeeper(
            lambda: f"session {self.session_id}", lease=lease, renew=self._renew,
            verdict=_verdict, unheard_lapses=presume_lost, min_period=0.02,
            min_renew_timeout=0.5)
        self.keeper.on_lapse.append(self._lapsed)
        self.source = source or address
        self._wants_session = session
        self._open_request = m.OpenSession(kind=kind, peer=peer or default_peer(),
                                           lease_ms=int(lease * 1000), resume=resume,
                                           query_id=query_id, process=process)
        # CURVE when the coordinator's public key is known: given, remembered for its address
        # (`discover`), or TQ_COORDINATOR_KEY (DESIGN §2 "Handshake").
        self._server_key = coordinator_key or os.environ.get(COORDINATOR_KEY_ENV) or None
        # Notify callbacks, kept here so that whichever client failover settles on (or moves
        # to) delivers them: a callback set on one RpcClient dies with it.
        self._notify_callbacks: dict[type[Notify], Callable[[Any], object]] = {}
        self._finding = asyncio.Lock()  # one failover search at a time (`find_active`)
        self.client = self._new_client(self.address)
        self.session_id: int | None = None
        self.catalog_broker = ""
        self.version = 0  # the newest catalog version a reply mentioned
        self.resumed = False
        self._lost: SessionLostError | None = None
        # An executor's: called for each heartbeat, its HostLoad rides along (quick, please).
        self.load_source: Callable[[], m.HostLoad] | None = None
        self._leaders: LeaderWatch | None = None  # made by the first watch_leader
        self._started = False
        self._closed = False

    @classmethod
    async def connect(cls, coordinator: str | None = None, *, secret_file: str | None = None,
                      coordinator_key: str | None = None, **options: Any) -> AsyncCluster:
        """Find the coordinator (argument, TQ_COORDINATOR, cluster.json) and start."""
        found = discover(coordinator, secret_file=secret_file, coordinator_key=coordinator_key)
        return await cls(found.address, found.secret, source=found.source,
                         coordinator_key=found.coordinator_key, **options).start()

    async def start(self) -> AsyncCluster:
        """Connect, and open (or resume) the session. NoCoordinatorError if nobody answers
        within `connect_timeout`."""
        if len(self.addresses) > 1:
            await self._find_active()
        else:
            await self.client.connect()
        self._started = True
        try:
            if self._wants_session:
                opened = await self._first(self._open_request)
                self.session_id = opened.session_id
                self.lease = opened.lease_ms / 1000
                self.catalog_broker = opened.catalog_broker
                _learn_server_keys(opened)
                self.resumed = opened.resumed
                _follow_namespace(opened.namespace)
                self._seen(opened.version)
                self.keeper.opened()
                self.keeper.start()
            else:
                info = await self._first(m.GetCatalogInfo())
                self.catalog_broker = info.catalog_broker
                _learn_server_keys(info)
                _follow_namespace(info.namespace)
                self._seen(info.version)
        except BaseException:
            await self.client.close()
            raise
        return self

    async def find_active(self) -> None:
        """With several coordinator addresses (failover): find the active one again, after
        the one we used stopped answering; calls in flight move to it. One search at a time:
        a caller that waited for another's finds the client it found."""
        if len(self.addresses) < 2 or self._closed:
            return
        client = self.client
        async with self._finding:
            if self.client is client:
                await self._find_active()

    async def _find_active(self) -> None:
        """Ask every coordinator at once; the first that answers is the active one (a standby
        does not listen until it takes over). NoCoordinatorError when none answers."""
        probes = [self._new_client(a) for a in self.addresses]
        asks = {asyncio.ensure_future(self._probe(p)): p for p in probes}
        found: RpcClient | None = None
        try:
            pending = set(asks)
            while pending and found is None:
                done, pending = await asyncio.wait(pending,
                                                   return_when=asyncio.FIRST_COMPLETED)
                found = next((asks[d] for d in done if not d.cancelled()
                              and d.exception() is None), None)
        finally:
            for ask, probe in asks.items():
                ask.cancel()
                if probe is not found:
                    await probe.close()
        if found is None:
            raise NoCoordinatorError(f"no coordinator answers at any of {self.addresses} "
                                     f"(from {self.source}) within {self.connect_timeout:g}s; "
                                     f"{START_HINT}")
        await self.client.close()
        self.client, self.address = found, found.address

    def _new_client(self, address: str) -> RpcClient:
        client = RpcClient(address, self.secret, timeout=self.timeout,
                           server_key=self._server_key)
        for message_type, callback in self._notify_callbacks.items():
            client.on_notify(message_type, callback)
        return client

    async def _probe(self, probe: RpcClient) -> None:
        """Returns once `probe`'s coordinator answers, an error included (a query process may
        not ask GetCatalogInfo before its session: the refusal still says who is active)."""
        await probe.connect()
        try:
            await probe.request(m.GetCatalogInfo(), timeout=self.connect_timeout)
        except TqError as exc:
            if isinstance(exc, DeadlineExceededError | SecretRejectedError):
                raise

    async def _first(self, request: Request[R]) -> R:
        try:
            return await self.client.request(request, timeout=self.connect_timeout)
        except DeadlineExceededError:
            raise NoCoordinatorError(f"no coordinator answers at {self.address} (from "
                                     f"{self.source}) within {self.connect_timeout:g}s; "
                                     f"{START_HINT}") from None

    async def __aenter__(self) -> AsyncCluster:
        return self if self._started else await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def lost(self) -> bool:
        """True once the coordinator dropped our session."""
        return self._lost is not None

    @property
    def lease(self) -> float:
        """Seconds: what we asked for, then what the coordinator granted."""
        return self.keeper.lease

    @lease.setter
    def lease(self, value: float) -> None:
        self.keeper.lease = value

    @property
    def renewed_at(self) -> float:
        """Loop time of the last answer to the open or a heartbeat."""
        return self.keeper.renewed_at

    async def wait_lapsed(self) -> None:
        """Return once the session lapsed: the coordinator dropped it, or (`presume_lost`)
        no heartbeat was answered for a lease, so it must be assumed to have."""
        await self.keeper.lapsed.wait()

    # -- requests ------------------------------------------------------------------------------

    async def request(self, request: Request[R], *, timeout: float | None = None) -> R:
        """Send any coordinator request; raises SessionLostError once the session is gone."""
        if self._lost is not None:
            raise self._lost
        try:
            reply = await self._ask(request, timeout)
        except UnknownSessionError as exc:
            if getattr(request, "session_id", None) == self.session_id is not None:
                self._lose(exc)
                assert self._lost is not None  # set by _lose
                raise self._lost from exc
            raise
        version = getattr(reply, "version", None)
        if version is not None:
            self._seen(version)
        _learn_server_keys(reply)
        return reply

    async def _ask(self, request: Request[R], timeout: float | None) -> R:
        """`request` to the coordinator in use; sent again to the active one when failover
        switched coordinators under it (`find_active`, asked by another caller, closed the
        client it was on)."""
        client = self.client
        try:
            return await client.request(request, timeout=timeout)
        except ClientClosedError:
            if self._closed or self.client is client:
                raise
            return await self.client.request(request, timeout=timeout)

    def _seen(self, version: int) -> None:
        self.version = max(self.version, version)

    def _session(self) -> int:
        if self.session_id is None:
            raise TqError("this cluster connection has no session (opened with session=False)")
        return self.session_id

    async def info(self) -> m.CatalogInfo:
        return await self.request(m.GetCatalogInfo())

    async def loads(self) -> dict[int, m.HostLoad]:
        """Each executor's load as its last heartbeat reported it, by executor id."""
        return (await self.request(m.GetLoads())).loads

    async def groups(self) -> list[m.GroupInfo]:
        """The consumer groups this principal may describe, with their committed offsets."""
        return (await self.request(m.GetGroups())).groups

    async def lookup_topic(self, name: str, *, wait: float = 0.0) -> m.TopicInfo:
        """The topic called `name`; with `wait` seconds, wait for it to be created."""
        return await self.request(m.LookupTopic(name=name, wait_ms=int(wait * 1000)),
                                  timeout=self._wait_timeout(wait))

    async def create_topic(self, name: str, partitions: int = 1, *, record_type: str = "bytes",
                           kind: TopicKind | str = TopicKind.STREAM, ingest: bool = False,
                           locations: tuple[int, ...] | None = None,
                           replication_factor: int | None = None) -> m.TopicInfo:
        """Create a topic; `replication_factor` None is the coordinator's default (1 with one
        executor host, else min(3, hosts); DESIGN §5 "Replication")."""
        return await self.request(m.CreateTopic(
            session_id=self._session(), name=name, partitions=partitions,
            record_type=record_type, kind=TopicKind(kind), ingest=ingest, locations=locations,
            replication_factor=replication_factor))

    async def delete_topic(self, name: str, *, force: bool = False) -> None:
        """Delete the topic. The coordinator has the brokers hosting it drop its partitions
        and files, and answers once those that are up did (a broker that is down drops them
        when it registers again), so a topic created again under the name starts empty."""
        await self.request(m.DeleteTopic(session_id=self._session(), name=name, force=force))

    async def alter_topic(self, name: str, *, partitions: int | None = None,
                          locations: tuple[int, ...] | None = None,
                          configs: dict[str, str | None] | None = None) -> m.TopicInfo:
        """Grow the topic to `partitions` and set (None: remove) its Kafka configs
        (retention.ms, retention.bytes, segment.bytes); the topic as it is now."""
        return await self.request(m.AlterTopic(
            session_id=self._session(), name=name, partitions=partitions, locations=locations,
            configs=dict(configs or {})))

    async def report_partitions_dropped(self, topic_id: int, broker_id: int) -> None:
        """An executor's: its broker dropped its partitions of deleted topic `topic_id`."""
        await self.request(m.ReportPartitionsDropped(session_id=self._session(),
                                                     topic_id=topic_id, broker_id=broker_id))

    async def alter_partition(self, topic_id: int, partition: int, broker_id: int,
                              leader_epoch: int, expected_isr: tuple[int, ...],
                              isr: tuple[int, ...]) -> m.TopicInfo:
        """A replicated partition's leader (broker `broker_id`, this session's) asks for a new
        ISR (DESIGN §5 "Replication"); the topic as it is after."""
        return await self.request(m.AlterPartition(
            session_id=self._session(), topic_id=topic_id, partition=partition,
            broker_id=broker_id, leader_epoch=leader_epoch, expected_isr=expected_isr,
            isr=isr))

    async def publish(self, name: str) -> m.TopicInfo:
        return await self.request(m.Publish(session_id=self._session(), name=name))

    async def unpublish(self, name: str) -> None:
        await self.request(m.Unpublish(session_id=self._session(), name=name))

    async def subscribe(self, name: str, *, record_type: str | None = None,
                        kind: TopicKind | str | None = None, wait: float = 0.0) -> m.TopicInfo:
        """Subscribe; with `wait` seconds, wait for the topic to be created (UnknownTopicError
        if it is not by then)."""
        return await self.request(m.Subscribe(
            session_id=self._session(), name=name, record_type=record_type,
            kind=None if kind is None else TopicKind(kind), wait_ms=int(wait * 1000)),
            timeout=self._wait_timeout(wait))

    async def unsubscribe(self, name: str) -> None:
        await self.request(m.Unsubscribe(session_id=self._session(), name=name))

    async def register_broker(self, host: str, address: str, *,
                              broker_id: int | None = None, kafka_address: str = "",
                              curve_key: str = "", slot: int = 0) -> Broker:
        """Register a broker: under `broker_id`, or with none under the id last registered
        from this host, principal and `slot` if that one is down, else a new one."""
        reply = await self.request(m.RegisterBroker(session_id=self._session(), host=host,
                                                    address=address, broker_id=broker_id,
                                                    kafka_address=kafka_address,
                                                    curve_key=curve_key, slot=slot))
        return reply.broker

    async def register_executor(self, host: str, broker_id: int, resources: Resources,
                                shards: tuple[int, ...] = ()) -> Executor:
        reply = await self.request(m.RegisterExecutor(session_id=self._session(), host=host,
                                                      broker_id=broker_id, resources=resources,
                                                      shards=tuple(shards)))
        return reply.executor

    async def submit_query(self, name: str, program: str, *, processes: int = 1,
                           workers: int = 1, args: tuple[str, ...] = (),
                           executors: tuple[int, ...] | None = None, wait: bool = False,
                           timeout: float | None = None,
                           start_timeout: float | None = None) -> Query:
        """Submit a query; with `wait`, return once it runs (QueryFailedError if it failed
        to start: the message says why). `start_timeout`: the coordinator fails the query
        unless every process registered that many seconds after submission (waiting for free
        slots included; None: the coordinator's default); a waiting call then allows that
        long plus a margin unless `timeout` says otherwise."""
        start_timeout_ms = None if start_timeout is None else max(1, round(start_timeout * 1000))
        if timeout is None and wait and start_timeout is not None:
            timeout = start_timeout + START_MARGIN
        reply = await self.request(m.SubmitQuery(
            session_id=self._session(), name=name, program=program, processes=processes,
            workers=workers, args=tuple(args), executors=executors, wait=wait,
            start_timeout_ms=start_timeout_ms), timeout=timeout)
        return reply.query

    async def await_start(self, query_id: int, *, timeout: float | None = None) -> Query:
        """Return once the query runs (every process registered), or raise QueryFailedError
        once it failed or was killed first. The coordinator answers by the query's start
        timeout; `timeout` (None: forever) bounds this wait, asking again after each
        `self.timeout` (a restarted coordinator forgets who waited)."""
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while True:
            step = self.timeout
            if deadline is not None:
                step = min(step, deadline - asyncio.get_running_loop().time())
                if step <= 0:
                    raise QueryTimeoutError(f"query {query_id} has not started within "
                                            f"{timeout:g}s")
            try:
                reply = await self.request(m.AwaitStart(session_id=self._session(),
                                                        query_id=query_id), timeout=step)
            except DeadlineExceededError:
                continue
            return reply.query

    async def report_exit(self, query_id: int, process: int, exit_code: int, *,
                          reason: str = "") -> Query:
        """An executor reports a process's exit; `reason`: why it failed, in its own words."""
        reply = await self.request(m.ReportExit(session_id=self._session(), query_id=query_id,
                                                process=process, exit_code=exit_code,
                                                reason=reason))
        return reply.query

    async def kill_query(self, query_id: int, reason: str = "killed") -> Query:
        reply = await self.request(m.KillQuery(session_id=self._session(), query_id=query_id,
                                               reason=reason))
        return reply.query

    async def report_spawn_failed(self, query_id: int, process: int, reason: str) -> Query:
        reply = await self.request(m.ReportSpawnFailed(
            session_id=self._session(), query_id=query_id, process=process, reason=reason[:2000]))
        return reply.query

    # -- principals (DESIGN §12) ------------------------------------------------------------

    @property
    def principal(self) -> str:
        return self.secret.principal

    async def add_user(self, principal: str, role: str = "user") -> Credential:
        """Make a named principal (admins only); returns its credential."""
        reply = await self.request(m.AddUser(session_id=self._session(), principal=principal,
                                             role=role))
        return Credential(reply.user.principal, unseal(self.secret.key, reply.sealed_key),
                          reply.coordinator_key)

    async def rotate_user(self, principal: str) -> Credential:
        """A new key for a named principal (admins only); the old one stops working."""
        reply = await self.request(m.RotateUser(session_id=self._session(),
                                                principal=principal))
        return Credential(reply.user.principal, unseal(self.secret.key, reply.sealed_key),
                          reply.coordinator_key)

    async def remove_user(self, principal: str) -> None:
        await self.request(m.RemoveUser(session_id=self._session(), principal=principal))

    async def create_token(self, ttl_ms: int = 3_600_000, name: str = "") -> tuple[Any, str]:
        """Mint a one-time join token (admins only; DESIGN §12 "Joining a host"): its catalog
        record and the string a new host joins with (`tq executor --join`)."""
        from ._join import format_token

        reply = await self.request(m.CreateToken(session_id=self._session(), ttl_ms=ttl_ms,
                                                 name=name))
        secret = unseal(self.secret.key, reply.sealed_secret)
        return reply.token, format_token(reply.coordinators, reply.token.token_id, secret,
                                          reply.coordinator_key)

    async def decommission_broker(self, broker_id: int, *,
                                  force: bool = False) -> m.Decommissioned:
        """Move every replica off broker `broker_id` to live brokers and retire it (admins
        only; a broker that is up only with `force`; DESIGN §5 "Decommissioning a broker"):
        what moved, what could not and why."""
        return await self.request(m.DecommissionBroker(session_id=self._session(),
                                                       broker_id=broker_id, force=force))

    async def revoke_token(self, token_id: int) -> None:
        """Remove a join token (admins only): it joins nobody any more."""
        await self.request(m.RevokeToken(session_id=self._session(), token_id=token_id))

    async def resolve_principal(self, principal: str) -> bytes | None:
        """`principal`'s broker key, or None if it does not exist (executors only: their
        broker's keyring asks this)."""
        reply = await self.request(m.ResolvePrincipal(session_id=self._session(),
                                                      principal=principal))
        return unseal(self.secret.key, reply.sealed_key) if reply.sealed_key else None

    async def resolve_curve_key(self, public: bytes) -> tuple[str, bytes] | None:
        """The principal whose CURVE public key (Z85) is `public`, and its broker key, or None
        (executors only: their broker's keyring asks this)."""
        reply = await self.request(m.ResolvePrincipal(session_id=self._session(),
                                                      principal="", curve_key=public))
        if not reply.sealed_key:
            return None
        return reply.principal, unseal(self.secret.key, reply.sealed_key)

    async def upload_artifact(self, digest: str, pack: bytes) -> str:
        """Store a program pack on the coordinator, in chunks of ARTIFACT_CHUNK_BYTES; returns
        its source, `sha256:<hex>`."""
        if self._lost is not None:
            raise self._lost
        view, size, offset = memoryview(pack), len(pack), 0
        while True:
            chunk = view[offset:offset + m.ARTIFACT_CHUNK_BYTES]
            await self.client.request(m.UploadArtifact(
                session_id=self._session(), sha256=digest, offset=offset, size=size),
                payload=[chunk])
            offset += len(chunk)
            if offset >= size:
                return f"sha256:{digest}"

    async def fetch_artifact(self, digest: str) -> bytes:
        """The pack `digest` (hex) that someone uploaded (NotFoundError if none)."""
        _, payload = await self.client.exchange(
            m.FetchArtifact(session_id=self._session(), sha256=digest))
        return b"".join(bytes(frame) for frame in payload)

    def on_notify(self, message_type: type[Notify], callback: Callable[[Any], object]) -> None:
        """Run `callback(notification)` on this loop for each notify of that type the
        coordinator pushes (an executor's `KillProcesses`), whichever coordinator of the list
        it is connected to now or later. It must be quick: hand work on."""
        self._notify_callbacks[message_type] = callback
        self.client.on_notify(message_type, callback)

    def follow(self, collection: str, *, credit: int = 4 * 1024 * 1024) -> Any:
        """An AsyncCollectionFollower of a catalog collection (`async with` / `async for`):
        a snapshot at the current version or later, then every later diff."""
        from ._follow import AsyncCollectionFollower

        return AsyncCollectionFollower(self, collection, credit=credit)

    def watch_leader(self, topic: str, partition: int, moved: Callable[[], None], *,
                     since: tuple[int, int, int] | None = None) -> Callable[[], None]:
        """Call `moved()` (on this loop: quick, please) whenever the catalog names another
        leader of partition `partition` of `topic` than its client knows: `since` at first
        (`TopicInfo.leader(partition)` of the look-up its address came from; None: unknown,
        told at once when the catalog is read); returns the function that ends the watch (on
        this loop). What a producer's or subscriber's `watch_leader` is bound to: it follows
        the leader at once instead of after a lease of silence (`_leaders.LeaderWatch`: one
        follower of the catalog's topics for every watch of this connection)."""
        return self._leader_watch().watch(topic, partition, moved, since=since)

    def hold_leaders(self) -> Callable[[], None]:
        """Keep following the catalog's leaders while no partition is watched (see
        `LeaderWatch.hold`); returns the function that lets go (on this loop)."""
        return self._leader_watch().hold()

    def _leader_watch(self) -> LeaderWatch:
        if self._leaders is None:
            from ._leaders import LeaderWatch

            self._leaders = LeaderWatch(self)
        return self._leaders

    def _wait_timeout(self, wait: float) -> float | None:
        return None if wait <= 0 else max(self.timeout, wait + 5.0)

    # -- the lease -----------------------------------------------------------------------------

    async def _renew(self, timeout: float) -> None:
        load = None if self.load_source is None else self.load_source()
        assert self.session_id is not None  # renewed once opened
        beat = m.Heartbeat(session_id=self.session_id, lease_ms=int(self.lease * 1000),
                           load=load)
        try:
            await self._ask(beat, timeout)
        except DeadlineExceededError:
            if len(self.addresses) < 2:
                raise
            # Failover: another coordinator may be active now and hold our session (recovered,
            # on its recovery lease): find it and renew there.
            await self.find_active()
            await self._ask(beat, timeout)

    def _lapsed(self, cause: BaseException | None) -> None:
        if cause is not None:  # the coordinator's word (else: unheard for a lease, presumed)
            self._lose(cause)

    def _lose(self, cause: BaseException) -> None:
        if self._lost is None:
            logger.warning("session %s lost: %s", self.session_id, cause)
            self._lost = SessionLostError(
                f"the coordinator dropped session {self.session_id} (its lease of "
                f"{self.lease:g}s ran out); what it owned is gone: open a new session")
            self.keeper.lapse_now(cause)

    async def close(self) -> None:
        """Stop heartbeats, close the session (its publications and subscriptions leave; its
        topics stay), close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.keeper.close()
        if self._leaders is not None:
            await self._leaders.close()
        try:
            if self.session_id is not None and self._lost is None:
                try:
                    await self.client.request(m.CloseSession(session_id=self.session_id),
                                              timeout=min(self.timeout, 5.0))
                except TqError as exc:  # it expires by itself later
                    logger.debug("session %s: close: %s", self.session_id, exc)
        finally:
            await self.client.close()
