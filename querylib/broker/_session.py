"""A client's session with one broker: a lease kept alive by heartbeats, and reopening the
session when the broker forgot it (lease expired, broker restarted) or stopped answering (it
went away, maybe to come back at another address). One interface, two transports:
`BrokerLink` speaks RPC to a broker in another process, `PortLink` (`_port.py`) is a session
with a broker in this process. Producers and subscribers build on either; they register
`on_reopen` callbacks to re-establish what the broker lost (producer roles and unacknowledged
batches, subscriptions from their last offsets) and `on_failure` callbacks to hear when the
link gave up.

Every session writes as a principal (`_access.py`): a `BrokerLink`'s is the one its
credential authenticates (DESIGN §12), the same credential across reconnects and moves; a
`PortLink`'s the one the in-process caller states.

Reconnecting (DESIGN §5 "Restarts"): while the broker does not answer, the link tries to open
its session again every `ATTEMPT_TIMEOUT` seconds or so, with a backoff between attempts, and
after each failed attempt a `BrokerLink` asks `locate` (if given: the catalog's current
address of the broker, looked up by the owner) whether the broker now listens elsewhere,
moving there if so. After `reconnect_timeout` seconds without an answer it gives up for good:
every call then raises BrokerUnavailableError, and `on_failure` callbacks are told once.

Following the catalog (DESIGN §5 "Replication"): a `BrokerLink` given `watch_leader` (the
catalog's word that the leader of its partition changed: `Cluster.watch_leader` bound to the
topic and partition) does not wait for its lease of silence when the leader moves: on the word
it asks `locate` at once and, when the partition is led elsewhere now, moves there (calls in
flight on the old broker fail as a lost connection and are sent again) and reopens the session,
its owners re-establishing what they had (a producer its unacknowledged batches, a subscriber
its subscriptions from their last offsets).

The lease itself (heartbeats every third of it, lapse, reopening with backoff, giving up) is
kept by a `querylib._lease.LeaseKeeper`; a link gives it the broker's messages and rules.
Runs on one asyncio loop; owns its keeper (and BrokerLink its RpcClient, a new one when the
broker moved). It decides nothing about data.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from catalog.errors import TqError
from querylib._lease import Backoff, LeaseKeeper, Renewal
from querylib._memory import keep_freed_memory
from querylib.rpc import (
    BROKER,
    Credential,
    InternalServerError,
    Limits,
    Notify,
    RemoteError,
    Reply,
    Request,
    RpcClient,
    RpcError,
)

from ._errors import (
    BrokerClosedError,
    BrokerUnavailableError,
    FencedLeaderEpochError,
    NotLeaderOrFollowerError,
    NotProducerError,
    UnknownBrokerSessionError,
)
from .messages import CloseSessionRequest, HeartbeatRequest, OpenSessionRequest, SessionOpened

__all__ = ["ATTEMPT_TIMEOUT", "RECONNECT_TIMEOUT", "BrokerLink", "LinkSource", "Locate",
           "SessionLink", "WatchLeader", "lost_connection"]

logger = logging.getLogger("querylib.broker")

R = TypeVar("R", bound=Reply)

# Deliveries are bounded by credit, not by count (see BrokerServer): raise zmq's HWM to match.
CLIENT_LIMITS = Limits(hwm=100_000)

RECONNECT_TIMEOUT = 60.0  # seconds a link keeps trying to reach its broker before it gives up
ATTEMPT_TIMEOUT = 2.0     # seconds one attempt to reopen the session waits for an answer
_BACKOFF_MIN, _BACKOFF_MAX = 0.05, 1.0  # seconds between attempts, doubling

Locate = Callable[[], Awaitable[str | None]]
# `on_answer(reply, error)` of `send_request`: exactly one of them is None.
Answer = Callable[[Any, BaseException | None], None]
# `watch_leader(moved)`: call `moved()`, from any thread, whenever the catalog changes the
# leader of the link's partition; returns the function that stops the watch.
WatchLeader = Callable[[Callable[[], None]], Callable[[], None]]


def _answer_from(task: asyncio.Task[Any],
                 on_answer: Answer) -> None:
    if task.cancelled():
        return  # the loop is closing: nobody waits for the answer
    error = task.exception()
    if error is None:
        on_answer(task.result(), None)
    else:
        on_answer(None, error)


class BrokerClosingError(RpcError):
    """A remote broker answered that it is closing (its process stops): to its clients, a
    lost connection (`lost_connection`), not a refusal."""

    retriable = True


def _verdict(exc: TqError) -> Renewal:
    """What a failed heartbeat means: forgotten, or no answer (lapsed if it lasts a lease)."""
    if isinstance(exc, UnknownBrokerSessionError):
        return Renewal.LAPSED
    if isinstance(exc, RpcError):  # the broker is slow or away (a client replaced: closed)
        return Renewal.AWAY
    return Renewal.REFUSED


def lost_connection(exc: BaseException) -> bool:
    """Whether a failed call means the broker is away or forgot us (reopen and send again),
    rather than that it refused the call (which sending again cannot change)."""
    if isinstance(exc, UnknownBrokerSessionError | NotProducerError):
        return True
    return isinstance(exc, RpcError) and not isinstance(exc, InternalServerError | RemoteError)


class LinkSource(Protocol):
    """A broker in this process, as clients see it: it opens sessions (`BrokerPort`)."""

    def link(self, principal: str, *, lease: float = ..., timeout: float = ...,
             session: str | None = None) -> SessionLink: ...


class SessionLink:
    """One broker session: open, heartbeats, reopen (retrying, for at most
    `reconnect_timeout`), close, over the transport a subclass gives (`_request`, `_notify`,
    `_connect`, `_disconnect`, and `_relocate` where the broker may move)."""

    def __init__(self, *, principal: str, lease: float, timeout: float,
                 session: str | None = None,
                 reconnect_timeout: float = RECONNECT_TIMEOUT) -> None:
        self.session = session or uuid.uuid4().hex
        self.principal = principal
        self.timeout = timeout
        self.reconnect_timeout = reconnect_timeout
        self.opened: SessionOpened | None = None
        # Renewals, lapse, reopening and giving up: the lease keeper, with a broker's rules
        # (the same session reopened; presumed lapsed once unheard for a lease).
        self.keeper = LeaseKeeper(
            lambda: self.where, lease=lease, renew=self._renew, verdict=_verdict,
            reopen=self._open, retry=self.lost, relocate=self._relocate,
            give_up_after=reconnect_timeout, give_up=self._give_up,
            attempt_timeout=min(timeout, ATTEMPT_TIMEOUT), min_period=0.05,
            min_renew_timeout=1.0, backoff=Backoff(_BACKOFF_MIN, _BACKOFF_MAX))
        # Owners register here: re-establish what the broker lost; hear that the link gave up.
        self.on_reopen = self.keeper.on_reopen
        self.on_failure = self.keeper.on_failure
        # Set while the session is open and every owner re-established its state: new calls
        # wait for it, so nothing overtakes what is being sent again.
        self.ready = self.keeper.ready

    @property
    def lease(self) -> float:
        return self.keeper.lease

    @property
    def generation(self) -> int:
        """How many times the session was (re)opened."""
        return self.keeper.generation

    @property
    def renewed_at(self) -> float:
        """Loop time of the last answer to an open or a heartbeat."""
        return self.keeper.renewed_at

    @property
    def failure(self) -> TqError | None:
        """The BrokerUnavailableError the link gave up with, if it did."""
        return self.keeper.failure

    @property
    def where(self) -> str:
        """The broker, as log lines and errors name it."""
        return f"broker session {self.session}"

    @property
    def follows_leaders(self) -> bool:
        """Whether a broker that does not lead the partition (now) is waited for: a remote
        one (`BrokerLink`) may be about to take the role the catalog gave it, or be followed
        to the new leader through `locate`. A broker in this process is not."""
        return False

    def lost(self, exc: BaseException) -> bool:
        """Whether a failed call is to be sent again once the session is reopened: a lost
        connection (`lost_connection`) or, on a link that follows leaders, a broker that
        does not lead the partition (NotLeaderOrFollower, FencedLeaderEpoch: the leader moved
        while this one lives, or this one has not taken the role the catalog gave it yet).
        Reopening then asks `locate` (the catalog), if given, after each refused attempt and
        moves to the leader it names, for at most `reconnect_timeout` (DESIGN §5
        "Replication")."""
        if lost_connection(exc):
            return True
        return self.follows_leaders and isinstance(
            exc, NotLeaderOrFollowerError | FencedLeaderEpochError)

    @property
    def closed(self) -> bool:
        return self.keeper.closed

    async def request(self, request: Request[R], *, payload: Iterable[Any] = (),
                      timeout: float | None = None) -> R:
        if self.failure is not None:
            raise self.failure
        return await self._request(request, payload=payload, timeout=timeout)

    def send_request(self, request: Request[Any], on_answer: Answer, *,
                     payload: Sequence[Any] = ()) -> None:
        """`request` without a coroutine: `on_answer(reply, None)` or `on_answer(None, error)`
        once, with what `request` returns or raises (see RpcClient.send_request). Requests
        sent this way leave in the order of the calls. Here a task runs `request`; a
        `BrokerLink` sends at once and answers from its receive loop (no task per call)."""
        task = asyncio.get_running_loop().create_task(self.request(request, payload=payload))
        task.add_done_callback(lambda done: _answer_from(done, on_answer))

    async def notify(self, message: Notify) -> None:
        if self.failure is not None:
            raise self.failure
        await self._notify(message)

    async def _request(self, request: Request[R], *, payload: Iterable[Any] = (),
                       timeout: float | None = None) -> R:
        raise NotImplementedError

    async def _notify(self, message: Notify) -> None:
        raise NotImplementedError

    async def _connect(self) -> None:
        pass

    async def _disconnect(self) -> None:
        pass

    async def _relocate(self) -> bool:
        """Whether the broker was found at another address (and we moved there)."""
        return False

    async def start(self, *, connect_timeout: float | None = None) -> SessionOpened:
        """Connect and open the session, retrying while the broker is not there yet."""
        await self._connect()
        opened = await self._open(connect_timeout or self.timeout)
        self.keeper.opened()
        self.keeper.start()
        return opened

    async def _open(self, timeout: float) -> SessionOpened:
        self.opened = await self._request(
            OpenSessionRequest(session=self.session, lease=self.lease,
                               principal=self.principal), timeout=timeout)
        return self.opened

    async def _renew(self, timeout: float) -> None:
        await self._request(HeartbeatRequest(session=self.session), timeout=timeout)

    async def reopen(self, seen_generation: int) -> None:
        """Open the session again (unless someone did since `seen_generation`), moving to the
        broker's new address if it moved, then let every owner re-establish its state.
        Retries with backoff; raises BrokerUnavailableError once `reconnect_timeout` passed
        without the broker answering."""
        await self.keeper.reopen(seen_generation)

    def _give_up(self) -> BrokerUnavailableError:
        return BrokerUnavailableError(
            f"the {self.where} did not answer for {self.reconnect_timeout:g}s "
            f"(its address looked up again when possible); giving up")

    async def close(self, *, clean: bool = True) -> None:
        """Stop heartbeats, close the session (when `clean`) and the transport. Idempotent."""
        if self.keeper.closed:
            return
        await self.keeper.close()
        if clean and self.opened is not None and self.failure is None:
            try:
                await self._request(CloseSessionRequest(session=self.session),
                                    timeout=min(self.timeout, 5.0))
            except TqError as exc:
                logger.debug("%s: close: %s", self.where, exc)
        await self._disconnect()


class BrokerLink(SessionLink):
    """One broker session over one RpcClient (replaced when the broker moves), writing as the
    principal of `secret` (our credential; a bare cluster secret is the admin's), or with
    `principal="anonymous"` as anonymous: a downgrade the broker grants (DESIGN §12; the
    session stays ours), which the connector endpoint uses to write its host's other brokers."""

    def __init__(self, address: str, secret: bytes | Credential, *, lease: float = 10.0,
                 timeout: float = 30.0, limits: Limits | None = None,
                 locate: Locate | None = None,
                 reconnect_timeout: float = RECONNECT_TIMEOUT,
                 session: str | None = None, principal: str | None = None,
                 watch_leader: WatchLeader | None = None) -> None:
        keep_freed_memory()  # batches of a megabyte come and go: reuse their pages
        super().__init__(principal=principal or Credential.of(secret).principal, lease=lease,
                         timeout=timeout, reconnect_timeout=reconnect_timeout,
                         session=session)
        self.address = address
        self.moves = 0  # how many times the broker was found at another address
        self._secret = secret  # every client of this link signs with it, wherever it moves
        self._limits = limits or CLIENT_LIMITS
        self._locate = locate
        self._watch_leader = watch_leader
        self._unwatch: Callable[[], None] | None = None
        self._relocating = asyncio.Lock()  # one look-up and move at a time
        self._following: set[asyncio.Task[None]] = set()  # moves the catalog's word started
        self.catalog_moves = 0  # how many of `moves` the catalog's word started
        self._notify_callbacks: dict[type[Notify], Callable[[Any], object]] = {}
        self.client = self._new_client(address)

    @property
    def where(self) -> str:
        return f"broker at {self.address}"

    @property
    def follows_leaders(self) -> bool:
        return True

    def _new_client(self, address: str) -> RpcClient:
        client = RpcClient(address, self._secret, audience=BROKER, limits=self._limits,
                           timeout=self.timeout)
        for message_type, callback in self._notify_callbacks.items():
            client.on_notify(message_type, callback)
        client.on_lost(self._connection_dropped)
        return client

    def on_notify(self, message_type: type[Notify], callback: Callable[[Any], object]) -> None:
        """`callback(notification)` for each notify of that type, from whichever client the
        link uses now or later."""
        self._notify_callbacks[message_type] = callback
        self.client.on_notify(message_type, callback)

    async def _connect(self) -> None:
        await self.client.connect()
        if self._watch_leader is not None and self._locate is not None \
                and self._unwatch is None:
            loop = asyncio.get_running_loop()

            def moved() -> None:  # on the catalog's thread
                try:
                    loop.call_soon_threadsafe(self._leader_moved)
                except RuntimeError:  # our loop is closed: nothing to follow any more
                    pass

            self._unwatch = self._watch_leader(moved)

    async def _disconnect(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        for task in list(self._following):
            task.cancel()
        await asyncio.gather(*self._following, return_exceptions=True)
        await self.client.close()

    def _connection_dropped(self) -> None:
        """The broker closed our connection or died (on the loop): reopen the session now,
        rather than when a call or the lease finds it gone; a subscriber has no call in
        flight to fail. Owners whose calls failed ask for the same reopen: it runs once."""
        if self.closed or self.failure is not None or not self.keeper.ready.is_set():
            return  # closing, given up, or reopening already
        task = asyncio.get_running_loop().create_task(
            self._reopen_after_drop(self.generation), name=f"reopening at {self.address}")
        self._following.add(task)
        task.add_done_callback(self._following.discard)

    async def _reopen_after_drop(self, generation: int) -> None:
        try:
            await self.reopen(generation)
        except TqError as exc:  # gave up, or refused: the owners hear it from their calls
            logger.info("%s: reopening after the connection dropped: %s", self.where, exc)

    def _leader_moved(self) -> None:
        """The catalog changed our partition's leader (on the loop): follow it now."""
        if self.closed or self.failure is not None:
            return
        task = asyncio.get_running_loop().create_task(
            self._follow_leader(), name=f"following the leader from {self.address}")
        self._following.add(task)
        task.add_done_callback(self._following.discard)

    async def _follow_leader(self) -> None:
        """Move to where the catalog says the partition is led now, if elsewhere, and reopen
        the session there (unless a reopen under way does: it tries the new address next)."""
        generation = self.generation
        if not await self._relocate():
            return
        self.catalog_moves += 1
        try:
            await self.reopen(generation)
        except TqError as exc:  # gave up, or refused: the owners hear it from their calls
            logger.info("%s: reopening after the leader moved: %s", self.where, exc)

    async def _request(self, request: Request[R], *, payload: Iterable[Any] = (),
                       timeout: float | None = None) -> R:
        try:
            return await self.client.request(request, payload=payload, timeout=timeout)
        except BrokerClosedError as exc:
            # A remote broker that is shutting down answers what it has in hand so; it is
            # away, as after a lost connection, and comes back (a restart), perhaps elsewhere.
            raise BrokerClosingError(str(exc)) from exc

    def send_request(self, request: Request[Any], on_answer: Answer, *,
                     payload: Sequence[Any] = ()) -> None:
        if self.failure is not None:
            on_answer(None, self.failure)
            return

        def answered(reply: Any, error: BaseException | None) -> None:
            if isinstance(error, BrokerClosedError):  # as `_request` says it
                error = BrokerClosingError(str(error))
            on_answer(reply, error)

        self.client.send_request(request, answered, payload=payload)

    async def _notify(self, message: Notify) -> None:
        await self.client.notify(message)

    async def _relocate(self) -> bool:
        """Ask where the broker is now; move the client there if it is elsewhere."""
        if self._locate is None:
            return False
        async with self._relocating:
            return await self._relocate_once()

    async def _relocate_once(self) -> bool:
        assert self._locate is not None
        try:
            address = await self._locate()
        except TqError as exc:  # the catalog is away too, or the broker is not registered yet
            logger.debug("%s: looking up its address: %s", self.where, exc)
            return False
        if not address or address == self.address or self.closed:
            return False
        logger.info("broker moved from %s to %s", self.address, address)
        old, self.client = self.client, self._new_client(address)
        self.address = address
        self.moves += 1
        await self.client.connect()
        await old.close()  # calls still in flight on it fail with ClientClosedError
        return True
