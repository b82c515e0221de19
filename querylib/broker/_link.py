"""A client's session with one broker: the RPC client, a lease kept alive by heartbeats, and
reopening the session when the broker forgot it (lease expired, broker restarted).

Producers and subscribers build on this; they register `on_reopen` callbacks to re-establish
what the broker lost (producer roles, subscriptions from their last offsets). Runs on one
asyncio loop; owns its heartbeat task and its RpcClient. It decides nothing about data.
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

__all__ = ["BrokerLink"]

logger = logging.getLogger("querylib.broker")

R = TypeVar("R", bound=Reply)

# Deliveries are bounded by credit, not by count (see BrokerServer): raise zmq's HWM to match.
CLIENT_LIMITS = Limits(hwm=100_000)


class BrokerLink:
    """One broker session over one RpcClient."""

    def __init__(self, address: str, secret: bytes, *, lease: float = 10.0,
                 timeout: float = 30.0, limits: Limits | None = None) -> None:
        keep_freed_memory()  # batches of a megabyte come and go: reuse their pages
        self.address = address
        self.session = uuid.uuid4().hex
        self.lease = lease
        self.timeout = timeout
        self.client = RpcClient(address, secret, audience=BROKER, limits=limits or CLIENT_LIMITS,
                                timeout=timeout)
        self.opened: SessionOpened | None = None
        self.generation = 0  # how many times the session was (re)opened
        self.on_reopen: list[Callable[[], Awaitable[None]]] = []
        self._reopen_lock = asyncio.Lock()
        self._heartbeats: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self, *, connect_timeout: float | None = None) -> SessionOpened:
        """Connect and open the session, retrying while the broker is not there yet."""
        await self.client.connect()
        opened = await self._open(connect_timeout or self.timeout)
        self._heartbeats = asyncio.get_running_loop().create_task(
            self._heartbeat_forever(), name=f"broker heartbeats {self.address}")
        return opened

    async def _open(self, timeout: float) -> SessionOpened:
        self.opened = await self.client.request(
            OpenSessionRequest(session=self.session, lease=self.lease), timeout=timeout)
        self.generation += 1
        return self.opened

    async def request(self, request: Request[R], *, payload: Iterable[Any] = (),
                      timeout: float | None = None) -> R:
        return await self.client.request(request, payload=payload, timeout=timeout)

    async def notify(self, message: Notify) -> None:
        await self.client.notify(message)

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
                    logger.info("broker %s: reopening session: %s", self.address, exc)
            for callback in list(self.on_reopen):
                await callback()

    async def _heartbeat_forever(self) -> None:
        interval = max(self.lease / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            generation = self.generation
            try:
                await self.client.request(HeartbeatRequest(session=self.session),
                                          timeout=max(interval, 1.0))
            except UnknownSessionError:
                await self.reopen(generation)
            except (DeadlineExceededError, RpcError) as exc:
                logger.debug("broker %s: heartbeat: %s", self.address, exc)
            except TqError as exc:
                logger.warning("broker %s: heartbeat refused: %s", self.address, exc)

    async def close(self, *, clean: bool = True) -> None:
        """Stop heartbeats, close the session (when `clean`) and the client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        if clean and self.opened is not None:
            try:
                await self.client.request(CloseSessionRequest(session=self.session),
                                          timeout=min(self.timeout, 5.0))
            except TqError as exc:
                logger.debug("broker %s: close session: %s", self.address, exc)
        await self.client.close()
