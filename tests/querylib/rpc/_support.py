"""Message types and a threaded server shared by the RPC tests (unit and integration).

The message classes register global tags, so they are declared once, here. `ServerThread`
runs a real RpcServer on its own event loop thread so synchronous tests (hypothesis, threads,
child processes) can talk to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import zmq

from catalog.errors import TqError, UserError
from querylib.rpc import (
    COORDINATOR,
    Context,
    Credential,
    Limits,
    Notify,
    Reply,
    Request,
    RpcServer,
    handshake_token,
)

T = TypeVar("T")

SECRET = b"0123456789abcdef0123456789abcdef"


def authenticate(sock: zmq.Socket[Any], secret: bytes | Credential,
                 audience: str = COORDINATOR) -> zmq.Socket[Any]:
    """Give a bare zmq socket (not connected yet) the handshake credential of `secret`'s
    principal, as RpcClient does: without it, a server closes the connection at the
    handshake and never sees a frame (DESIGN §2 "Handshake")."""
    own = Credential.of(secret).for_audience(audience)
    sock.setsockopt(zmq.PLAIN_USERNAME, own.principal.encode())
    sock.setsockopt(zmq.PLAIN_PASSWORD, handshake_token(own.key))
    return sock


class ShelfError(TqError):
    """The declared error type of Fetch."""


class ShelfEmptyError(ShelfError):
    retriable = True
    kafka_error_code = 3


class ShelfLockedError(ShelfError):
    """Its constructor wants more than a message: the client must still rebuild it."""

    def __init__(self, shelf: str, owner: str) -> None:
        super().__init__(f"shelf {shelf} locked by {owner}")


class FetchReply(Reply, tag="test.fetch.reply"):
    token: int


class Fetch(Request[FetchReply], tag="test.fetch"):
    """Answered by the `fetch` handler: waits for its gate, fails as told, or answers."""

    error_type: ClassVar[type[TqError]] = ShelfError
    token: int
    fail: str = ""  # "", "empty", "locked", "user", "bug", "remote", "wrong_reply"


class WrongReply(Reply, tag="test.wrong.reply"):
    pass


class Unserved(Request[FetchReply], tag="test.unserved"):
    pass


class SubscribeReply(Reply, tag="test.subscribe.reply"):
    sent: int


class Subscribe(Request[SubscribeReply], tag="test.subscribe"):
    count: int


class Delivery(Notify, tag="test.delivery"):
    seq: int


class Credit(Notify, tag="test.credit"):
    amount: int


class Handlers:
    """The test server's handlers and what they observed."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.credits: list[tuple[int, bytes]] = []
        self.peers: list[bytes] = []  # ROUTER identity of each credit's sender
        self.started: set[int] = set()
        self.arrived: list[int] = []  # Fetch tokens, in the order their handlers started

    def gate(self, token: int) -> asyncio.Event:
        return self.gates.setdefault(token, asyncio.Event())

    async def fetch(self, request: Fetch, ctx: Context) -> Reply:
        self.started.add(request.token)
        self.arrived.append(request.token)
        if request.token in self.gates:
            await self.gates[request.token].wait()
        if request.fail == "empty":
            raise ShelfEmptyError(f"shelf {request.token} is empty")
        if request.fail == "locked":
            raise ShelfLockedError(str(request.token), "alice")
        if request.fail == "user":
            raise UserError("a plain user error")
        if request.fail == "bug":
            raise ZeroDivisionError("handler bug")
        if request.fail == "remote":
            from querylib.rpc import RemoteError
            raise RemoteError("from afar", remote_type="elsewhere.FarError", retriable=True,
                              kafka_error_code=77)
        if request.fail == "wrong_reply":
            return WrongReply()
        ctx.attach(*ctx.payload)
        return FetchReply(request.token)

    async def subscribe(self, request: Subscribe, ctx: Context) -> SubscribeReply:
        for seq in range(request.count):
            ctx.server.notify(ctx.peer, Delivery(seq), payload=[seq.to_bytes(4, "big") * 100])
        return SubscribeReply(request.count)

    async def credit(self, message: Credit, ctx: Context) -> None:
        self.credits.append((message.amount, ctx.session))
        self.peers.append(ctx.peer)

    def install(self, server: RpcServer) -> None:
        server.register(Fetch, self.fetch)
        server.register(Subscribe, self.subscribe)
        server.register(Credit, self.credit)


class ServerThread:
    """A real RpcServer with the test handlers, on an event loop in a background thread."""

    def __init__(self, secret: bytes = SECRET, limits: Limits | None = None,
                 bind: str = "tcp://127.0.0.1:0") -> None:
        self.handlers = Handlers()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="rpc-test-server")
        self._thread.start()
        self.server = RpcServer(secret, limits=limits)
        self.handlers.install(self.server)
        self.endpoint: str = self.call(self.server.start(bind))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def run(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the server's loop thread (state is only touched there)."""
        async def wrapper() -> T:
            return fn()
        return self.call(wrapper())

    def counters(self) -> dict[str, int]:
        return self.run(lambda: self.server.counters)

    def stop(self) -> None:
        try:
            self.call(self.server.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
