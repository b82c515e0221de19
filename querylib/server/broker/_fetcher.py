"""A follower broker's fetcher (DESIGN §5 "Replication"): one RPC link per leader broker and
one task per partition this broker follows there. Each asks the leader for the partition's
batches from the follower's log end (`ReplicaFetchRequest`, naming the leader epoch it
follows), appends what comes unchanged (`PartitionLog.append_replica`: offsets and epochs
kept, CRC checked, no gap) and reports the new ends and the leader's high watermark to the
core (`ReplicaAppended`). A fetch at the leader's log end waits there up to `max_wait` for the
next append (Kafka's replica.fetch.wait.max.ms), so a caught-up follower neither polls nor
lags: it has a new batch as soon as the leader wrote it.

Owns its RpcClient and tasks; decides nothing the core decides (the leader records the
follower's end from the fetch itself).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from catalog.errors import StorageError, TqError
from querylib.broker.messages import EpochEndRequest, ReplicaFetchRequest
from querylib.errors import OffsetOutOfRangeError
from querylib.log import FlushPolicy, PartitionLog
from querylib.rpc import BROKER, Credential, RpcClient, RpcError

from ._events import PartitionId, ReplicaAppended, Stimulus
from ._replication import PartitionRole, follower_truncation
from ._txn_index import forget_history

__all__ = ["ReplicaFetcher"]

logger = logging.getLogger("querylib.broker")


class ReplicaFetcher:
    """Fetches the partitions this broker follows from one leader at `address`."""

    def __init__(self, address: str, secret: bytes | Credential, *, broker_id: int,
                 log_of: Callable[[PartitionId], PartitionLog], executor: Executor,
                 report: Callable[[Stimulus], None], max_bytes: int = 1024 * 1024,
                 max_wait: float = 0.5, retry_wait: float = 0.1, timeout: float = 5.0) -> None:
        self.address = address
        self.broker_id = broker_id
        self.partitions: dict[PartitionId, PartitionRole] = {}
        self._secret = secret
        self._log_of = log_of
        self._executor = executor
        self._report = report
        self._max_bytes = max_bytes
        self._max_wait_ms = int(max_wait * 1000)
        self._retry_wait = retry_wait
        self._timeout = timeout
        self._client: RpcClient | None = None
        self._connecting = asyncio.Lock()
        self._tasks: dict[PartitionId, asyncio.Task[None]] = {}
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._joining: set[PartitionId] = set()  # to truncate (KIP-279) before fetching
        self._writing: set[PartitionId] = set()  # whose log a pool thread writes now

    @property
    def held(self) -> bool:
        """Whether fetches are paused (tests: `hold`)."""
        return not self._resumed.is_set()

    def follow(self, pid: PartitionId, role: PartitionRole) -> None:
        """Fetch `pid` as `role` says; at a new leader epoch, truncate first (KIP-279)."""
        old = self.partitions.get(pid)
        if old is None or old.leader_epoch != role.leader_epoch:
            self._joining.add(pid)
        self.partitions[pid] = role
        if pid not in self._tasks:
            self._tasks[pid] = asyncio.get_running_loop().create_task(
                self._run(pid), name=f"replica fetcher of {pid} from {self.address}")

    async def unfollow(self, pid: PartitionId) -> None:
        """Stop fetching `pid`; returns once nothing of it is under way, so its log may be
        closed or opened again: a fetch waiting at the leader is abandoned (a dead leader's
        would wait out the RPC timeout), a write to the log on the pool (an append, a
        truncation) finishes first (its thread would go on writing a log being closed)."""
        self.partitions.pop(pid, None)
        task = self._tasks.get(pid)
        if task is not None:
            await self._stop(pid, task)

    async def _stop(self, pid: PartitionId, task: asyncio.Task[None]) -> None:
        if pid not in self._writing:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def hold(self, held: bool) -> None:
        """Pause (True) or resume fetching; a fetch in flight when paused appends nothing."""
        if held:
            self._resumed.clear()
        else:
            self._resumed.set()

    async def close(self) -> None:
        """Stop every partition's fetching (see `unfollow`) and the link."""
        self.partitions.clear()
        await asyncio.gather(*(self._stop(pid, task) for pid, task in list(self._tasks.items())))
        self._tasks.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _connected(self) -> RpcClient:
        async with self._connecting:
            if self._client is None:
                client = RpcClient(self.address, self._secret, audience=BROKER,
                                   timeout=self._timeout + self._max_wait_ms / 1000)
                await client.connect()
                self._client = client
            return self._client

    async def _run(self, pid: PartitionId) -> None:
        failures = 0  # in a row: the first retries come sooner (a new leader takes its role
        # from the same catalog change as its followers, a few milliseconds apart)
        try:
            while (role := self.partitions.get(pid)) is not None:
                if self.held:
                    await self._resumed.wait()
                    continue
                try:
                    await self._fetch(await self._connected(), pid, role)
                    failures = 0
                except OffsetOutOfRangeError as exc:
                    # The leader's log ends below ours at this epoch (it lost an unflushed
                    # tail, say): truncate again before the next fetch.
                    self._joining.add(pid)
                    logger.info("replica fetch of %s from %s: %s; truncating again",
                                pid, self.address, exc)
                except (TqError, RpcError) as exc:
                    logger.info("replica fetch of %s from %s: %s", pid, self.address, exc)
                    await asyncio.sleep(min(self._retry_wait, 0.01 * 2 ** failures))
                    failures += 1
        finally:
            if self._tasks.get(pid) is asyncio.current_task():
                del self._tasks[pid]

    async def _fetch(self, client: RpcClient, pid: PartitionId, role: PartitionRole) -> None:
        log = self._log_of(pid)
        if pid in self._joining:
            await self._truncate(client, pid, log)
            self._joining.discard(pid)
        request = ReplicaFetchRequest(pid[0], pid[1], log.log_end_offset, role.leader_epoch,
                                      self.broker_id, self._max_bytes, self._max_wait_ms)
        reply, frames = await client.exchange(request)
        if self.held or self.partitions.get(pid) is not role:
            return  # paused, or its role changed meanwhile: the next fetch tells
        # A batch a frame, or one run of them: appended as they came, never joined (a copy).
        data = frames[0] if len(frames) == 1 else frames
        size = sum(len(frame) for frame in frames)
        if size:
            if log.config.flush is FlushPolicy.NEVER and not log.may_roll(size):
                # As the leader's append lane does: no append waits for the disk under
                # "never" (the page cache takes it), so it is written here, without a thread
                # hop each way per fetch; one that may roll the segment (the roll fsyncs the
                # segment it seals) goes to the pool.
                log.append_replica(data)
            else:
                await self._write(pid, log.append_replica, data)
        if self.partitions.get(pid) is role:
            self._report(ReplicaAppended(pid, log.log_end_offset, log.durable_end_offset,
                                         reply.high_watermark))

    async def _write(self, pid: PartitionId, write: Callable[[Any], object], arg: Any) -> None:
        """`write(arg)` to `pid`'s log on the pool; `unfollow` waits for it instead of
        cancelling the task (the thread would go on regardless)."""
        self._writing.add(pid)
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, write, arg)
        finally:
            self._writing.discard(pid)

    async def _truncate(self, client: RpcClient, pid: PartitionId, log: PartitionLog) -> None:
        """Truncate a (re)joining follower's log where it parts from the leader's: a tail it
        wrote as an older epoch's leader, never acknowledged, goes (KIP-101/279). Each round
        asks the leader where the follower's latest epoch ended; it ends when both hold the
        epoch answered, so at most once per epoch the follower knows."""
        for _round in range(len(log.leader_epochs.entries)):
            own = log.leader_epochs
            if own.latest_epoch < 0:
                return  # an empty log: nothing to truncate
            answer = await client.request(EpochEndRequest(pid[0], pid[1], own.latest_epoch,
                                                          self.broker_id))
            end = log.log_end_offset
            offset, final = follower_truncation((answer.leader_epoch, answer.end_offset), own,
                                                log_end=end)
            offset = max(offset, log.log_start_offset)
            if offset < end:
                logger.info("replica %s: truncating %d..%d (leader %s ended epoch %d at %d)",
                            pid, offset, end, self.address, answer.leader_epoch,
                            answer.end_offset)
                await self._write(pid, _truncate_forgetting_history, (log, offset))
            if final:
                return


def _truncate_forgetting_history(args: tuple[PartitionLog, int]) -> None:
    """Truncate the log at the offset, having removed its transaction history first (a crash
    in between leaves none: the next opening walks the log)."""
    log, offset = args
    try:
        forget_history(log.path)
    except OSError as exc:  # a storage failure, retried like a fetch's (the log is intact)
        raise StorageError(f"{log.path}: cannot remove the transaction history before "
                           f"truncating the log: {exc}") from exc
    log.truncate_to(offset)
