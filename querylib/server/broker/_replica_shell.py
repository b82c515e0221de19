"""A broker's replication shell (DESIGN §5 "Replication"): the I/O around the core's rules
for replicated partitions, as `BrokerServer.replication`.

It keeps this broker's role per replicated partition as the catalog gives it (`set_role`: the
one seam, called by the executor's catalog view, or by tests), runs a `ReplicaFetcher` per
leader it follows, and serves the two requests other brokers make of a leader: the replica
fetch (`broker.replica.fetch`: the stored bytes from the follower's log end and the high
watermark, long-polled at the log end) and OffsetForLeaderEpoch (`broker.replica.epoch_end`),
only to a principal `may_replicate` admits as the replica its request names, and only for the
partition's replicas. The leader's
bookkeeping (high watermark, ISR proposals, fencing) is the core's (`_replication.py`, fed as
`SetReplicaRole` / `ReplicaFetched` / `ReplicaAppended`); its ISR proposals come out of the
core and go to `on_isr_proposal`.

    replication = server.replication
    replication.credential = secret          # what a follower signs its fetches with
    replication.may_replicate = holds        # (principal, replica id): may it fetch as that
    replication.on_isr_proposal = send_alter_partition
    await replication.set_role("t", 0, role, broker_id=2, min_insync=2)

Owns its fetchers (closed by `close`); decides nothing the core decides.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor

from querylib.broker._errors import (
    BrokerClosedError,
    BrokerProtocolError,
    NotLeaderOrFollowerError,
    PrincipalError,
)
from querylib.broker.messages import EpochEnd, EpochEndRequest, ReplicaData, ReplicaFetchRequest
from querylib.errors import OffsetOutOfRangeError
from querylib.rpc import Context, Credential, RpcServer
from querylib.rpc._signer import DigestCache

from ._appender import AppendLane
from ._bookkeeping import BrokerLimits
from ._disk import validate_partition
from ._events import (
    PartitionId,
    ProposeIsr,
    ReplicaAnswer,
    ReplicaFetched,
    SetReplicaRole,
    Stimulus,
)
from ._fetcher import ReplicaFetcher
from ._replication import PartitionRole
from ._write_access import ADMIN

__all__ = ["ReplicaShell"]

logger = logging.getLogger("querylib.broker")

MAX_REPLICA_WAIT_MS = 30_000  # a follower's fetch waits at most this long for an append
# Digests of held batches kept for the next follower's fetch (`DigestCache`: each keeps its
# batch alive until dropped, so they are bounded by the bytes and count of those batches).
KEPT_DIGEST_BYTES = 16 * 1024 * 1024
KEPT_DIGESTS = 4096


class ReplicaShell:
    """The replication half of one `BrokerServer`. `ensure` opens a partition (creating it);
    `reopen` opens an open one again; `drop` closes one and deletes its files; `lanes` are
    the server's append lanes (one per open partition); `feed` gives the core a stimulus;
    `closing` says whether the server is closing."""

    def __init__(self, *, ensure: Callable[[str, int], Awaitable[PartitionId]],
                 reopen: Callable[[PartitionId], Awaitable[None]],
                 drop: Callable[[str, int], Awaitable[None]],
                 lanes: Mapping[PartitionId, AppendLane], feed: Callable[[Stimulus], None],
                 limits: BrokerLimits, append_pool: Executor, read_pool: Executor,
                 closing: Callable[[], bool], credential: bytes | Credential | None) -> None:
        self._ensure = ensure
        self._reopen = reopen
        self._drop = drop
        self._lanes = lanes
        self._feed = feed
        self._limits = limits
        self._append_pool = append_pool
        self._read_pool = read_pool
        self._closing = closing
        # What a follower signs its fetches with: the cluster secret (a broker given a keyring,
        # e.g. an executor's, is told its credential by whoever sets its roles).
        self.credential = credential
        # Who may fetch as which follower: (principal, the replica id its request names) ->
        # whether that principal holds that broker (the admin's secret holds all here; an
        # executor passes its catalog's rule: the principal that registered the broker). A
        # replica's fetches move the high watermark, so naming another replica is refused.
        self.may_replicate: Callable[[str, int], bool] = \
            lambda principal, replica: principal == ADMIN
        # Where ISR proposals go (an executor: AlterPartition through its coordinator session).
        self.on_isr_proposal: Callable[[ProposeIsr], object] = lambda instr: logger.info(
            "broker: no one takes ISR proposals here: %s", instr)
        self._roles: dict[PartitionId, PartitionRole] = {}
        self._fetchers: dict[str, ReplicaFetcher] = {}
        # The payload digests of the held batches last sent to followers: every follower
        # fetches the same batch objects, each hashed once for all of them.
        self.digests = DigestCache(KEPT_DIGEST_BYTES, KEPT_DIGESTS)
        self._leading: set[PartitionId] = set()

    async def close(self) -> None:
        """Stop every fetcher (before the logs they append to close)."""
        for fetcher in list(self._fetchers.values()):
            await fetcher.close()
        self._fetchers.clear()

    async def set_role(self, topic: str, partition: int, role: PartitionRole | None, *,
                       broker_id: int, min_insync: int = 1) -> None:
        """This broker's role (broker `broker_id`) on a replicated partition, as the catalog
        says (None: the partition has one replica; one not naming it: no replica any more).
        The partition is opened here if it is not (a replica holds a log); a follower fetches
        from `role.leader_address`; a follower
        promoted to leader opens its partition again first (it appended its leader's batches
        unjudged: producers' sequences, frontier and end of stream come from its log).

        A role not naming this broker (decommissioned, DESIGN §5 "Decommissioning a broker"):
        its copy is kept while a replica named is out of the ISR (catching up), then dropped,
        files and all; a partition not open here is left alone (not made anew)."""
        drained = role is not None and broker_id not in role.replicas
        if drained and validate_partition(topic, partition) not in self._lanes:
            return  # dropped already, or never held
        pid = await self._ensure(topic, partition)
        old = self._roles.pop(pid, None)
        fetcher = None if old is None else self._fetchers.get(old.leader_address)
        if fetcher is not None:
            await fetcher.unfollow(pid)  # nothing in flight writes its log any more
        leads = role is not None and role.is_leader(broker_id)
        if leads and old is not None and not old.is_leader(broker_id):
            await self._reopen(pid)
        self._lanes[pid].leader_epoch = role.leader_epoch if leads and role is not None else 0
        self._feed(SetReplicaRole(pid, role, broker_id, min_insync))
        if leads:
            self._leading.add(pid)
        else:
            self._leading.discard(pid)
        if role is None:
            return
        self._roles[pid] = role
        if not drained:
            if not leads:
                self._follow(pid, role, broker_id)
            return
        # Taken out of the replicas: it refuses producers and subscribers as a follower does,
        # but fetches from nobody (the leader would refuse it). Once every replica named is
        # in sync, they hold all that was acknowledged: this copy is dead weight.
        if role.isr and set(role.replicas) <= set(role.isr):
            await self._drop(topic, partition)
            del self._roles[pid]
            logger.info("broker %d: dropped its copy of %s-%d: no replica of it any more, and "
                        "the replicas named (%s) are in sync", broker_id, topic, partition,
                        ", ".join(map(str, role.replicas)))

    def _follow(self, pid: PartitionId, role: PartitionRole, broker_id: int) -> None:
        if not role.leader_address:
            raise ValueError(f"a follower of {pid} needs its leader's address")
        fetcher = self._fetchers.get(role.leader_address)
        if fetcher is None:
            if self.credential is None:
                raise ValueError("a follower needs a credential to fetch with")
            fetcher = self._fetchers[role.leader_address] = ReplicaFetcher(
                role.leader_address, self.credential, broker_id=broker_id,
                log_of=lambda p: self._lanes[p].log, executor=self._append_pool,
                report=self._feed)
        fetcher.follow(pid, role)

    def hold(self, held: bool) -> None:
        """Pause (True) or resume this broker's fetches as a follower (tests)."""
        for fetcher in self._fetchers.values():
            fetcher.hold(held)

    async def epoch_end(self, pid: PartitionId, leader_epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch on a partition this broker holds: (the largest epoch at most
        `leader_epoch` in its log, the offset where it ended), from its leader epoch cache."""
        log = self._lanes[pid].log
        return log.leader_epochs.end_offset_for(leader_epoch, log_end=log.log_end_offset)

    # -- what other brokers ask of a leader (RPC handlers) ------------------------------------

    async def serve_epoch_end(self, req: EpochEndRequest, ctx: Context) -> EpochEnd:
        """OffsetForLeaderEpoch for a (re)joining follower: where `req.leader_epoch` ended in
        this leader's log."""
        pid = self._checked(req.topic, req.partition, req.replica, ctx)
        role = self._roles.get(pid)
        if pid not in self._leading or role is None or not role.is_follower(req.replica):
            raise NotLeaderOrFollowerError(f"this broker does not lead {pid} for {req.replica}")
        return EpochEnd(*await self.epoch_end(pid, req.leader_epoch))

    async def serve_fetch(self, req: ReplicaFetchRequest, ctx: Context) -> ReplicaData:
        """A follower's fetch: the core records its end (the high watermark may move) and
        answers, at once or, at the log end, once more is appended or `max_wait_ms` passed;
        then the stored bytes from its end are attached."""
        pid = self._checked(req.topic, req.partition, req.replica, ctx)
        if not 0 < req.max_bytes <= self._limits.max_read_bytes * 8:
            raise BrokerProtocolError(f"a replica fetch of {req.max_bytes} bytes")
        if not 0 <= req.max_wait_ms <= MAX_REPLICA_WAIT_MS:
            raise BrokerProtocolError(f"a replica fetch waiting {req.max_wait_ms} ms (at most "
                                      f"{MAX_REPLICA_WAIT_MS})")
        lane = self._lanes.get(pid)
        if lane is None:
            raise NotLeaderOrFollowerError(f"this broker does not lead {pid}")
        if not 0 <= req.fetch_offset <= lane.log.log_end_offset:
            # Records this log never held (a tail the replica did not truncate) must not count
            # towards the high watermark (Kafka: OFFSET_OUT_OF_RANGE). Checked against the
            # log itself: the core hears of an append after the lane wrote it.
            raise OffsetOutOfRangeError(f"replica {req.replica} fetches {pid} at "
                                        f"{req.fetch_offset}, the log ends at "
                                        f"{lane.log.log_end_offset}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ReplicaAnswer] = loop.create_future()
        self._feed(ReplicaFetched(future, pid, req.replica, req.fetch_offset,
                                  req.leader_epoch, req.max_wait_ms / 1000, req.max_bytes))
        answer = await future
        log = lane.log
        end = log.log_end_offset
        if answer.batches is not None:
            # Still held by the core, as stored: no read (nor a hop to the read pool), and
            # each batch goes out as its own frame, not copied into one: one zero-copy zmq
            # frame and one digest a batch, shared by both followers and the subscribers.
            sendable = self.digests.sendable
            share = RpcServer.shared_payload
            sent = [sendable(batch, share) for batch in answer.batches]
            ctx.attach(*[frame for frame, _ in sent], digests=[digest for _, digest in sent])
        elif req.fetch_offset < end:
            ctx.attach(await loop.run_in_executor(
                self._read_pool, lambda: log.read(req.fetch_offset, req.max_bytes,
                                                  end_offset=end)))
        return ReplicaData(answer.high_watermark, log.log_start_offset, end)

    def _checked(self, topic: str, partition: int, replica: int, ctx: Context) -> PartitionId:
        """The partition a replica's request names, once its sender may replicate as
        `replica`: the principal that holds that broker of the cluster (`may_replicate`), to
        an open broker."""
        if self._closing():
            raise BrokerClosedError("the broker is closed")
        if not self.may_replicate(ctx.principal or "", replica):
            raise PrincipalError(f"{ctx.principal} may not fetch as replica {replica}: only "
                                 "the broker of the cluster registered as it does")
        return validate_partition(topic, partition)
