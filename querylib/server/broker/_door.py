"""The in-process door into a `BrokerServer` (DESIGN §5 "One door"): what the broker's RPC
server is for clients in other processes, `BrokerPort` is for the code in its own process:
the Kafka listener, the connector endpoint, the coordinator's catalog writer, an executor's
log forwarder.

Writes go through sessions (`port.link(principal)`: a `PortLink`, the same interface as the
RPC `BrokerLink`, so `AsyncProducer` and `ProducerCore` run over either), whose requests are
the broker's RPC messages, handled by the same code as RPC requests: admission, credit
windows, frontiers and durability are decided once, by the broker's core. Reads of what
subscribers may see (partition info up to the visible end, the log for reads, `on_visible`)
are on the port too, so no endpoint touches the broker's state or its event types.

    port = server.port
    link = port.link("anonymous", lease=30.0)
    await link.start()
    await link.request(OpenProducerRequest(session=link.session, topic="t", partition=0))

A broker also has a directory (`TopicDirectory`): who the core asks about a topic it has no
writers rule for. `OpenDirectory` is a standalone broker's: every topic is open to anyone.

Must not: decide anything (the core does), or append to a log (the append lane does).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from querylib.broker._errors import BrokerProtocolError
from querylib.broker._session import SessionLink
from querylib.broker.messages import PartitionInfo
from querylib.rpc import DeadlineExceededError, Notify, Reply, Request

from ._events import PartitionId, TopicAccess
from ._subscriptions import aborted_between
from ._write_access import ANYONE

if TYPE_CHECKING:
    from querylib.log import LogConfig, PartitionLog

    from ._bookkeeping import BrokerLimits
    from ._server import BrokerServer

__all__ = ["BrokerPort", "OpenDirectory", "PortLink", "TopicDirectory"]

R = TypeVar("R", bound=Reply)


class TopicDirectory(Protocol):
    """Where a broker learns who may write a topic and where its partitions live (the
    catalog, under an executor)."""

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        """The access of `topic` (a writer wants its `partition`); with `create`, an unknown
        topic may be registered as an ingest topic. A TqError refuses the writer (e.g.
        UnknownTopicError)."""
        ...

    def watch(self, learn: Callable[[TopicAccess], None],
              forget: Callable[[str], None]) -> None:
        """From now on, tell the broker (on its loop) when a topic's access changes (`learn`)
        or the topic is gone (`forget`)."""
        ...


class OpenDirectory:
    """A standalone broker's directory: every topic is open to any writer, on any partition
    (`__` topics stay tq's own: the core decides that by their names)."""

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        return TopicAccess(topic, ANYONE)

    def watch(self, learn: Callable[[TopicAccess], None],
              forget: Callable[[str], None]) -> None:
        pass  # nothing ever changes


LOCAL_SESSIONS = "tq.local."  # the prefix of in-process sessions' ids, which RPC may not use


class PortLink(SessionLink):
    """A broker session in the broker's own process: `BrokerLink`'s interface, no socket.
    Its principal may be "system" (tq's own writers), which no RPC client may claim. Its id
    starts with LOCAL_SESSIONS, which RPC clients may not use, so a client cannot take the id
    first (the connector names its streams' sessions predictably, to reopen them)."""

    def __init__(self, server: BrokerServer, *, principal: str, lease: float = 10.0,
                 timeout: float = 30.0, session: str | None = None) -> None:
        super().__init__(principal=principal, lease=lease, timeout=timeout,
                         session=LOCAL_SESSIONS + (session or uuid.uuid4().hex))
        self._server = server

    @property
    def where(self) -> str:
        return f"in-process broker (session {self.session})"

    async def _request(self, request: Request[R], *, payload: Iterable[Any] = (),
                       timeout: float | None = None) -> R:
        call = self._server._serve(request, list(payload), peer=None, remote=False)
        if timeout is None:
            return await call
        try:
            return await asyncio.wait_for(call, timeout)
        except TimeoutError:
            raise DeadlineExceededError(f"the broker did not answer "
                                        f"{type(request).__name__} within {timeout:g}s") from None

    async def _notify(self, message: Notify) -> None:
        raise BrokerProtocolError("subscriptions are served over RPC, not in-process")


class BrokerPort:
    """The public door into one in-process `BrokerServer` (see the module docstring)."""

    def __init__(self, server: BrokerServer) -> None:
        self._server = server

    def link(self, principal: str, *, lease: float = 10.0, timeout: float = 30.0,
             session: str | None = None) -> PortLink:
        """A session writing as `principal` (start it before use; `session` reuses an id)."""
        return PortLink(self._server, principal=principal, lease=lease, timeout=timeout,
                        session=session)

    @property
    def limits(self) -> BrokerLimits:
        """The broker's limits: its largest batch, producer window, ..."""
        return self._server.state.limits

    @property
    def data_dir(self) -> str:
        return self._server.data_dir

    def hosts(self, pid: PartitionId) -> bool:
        """Whether the broker has this partition open."""
        return pid in self._server.state.partitions

    def partitions(self, topic: str = "") -> list[PartitionInfo]:
        """The partitions the broker hosts (of `topic`, or all), in order."""
        state = self._server.state
        return [state.partition_info(p) for p in sorted(state.partitions)
                if not topic or p[0] == topic]

    def leader_epoch(self, pid: PartitionId, current_leader_epoch: int = -1) -> int:
        """The leader epoch this broker leads a hosted partition at (-1: one replica), checked
        against a client's (`BrokerState.leader_epoch`: NotLeaderOrFollower on a follower,
        FencedLeaderEpoch / UnknownLeaderEpoch for an older / newer epoch)."""
        return self._server.state.leader_epoch(pid, current_leader_epoch)

    async def epoch_end(self, pid: PartitionId, leader_epoch: int) -> tuple[int, int]:
        """(epoch, end offset) of `leader_epoch` in the hosted partition's log (Kafka's
        OffsetForLeaderEpoch)."""
        return await self._server.replication.epoch_end(pid, leader_epoch)

    def info(self, pid: PartitionId) -> PartitionInfo:
        """What subscribers may see of a hosted partition: its range up to the visible end
        (Kafka's high watermark) and the frontier there. UnknownPartitionError if not hosted."""
        return self._server.state.partition_info(pid)

    def aborted_transactions(self, pid: PartitionId, start: int,
                             end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted Kafka transactions with records in
        [start, end) of a hosted partition (read_committed fetches). UnknownPartitionError if
        not hosted."""
        part = self._server.state._partition(pid)
        return [(pid_, first) for pid_, first, _ in aborted_between(part, start, end)]

    def log(self, pid: PartitionId) -> PartitionLog:
        """The log of a hosted partition, for reads (thread-safe against the append lane), up
        to `info(pid).log_end`. Never append to it. UnknownPartitionError if not hosted."""
        return self._server.partition_log(pid)

    async def delete_records(self, pid: PartitionId, offset: int) -> int:
        """Move a hosted partition's log start up to `offset` (Kafka's DeleteRecords; whole
        segments below it are removed): the new log start. Who may is the caller's decision
        (`may_write`). UnknownPartitionError, OffsetOutOfRangeError past the end."""
        return await self._server.delete_records(pid, offset)

    async def may_write(self, topic: str, principal: str) -> bool:
        """Whether the topic's writers rule admits `principal` (asking the broker's directory
        when the core has no rule for it yet): Kafka's DELETE and ALTER on a topic are its
        writers' (DESIGN §12)."""
        return await self._server.may_write(topic, principal)

    async def drop(self, topic: str, partition: int) -> None:
        """Close and delete a hosted partition (a standalone broker's DeleteTopics)."""
        await self._server.drop_partition(topic, partition)

    @property
    def log_config(self) -> LogConfig:
        """How the broker's partition logs roll and retain (Kafka's broker defaults)."""
        return self._server.log_config

    async def ensure(self, topic: str, partition: int, *, create: bool) -> PartitionId:
        """The partition's id once the broker has it open, opening (`create`: creating) it,
        for reading. Writers need no such call: opening a producer opens what the core
        admits. InvalidTopicError for a name the broker cannot store."""
        return await self._server.ensure_partition(topic, partition, create=create)

    async def principal_key(self, principal: str) -> bytes | None:
        """`principal`'s broker key, if it exists now (an endpoint in this process checks its
        clients' passwords with it, DESIGN §12); None for an unknown principal."""
        return await self._server.keyring.key_of(principal)

    def on_visible(self, listener: Callable[[PartitionId], None]) -> Callable[[], None]:
        """Call `listener(pid)` (on the loop; quick) whenever what subscribers may read of a
        partition may have grown. Returns the function that stops it."""
        return self._server.on_visible(listener)
