"""A host's other brokers, one process each (`tq executor --brokers N`, DESIGN §5 "The broker",
§6): shared-nothing, as a thread per core, so a host's broker work uses its cores.

Broker 0 runs in the agent's process; broker k (1..N-1) is a shard: a child process of the
agent, `tq executor --shard k` with the agent's coordinator, credential, data dir and Kafka
options, running a `HostBroker` on `<data>/broker-<k>` with its own remembered id and ports
(its Kafka listener on any free port, remembered), its own catalog view, keyring and exit
feed, and a coordinator session of its own with the executor's credential (its broker record
leaves with it). The agent registers the executor with the shards' broker ids
(`Executor.shards`); placement spreads the host's partitions over them.

Agent side, `ShardProcess`:

    shard = ShardProcess(k, argv)
    ready = await shard.start()     # ShardReady (broker id, addresses) once it registered
    ...
    await shard.close()             # SIGTERM, SIGKILL after a deadline

The shard dies with the agent (PR_SET_PDEATHSIG, querylib._parent), and says it is ready on a
pipe, as tq up's executor child does. A shard that exits before it is ready fails the start
(ExecutorExitedError; it said why on stderr). One that exits later is said at WARNING and
started again on the same data (so the same broker id and ports), after a backoff that doubles
from `RESTART_BACKOFF_MIN` up to `RESTART_BACKOFF_MAX` seconds and resets once a run lasted
`RESTART_STABLE` seconds. Before that the agent closes the dead shard's coordinator session
(`on_exit`; the shard named it when ready), rather than leave it a whole lease to expire: its
broker record leaves with it, so placement leaves its broker out, its replicated partitions
elect leaders elsewhere, the restarted shard registers on its id at once, and clients of its
partitions retry until it is back.

Shard side, `serve_shard`: open the broker, join (retrying while the coordinator is away, as
the agent does), report ready once, and rejoin whenever the session lapses, until SIGTERM. The
coordinator tells a broker's session to drop a deleted topic's partitions (`DropPartitions`):
the shard drops them from its broker and reports it, as the agent does for broker 0.

Must not: spawn query processes, register an executor, or forward logs (the agent does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalog import SessionKind, TopicName, TqError
from querylib._lease import Backoff
from querylib.cluster import AsyncCluster, DropPartitions, hold_data_dir
from querylib.rpc import Credential
from querylib.server import ProcessMetrics, serve_metrics
from querylib.server.broker import drop_hosted

from ._host_broker import HostBroker
from ._metrics import broker_metrics
from ._ready_child import exit_text, start_ready_child

__all__ = ["RESTART_BACKOFF_MAX", "ShardProcess", "ShardReady", "serve_shard", "shard_dir"]

logger = logging.getLogger("executor")

RESTART_BACKOFF_MIN = 0.5  # seconds before restarting a shard that exited; doubled each time
RESTART_BACKOFF_MAX = 10.0  # ... up to this
RESTART_STABLE = 30.0  # a run this long resets the backoff
_STOP_DEADLINE = 10.0  # seconds a SIGTERMed shard has before SIGKILL
_JOIN_BACKOFF_MAX = 5.0


def shard_dir(data_dir: str | os.PathLike[str], k: int) -> Path:
    """Where shard `k` of the executor on `data_dir` keeps its broker."""
    return Path(data_dir) / f"broker-{k}"


@dataclass(frozen=True)
class ShardReady:
    """What a shard reports once its broker is registered."""

    pid: int
    broker_id: int
    broker: str
    kafka: str
    metrics: str = ""  # its /metrics on loopback, when the agent serves metrics
    session_id: int = 0  # its coordinator session when it registered (0: not said)


class ShardProcess:
    """Shard `k` of this agent: its child process, restarted when it exits."""

    def __init__(self, k: int, argv: Sequence[str],
                 on_exit: Callable[[ShardReady], Awaitable[None]] | None = None) -> None:
        """`on_exit(ready)`: what the agent does once the shard it started (`ready`) died,
        before it is started again (close its coordinator session)."""
        self.k = k
        self.argv = list(argv)  # `tq executor` options: coordinator, credentials, data, ...
        self.on_exit = on_exit
        self.ready: ShardReady | None = None
        self.restarts = 0
        self.proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> ShardReady:
        """Start it and wait until it is ready; then watch it (restarting it if it exits)."""
        self.ready = await self._run_once()
        self._watch = asyncio.get_running_loop().create_task(self._keep(),
                                                             name=f"shard {self.k}")
        return self.ready

    async def _run_once(self) -> ShardReady:
        self.proc, fields = await start_ready_child(["--shard", str(self.k), *self.argv],
                                                    f"broker shard {self.k}")
        try:
            return ShardReady(**fields)
        except TypeError:
            await self._stop(self.proc)
            raise

    async def _keep(self) -> None:
        """Restart the shard whenever it exits, with backoff, until closed."""
        loop = asyncio.get_running_loop()
        delays = Backoff(RESTART_BACKOFF_MIN, RESTART_BACKOFF_MAX).delays()
        while True:
            assert self.proc is not None
            started = loop.time()
            code = await self.proc.wait()
            if self._stopping:  # its exit is part of the agent's stop: nothing to say
                return
            if loop.time() - started >= RESTART_STABLE:
                delays = Backoff(RESTART_BACKOFF_MIN, RESTART_BACKOFF_MAX).delays()
            delay = next(delays)
            broker = self.ready.broker_id if self.ready is not None else "?"
            logger.warning("broker shard %d (broker %s, pid %d) %s; restarting it in %.1fs",
                           self.k, broker, self.proc.pid, exit_text(code), delay)
            if self.on_exit is not None and self.ready is not None:
                await self.on_exit(self.ready)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                self.ready = await self._run_once()
            except (TqError, OSError) as exc:  # it said why on stderr; try again later
                logger.warning("broker shard %d did not restart: %s", self.k, exc)
                continue
            self.restarts += 1
            logger.warning("broker shard %d restarted (broker %d, pid %d)", self.k,
                           self.ready.broker_id, self.ready.pid)

    def metrics_url(self) -> str:
        """Where the shard serves its /metrics now ("" if it does not, or is not ready)."""
        ready = self.ready  # replaced whole when it restarts: safe to read from any thread
        return ready.metrics if ready is not None else ""

    def stop_restarting(self) -> None:
        """The agent is stopping: an exit from now on is part of it, not said, not restarted
        (a signal to the agent's whole process group stops the shard at once, while the agent
        still stops its queries before it reaches `close`)."""
        self._stopping = True

    async def close(self) -> None:
        """SIGTERM, SIGKILL after a deadline; no restart after this."""
        self.stop_restarting()
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self.proc is not None:
            await self._stop(self.proc)

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), _STOP_DEADLINE)
        except TimeoutError:
            logger.warning("broker shard pid %d did not stop within %gs; killing it", proc.pid,
                           _STOP_DEADLINE)
            proc.kill()
            await proc.wait()


# -- the shard's own process ----------------------------------------------------------------------


async def serve_shard(k: int, coordinator: str, secret: bytes | Credential, data_dir: str,
                      *, host: str, listen: str, lease: float, kafka: Any,
                      ready_fd: int | None, stop: asyncio.Event, metrics: bool = False,
                      advertise: str | None = None) -> None:
    """Run shard `k`'s broker until `stop` is set (see the module docstring). `metrics`:
    serve its /metrics on a free loopback port, named in the ready line, for the agent to
    merge into its own. `advertise`: the host its broker registers when bound to a
    wildcard address."""
    credential = Credential.of(secret)
    directory = shard_dir(data_dir, k)
    directory.mkdir(parents=True, exist_ok=True)
    lock = hold_data_dir(directory)
    broker = HostBroker(directory, credential, listen=listen, kafka=kafka, advertise=advertise,
                        slot=k)
    drops = _Drops(broker)
    cluster: AsyncCluster | None = None
    served: tuple[str, Callable[[], None]] | None = None
    registry: Any = None
    try:
        await broker.start()
        if metrics:
            registry = ProcessMetrics(asyncio.get_running_loop())
            registry.add(lambda: broker_metrics(broker.broker, broker.broker_id))
            port, stop_metrics = serve_metrics(registry, "127.0.0.1", 0, fallback=False)
            served = f"http://127.0.0.1:{port}/metrics", stop_metrics
        delays = Backoff(0.2, _JOIN_BACKOFF_MAX).delays()
        while not stop.is_set():
            cluster = AsyncCluster(coordinator, credential, kind=SessionKind.EXECUTOR,
                                   lease=lease, peer=f"broker shard {k}@{host}",
                                   connect_timeout=_JOIN_BACKOFF_MAX, presume_lost=True)
            cluster.on_notify(DropPartitions, drops.requested(cluster))
            try:
                await cluster.start()
                broker_id = await broker.attach(cluster, host)
            except (TqError, OSError) as exc:  # the coordinator is away: try again
                logger.info("broker shard %d: joining %s failed: %s", k, coordinator, exc)
                await cluster.close()
                cluster = None
                await _wait(stop, next(delays))
                continue
            delays = Backoff(0.2, _JOIN_BACKOFF_MAX).delays()
            if ready_fd is not None:
                with os.fdopen(ready_fd, "w") as out:
                    out.write(json.dumps({"pid": os.getpid(), "broker_id": broker_id,
                                          "broker": broker.address,
                                          "kafka": broker.kafka_address or "",
                                          "metrics": served[0] if served else "",
                                          "session_id": cluster.session_id or 0}) + "\n")
                ready_fd = None
            lapsed = asyncio.ensure_future(cluster.wait_lapsed())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait((lapsed, stopping), return_when=asyncio.FIRST_COMPLETED)
            lapsed.cancel()
            stopping.cancel()
            if not stop.is_set():
                logger.warning("broker shard %d (broker %d): lost the coordinator; rejoining",
                               k, broker_id)
            await broker.detach()
            await cluster.close()
            cluster = None
    finally:
        if served is not None:
            await asyncio.to_thread(served[1])
        if registry is not None:
            registry.close()
        await drops.close()
        await broker.stop_serving()
        if cluster is not None:
            await cluster.close()
        await broker.close()
        lock.release()


class _Drops:
    """A deleted topic's partitions leave the shard's broker, files included, reported back
    (the coordinator asks again until they are); one drop per topic at a time."""

    def __init__(self, broker: HostBroker) -> None:
        self.broker = broker
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def requested(self, cluster: AsyncCluster) -> Any:
        def on_drop(notification: Any) -> None:
            note: DropPartitions = notification.message
            if note.topic_id in self._tasks:
                return  # being dropped; the coordinator asks again if the report is lost
            task = asyncio.get_running_loop().create_task(self._drop(cluster, note),
                                                          name=f"drop {note.topic_id}")
            self._tasks[note.topic_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(note.topic_id, None))
        return on_drop

    async def _drop(self, cluster: AsyncCluster, note: DropPartitions) -> None:
        assert self.broker.broker is not None
        try:
            await drop_hosted(self.broker.broker, TopicName.parse(note.name).short,
                              note.partitions)
            if not cluster.lost:
                await cluster.report_partitions_dropped(note.topic_id, note.broker_id)
        except TqError as exc:  # the broker's file I/O raises StorageError, never OSError
            logger.warning("broker shard: drop of deleted topic %d (%s): %s", note.topic_id,
                           note.name, exc)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)


async def _wait(stop: asyncio.Event, delay: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        pass
