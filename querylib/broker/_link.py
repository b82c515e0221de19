"""A client's session with one broker: a lease kept alive by heartbeats, and reopening the
session when the broker forgot it (lease expired, broker restarted). One interface, two
transports: `BrokerLink` speaks RPC to a broker in another process, `PortLink` (`_port.py`)
is a session with a broker in this process. Producers and subscribers build on either;
they register `on_reopen` callbacks to re-establish what the broker lost (producer roles,
subscriptions from their last offsets).

Every session writes as a principal (`_access.py`): a `BrokerLink`'s is the one its
credential authenticates (DESIGN §12), a `PortLink`'s the one the in-process caller states.

Runs on one asyncio loop; owns its heartbeat task (and BrokerLink its RpcClient). It
decides nothing about data.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from catalog.errors import TqError
from querylib._memory import keep_freed_memory
from querylib.rpc import (
    BROKER,
    ClientClosedError,
    Credential,
    DeadlineExceededError,
    Limits,
    Notify,
    Reply,
    Request,
    RpcClient,
    RpcError,
)

from ._errors import UnknownSessionError
from ._messages import CloseSessionRequest, HeartbeatRequest, OpenSessionRequest, SessionOpened

__all__ = ["BrokerLink", "SessionLink"]

logger = logging.getLogger("querylib.broker")

R = TypeVar("R", bound=Reply)

# Deliveries are bounded by credit, not by count (see BrokerServer): raise zmq's HWM to match.
CLIENT_LIMITS = Limits(hwm=100_000)


class SessionLink:
    """One broker session: open, heartbeats, reopen, close, over the transport a subclass
    gives (`request`, `notify`, `_connect`, `_disconnect`)."""

    def __init__(self, *, principal: str, lease: float, timeout: float,
                 session: str | None = None) -> None:
        self.session = session or uuid.uuid4().hex
        self.principal = principal
        self.lease = lease
        self.timeout = timeout
        self.opened: SessionOpened | None = None
        self.generation = 0  # how many times the session was (re)opened
        self.on_reopen: list[Callable[[], Awaitable[None]]] = []
        self._reopen_lock = asyncio.Lock()
        self._heartbeats: asyncio.Task[None] | None = None
        self._closed = False

    async def request(self, request: Request[R], *, payload: Iterable[Any] = (),
                      timeout: float | None = None) -> R:
        raise NotImplementedError

    async def notify(self, message: Notify) -> None:
        raise NotImplementedError

    async def _connect(self) -> None:
        pass

    async def _disconnect(self) -> None:
        pass

    async def start(self, *, connect_timeout: float | None = None) -> SessionOpened:
        """Connect and open the session, retrying while the broker is not there yet."""
        await self._connect()
        opened = await self._open(connect_timeout or self.timeout)
        self._heartbeats = asyncio.get_running_loop().create_task(
            self._heartbeat_forever(), name=f"broker heartbeats {self.session}")
        return opened

    async def _open(self, timeout: float) -> SessionOpened:
        self.opened = await self.request(
            OpenSessionRequest(session=self.session, lease=self.lease,
                               principal=self.principal), timeout=timeout)
        self.generation += 1
        return self.opened

    async def reopen(self, seen_generation: int) -> None:
        """Open the session again (unless someone did since `seen_generation`), then let every
        owner re-establish its state. Retries until the broker answers."""
        async with self._reopen_lock:
            if self.generation != seen_generation or self._closed:
                return
            while not self._closed:
                try:
                    await self._open(self.timeout)
                    break
                except ClientClosedError:
                    return
                except RpcError as exc:  # the broker is not back yet: zmq reconnects for us
                    logger.info("broker session %s: reopening: %s", self.session, exc)
            for callback in list(self.on_reopen):
                await callback()

    async def _heartbeat_forever(self) -> None:
        interval = max(self.lease / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            generation = self.generation
            try:
                await self.request(HeartbeatRequest(session=self.session),
                                   timeout=max(interval, 1.0))
            except UnknownSessionError:
                await self.reopen(generation)
            except (DeadlineExceededError, RpcError) as exc:
                logger.debug("broker session %s: heartbeat: %s", self.session, exc)
            except TqError as exc:
                logger.warning("broker session %s: heartbeat refused: %s", self.session, exc)

    async def close(self, *, clean: bool = True) -> None:
        """Stop heartbeats, close the session (when `clean`) and the transport. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        if clean and self.opened is not None:
            try:
                await self.request(CloseSessionRequest(session=self.session),
                                   timeout=min(self.timeout, 5.0))
            except TqError as exc:
                logger.debug("broker session %s: close: %s", self.session, exc)
        await self._disconnect()


class BrokerLink(SessionLink):
    """One broker session over one RpcClient, writing as the principal of `secret` (our
    credential; a bare cluster secret is the admin's)."""

    def __init__(self, address: str, secret: bytes | Credential, *, lease: float = 10.0,
                 timeout: float = 30.0, limits: Limits | None = None) -> None:
        keep_freed_memory()  # batches of a megabyte come and go: reuse their pages
        super().__init__(principal=Credential.of(secret).principal, lease=lease,
                         timeout=timeout)
        self.address = address
        self.client = RpcClient(address, secret, audience=BROKER,
                                limits=limits or CLIENT_LIMITS, timeout=timeout)

    async def _connect(self) -> None:
        await self.client.connect()

    async def _disconnect(self) -> None:
        await self.client.close()

    async def request(self, request: Request[R], *, payload: Iterable[Any] = (),
                      timeout: float | None = None) -> R:
        return await self.client.request(request, payload=payload, timeout=timeout)

    async def notify(self, message: Notify) -> None:
        await self.client.notify(message)
