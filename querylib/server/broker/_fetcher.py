"""A follower broker's fetcher (DESIGN §5 "Replication"): one task and one RPC link per leader
broker, fetching every partition this broker follows there. Each round asks the leader for
each partition's batches from the follower's log end (`ReplicaFetchRequest`, naming the leader
epoch it follows), appends what comes unchanged (`PartitionLog.append_replica`: offsets and
epochs kept, CRC checked, no gap) and reports the new ends and the leader's high watermark to
the core (`ReplicaAppended`). A round that brought nothing waits `idle_wait` before the next.

Owns its RpcClient and task; decides nothing the core decides (the leader records the
follower's end from the fetch itself).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from catalog.errors import TqError
from querylib.broker.messages import EpochEndRequest, ReplicaFetchRequest
from querylib.errors import OffsetOutOfRangeError
from querylib.log import PartitionLog
from querylib.rpc import BROKER, Credential, RpcClient, RpcError

from ._events import PartitionId, ReplicaAppended, Stimulus
from ._replication import PartitionRole, follower_truncation_offset, scan_epochs

__all__ = ["ReplicaFetcher"]

logger = logging.getLogger("querylib.broker")


class ReplicaFetcher:
    """Fetches the partitions this broker follows from one leader at `address`."""

    def __init__(self, address: str, secret: bytes | Credential, *, broker_id: int,
                 log_of: Callable[[PartitionId], PartitionLog], executor: Executor,
                 report: Callable[[Stimulus], None], max_bytes: int = 1024 * 1024,
                 idle_wait: float = 0.01, timeout: float = 5.0) -> None:
        self.address = address
        self.broker_id = broker_id
        self.partitions: dict[PartitionId, PartitionRole] = {}
        self._secret = secret
        self._log_of = log_of
        self._executor = executor
        self._report = report
        self._max_bytes = max_bytes
        self._idle_wait = idle_wait
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.held = False  # tests pause a follower's fetches (`hold`)
        self._joining: set[PartitionId] = set()  # to truncate (KIP-279) before fetching
        self._fetching: PartitionId | None = None  # the partition of the round in progress
        self._settled = asyncio.Event()  # set whenever no partition's round is in progress
        self._settled.set()

    def follow(self, pid: PartitionId, role: PartitionRole) -> None:
        if self.partitions.get(pid) != role:
            self._joining.add(pid)
        self.partitions[pid] = role
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"replica fetcher of {self.address}")
        self._wake.set()

    def unfollow(self, pid: PartitionId) -> None:
        self.partitions.pop(pid, None)

    async def settled(self, pid: PartitionId) -> None:
        """Wait until no fetch of `pid` is in progress (unfollowed: none starts again), so
        its log is no longer written by this fetcher."""
        while self._fetching == pid:
            await self._settled.wait()

    def hold(self, held: bool) -> None:
        self.held = held
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        client = RpcClient(self.address, self._secret, audience=BROKER, timeout=self._timeout)
        await client.connect()
        try:
            while True:
                progressed = False
                if not self.held:
                    for pid, role in list(self.partitions.items()):
                        try:
                            progressed |= await self._fetch(client, pid, role)
                        except OffsetOutOfRangeError as exc:
                            # The leader's log ends below ours at this epoch (it lost an
                            # unflushed tail, say): truncate again before the next fetch.
                            self._joining.add(pid)
                            logger.info("replica fetch of %s from %s: %s; truncating again",
                                        pid, self.address, exc)
                        except (TqError, RpcError) as exc:
                            logger.info("replica fetch of %s from %s: %s", pid, self.address,
                                        exc)
                if not progressed:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), self._idle_wait)
                    except TimeoutError:
                        pass
        finally:
            await client.close()

    async def _fetch(self, client: RpcClient, pid: PartitionId, role: PartitionRole) -> bool:
        self._fetching = pid
        self._settled.clear()
        try:
            return await self._fetch_once(client, pid, role)
        finally:
            self._fetching = None
            self._settled.set()

    async def _fetch_once(self, client: RpcClient, pid: PartitionId,
                          role: PartitionRole) -> bool:
        log = self._log_of(pid)
        if pid in self._joining:
            await self._truncate(client, pid, log)
            self._joining.discard(pid)
        request = ReplicaFetchRequest(pid[0], pid[1], log.log_end_offset, role.leader_epoch,
                                      self.broker_id, self._max_bytes)
        reply, frames = await client.exchange(request)
        data = b"".join(bytes(f) for f in frames)
        if data:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, log.append_replica, data)
        if self.partitions.get(pid) is role:
            self._report(ReplicaAppended(pid, log.log_end_offset, log.durable_end_offset,
                                         reply.high_watermark))
        return bool(data)

    async def _truncate(self, client: RpcClient, pid: PartitionId, log: PartitionLog) -> None:
        """Truncate a (re)joining follower's log where its latest epoch ended on the leader:
        a tail it wrote as an older epoch's leader, never acknowledged, goes (KIP-101/279)."""
        loop = asyncio.get_running_loop()
        cache = await loop.run_in_executor(
            self._executor, scan_epochs, lambda offset: log.read(offset, 1 << 20),
            log.log_start_offset)
        if cache.latest_epoch < 0:
            return  # an empty log: nothing to truncate
        answer = await client.request(EpochEndRequest(pid[0], pid[1], cache.latest_epoch,
                                                      self.broker_id))
        end = log.log_end_offset
        offset = max(follower_truncation_offset((answer.leader_epoch, answer.end_offset),
                                                own_end=end), log.log_start_offset)
        if offset < end:
            logger.info("replica %s: truncating %d..%d (leader %s ended epoch %d at %d)",
                        pid, offset, end, self.address, answer.leader_epoch, answer.end_offset)
            await loop.run_in_executor(self._executor, log.truncate_to, offset)
