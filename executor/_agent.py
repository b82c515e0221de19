"""The executor agent (`tq executor`, DESIGN §6): one per host, it wires the building blocks to
the coordinator.

    agent = await ExecutorAgent(coordinator, secret, secret_file, data_dir).start()
    ...
    await agent.close()

On start it runs this host's broker 0 (`_host_broker.HostBroker`: the catalog, through
`CatalogTopics`, is its directory: who may write which topic, which partitions live here), opens
the broker's optional endpoints (connector endpoint, Kafka listener), each on the address it had
in the last run on this data where "any free port" was asked and that address is free
(`_broker_id.py`), opens an executor session (while no coordinator answers it says so and
keeps trying, as a rejoin does; a coordinator refusing our secret ends the start with
SecretRejectedError), registers the broker (with its Kafka address), starts the host's other
brokers (`brokers - 1` shard processes, `_shard.py`, each with a session of its own; once, on
the first join) and registers the executor (host, broker address, the shards' broker ids,
host resources); its heartbeats carry the host's load (placement breaks ties by it). Then it
serves the coordinator's notifies. What to do with them is decided by the agent's pure core
(`_agent_state.AgentState`: slots, sessions and their generations, the dying set, kills during
a spawn), which this shell feeds through `querylib.driver.Driver` and whose instructions it
performs as tasks (fetch, launch, kill, report), feeding their outcomes back:

- `SpawnProcesses`: per process, a slot (or a wait for a dying process's), fetch the artifact
  (an uploaded pack comes from the coordinator), start it under the supervisor. A failure is
  reported back as `ReportSpawnFailed` with the typed error's message, and the query fails
  with that reason; a bug (any other exception) too, logged once with its traceback, its slot
  released.
- `KillProcesses`: TERM to each process group, KILL after the grace period; a process still
  starting is not launched, or is killed as soon as it runs.
- `DropPartitions`: a deleted topic's partitions leave this host's broker, files included;
  reported back with `ReportPartitionsDropped` (the coordinator asks again until it is).

No task's failure is dropped: one that ends with an exception (a bug: each task handles the
errors it expects) is logged with its traceback and counted (`counters["bugs"]`).

Every exit goes back as `ReportExit` (an exit status, or minus the signal that killed it);
output lines go to the `__logs` topic on this host's broker. When the agent stops, or its
session is lost (the coordinator did not hear from it for a lease), it kills its processes:
the coordinator has failed their queries by then anyway. After a loss it rejoins by itself
(DESIGN §6 "Executor loss and rejoin"): its broker and endpoints keep running, and it opens a
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
from collections.abc import Awaitable, Collection, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalog import NotFoundError, SessionKind, TopicName, TqError
from querylib._lease import Backoff
from querylib._pidlock import PidLock
from querylib.cluster import (
    AsyncCluster,
    DropPartitions,
    KillProcesses,
    NoCoordinatorError,
    SpawnProcesses,
    hold_data_dir,
)
from querylib.cluster.messages import CloseSession
from querylib.driver import Driver
from querylib.rpc import Credential, RemoteKeyring, RpcError, SecretRejectedError
from querylib.server import BrokerEndpoints
from querylib.server.broker import BrokerServer, drop_hosted

from ._agent_state import (
    AgentState,
    Attached,
    CleanDisk,
    CleanDone,
    DropDone,
    DropRequested,
    DropTopic,
    Exited,
    Fetch,
    Fetched,
    Forget,
    Kill,
    KillAll,
    KillRequested,
    Launch,
    Launched,
    Phase,
    ReportExit,
    ReportSpawnFailed,
    SessionLost,
    SpawnRequested,
    StartFailed,
    Tick,
    WakeAt,
)
from ._artifacts import ArtifactCache, ArtifactFetcher
from ._cleanup import prune_artifacts, prune_work_dirs, touch_artifact
from ._credentials import ProcessCredentials
from ._endpoints import CatalogTopics
from ._host_broker import HostBroker
from ._logs import LogForwarder
from ._metrics import HostLoad, LoadSampler, host_resources
from ._query_exits import QueryExitFeed
from ._shard import ShardProcess, ShardReady
from ._slots import Slots, default_slots
from ._spawn import SpawnSpec
from ._supervisor import ExitReport, Supervisor

if TYPE_CHECKING:
    from querylib.server.connector import EndpointConfig

__all__ = ["REJOIN_BACKOFF_MAX", "ExecutorAgent"]

logger = logging.getLogger("executor")

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
    `brokers`: how many brokers this host runs (broker 0 here, the others in shard processes,
    `tq executor --shard K` with the agent's options and `shard_args`: their Kafka options;
    by default, from `kafka`'s host on any free port).
    """

    def __init__(self, coordinator: str, secret: bytes | Credential, secret_file: str,
                 data_dir: str | os.PathLike[str], *, slots: int | None = None,
                 host: str | None = None, broker_listen: str = "tcp://127.0.0.1:0",
                 lease: float = 10.0, grace: float = 5.0,
                 connector: EndpointConfig | None = None, kafka: Any = None,
                 endpoints_required: bool = True, endpoint_fallback: Collection[str] = (),
                 keep_work_dirs: int = 50, work_dir_bytes: int = 4 << 30,
                 artifact_ttl: float = 7 * 86400.0, artifact_bytes: int = 4 << 30,
                 brokers: int = 1,
                 shard_args: Sequence[str] | None = None, advertise: str | None = None,
                 broker_id: int | None = None) -> None:
        self.coordinator = coordinator
        self.secret = Credential.of(secret)  # our own credential: executor:NAME, or admin
        self.secret_file = str(Path(secret_file).resolve())
        self.data_dir = Path(data_dir)
        self.credentials = ProcessCredentials(self.data_dir / "credentials", self.secret)
        # What to do with processes is decided by the pure core (`_agent_state.py`); this
        # shell performs its instructions (fetch, launch, kill, report) and feeds back results.
        self.state = AgentState(Slots(slots or default_slots(os.cpu_count())), grace=grace)
        self._driver = Driver("executor", self.state.handle, {
            Fetch: self._fetch, Launch: self._launch, Kill: self._kill,
            KillAll: self._kill_all, Forget: self._forget,
            ReportSpawnFailed: self._report_spawn_failed, ReportExit: self._report_exit,
            CleanDisk: self._clean,
            DropTopic: lambda i: self._spawn_task(self._drop(i.note),
                                                  f"drop topic {i.note.topic_id}"),
            WakeAt: self._wake_at,
        }, on_bug=self._bug, invariants=self.state.check_invariants, logger=logger)
        self._killing_all: asyncio.Task[Any] | None = None
        self.host = host or socket.gethostname()
        self.broker_listen = broker_listen
        self.advertise = advertise  # the host its brokers register when bound to a wildcard
        self.lease = lease
        self.grace = grace
        self.connector_config = connector
        self.kafka_config = kafka
        self.endpoints_required = endpoints_required
        self.endpoint_fallback = tuple(endpoint_fallback)
        # Disk cleanup after each exit: the newest work dirs stay for post-mortems, artifacts
        # unused for artifact_ttl seconds go (DESIGN §6 "Executor disk cleanup").
        self.keep_work_dirs = keep_work_dirs
        self.work_dir_bytes = work_dir_bytes  # ended ones' bound: past it, the oldest go
        self.artifact_ttl = artifact_ttl
        self.artifact_bytes = artifact_bytes  # the cache's bound: past it, least recently used go
        self._artifact_of: dict[tuple[int, int], str] = {}  # running process -> its digest
        # Broker 0: the broker, its endpoints, catalog view, keyring and exit feed.
        self.host_broker = HostBroker(self.data_dir, self.secret, listen=broker_listen,
                                      connector=connector, kafka=kafka,
                                      required=endpoints_required, fallback=endpoint_fallback,
                                      advertise=advertise, broker_id=broker_id)
        if brokers < 1:
            raise ValueError(f"an executor runs at least one broker, not {brokers}")
        self.brokers = brokers
        self.shard_args = list(_kafka_args(kafka) if shard_args is None else shard_args)
        self.shards: list[ShardProcess] = []
        self.cluster: AsyncCluster | None = None
        self.forwarder: LogForwarder | None = None
        self.supervisor: Supervisor | None = None
        self.fetcher: ArtifactFetcher | None = None
        self.executor_id: int | None = None
        self.lost = asyncio.Event()  # set while the agent has no session (until it rejoins)
        self.rejoins = 0
        self._sampler: LoadSampler | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.Task[None] | None = None
        self._closed = False
        self._data_lock: PidLock | None = None
        self._counters = {"report_failed": 0, "bugs": 0, "work_dirs_removed": 0,
                          "artifacts_removed": 0}

    @property
    def broker(self) -> BrokerServer | None:
        return self.host_broker.broker

    @property
    def broker_id(self) -> int | None:
        return self.host_broker.broker_id

    @property
    def broker_address(self) -> str:
        return self.host_broker.address

    @property
    def topics(self) -> CatalogTopics:
        return self.host_broker.topics

    @property
    def endpoints(self) -> BrokerEndpoints | None:
        return self.host_broker.endpoints

    @property
    def exit_feed(self) -> QueryExitFeed | None:
        """Process exits from the catalog, for broker 0's cohorts."""
        return self.host_broker.exit_feed

    @property
    def keys(self) -> RemoteKeyring:
        return self.host_broker.keys

    @property
    def shard_ids(self) -> tuple[int, ...]:
        """The broker ids of this host's other brokers (its shard processes)."""
        return tuple(s.ready.broker_id for s in self.shards if s.ready is not None)

    @property
    def slots(self) -> Slots:
        return self.state.slots

    @property
    def counters(self) -> dict[str, int]:
        """The shell's counts, the core's (spawned, spawn_failed, void_spawns) and the
        driver's bugs."""
        return {**self.state.counters, **self._counters,
                "bugs": self._counters["bugs"] + self._driver.bugs}

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def last_load(self) -> HostLoad | None:
        """The load it sampled last (sent with its last heartbeat), None before the first."""
        return None if self._sampler is None else self._sampler.last

    async def start(self) -> ExecutorAgent:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            # Held until close: two agents on one data dir would share a broker's logs and
            # broker id; the second is told which process has it.
            self._data_lock = hold_data_dir(self.data_dir)
            await self.host_broker.start()
            assert self.broker is not None
            self.forwarder = await LogForwarder(self.broker.port).start()
            self.supervisor = Supervisor(work_root=self.data_dir / "work", sink=self.forwarder,
                                         on_exit=self._exited, grace=self.grace)
            await self.supervisor.start()  # the fork server imports in the background
            cache = ArtifactCache(self.data_dir / "artifacts")
            cache.clean_incoming()
            self.fetcher = ArtifactFetcher(cache, upload=self._download)
            self._sampler = LoadSampler(self.data_dir)
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
                               connect_timeout=connect_timeout, presume_lost=True)
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
            broker_id = await self.host_broker.attach(cluster, self.host)
            if len(self.shards) < self.brokers - 1:
                await self._start_shards()
            executor = await cluster.register_executor(
                self.host, broker_id, host_resources(self.data_dir, self.slots.total),
                self.shard_ids)
        except BaseException:
            await self.host_broker.detach()
            await cluster.close()
            raise
        self.executor_id = executor.executor_id
        self.lost.clear()
        self._feed(Attached(self.executor_id))

    async def _start_shards(self) -> None:
        """Start the host's other brokers, each in a process of its own (`_shard.py`), and
        wait until each registered its broker. A shard that cannot start fails the start."""
        host, _, _ = self.broker_listen.rpartition(":")
        argv = ["--coordinator", self.coordinator, "--credentials", self.secret_file,
                "--data", str(self.data_dir.resolve()), "--host", self.host,
                "--broker-listen", f"{host}:0", "--lease", str(self.lease),
                *(["--advertise", self.advertise] if self.advertise else []),
                *(["--verbose"] if logger.isEnabledFor(logging.INFO) else []),
                *self.shard_args]
        for k in range(len(self.shards) + 1, self.brokers):
            shard = ShardProcess(k, argv, on_exit=self._shard_died)
            try:
                await shard.start()
            except BaseException:
                await shard.close()
                raise
            self.shards.append(shard)

    async def _shard_died(self, ready: ShardReady) -> None:
        """Close the session of a shard that died (the same principal's: the shard runs with
        the executor's credential). Said or not, it would expire after its lease."""
        cluster = self.cluster
        if cluster is None or not ready.session_id:
            return
        try:
            await cluster.request(CloseSession(session_id=ready.session_id), timeout=5.0)
        except TqError as exc:  # gone already (it lapsed, or rejoined under another id)
            logger.info("shard of broker %d: closing its session %d: %s", ready.broker_id,
                        ready.session_id, exc)

    @property
    def connector_address(self) -> str | None:
        """HOST:PORT of the broker's connector endpoint, if it has one."""
        return self.host_broker.connector_address

    @property
    def kafka_address(self) -> str | None:
        """HOST:PORT Kafka clients bootstrap from, if the broker has a Kafka listener."""
        return self.host_broker.kafka_address

    def closing(self) -> None:
        """The agent is about to stop (say so as soon as it is decided): its broker shards are
        not restarted from now on. A signal to its whole process group (a terminal, a service
        manager) stops them at once, and the agent stops its queries before it reaches them:
        their exits were said as crashes and the shards started again."""
        for shard in self.shards:
            shard.stop_restarting()

    async def close(self) -> None:
        """Kill every process (reporting their exits while the session lasts), close the
        session, the log forwarder and the broker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.closing()
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.supervisor is not None:
            await self.supervisor.close()
        # The exits of the processes just killed are reported while the session lasts.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.fetcher is not None:
            await self.fetcher.close()
        await asyncio.gather(*(shard.close() for shard in self.shards))
        await self.host_broker.stop_serving()
        if self.cluster is not None:
            await self.cluster.close()
        if self.forwarder is not None:
            await self.forwarder.close()
        await self.host_broker.close()
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
        # Unheard for a lease, the coordinator has expired our session (or is gone).
        await cluster.wait_lapsed()

    async def _drop_session(self) -> None:
        """Our processes' queries have failed with the session: kill them rather than let them
        run unaccounted for, then let the old session go."""
        logger.warning("executor %s: lost the coordinator; killing its processes",
                       self.executor_id)
        self.lost.set()  # first: nobody is there to hear about their exits
        self._feed(SessionLost())  # a new generation: KillAll, and every start is void
        if self._killing_all is not None:
            await asyncio.wait([self._killing_all])
        await self.host_broker.detach()  # key requests wait for the rejoin
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
        delays = Backoff(REJOIN_BACKOFF_MIN, REJOIN_BACKOFF_MAX).delays()
        delay = next(delays)
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
            delay = next(delays)

    def _spawn_task(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """Every task's end: a failure (a bug: each task handles the errors it expects) is
        logged with its traceback and counted, never dropped; cancellation is no failure."""
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._counters["bugs"] += 1
            logger.error("executor %s: bug in task %r", self.executor_id, task.get_name(),
                         exc_info=exc)

    # -- the core ------------------------------------------------------------------------------

    def _feed(self, event: object) -> None:
        self._driver.feed(event)

    def _bug(self, event: object, exc: Exception) -> None:
        """A bug handling `event` (logged by the driver). A spawn it was about gives its slot
        back and fails its query with the reason, rather than hold the slot for good."""
        key = getattr(event, "key", None)
        process = self.state.processes.get(key) if isinstance(key, tuple) else None
        if process is not None and key is not None and process.phase is not Phase.RUNNING \
                and not isinstance(event, StartFailed):
            self._feed(StartFailed(key, f"executor bug: {type(exc).__name__}: {exc}"))

    def _wake_at(self, instruction: WakeAt) -> None:
        loop = asyncio.get_running_loop()
        loop.call_at(instruction.when, lambda: None if self._closed else
                     self._feed(Tick(loop.time())))

    # -- notifies ------------------------------------------------------------------------------

    def _on_spawn(self, notification: Any) -> None:
        note: SpawnProcesses = notification.message
        now = asyncio.get_running_loop().time()
        for process in note.processes:
            self._feed(SpawnRequested(note, process, now))

    def _on_kill(self, notification: Any) -> None:
        note: KillProcesses = notification.message
        for process in note.processes:
            self._feed(KillRequested((note.query_id, process)))

    def _on_drop(self, notification: Any) -> None:
        self._feed(DropRequested(notification.message))

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
            self._feed(DropDone(note.topic_id))

    # -- performing the core's instructions -------------------------------------------------------

    def _fetch(self, instruction: Fetch) -> None:
        self._spawn_task(self._starting(instruction.key, self._fetched(instruction)),
                         f"fetch {instruction.key[0]}/{instruction.key[1]}")

    async def _fetched(self, instruction: Fetch) -> object:
        assert self.fetcher is not None
        artifact = await self.fetcher.ensure(instruction.note.program)
        return Fetched(instruction.key, artifact)

    def _launch(self, instruction: Launch) -> None:
        self._spawn_task(self._starting(instruction.key, self._launched(instruction)),
                         f"spawn {instruction.key[0]}/{instruction.key[1]}")

    async def _launched(self, instruction: Launch) -> object:
        assert self.supervisor is not None and self.fetcher is not None
        (query_id, process), note, artifact = instruction.key, instruction.note, \
            instruction.artifact
        self._artifact_of[instruction.key] = artifact.digest
        await asyncio.to_thread(touch_artifact, self.fetcher.cache, artifact.digest)
        credentials = await asyncio.to_thread(
            self.credentials.write, query_id, process, note.credential,
            coordinator=self.coordinator)
        spec = SpawnSpec(query_id=query_id, process=process, processes=note.process_count,
                         workers=note.workers, args=tuple(note.args),
                         coordinator=self.coordinator, credentials=str(credentials),
                         broker=self.broker_address, executor_id=self.executor_id,
                         name=note.name)
        await self.supervisor.spawn(spec, artifact.program)
        return Launched(instruction.key)

    async def _starting(self, key: tuple[int, int], step: Awaitable[object]) -> None:
        """One step of a start (fetch, launch): its outcome goes to the core. A failure is
        StartFailed with its reason; a bug is one too, said once with its traceback."""
        try:
            outcome = await step
        except Exception as exc:
            if isinstance(exc, TqError):
                reason = f"{type(exc).__name__}: {exc}"
            else:  # a bug (ours): said once with its traceback; the query hears of it now
                self._counters["bugs"] += 1
                logger.exception("executor %s: bug starting process %d of query %d",
                                 self.executor_id, key[1], key[0])
                reason = f"executor bug: {type(exc).__name__}: {exc}"
            logger.warning("executor %s: process %d of query %d did not start: %s",
                           self.executor_id, key[1], key[0], reason)
            outcome = StartFailed(key, reason)
        self._feed(outcome)

    def _kill(self, instruction: Kill) -> None:
        self._spawn_task(self._killing(instruction.key),
                         f"kill {instruction.key[0]}/{instruction.key[1]}")

    async def _killing(self, key: tuple[int, int]) -> None:
        assert self.supervisor is not None
        try:
            await self.supervisor.kill(key, self.grace)
        except TqError as exc:  # it ended here meanwhile: nothing to kill
            logger.debug("executor %s: kill %d/%d: %s", self.executor_id, key[0], key[1], exc)

    def _kill_all(self, instruction: KillAll) -> None:
        assert self.supervisor is not None
        self._killing_all = self._spawn_task(self.supervisor.kill_all(), "kill all")

    def _clean(self, instruction: CleanDisk) -> None:
        if self._closed:
            self._feed(CleanDone())
        else:
            self._spawn_task(self._clean_disk(), "disk cleanup")

    def _forget(self, instruction: Forget) -> None:
        self._artifact_of.pop(instruction.key, None)
        self.credentials.remove(*instruction.key)

    def _report_spawn_failed(self, instruction: ReportSpawnFailed) -> None:
        self._spawn_task(self._report_failed_spawn(instruction),
                         f"report spawn {instruction.query_id}/{instruction.process}")

    async def _report_failed_spawn(self, instruction: ReportSpawnFailed) -> None:
        cluster = self.cluster
        if cluster is None or self.lost.is_set():  # its session, hence its query, is gone
            return
        try:
            await cluster.report_spawn_failed(instruction.query_id, instruction.process,
                                              instruction.reason)
        except TqError as exc:
            self._counters["report_failed"] += 1
            logger.warning("executor %s: cannot report the failed spawn: %s",
                           self.executor_id, exc)

    def _report_exit(self, instruction: ReportExit) -> None:
        report: ExitReport = instruction.report
        self._spawn_task(self._reported_exit(report),
                         f"report exit {report.query_id}/{report.process}")

    async def _reported_exit(self, report: ExitReport) -> None:
        cluster = self.cluster
        if cluster is None or cluster.lost or self.lost.is_set():
            return
        try:
            if self.forwarder is not None:
                await self._flush_logs()  # its last lines are readable before it is ended
            await cluster.report_exit(report.query_id, report.process, report.exit_code,
                                      reason=report.failure)
        except TqError as exc:  # the query ended already (killed), or the coordinator is away
            self._counters["report_failed"] += 1
            logger.info("executor %s: exit of %d/%d not recorded: %s", self.executor_id,
                        report.query_id, report.process, exc)

    # -- from the supervisor and the fetcher -----------------------------------------------------

    async def _exited(self, report: ExitReport) -> None:
        self._feed(Exited((report.query_id, report.process), report))

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
                                           keep=self.keep_work_dirs, running=running,
                                           max_bytes=self.work_dir_bytes)
            digests = await asyncio.to_thread(prune_artifacts, self.fetcher.cache,
                                              unused_for=self.artifact_ttl, now=time.time(),
                                              running=in_use, max_bytes=self.artifact_bytes)
        except OSError as exc:  # a disk problem must not stop the agent; the next exit retries
            logger.warning("executor %s: disk cleanup: %s", self.executor_id, exc)
            return
        finally:
            self._feed(CleanDone())
        self._counters["work_dirs_removed"] += len(dirs)
        self._counters["artifacts_removed"] += len(digests)

    async def _download(self, digest: str) -> bytes | None:
        if self.cluster is None:  # between sessions: the spawn that asked is void anyway
            return None
        try:
            return await self.cluster.fetch_artifact(digest)
        except NotFoundError:
            return None


def _kafka_args(kafka: Any) -> list[str]:
    """Shard Kafka options from a KafkaConfig: its host and what it tells clients, on any free
    port (a listener with SASL or TLS needs the options given as `shard_args`)."""
    if kafka is None:
        return []
    argv = ["--kafka-port", "0", "--kafka-host", kafka.host]
    if kafka.advertised_host:
        argv += ["--advertised-host", kafka.advertised_host]
    if not kafka.auto_create_topics:
        argv.append("--no-kafka-auto-create-topics")
    return argv
