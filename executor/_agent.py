"""The executor agent (`tq executor`, DESIGN §6): one per host, it wires the building blocks to
the coordinator.

    agent = await ExecutorAgent(coordinator, secret, secret_file, data_dir).start()
    ...
    await agent.close()

On start it runs this host's broker (the catalog, through `CatalogTopics`, is its directory:
who may write which topic, which partitions live here), opens the broker's optional endpoints
(connector endpoint, Kafka listener), each on the address it had in the last run on this data
where "any free port" was asked and that address is free (`_broker_id.py`), opens an executor
session (while no coordinator answers it says so and keeps trying, as a rejoin does; a
coordinator refusing our secret ends the start with SecretRejectedError), registers the
broker (with its Kafka address) and the executor (host, broker address, host resources); its
heartbeats carry the host's load (placement breaks ties by it). Then it serves the
coordinator's notifies:

- `SpawnProcesses`: per process, reserve a slot, fetch the artifact (an uploaded pack comes
  from the coordinator), start it under the supervisor. A failure is reported back as
  `ReportSpawnFailed` with the typed error's message, and the query fails with that reason.
- `KillProcesses`: TERM to each process group, KILL after the grace period.
- `DropPartitions`: a deleted topic's partitions leave this host's broker, files included;
  reported back with `ReportPartitionsDropped` (the coordinator asks again until it is).

Every exit goes back as `ReportExit` (an exit status, or minus the signal that killed it);
output lines go to the `__logs` topic on this host's broker. When the agent stops, or its
session is lost (the coordinator did not hear from it for a lease), it kills its processes:
the coordinator has failed their queries by then anyway. After a loss it rejoins by itself
(DESIGN §11 "Executor loss and rejoin"): its broker and endpoints keep running, and it opens a
new session (retried with backoff, capped at `REJOIN_BACKOFF_MAX` seconds, until it succeeds or
the agent is closed), registers the broker under its remembered id and itself as a new
executor. `lost` is set while it has no session; `rejoins` counts the rejoins.

Must not: decide placement or query state (the coordinator does), or block the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalog import NotFoundError, SessionKind, TopicName, TqError
from querylib._pidlock import PidLock
from querylib.broker import BrokerEndpoints, BrokerServer, drop_hosted
from querylib.cluster import (
    AsyncCluster,
    DropPartitions,
    KillProcesses,
    NoCoordinatorError,
    SpawnProcesses,
    hold_data_dir,
)
from querylib.rpc import (
    BROKER,
    Credential,
    RemoteKeyring,
    RpcError,
    SecretRejectedError,
)

from ._artifacts import ArtifactCache, ArtifactFetcher
from ._broker_id import (
    Endpoints,
    follow_remembered_namespace,
    preferred_listen,
    register_remembered,
    remember_endpoints,
    remember_namespace,
    remembered_endpoints,
)
from ._cleanup import prune_artifacts, prune_work_dirs, touch_artifact
from ._credentials import ProcessCredentials
from ._endpoints import CatalogTopics
from ._errors import NoFreeSlotsError
from ._logs import LogForwarder
from ._metrics import LoadSampler, host_resources
from ._query_exits import QueryExitFeed
from ._slots import Slots, default_slots
from ._spawn import SpawnSpec
from ._supervisor import ExitReport, Supervisor

if TYPE_CHECKING:
    from querylib.connector import EndpointConfig

__all__ = ["REJOIN_BACKOFF_MAX", "ExecutorAgent"]

logger = logging.getLogger("executor")

_KEY_WAIT = 30.0  # seconds a key request waits for this agent's session with the coordinator

REJOIN_BACKOFF_MIN = 0.2  # seconds before the first rejoin attempt; doubled after each failure
REJOIN_BACKOFF_MAX = 5.0  # ... up to this (also how long each attempt waits for an answer)
# The very first attempt waits this long before the agent says it is waiting for the
# coordinator (a running one answers in milliseconds), and then repeats that notice at most
# this often while it keeps waiting.
FIRST_CONNECT_TIMEOUT = 2.0
WAITING_NOTICE_INTERVAL = 30.0


class ExecutorAgent:
    """A host agent: its broker, its session with the coordinator, its query processes.

    `connector` (a querylib.connector.EndpointConfig) and `kafka` (a querylib.kafka.KafkaConfig)
    open the broker's endpoints; one named in `endpoint_fallback` ("connector", "kafka") whose
    port is taken opens on another (`endpoints.moved`); with `endpoints_required=False` one
    whose port is taken is skipped (listed in `endpoints.skipped`) instead of failing the start.
    """

    def __init__(self, coordinator: str, secret: bytes | Credential, secret_file: str,
                 data_dir: str | os.PathLike[str], *, slots: int | None = None,
                 host: str | None = None, broker_listen: str = "tcp://127.0.0.1:0",
                 lease: float = 10.0, grace: float = 5.0,
                 connector: EndpointConfig | None = None, kafka: Any = None,
                 endpoints_required: bool = True, endpoint_fallback: Collection[str] = (),
                 keep_work_dirs: int = 50,
                 artifact_ttl: float = 7 * 86400.0) -> None:
        self.coordinator = coordinator
        self.secret = Credential.of(secret)  # our own credential: executor:NAME, or admin
        self.secret_file = str(Path(secret_file).resolve())
        self.data_dir = Path(data_dir)
        self.credentials = ProcessCredentials(self.data_dir / "credentials", self.secret)
        # Our broker checks its clients' keys; the coordinator tells it each principal's
        # (ResolvePrincipal), once this agent has a session. It knows its own.
        self.keys = RemoteKeyring(self._fetch_key, audience=BROKER)
        self.keys.pin(self.secret.principal, self.secret.for_audience(BROKER).key)
        self._attached = asyncio.Event()
        self.slots = Slots(slots or default_slots(os.cpu_count()))
        self.host = host or socket.gethostname()
        self.broker_listen = broker_listen
        self.lease = lease
        self.grace = grace
        self.connector_config = connector
        self.kafka_config = kafka
        self.endpoints_required = endpoints_required
        self.endpoint_fallback = tuple(endpoint_fallback)
        # Disk cleanup after each exit: the newest work dirs stay for post-mortems, artifacts
        # unused for artifact_ttl seconds go (DESIGN §11 "Executor disk cleanup").
        self.keep_work_dirs = keep_work_dirs
        self.artifact_ttl = artifact_ttl
        self._artifact_of: dict[tuple[int, int], str] = {}  # running process -> its digest
        self._cleaning = False
        self.topics = CatalogTopics()
        self.endpoints: BrokerEndpoints | None = None
        # Processes told to die whose slots are not back yet, and a wake-up for whoever waits on
        # one: the coordinator counts a slot free once its query ended, a little before the
        # process here has exited and been drained.
        self._dying: set[tuple[int, int]] = set()
        self._dropping: set[int] = set()  # deleted topics whose partitions are being dropped
        self._slot_freed = asyncio.Event()
        self.broker: BrokerServer | None = None
        self.exit_feed: QueryExitFeed | None = None  # process exits from the catalog
        self.broker_address = ""
        self.cluster: AsyncCluster | None = None
        self.forwarder: LogForwarder | None = None
        self.supervisor: Supervisor | None = None
        self.fetcher: ArtifactFetcher | None = None
        self.executor_id: int | None = None
        self.broker_id: int | None = None
        self.lost = asyncio.Event()  # set while the agent has no session (until it rejoins)
        self.rejoins = 0
        # Bumped when a session is lost: a spawn that began under an older session must not
        # leave a process running (its query failed with that session).
        self._generation = 0
        self._sampler: LoadSampler | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch: asyncio.Task[None] | None = None
        self._closed = False
        self._data_lock: PidLock | None = None
        self.counters = {"spawned": 0, "spawn_failed": 0, "report_failed": 0,
                         "work_dirs_removed": 0, "artifacts_removed": 0}

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> ExecutorAgent:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            # Held until close: two agents on one data dir would share a broker's logs and
            # broker id; the second is told which process has it.
            self._data_lock = hold_data_dir(self.data_dir)
            previous = await asyncio.to_thread(remembered_endpoints, self.data_dir)
            await asyncio.to_thread(follow_remembered_namespace, self.data_dir)
            # The catalog says who may write which topic here (`CatalogTopics`); the
            # coordinator, whose keys its clients sign with (`keys`).
            self.broker = BrokerServer(self.data_dir / "broker", self.keys,
                                       directory=self.topics)
            self.broker_address = await self.broker.start(
                self.broker_listen, prefer=preferred_listen(self.broker_listen, previous.broker))
            self.exit_feed = QueryExitFeed(self.broker)
            self.forwarder = await LogForwarder(self.broker.port).start()
            self.supervisor = Supervisor(work_root=self.data_dir / "work", sink=self.forwarder,
                                         on_exit=self._exited, grace=self.grace)
            await self.supervisor.start()  # the fork server imports in the background
            cache = ArtifactCache(self.data_dir / "artifacts")
            cache.clean_incoming()
            self.fetcher = ArtifactFetcher(cache, upload=self._download)
            self._sampler = LoadSampler(self.data_dir)
            # The endpoints outlive sessions: `CatalogTopics` answers once a session attaches.
            # The connector cookie and the Kafka cluster id derive from the key we hold (the
            # cluster secret for an admin's executor, as in tq up).
            self.endpoints = await BrokerEndpoints(
                self.broker, self.secret.key, connector=self.connector_config,
                kafka=self.kafka_config, kafka_cluster=self.topics,
                required=self.endpoints_required, fallback=self.endpoint_fallback,
                previous={"connector": previous.connector, "kafka": previous.kafka}).start()
            await asyncio.to_thread(remember_endpoints, self.data_dir, Endpoints(
                self.broker_address, self.connector_address or "", self.kafka_address or ""))
            await self._join_retrying(first=True)
        except BaseException:
            await self.close()
            raise
        self._watch = asyncio.get_running_loop().create_task(self._keep_session(),
                                                             name="executor session watch")
        return self

    async def _join(self, connect_timeout: float = 10.0) -> None:
        """Open a session, register the broker (its remembered id) and the executor."""
        assert self.supervisor is not None and self._sampler is not None
        cluster = AsyncCluster(self.coordinator, self.secret, kind=SessionKind.EXECUTOR,
                               lease=self.lease, peer=f"executor@{self.host}",
                               connect_timeout=connect_timeout)
        # Notifies may arrive as soon as the executor is registered: listen first.
        cluster.on_notify(SpawnProcesses, self._on_spawn)
        cluster.on_notify(KillProcesses, self._on_kill)
        cluster.on_notify(DropPartitions, self._on_drop)
        sampler, supervisor = self._sampler, self.supervisor
        cluster.load_source = lambda: sampler.sample(
            (r.spec.query_id, r.spec.process, r.pid) for r in supervisor.running())
        self.cluster = cluster
        try:
            await cluster.start()
            await asyncio.to_thread(remember_namespace, self.data_dir)
            broker = await register_remembered(cluster, self.data_dir, self.host,
                                               self.broker_address,
                                               kafka_address=self.kafka_address or "")
            self.broker_id = broker.broker_id
            await self.topics.close()  # a previous session's catalog view
            self.topics.attach(cluster, broker.broker_id,
                               follow=self.endpoints is not None and
                               self.endpoints.kafka is not None)
            executor = await cluster.register_executor(
                self.host, broker.broker_id,
                host_resources(self.data_dir, self.slots.total))
        except BaseException:
            await cluster.close()
            raise
        self.executor_id = executor.executor_id
        if self.exit_feed is not None:
            self.exit_feed.attach(cluster)
        self.lost.clear()
        self._attached.set()

    async def _fetch_key(self, principal: str) -> bytes | None:
        """A principal's broker key, from the coordinator (waits for a session, bounded)."""
        try:
            await asyncio.wait_for(self._attached.wait(), _KEY_WAIT)
        except TimeoutError:
            return None
        cluster = self.cluster
        if cluster is None or cluster.lost:
            return None
        return await cluster.resolve_principal(principal)

    @property
    def connector_address(self) -> str | None:
        """HOST:PORT of the broker's connector endpoint, if it has one."""
        return None if self.endpoints is None else self.endpoints.connector_address

    @property
    def kafka_address(self) -> str | None:
        """HOST:PORT Kafka clients bootstrap from, if the broker has a Kafka listener."""
        return None if self.endpoints is None else self.endpoints.kafka_address

    async def close(self) -> None:
        """Kill every process (reporting their exits while the session lasts), close the
        session, the log forwarder and the broker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.supervisor is not None:
            await self.supervisor.close()
        if self.fetcher is not None:
            await self.fetcher.close()
        if self.endpoints is not None:
            await self.endpoints.close()
        await self.topics.close()
        if self.exit_feed is not None:
            await self.exit_feed.close()
        if self.cluster is not None:
            await self.cluster.close()
        if self.forwarder is not None:
            await self.forwarder.close()
        if self.broker is not None:
            await self.broker.close()
        if self._data_lock is not None:
            self._data_lock.release()

    async def __aenter__(self) -> ExecutorAgent:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _keep_session(self) -> None:
        while True:
            await self._watch_session()
            await self._drop_session()
            await self._rejoin()

    async def _watch_session(self) -> None:
        """Return once the coordinator has dropped our session (or must be assumed to)."""
        cluster = self.cluster
        assert cluster is not None
        loop = asyncio.get_running_loop()
        # Unheard for a lease, the coordinator has expired our session (or is gone).
        while not cluster.lost and loop.time() - cluster.renewed_at <= cluster.lease:
            await asyncio.sleep(cluster.lease / 4)

    async def _drop_session(self) -> None:
        """Our processes' queries have failed with the session: kill them rather than let them
        run unaccounted for, then let the old session go."""
        logger.warning("executor %s: lost the coordinator; killing its processes",
                       self.executor_id)
        self.lost.set()  # first: nobody is there to hear about their exits
        self._attached.clear()  # key requests wait for the rejoin
        self._generation += 1
        assert self.supervisor is not None
        await self.supervisor.kill_all()
        self._dying.clear()
        await self.topics.close()
        if self.exit_feed is not None:
            await self.exit_feed.close()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            # If the coordinator still holds the session (we gave up on our own clock), this
            # ends it now, so the broker's registration is free for the next one.
            await cluster.close()

    async def _rejoin(self) -> None:
        """Join again, with backoff, until it works (or the agent is closed)."""
        lost_id = self.executor_id
        await self._join_retrying(first=False)
        self.rejoins += 1
        logger.warning("executor %s: rejoined the coordinator as executor %s (broker %s)",
                       lost_id, self.executor_id, self.broker_id)

    async def _join_retrying(self, *, first: bool) -> None:
        """Join, with backoff (REJOIN_BACKOFF_MIN doubling up to REJOIN_BACKOFF_MAX), until it
        works or the agent is closed.

        The first join retries only while nobody answers (the coordinator is not up yet),
        saying so at WARNING once and then at most every WAITING_NOTICE_INTERVAL; a refused
        secret, or any other error, ends the start. A rejoin retries whatever fails: a bug
        must not leave a running agent for good without a session."""
        loop = asyncio.get_running_loop()
        delay = REJOIN_BACKOFF_MIN
        attempt = 0
        noticed_at: float | None = None
        while True:
            attempt += 1
            if not first:
                logger.info("executor %s: rejoining the coordinator at %s (attempt %d)",
                            self.executor_id, self.coordinator, attempt)
            timeout = FIRST_CONNECT_TIMEOUT if first and attempt == 1 else REJOIN_BACKOFF_MAX
            try:
                await self._join(connect_timeout=timeout)
                return
            except Exception as exc:
                self.cluster = None
                if first:
                    if not isinstance(exc, NoCoordinatorError | RpcError) or \
                            isinstance(exc, SecretRejectedError):
                        raise
                    if noticed_at is None or \
                            loop.time() - noticed_at >= WAITING_NOTICE_INTERVAL:
                        noticed_at = loop.time()
                        logger.warning("executor on %s: waiting for the coordinator at %s "
                                       "(attempt %d: %s)", self.host, self.coordinator,
                                       attempt, exc)
                    else:
                        logger.info("executor on %s: attempt %d to join %s failed: %s",
                                    self.host, attempt, self.coordinator, exc)
                elif isinstance(exc, SecretRejectedError):  # fixable only by an operator
                    logger.error("executor %s: rejoin attempt %d: %s", self.executor_id,
                                 attempt, exc)
                elif isinstance(exc, TqError | OSError):  # the coordinator is away or refuses
                    logger.info("executor %s: rejoin attempt %d failed: %s; next in %.1fs",
                                self.executor_id, attempt, exc, delay)
                else:
                    logger.exception("executor %s: rejoin attempt %d failed",
                                     self.executor_id, attempt)
            await asyncio.sleep(delay)
            delay = min(delay * 2, REJOIN_BACKOFF_MAX)

    def _spawn_task(self, coro: object, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- notifies ------------------------------------------------------------------------------

    def _on_spawn(self, notification: Any) -> None:
        note: SpawnProcesses = notification.message
        for process in note.processes:
            self._spawn_task(self._start(note, process), f"spawn {note.query_id}/{process}")

    def _on_kill(self, notification: Any) -> None:
        note: KillProcesses = notification.message
        for process in note.processes:
            self._spawn_task(self._kill(note.query_id, process), f"kill {note.query_id}/{process}")

    def _on_drop(self, notification: Any) -> None:
        note: DropPartitions = notification.message
        if note.topic_id in self._dropping:  # sent again while we are at it
            return
        self._dropping.add(note.topic_id)
        self._spawn_task(self._drop(note), f"drop topic {note.topic_id}")

    async def _drop(self, note: DropPartitions) -> None:
        """Drop a deleted topic's partitions from our broker, then report it; a failure is
        left to the coordinator, which sends the drop again."""
        assert self.broker is not None
        try:
            await drop_hosted(self.broker, TopicName.parse(note.name).short, note.partitions)
            cluster = self.cluster
            if cluster is None or self.lost.is_set():
                return  # dropped; the coordinator asks again, and we report, after a rejoin
            await cluster.report_partitions_dropped(note.topic_id, note.broker_id)
        except TqError as exc:  # the broker's file I/O raises StorageError, never OSError
            logger.warning("executor %s: drop of deleted topic %d (%s): %s", self.executor_id,
                           note.topic_id, note.name, exc)
        finally:
            self._dropping.discard(note.topic_id)

    async def _start(self, note: SpawnProcesses, process: int) -> None:
        assert self.supervisor is not None and self.fetcher is not None
        key = (note.query_id, process)
        generation = self._generation
        try:
            await self._reserve(key)
        except TqError as exc:
            await self._spawn_failed(note.query_id, process, exc)
            return
        try:
            artifact = await self.fetcher.ensure(note.program)
            if generation != self._generation:  # its session, hence its query, is gone
                self._artifact_of.pop(key, None)
                self.slots.release(key)
                return
            self._artifact_of[key] = artifact.digest
            await asyncio.to_thread(touch_artifact, self.fetcher.cache, artifact.digest)
            credentials = await asyncio.to_thread(
                self.credentials.write, note.query_id, process, note.credential,
                coordinator=self.coordinator)
            spec = SpawnSpec(query_id=note.query_id, process=process,
                             processes=note.process_count, workers=note.workers,
                             args=tuple(note.args), coordinator=self.coordinator,
                             credentials=str(credentials), broker=self.broker_address,
                             executor_id=self.executor_id, name=note.name)
            await self.supervisor.spawn(spec, artifact.program)
            self.counters["spawned"] += 1
            if generation != self._generation:  # lost the session while it started
                await self._kill(note.query_id, process)
        except TqError as exc:
            self._artifact_of.pop(key, None)
            self.slots.release(key)
            self._slot_freed.set()
            await self._spawn_failed(note.query_id, process, exc)

    async def _spawn_failed(self, query_id: int, process: int, exc: TqError) -> None:
        self.counters["spawn_failed"] += 1
        reason = f"{type(exc).__name__}: {exc}"
        logger.warning("executor %s: process %d of query %d did not start: %s",
                       self.executor_id, process, query_id, reason)
        cluster = self.cluster
        if cluster is None or self.lost.is_set():  # its session, hence its query, is gone
            return
        try:
            await cluster.report_spawn_failed(query_id, process, reason)
        except TqError as report_exc:
            self.counters["report_failed"] += 1
            logger.warning("executor %s: cannot report the failed spawn: %s",
                           self.executor_id, report_exc)

    async def _reserve(self, key: tuple[int, int]) -> None:
        """Reserve a slot; while slots are held only by processes being killed, wait for them
        (bounded by the kill grace period plus the supervisor's drain time) before refusing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace + 5.0
        while True:
            try:
                self.slots.reserve(key)
                return
            except NoFreeSlotsError:
                remaining = deadline - loop.time()
                if not self._dying or remaining <= 0:
                    raise
                self._slot_freed.clear()
                try:
                    await asyncio.wait_for(self._slot_freed.wait(), remaining)
                except TimeoutError:
                    pass

    async def _kill(self, query_id: int, process: int) -> None:
        assert self.supervisor is not None
        if (query_id, process) in self.slots.held():
            self._dying.add((query_id, process))
        try:
            await self.supervisor.kill((query_id, process), self.grace)
        except TqError as exc:  # it ended (or never started) here: nothing to kill
            logger.debug("executor %s: kill %d/%d: %s", self.executor_id, query_id, process,
                         exc)

    # -- from the supervisor and the fetcher -----------------------------------------------------

    async def _exited(self, report: ExitReport) -> None:
        self.slots.release((report.query_id, report.process))
        self._dying.discard((report.query_id, report.process))
        self._slot_freed.set()
        self._artifact_of.pop((report.query_id, report.process), None)
        self.credentials.remove(report.query_id, report.process)
        if not self._cleaning and not self._closed:
            self._cleaning = True
            self._spawn_task(self._clean_disk(), "disk cleanup")
        if self.cluster is None or self.cluster.lost or self.lost.is_set():
            return
        try:
            if self.forwarder is not None:
                await self._flush_logs()  # its last lines are readable before it is ended
            await self.cluster.report_exit(report.query_id, report.process, report.exit_code,
                                           reason=report.failure)
        except TqError as exc:  # the query ended already (killed), or the coordinator is away
            self.counters["report_failed"] += 1
            logger.info("executor %s: exit of %d/%d not recorded: %s", self.executor_id,
                        report.query_id, report.process, exc)

    async def _flush_logs(self) -> None:
        """Wait until the lines forwarded so far are acknowledged, so a reader that sees a
        query end (`tq logs --follow`, `tq submit --wait`) finds all its lines. A failed batch
        is counted by the forwarder; the exit is reported regardless."""
        assert self.forwarder is not None
        try:
            await self.forwarder.flush()
        except TqError as exc:
            logger.warning("executor %s: flushing query output: %s", self.executor_id, exc)

    async def _clean_disk(self) -> None:
        """Prune work dirs and artifacts on a thread; one run at a time (an exit during a
        run is covered by the next exit's)."""
        assert self.supervisor is not None and self.fetcher is not None
        running = [r.launched.work_dir for r in self.supervisor.running()]
        in_use = set(self._artifact_of.values())
        try:
            dirs = await asyncio.to_thread(prune_work_dirs, self.data_dir / "work",
                                           keep=self.keep_work_dirs, running=running)
            digests = await asyncio.to_thread(prune_artifacts, self.fetcher.cache,
                                              unused_for=self.artifact_ttl, now=time.time(),
                                              running=in_use)
        except OSError as exc:  # a disk problem must not stop the agent; the next exit retries
            logger.warning("executor %s: disk cleanup: %s", self.executor_id, exc)
            return
        finally:
            self._cleaning = False
        self.counters["work_dirs_removed"] += len(dirs)
        self.counters["artifacts_removed"] += len(digests)

    async def _download(self, digest: str) -> bytes | None:
        if self.cluster is None:  # between sessions: the spawn that asked is void anyway
            return None
        try:
            return await self.cluster.fetch_artifact(digest)
        except NotFoundError:
            return None
