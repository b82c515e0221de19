"""The broker's I/O shell: RPC handlers, append lanes, disk reads and the clock around the pure
`BrokerState` (the dask WorkerState/BaseWorker split; DESIGN §5).

Every client request becomes a stimulus carrying a future as its token; the state answers with
instructions that this module performs: resolve the future (the RPC reply), hand an append to
the partition's lane, read from the log on a thread, push a delivery to a client. Results come
back as stimuli. The shell decides nothing the state decides (credit, acks, frontiers,
delivery); it owns every task, thread pool and log it opens, and closes them.

    server = BrokerServer("/data", secret, log_config=LogConfig(flush="always"))
    endpoint = await server.start("tcp://127.0.0.1:7500")
    ...
    await server.close()
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from catalog.errors import StorageError, TqError, UserError
from querylib._memory import keep_freed_memory
from querylib.log import FlushPolicy, LogConfig, PartitionLog, stored_batch
from querylib.records import read_header
from querylib.rpc import (
    AddressError,
    Context,
    InternalServerError,
    Limits,
    PeerBusyError,
    PeerUnreachableError,
    RpcServer,
    error_body,
)

from ._errors import BrokerProtocolError, UnknownPartitionError
from ._events import (
    AdvanceFrontier,
    Append,
    AppendCompleted,
    CloseSession,
    Deliver,
    DropPartition,
    DropSubscription,
    DurableAdvanced,
    EndStream,
    Fail,
    GrantCredit,
    Heartbeat,
    Instruction,
    OpenProducer,
    OpenSession,
    PartitionId,
    PartitionOpened,
    Produce,
    QueryExits,
    Read,
    ReadCompleted,
    ReadFailed,
    Reply,
    SaveGroups,
    SessionExpired,
    Stimulus,
    Subscribe,
    SubscriptionClosed,
    Tick,
    Unsubscribe,
)
from ._frontier import SavedGroup, query_of_group
from ._group_store import GroupSaver, load_groups
from ._host import (
    OpenedPartition,
    find_partitions,
    open_partition,
    partition_path,
    purge_deleted,
    remove_partition_dir,
    validate_partition,
)
from ._lane import AppendLane
from ._messages import (
    AdvanceRequest,
    CloseSessionRequest,
    CreditNotify,
    Delivery,
    Done,
    DropPartitionRequest,
    EndStreamRequest,
    EnsurePartition,
    HeartbeatRequest,
    ListPartitions,
    OpenProducerRequest,
    OpenSessionRequest,
    PartitionInfo,
    PartitionList,
    Produced,
    ProduceRequest,
    ProducerOpened,
    SessionOpened,
    Subscribed,
    SubscribeRequest,
    SubscriptionEnded,
    UnsubscribeRequest,
)
from ._model import BrokerLimits
from ._state import BrokerState

__all__ = ["BrokerServer"]

logger = logging.getLogger("querylib.broker")

_LENGTH = struct.Struct(">qi")  # baseOffset, batchLength


def _read(log: PartitionLog, offset: int, max_bytes: int, end_offset: int) -> tuple[bytes, int]:
    """Whole batches from `offset` and the offset after the last of them (thread side)."""
    data = log.read(offset, max_bytes, end_offset=end_offset)
    pos, last = 0, -1
    while pos < len(data):
        last = pos
        pos += 12 + _LENGTH.unpack_from(data, pos)[1]
    if last < 0:
        return data, offset
    return data, read_header(data, last).next_offset


def _open_partition(data_dir: str, pid: PartitionId, config: LogConfig,
                    scan_bytes: int) -> tuple[OpenedPartition, tuple[SavedGroup, ...]]:
    """The partition's log, recovered, and the writer groups saved beside it (thread side)."""
    opened = open_partition(data_dir, pid, config, producer_scan_bytes=scan_bytes)
    return opened, load_groups(partition_path(data_dir, pid))


class BrokerServer:
    """A broker hosting the partitions under `data_dir`, serving them over RPC."""

    def __init__(self, data_dir: str | os.PathLike[str], secret: bytes, *,
                 limits: BrokerLimits | None = None, log_config: LogConfig | None = None,
                 rpc_limits: Limits | None = None, max_partitions: int = 10_000,
                 tick_interval: float = 0.1, append_threads: int = 4,
                 read_threads: int = 4) -> None:
        keep_freed_memory()  # a batch's megabyte is freed once stored and sent: reuse it
        self.data_dir = os.fspath(data_dir)
        self.log_config = log_config or LogConfig()
        self.max_partitions = max_partitions
        self.tick_interval = tick_interval
        # Tail deliveries hand out the bytes exactly as the log stores them (it stamps more
        # than the base offset), without reading them back.
        self.state = BrokerState(limits, stamp=stored_batch)
        # Deliveries are bounded by credit, not by message count: a subscriber with 1 MiB of
        # credit and 100-byte batches has ~10k messages in flight, beyond zmq's default HWM.
        self._rpc = RpcServer(secret, limits=rpc_limits or Limits(hwm=100_000))
        self._append_pool = ThreadPoolExecutor(append_threads, thread_name_prefix="tq-append")
        self._read_pool = ThreadPoolExecutor(read_threads, thread_name_prefix="tq-read")
        self._lanes: dict[PartitionId, AppendLane] = {}
        self._savers: dict[PartitionId, GroupSaver] = {}
        self._opening: dict[PartitionId, asyncio.Lock] = {}
        self._peers: dict[str, bytes] = {}  # broker session -> ROUTER identity of its client
        self._broken: set[tuple[str, int]] = set()  # subscriptions whose delivery failed
        self._inbox: deque[Stimulus] = deque()
        self._feeding = False
        self._ticker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.endpoint: str | None = None
        self.counters: dict[str, int] = {"delivery_failed": 0, "bugs": 0}
        self._visible_listeners: list[Callable[[PartitionId], None]] = []
        self._register()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, listen: str = "tcp://127.0.0.1:0", *, prefer: str | None = None) -> str:
        """Open (and recover) every partition under the data directory, then listen: on
        `prefer` if given and free (the address of a previous run, so clients find us where
        they left us), else on `listen`."""
        self._loop = asyncio.get_running_loop()
        # The state's clock starts now, not at the ticker's first run: a session opened in
        # between would otherwise get its lease counted from time 0 and expire at once.
        self._feed(Tick(self._loop.time(), int(time.time() * 1000)))
        os.makedirs(self.data_dir, exist_ok=True)
        await self._loop.run_in_executor(self._append_pool, purge_deleted, self.data_dir)
        pids = await self._loop.run_in_executor(self._append_pool, find_partitions,
                                                self.data_dir)
        await asyncio.gather(*(self._open(pid) for pid in pids))
        if prefer:
            try:
                self.endpoint = await self._rpc.start(prefer)
            except AddressError as exc:
                logger.warning("broker: %s; listening on %s instead", exc, listen)
        if self.endpoint is None:
            self.endpoint = await self._rpc.start(listen)
        self._ticker = self._loop.create_task(self._tick_forever(), name="broker ticks")
        logger.info("broker on %s: %d partitions under %s", self.endpoint, len(pids),
                    self.data_dir)
        return self.endpoint

    async def close(self) -> None:
        """Stop serving, finish queued appends, close every log. Idempotent."""
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        await self._rpc.close()
        for lane in list(self._lanes.values()):
            await lane.close()
        for saver in list(self._savers.values()):
            await saver.close()
        loop = asyncio.get_running_loop()
        for lane in self._lanes.values():
            await loop.run_in_executor(self._append_pool, lane.log.close)
        self._lanes.clear()
        self._append_pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=True)

    async def __aenter__(self) -> BrokerServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def rpc_counters(self) -> dict[str, int]:
        """Messages the RPC layer dropped or refused, by reason."""
        return self._rpc.counters

    def statistics(self) -> dict[str, int]:
        return {**self.state.statistics(), **self.counters}

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._feed(Tick(loop.time(), int(time.time() * 1000)))
            await asyncio.sleep(self.tick_interval)

    # -- partitions -------------------------------------------------------------------------

    async def _open(self, pid: PartitionId) -> None:
        loop = asyncio.get_running_loop()
        opened, groups = await loop.run_in_executor(
            self._append_pool, _open_partition, self.data_dir, pid, self.log_config,
            self.state.limits.producer_scan_bytes)
        log = opened.log
        inline = self.log_config.flush is FlushPolicy.NEVER
        self._lanes[pid] = AppendLane(pid, log, self._append_pool, self._feed, inline=inline)
        self._savers[pid] = GroupSaver(pid, partition_path(self.data_dir, pid),
                                       self._append_pool, self._feed)
        self._feed(PartitionOpened(pid, log.log_start_offset, log.log_end_offset,
                                   log.durable_end_offset, opened.frontier, opened.ended,
                                   groups, opened.producers))

    # -- hooks for endpoints in the same process (connector, Kafka listener) ----------------------

    def submit(self, make: Callable[[asyncio.Future[Any]], Stimulus]) -> asyncio.Future[Any]:
        """Feed the stimulus `make(future)` to the state, on the broker's loop; the future
        resolves with the state's reply (or its error). How in-process endpoints produce,
        advance frontiers and open sessions exactly as RPC clients do."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._feed(make(future))
        return future

    async def ensure_partition(self, topic: str, partition: int, *,
                               create: bool) -> PartitionId:
        """The partition's id once this broker hosts it, opening (`create`: creating) it.
        InvalidTopicError for a name the broker cannot store, UnknownPartitionError when it
        does not host it and `create` is off."""
        return await self._ensure(topic, partition, create)

    def on_visible(self, listener: Callable[[PartitionId], None]) -> Callable[[], None]:
        """Call `listener(pid)` (on the loop; it must be quick) whenever what subscribers may
        read of a partition may have grown. Returns the function that stops it. How a Kafka
        Fetch waiting for data learns of appends without polling."""
        self._visible_listeners.append(listener)
        return lambda: self._visible_listeners.remove(listener)

    def partition_log(self, pid: PartitionId) -> PartitionLog:
        """The log of a hosted partition, for reads (thread-safe against the append lane).
        Never append to it: the lane is its one writer. UnknownPartitionError if not hosted."""
        lane = self._lanes.get(pid)
        if lane is None:
            raise UnknownPartitionError(f"this broker has no partition {pid[1]} of topic "
                                        f"{pid[0]!r}")
        return lane.log

    def query_exits(self, query_id: int, exit_codes: tuple[int | None, ...],
                    failed: bool) -> None:
        """What the catalog says of a query's processes (exit code each, None while running;
        `failed`: the query failed or was killed): its writer groups on this broker settle
        (DESIGN §11 "Collective publishing"). Call on the broker's loop."""
        self._feed(QueryExits(query_id, tuple(exit_codes), failed))

    def group_queries(self) -> set[int]:
        """The queries some writer group on this broker is waiting for (to join, or to end)."""
        return {q for part in self.state.partitions.values()
                for g in part.frontier.open_groups()
                if (q := query_of_group(g)) is not None}

    async def _ensure(self, topic: str, partition: int, create: bool) -> PartitionId:
        pid = validate_partition(topic, partition)
        if pid in self.state.partitions:
            return pid
        if not create:
            raise UnknownPartitionError(f"this broker has no partition {partition} of topic "
                                        f"{topic!r}")
        lock = self._opening.setdefault(pid, asyncio.Lock())
        async with lock:
            if pid not in self.state.partitions:
                if len(self.state.partitions) >= self.max_partitions:
                    raise UserError(f"this broker hosts its maximum of {self.max_partitions} "
                                    "partitions")
                await self._open(pid)
        self._opening.pop(pid, None)
        return pid

    async def drop_partition(self, topic: str, partition: int) -> None:
        """Forget a partition and delete its files (its topic was deleted). PartitionBusyError
        while appends or reads on it are in flight; done already if not hosted."""
        pid = validate_partition(topic, partition)
        # Under the partition's opening lock: an open asked for meanwhile (the topic created
        # again) waits and then finds no directory, so a new topic never sees old records.
        lock = self._opening.setdefault(pid, asyncio.Lock())
        async with lock:
            self._opening[pid] = lock  # an open that held it before us may have let it go
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._feed(DropPartition(future, pid))
            await future
            loop = asyncio.get_running_loop()
            lane = self._lanes.pop(pid, None)
            if lane is not None:
                await lane.close()
                await loop.run_in_executor(self._append_pool, lane.log.close)
            saver = self._savers.pop(pid, None)
            if saver is not None:
                await saver.close()
            await loop.run_in_executor(self._append_pool, remove_partition_dir, self.data_dir,
                                       pid)

    # -- the state machine loop -------------------------------------------------------------

    def _feed(self, stimulus: Stimulus) -> None:
        """Hand a stimulus to the state and perform its instructions. Stimuli raised while
        performing (a failed delivery) queue behind, so instructions run in the order given."""
        self._inbox.append(stimulus)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._inbox:
                current = self._inbox.popleft()
                try:
                    instructions = self.state.handle(current)
                except Exception as exc:
                    # A bug (ours, not a client's): report it and keep serving everyone else.
                    self.counters["bugs"] += 1
                    logger.exception("broker: bug handling %s", type(current).__name__)
                    token = getattr(current, "token", None)
                    if isinstance(token, asyncio.Future) and not token.done():
                        token.set_exception(InternalServerError(
                            f"broker bug: {type(exc).__name__}: {exc}"))
                    continue
                for instruction in instructions:
                    self._perform(instruction)
                if self._visible_listeners and isinstance(current, (AppendCompleted,
                                                                    DurableAdvanced)):
                    for listener in list(self._visible_listeners):
                        listener(current.partition)
        finally:
            self._feeding = False

    def _perform(self, instr: Instruction) -> None:
        if isinstance(instr, Reply):
            if not instr.token.done():
                instr.token.set_result(instr.value)
        elif isinstance(instr, Deliver):
            self._deliver(instr)
        elif isinstance(instr, Append):
            self._lanes[instr.partition].submit(instr.ticket, instr.batch)
        elif isinstance(instr, Read):
            self._read(instr)
        elif isinstance(instr, Fail):
            if not instr.token.done():
                instr.token.set_exception(instr.error)
        elif isinstance(instr, SubscriptionClosed):
            self._broken.discard((instr.session, instr.sub_id))
            error = instr.error if isinstance(instr.error, TqError) else StorageError(
                str(instr.error))
            self._notify(instr.session, SubscriptionEnded(
                sub_id=instr.sub_id, topic=instr.partition[0], partition=instr.partition[1],
                error=error_body(error)))
        elif isinstance(instr, SaveGroups):
            self._savers[instr.partition].submit(instr)
        elif isinstance(instr, SessionExpired):
            self._peers.pop(instr.session, None)
        else:  # pragma: no cover - the state emits nothing else
            raise TypeError(f"unknown instruction {instr!r}")

    def _deliver(self, d: Deliver) -> None:
        key = (d.session, d.sub_id)
        if key in self._broken:
            return  # an earlier delivery of this round failed: the subscription is ending
        message = Delivery(sub_id=d.sub_id, topic=d.partition[0], partition=d.partition[1],
                           offset=d.offset, next_offset=d.next_offset)
        try:
            peer = self._peers.get(d.session)
            if peer is None:
                raise PeerUnreachableError(f"no address known for session {d.session!r}")
            self._rpc.notify(peer, message, payload=[d.data])
        except (PeerBusyError, PeerUnreachableError) as exc:
            # Delivering out of order or with a hole is never an option: end the subscription;
            # the client resubscribes from the last offset it has.
            self.counters["delivery_failed"] += 1
            self._broken.add(key)
            self._feed(DropSubscription(d.session, d.sub_id, exc))

    def _notify(self, session: str, message: Any) -> None:
        peer = self._peers.get(session)
        if peer is None:
            return
        try:
            self._rpc.notify(peer, message)
        except (PeerBusyError, PeerUnreachableError):
            self.counters["delivery_failed"] += 1

    def _read(self, instr: Read) -> None:
        assert self._loop is not None
        log = self._lanes[instr.partition].log
        future = self._loop.run_in_executor(self._read_pool, _read, log, instr.offset,
                                            instr.max_bytes, instr.end_offset)

        def done(f: asyncio.Future[tuple[bytes, int]]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                if not isinstance(exc, TqError):
                    logger.error("broker: read of %s failed: %r", instr.partition, exc)
                self._feed(ReadFailed(instr.serial, instr.offset, exc))
            else:
                data, next_offset = f.result()
                self._feed(ReadCompleted(instr.serial, instr.offset, data, next_offset))

        future.add_done_callback(done)

    # -- request handlers -------------------------------------------------------------------

    async def _call(self, ctx: Context, session: str, make: Callable[[Any], Stimulus]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._feed(make(future))
        if session in self.state.sessions:
            self._peers[session] = ctx.peer  # the client may have reconnected from a new socket
        return await future

    def _register(self) -> None:
        rpc = self._rpc

        @rpc.route(OpenSessionRequest)
        async def open_session(req: OpenSessionRequest, ctx: Context) -> SessionOpened:
            return await self._call(ctx, req.session,
                                    lambda t: OpenSession(t, req.session, req.lease))

        @rpc.route(HeartbeatRequest)
        async def heartbeat(req: HeartbeatRequest, ctx: Context) -> Done:
            return await self._call(ctx, req.session, lambda t: Heartbeat(t, req.session))

        @rpc.route(CloseSessionRequest)
        async def close_session(req: CloseSessionRequest, ctx: Context) -> Done:
            return await self._call(ctx, req.session, lambda t: CloseSession(t, req.session))

        @rpc.route(ListPartitions)
        async def list_partitions(req: ListPartitions, ctx: Context) -> PartitionList:
            pids = sorted(p for p in self.state.partitions if not req.topic or p[0] == req.topic)
            return PartitionList([self.state.partition_info(p) for p in pids])

        @rpc.route(EnsurePartition)
        async def ensure(req: EnsurePartition, ctx: Context) -> PartitionInfo:
            pid = await self._ensure(req.topic, req.partition, req.create)
            return self.state.partition_info(pid)

        @rpc.route(DropPartitionRequest)
        async def drop(req: DropPartitionRequest, ctx: Context) -> Done:
            await self.drop_partition(req.topic, req.partition)
            return Done()

        @rpc.route(OpenProducerRequest)
        async def open_producer(req: OpenProducerRequest, ctx: Context) -> ProducerOpened:
            pid = await self._ensure(req.topic, req.partition, req.create)
            return await self._call(ctx, req.session,
                                    lambda t: OpenProducer(t, req.session, pid, req.group,
                                                           req.writer, req.writers,
                                                           req.rejoin))

        @rpc.route(ProduceRequest)
        async def produce(req: ProduceRequest, ctx: Context) -> Produced:
            if len(ctx.payload) != 1:
                raise BrokerProtocolError(f"a produce carries exactly one payload frame (one "
                                          f"record batch), not {len(ctx.payload)}")
            pid = (req.topic, req.partition)
            batch = ctx.payload[0]
            return await self._call(ctx, req.session,
                                    lambda t: Produce(t, req.session, pid, batch))

        @rpc.route(AdvanceRequest)
        async def advance(req: AdvanceRequest, ctx: Context) -> Done:
            pid = (req.topic, req.partition)
            return await self._call(ctx, req.session,
                                    lambda t: AdvanceFrontier(t, req.session, pid, req.frontier))

        @rpc.route(EndStreamRequest)
        async def end_stream(req: EndStreamRequest, ctx: Context) -> Done:
            pid = (req.topic, req.partition)
            return await self._call(ctx, req.session, lambda t: EndStream(t, req.session, pid))

        @rpc.route(SubscribeRequest)
        async def subscribe(req: SubscribeRequest, ctx: Context) -> Subscribed:
            pid = await self._ensure(req.topic, req.partition, req.create)
            return await self._call(ctx, req.session, lambda t: Subscribe(
                t, req.session, req.sub_id, pid, req.start, req.credit))

        @rpc.route(UnsubscribeRequest)
        async def unsubscribe(req: UnsubscribeRequest, ctx: Context) -> Done:
            return await self._call(ctx, req.session,
                                    lambda t: Unsubscribe(t, req.session, req.sub_id))

        @rpc.route(CreditNotify)
        async def credit(msg: CreditNotify, ctx: Context) -> None:
            if msg.session in self.state.sessions:
                self._peers[msg.session] = ctx.peer
            self._feed(GrantCredit(msg.session, msg.sub_id, msg.nbytes))
