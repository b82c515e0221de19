"""A blocking RPC client for plain scripts and threads: an RpcClient on its own loop thread.

    with BlockingClient(address, secret) as client:
        reply = client.request(Ping(b"hi"), timeout=5)

Thread-safe: any number of threads may call one BlockingClient at once; every call is handed to
the background loop (`LoopThread`, `_bridge.py`), and that loop alone touches the socket.
Notify callbacks (`on_notify`) run on that background thread. Payload buffers passed in must
not be mutated until the call returns (they are sent without copying).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, TypeVar

import zmq

from ._bridge import LoopThread
from ._client import Notification, NotifyCallback, RpcClient
from ._codec import Buffer, Limits
from ._credentials import COORDINATOR, Credential
from ._errors import ClientClosedError
from ._messages import Notify, Reply, Request

__all__ = ["BlockingClient"]

R = TypeVar("R", bound=Reply)


class BlockingClient:
    """The RpcClient API as blocking calls, safe to share between threads."""

    def __init__(self, address: str, secret: bytes | Credential, *,
                 limits: Limits | None = None, timeout: float = 30.0,
                 context: zmq.Context[Any] | None = None, audience: str = COORDINATOR,
                 server_key: str | bytes | None = None) -> None:
        self._bridge = LoopThread(f"rpc-client {address}", owner="a BlockingClient")
        self._call = self._bridge.call
        try:
            self._client = self._call(RpcClient(
                address, secret, limits=limits, timeout=timeout, context=context,
                audience=audience, server_key=server_key).connect())
        except BaseException:
            self._bridge.close()
            raise

    @property
    def session(self) -> bytes:
        return self._client.session

    @property
    def counters(self) -> dict[str, int]:
        """Messages dropped so far, by reason (a snapshot)."""
        return self._call(_counters(self._client))

    def request(self, request: Request[R], *, payload: Iterable[Buffer] = (),
                timeout: float | None = None) -> R:
        """Send `request` and block until its reply, error or deadline."""
        return self._call(self._client.request(request, payload=list(payload),
                                               timeout=timeout))

    def exchange(self, request: Request[R], *, payload: Iterable[Buffer] = (),
                 timeout: float | None = None) -> tuple[R, list[Buffer]]:
        """Like `request`, also returning the reply's payload frames."""
        return self._call(self._client.exchange(request, payload=list(payload),
                                                timeout=timeout))

    def notify(self, message: Notify, payload: Iterable[Buffer] = ()) -> None:
        """Send a one-way message."""
        self._call(self._client.notify(message, list(payload)))

    def on_notify(self, message_type: type[Notify], callback: NotifyCallback) -> None:
        """Run `callback(notification)` on the client's loop thread for that type."""
        self._client.on_notify(message_type, callback)

    def next_notification(self, timeout: float | None = None) -> Notification | None:
        """The oldest queued notify, waiting up to `timeout` seconds (None: forever)."""
        try:
            return self._call(asyncio.wait_for(self._client.notifications.get(), timeout))
        except TimeoutError:
            return None

    def close(self) -> None:
        """Close the client and stop its thread. Idempotent."""
        if self._bridge.closed:
            return
        try:
            self._call(self._client.close())
        except ClientClosedError:  # another thread closes it at the same moment
            return
        finally:
            self._bridge.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _counters(client: RpcClient) -> dict[str, int]:
    return client.counters  # read on the loop thread, which is the one updating them
