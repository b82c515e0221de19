"""The asyncio server shell: a ROUTER socket, a frame pump, one task per request.

    server = RpcServer(secret)
    server.register(Produce, handle_produce)      # async def handle_produce(req, ctx) -> Reply
    endpoint = await server.start("tcp://127.0.0.1:0")
    ...
    server.notify(ctx.peer, Delivery(...), payload=[batch])   # push to a client, no request
    await server.close()

What a message means, whether it is signed, fresh and well formed, is decided by the codec;
this module only moves frames, runs handlers under their deadlines and counts what it drops.
A peer's garbage never stops the receive loop: it is counted by reason, and answered with an
error only when it was authentic enough to deserve an answer (signed, with a request header).
Handlers are cancelled at their request's deadline, by one timer for all of them (wrap work
that must finish in asyncio.shield; `ctx.expired` tells a handler why it was cancelled).
A request type served often (once per record batch, a heartbeat) may register a *direct*
handler (`register_direct`): a plain function that runs at once, inside the receive loop, and
returns a future of the reply (or raises a TqError); the reply is sent when the future
resolves, with no task per request (the future is cancelled at the deadline instead). A future
already resolved when the handler returns is answered on the spot: no deadline to track, no
callback through the loop. Ping is served that way.
Requests may come several to a message (a BATCH, `_codec`): each is served as if it came
alone, and a bad one is answered with its own error. Replies without payload are not sent one
by one: those ready in one loop turn go to each client together, as one BATCH message
(`_queue_reply`), so a reply waits for no sibling that is not ready, only for the turn to end.
A handler raising a TqError answers the client with it; anything else is a bug: logged with
its traceback and answered with InternalServerError.

Principals (DESIGN §12): the keyring says whose key checks a message; the handler learns the
authenticated principal as `ctx.principal`. A keyring that fetches keys elsewhere (an
executor's broker asks the coordinator) gets the message of a principal it does not know yet
parked, bounded in count and bytes, while it asks; it is decoded again once the key comes and
dropped (counted as "unknown_principal") if there is none.

Handshake (DESIGN §2 "Handshake"): before a peer may send a frame, it must show a PLAIN
credential, its principal and `handshake_token` of its key for our audience, or, on a CURVE
server (bound where other hosts reach it, or forced: `_curve`), the CURVE public key derived
from that key, which ZeroMQ hands the ZAP handler of our context (`_zap`), which hands it to
`_admit` on our loop. The keyring says: admitted (200), refused (400: the principal does not
exist, or the token or CURVE key is not its; "handshake_refused"), or nothing (a keyring
that fetches keys cannot ask now, the coordinator being away: "handshake_deferred";
ZeroMQ drops the connection after HANDSHAKE_INTERVAL and the peer connects again). A key
being fetched holds the handshake until it comes, so a peer's first connection gets in.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

import zmq
from zmq.utils import z85

from catalog import InvalidCommandError, check_principal
from catalog.errors import TqError

from ._codec import Buffer, Codec, Incoming, Limits
from ._credentials import COORDINATOR, Keyring, MasterKeyring, handshake_token
from ._curve import curve_forced, leaves_host, server_keypair
from ._errors import (
    AddressError,
    InternalServerError,
    PeerBusyError,
    PeerUnreachableError,
    RpcProtocolError,
    ServerBusyError,
    UnknownPrincipalKeyError,
    UnsupportedRequestError,
)
from ._messages import Entry, Header, Kind, Message, Notify, Ping, Pong, Reply, Request
from ._shell import DeadlineTimer, DropCounters, FramePump, log, new_socket
from ._stats import RequestStats
from ._zap import Verdict, admit_through, stop_admitting

__all__ = ["HANDSHAKE_INTERVAL", "Context", "Handler", "RpcServer"]

# Seconds a connection may take to pass its handshake (ZMQ_HANDSHAKE_IVL): what a peer we
# cannot tell about yet waits before it connects again.
HANDSHAKE_INTERVAL = 10.0
_ZAP_IN_USE = "something else serves ZAP (inproc://zeromq.zap.01) in this zmq context"

Handler = Callable[[Any, "Context"], Awaitable[Any]]
DirectHandler = Callable[[Any, "Context"], "asyncio.Future[Any]"]


class Context:
    """What a handler knows about the message it handles, and how it adds payload to its reply.

    peer        the client's ROUTER identity: the address for `server.notify(peer, ...)`
    session     the client's session id (16 bytes, stable for the client's lifetime)
    principal   who the client authenticated as (`admin`, `user:alice`, `query:7`, ...)
    payload     the request's payload frames, as zero-copy memoryviews
    deadline    the request's deadline on the event loop's clock (inf for notifies)
    server      the server, e.g. to notify this peer later
    """

    __slots__ = ("deadline", "expired", "payload", "peer", "principal", "reply_digests",
                 "reply_payload", "request_id", "server", "session")

    def __init__(self, server: RpcServer, peer: bytes, header: Header, payload: list[Buffer],
                 deadline: float) -> None:
        self.server = server
        self.peer = peer
        self.session = header.session
        self.principal = header.principal
        self.request_id = header.id
        self.payload = payload
        self.deadline = deadline
        self.expired = False  # set when the server cancels the handler at the deadline
        self.reply_payload: list[Buffer] = []
        # `payload_digest` of each frame attached, while every one came with it
        self.reply_digests: list[bytes] | None = []

    def attach(self, *frames: Buffer, digests: Sequence[bytes] | None = None) -> None:
        """Send these raw frames after the reply's body (not copied: do not mutate them).
        `digests`: their `payload_digest`s, when the caller has them (a frame sent to several
        peers is hashed once); a wrong one only makes a reply its receiver refuses."""
        self.reply_payload.extend(frames)
        if digests is None or self.reply_digests is None:
            self.reply_digests = None
        else:
            if len(digests) != len(frames):
                raise ValueError(f"{len(digests)} digests for {len(frames)} frames")
            self.reply_digests.extend(digests)

    def remaining(self) -> float:
        """Seconds until the deadline (negative once past)."""
        return self.deadline - asyncio.get_running_loop().time()


def _echo(request: Ping, ctx: Context) -> asyncio.Future[Pong]:
    ctx.attach(*ctx.payload)
    answered: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
    answered.set_result(Pong(request.data))
    return answered


def _cancel_expired(_local_id: int, entry: tuple[asyncio.Future[Any], Context]) -> None:
    task, ctx = entry
    ctx.expired = True
    task.cancel()


class RpcServer:
    """Serves registered request and notify types on a bound ROUTER socket."""

    def __init__(self, secret: bytes | Keyring, *, limits: Limits | None = None,
                 context: zmq.Context[Any] | None = None, audience: str = COORDINATOR,
                 max_parked: int = 256, max_parked_bytes: int = 64 * 1024 * 1024,
                 curve: bool | None = None, server_key: bytes | None = None) -> None:
        """`secret` is the keyring of the principals we serve, or the cluster secret (then
        every principal's key is derived from it, for `audience`). `max_parked` also bounds
        the handshakes waiting for a key. `curve`: a CURVE server (None: when bound where
        other hosts reach it, or TQ_RPC_CURVE=1); its keypair derives from `server_key`
        (default: the cluster secret of a MasterKeyring)."""
        self.limits = limits or Limits()
        keyring = secret if isinstance(secret, Keyring) else MasterKeyring(secret,
                                                                           audience=audience)
        self.keyring = keyring
        if server_key is None and isinstance(keyring, MasterKeyring):
            server_key = keyring.secret
        self._server_key = server_key
        self._curve = curve
        self.public_key = ""  # our CURVE public key (Z85) once started as a CURVE server
        self._codec = Codec(role="server", limits=self.limits, keyring=keyring)
        # Messages of principals the keyring is fetching the key of: principal -> messages.
        self._parked: dict[str, list[list[Any]]] = {}
        self._parked_count = 0
        self._parked_bytes = 0
        self._max_parked = max_parked
        self._max_parked_bytes = max_parked_bytes
        self._context = context or zmq.Context.instance()
        self._domain = b"tq-rpc-" + self._codec.session.hex().encode()  # our ZAP domain
        self._admitting: set[asyncio.Task[None]] = set()  # handshakes waiting for a key
        self._handlers: dict[type[Message], Handler] = {Ping: _direct_marker}
        self.stats = RequestStats()  # what it served, by message type (the metrics read it)
        self._direct: dict[type[Message], DirectHandler] = {Ping: _echo}
        self._sock: zmq.Socket[Any] | None = None
        self._pump: FramePump | None = None
        self._deadlines: DeadlineTimer[tuple[asyncio.Future[Any], Context]] | None = None
        # Handler tasks, and the futures of direct handlers, running now.
        self._tasks: set[asyncio.Future[Any]] = set()
        self._peers: dict[bytes, bytes] = {}  # ROUTER identity -> session, for notify()
        # Replies and errors without payload waiting for the end of this receive burst or
        # loop turn, by ROUTER identity and then session: sent as one BATCH message each
        # (`_flush_replies`); a push to a peer takes its own in one lookup.
        self._replies: dict[bytes, dict[bytes, list[Entry]]] = {}
        self._flush_scheduled = False
        self._drops = DropCounters()
        self.endpoint: str | None = None
        self._closed = False

    @property
    def session(self) -> bytes:
        """This server's session id."""
        return self._codec.session

    @property
    def counters(self) -> dict[str, int]:
        """Messages dropped or refused so far, by reason."""
        return self._drops.snapshot()

    def register(self, message_type: type[Message], handler: Handler) -> None:
        """Serve `message_type` (a Request or Notify class) with `async def handler(msg, ctx)`.

        A request handler returns an instance of the request's reply type; a notify handler
        returns None.
        """
        if not (isinstance(message_type, type) and issubclass(message_type, (Request, Notify))
                and message_type.rpc_tag is not None):
            raise TypeError(f"{message_type!r} is not a tagged Request or Notify class")
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(f"handler for {message_type.__name__} must be an async function")
        self._handlers[message_type] = handler
        self._direct.pop(message_type, None)

    def register_direct(self, message_type: type[Request], handler: DirectHandler) -> None:
        """Serve `message_type` (a Request class) with a plain `def handler(req, ctx)` that
        returns, without waiting, a future of its reply (or raises a TqError): it runs inside
        the receive loop, so it must not block, and is meant for the request served once per
        record batch (no task per request). The reply is sent once the future resolves; the
        future is cancelled at the request's deadline."""
        if not (isinstance(message_type, type) and issubclass(message_type, Request)
                and message_type.rpc_tag is not None):
            raise TypeError(f"{message_type!r} is not a tagged Request class")
        if inspect.iscoroutinefunction(handler):
            raise TypeError(f"a direct handler for {message_type.__name__} returns a future; "
                            "register a coroutine function with register()")
        self._handlers[message_type] = _direct_marker
        self._direct[message_type] = handler

    def route(self, message_type: type[Message]) -> Callable[[Handler], Handler]:
        """Decorator form of `register`."""
        def decorate(handler: Handler) -> Handler:
            self.register(message_type, handler)
            return handler
        return decorate

    async def start(self, bind: str = "tcp://127.0.0.1:0") -> str:
        """Bind and start serving; returns the bound endpoint (the real port for port 0)."""
        if self._sock is not None or self._closed:
            raise RuntimeError("an RpcServer starts once")
        sock = new_socket(zmq.ROUTER, self.limits, self._context)
        # Unroutable replies (the client went away) fail loudly to us instead of vanishing.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Peers pass the handshake, or send nothing (module docstring).
        curve = self._curve if self._curve is not None else (curve_forced()
                                                             or leaves_host(bind))
        if curve:
            if self._server_key is None:
                sock.close(linger=0)
                raise ValueError("a CURVE server needs the key its keypair derives from")
            public, secret_key = server_keypair(self._server_key, self.keyring.audience)
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret_key)
            self.public_key = public.decode()
        else:
            sock.setsockopt(zmq.PLAIN_SERVER, 1)
        sock.setsockopt(zmq.ZAP_DOMAIN, self._domain)
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_INTERVAL * 1000))
        loop = asyncio.get_running_loop()
        try:
            admit_through(self._context, self._domain, loop, self._handshake)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise AddressError(f"cannot authenticate peers: {_ZAP_IN_USE} ({exc})") from exc
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            stop_admitting(self._context, self._domain)
            raise AddressError(f"cannot listen on {bind}: {exc}") from exc
        self._sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._deadlines = DeadlineTimer(loop, self.limits.max_handlers, _cancel_expired)
        # Fair: peers take turns by bytes, so a bulk producer's backlog does not hold up a
        # small request of another client (DESIGN §5 "Fair service").
        self._pump = FramePump(sock, loop, small_frames=2, fair=True,
                               limits=self.limits, on_message=self._on_message,
                               on_drop=self._on_drop, on_send_error=self._send_failed,
                               on_burst_end=self._burst_ended)
        return self.endpoint

    async def close(self) -> None:
        """Stop receiving, cancel running handlers, close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pump is not None:
            self._pump.close()
        if self._deadlines is not None:
            self._deadlines.close()
        tasks = [*self._tasks, *self._admitting]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
            stop_admitting(self._context, self._domain)

    async def __aenter__(self) -> RpcServer:
        if self._sock is None:
            await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @staticmethod
    def shared_payload(data: Buffer) -> Buffer:
        """`data` as one zmq frame for a payload `notify` pushes to many peers: each send
        hands zmq a reference to the same buffer (no copy, and pyzmq's release of a zero-copy
        buffer happens once, after the last peer's copy went out, rather than once a peer).
        Below zmq's copy threshold zmq copies anyway: `data` is returned as it is."""
        if len(data) < zmq.COPY_THRESHOLD:
            return data
        return zmq.Frame(data, copy=False)

    def notify(self, peer: bytes, message: Notify, payload: Iterable[Buffer] = (),
               digests: Sequence[bytes] | None = None) -> None:
        """Push `message` to the client with ROUTER identity `peer`, without waiting.

        Call it from the server's event loop (a handler, or a task of the same loop).
        `digests`: `payload_digest` of each payload frame, if known (`Codec.notify`).

        Raises PeerUnreachableError if no such client is connected (or it never sent us
        anything), PeerBusyError if its queue is full (it stopped reading; retriable).
        """
        if self._sock is None or self._pump is None or self._closed:
            raise PeerUnreachableError("the server is not running")
        session = self._peers.get(peer)
        if session is None:
            raise PeerUnreachableError(f"no client with identity {peer.hex()} has spoken to us")
        frames = self._codec.notify(message, to=session, now=time.time(), payload=payload,
                                    digests=digests)
        if self._replies:
            self._flush_replies(peer)  # its replies queued before this push go out before it
        try:
            self._pump.send([peer, *frames])
        except zmq.Again as exc:
            raise PeerBusyError(f"client {peer.hex()} is not reading (queue full)") from exc
        except zmq.ZMQError as exc:
            raise PeerUnreachableError(f"client {peer.hex()} is gone: {exc}") from exc

    # -- the handshake ---------------------------------------------------------------------

    def _handshake(self, mechanism: bytes, credentials: list[bytes], verdict: Verdict) -> None:
        """A peer connects (called on our loop by the ZAP handler): admit it or not."""
        if self._closed:
            return  # no verdict: a refusal would tell the peer its key is wrong
        if len(self._admitting) >= self._max_parked:
            self._drops["handshake_deferred"] += 1  # too many wait for keys: it comes again
            return
        admit = (self._admit(credentials[0], credentials[1], verdict) if mechanism == b"PLAIN"
                 else self._admit_curve(credentials[0], verdict))
        task = asyncio.get_running_loop().create_task(admit)
        self._admitting.add(task)
        task.add_done_callback(self._admitting.discard)

    async def _admit_curve(self, public: bytes, verdict: Verdict) -> None:
        """A CURVE peer: its public key is the credential; the keyring says whose it is."""
        try:
            principal = await self.keyring.principal_of_curve(z85.encode(public))
        except TqError as exc:  # the keyring could not ask (the coordinator is away)
            log.info("rpc server %s: cannot learn whose CURVE key %s is: %s", self.endpoint,
                     z85.encode(public).decode(), exc)
            self._drops["handshake_deferred"] += 1
            return
        except Exception:  # a bug in a keyring; the server must outlive it
            self._drops["internal_error"] += 1
            log.exception("rpc server %s: bug while checking a handshake", self.endpoint)
            return
        if principal is None:
            self._drops["handshake_refused"] += 1
        verdict(principal)

    async def _admit(self, username: bytes, token: bytes, verdict: Verdict) -> None:
        try:
            principal = check_principal(username.decode())
        except (UnicodeDecodeError, InvalidCommandError):
            principal = None
        try:
            admitted = principal is not None and await self._check(principal, token)
        except TqError as exc:  # the keyring could not ask (the coordinator is away)
            log.info("rpc server %s: cannot learn the key of %s: %s", self.endpoint,
                     principal, exc)
            self._drops["handshake_deferred"] += 1
            return
        except Exception:  # a bug in a keyring; the server must outlive it
            self._drops["internal_error"] += 1
            log.exception("rpc server %s: bug while checking a handshake", self.endpoint)
            return
        if not admitted:
            self._drops["handshake_refused"] += 1
        verdict(principal if admitted else None)

    async def _check(self, principal: str, token: bytes) -> bool:
        """Whether `token` is `principal`'s (a keyring that cannot ask now raises TqError)."""
        keyring = self.keyring
        key = await keyring.key_of(principal)
        if key is not None and not _token_of(key, token) and keyring.refetch(principal):
            key = await keyring.key_of(principal)  # the key we had may be a rotated one
        return key is not None and _token_of(key, token)

    # -- the loop --------------------------------------------------------------------------

    def _on_drop(self, reason: str) -> None:
        self._drops[reason] += 1

    def _on_message(self, parts: list[Any]) -> None:
        try:
            self._dispatch(parts)
        except Exception:  # a bug in this module; the server must outlive it
            self._drops["internal_error"] += 1
            log.exception("rpc server %s: bug while handling a message", self.endpoint)

    def _dispatch(self, parts: list[Any]) -> None:
        peer = parts[0]
        try:
            messages = self._codec.decode_all(parts[1:], time.time())
        except UnknownPrincipalKeyError as exc:
            if self.keyring.resolves and not self._closed:
                self._park(exc.principal, parts)
                return
            self._drops[exc.reason] += 1
            return
        except RpcProtocolError as exc:
            self._drops[exc.reason] += 1
            header = exc.header
            if header is not None and header.kind == Kind.REQUEST:
                self._send_error(peer, header, exc)
            return
        for incoming in messages:
            if isinstance(incoming, RpcProtocolError):  # one bad entry of a batch
                self._drops[incoming.reason] += 1
                header = incoming.header
                if header is not None and header.kind == Kind.REQUEST:
                    self._send_error(peer, header, incoming)
                continue
            self._serve(peer, incoming)

    def _serve(self, peer: bytes, incoming: Incoming) -> None:
        """Start serving one authentic message of `peer`."""
        header = incoming.header
        if self._peers.get(peer) != header.session:
            self._remember_peer(peer, header.session)
        message = incoming.body
        handler = self._handlers.get(type(message))  # type: ignore[arg-type]  # ErrorBody: None
        if handler is None:
            self._drops["no_handler"] += 1
            if header.kind == Kind.REQUEST:
                self._send_error(peer, header, UnsupportedRequestError(
                    f"this server does not serve {type(message).__name__} ({header.tag})"))
            return
        if len(self._tasks) >= self.limits.max_handlers:
            self._drops["busy"] += 1
            if header.kind == Kind.REQUEST:
                self._send_error(peer, header, ServerBusyError(
                    f"{len(self._tasks)} requests running; retry later"))
            return
        loop = asyncio.get_running_loop()
        if header.kind == Kind.REQUEST:
            ctx = Context(self, peer, header, incoming.payload, loop.time() + header.ttl)
            if handler is _direct_marker:
                self._serve_direct(incoming, ctx)
                return
            deadlines = self._deadlines
            assert deadlines is not None
            local_id = deadlines.next_id()
            task = loop.create_task(self._serve_request(handler, incoming, ctx, local_id))
            deadlines.track(local_id, ctx.deadline, (task, ctx))
        else:
            ctx = Context(self, peer, header, incoming.payload, math.inf)
            task = loop.create_task(self._serve_notify(handler, incoming, ctx))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _park(self, principal: str, parts: list[Any]) -> None:
        """Hold a message until the keyring learns `principal`'s key (bounded: past the
        bounds it is dropped, as a message of a principal with no key)."""
        size = sum(len(p) for p in parts)
        if (self._parked_count >= self._max_parked
                or self._parked_bytes + size > self._max_parked_bytes):
            self._drops["parked_overflow"] += 1
            return
        waiting = self._parked.get(principal)
        self._parked_count += 1
        self._parked_bytes += size
        if waiting is not None:
            waiting.append(parts)
            return
        self._parked[principal] = [parts]
        task = asyncio.get_running_loop().create_task(self._resolve(principal),
                                                      name=f"resolve {principal[:80]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve(self, principal: str) -> None:
        try:
            known = await self.keyring.resolve(principal)
        except TqError as exc:
            log.warning("rpc server %s: cannot learn the key of %s: %s", self.endpoint,
                        principal[:80], exc)
            known = False
        finally:
            waiting = self._parked.pop(principal, [])
            self._parked_count -= len(waiting)
            self._parked_bytes -= sum(len(p) for parts in waiting for p in parts)
        for parts in waiting:
            if known:
                self._on_message(parts)
            else:
                self._drops["unknown_principal"] += 1

    def _remember_peer(self, peer: bytes, session: bytes) -> None:
        self._peers.pop(peer, None)
        self._peers[peer] = session
        if len(self._peers) > self.limits.max_sessions:
            # Forget the longest-known identity; if it is still alive, its next message
            # teaches it to us again.
            del self._peers[next(iter(self._peers))]

    async def _serve_request(self, handler: Handler, incoming: Incoming, ctx: Context,
                             local_id: int) -> None:
        header = incoming.header
        request = incoming.body
        began = time.perf_counter()
        error: str | None = None
        try:
            reply = await handler(request, ctx)
        except asyncio.CancelledError:
            if not ctx.expired:
                raise  # the server is closing
            # Cancelled by us at the deadline: the client has given up on this id already.
            self._drops["handler_deadline"] += 1
            error = "DeadlineExceededError"
            return
        except TqError as exc:
            error = type(exc).__name__
            self._send_error(ctx.peer, header, exc)
            return
        except Exception as exc:
            error = "InternalServerError"
            log.exception("rpc server %s: handler of %s failed", self.endpoint, header.tag)
            self._send_error(ctx.peer, header, InternalServerError(
                f"handler of {header.tag} failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            self.stats.record(header.tag, time.perf_counter() - began, error)
            if self._deadlines is not None:
                self._deadlines.forget(local_id)
        expected = cast("type[Request[Any]]", type(request)).reply_type  # served: a request
        if not isinstance(reply, expected):
            log.error("rpc server %s: handler of %s returned %r, not a %s", self.endpoint,
                      header.tag, type(reply).__name__, expected.__name__)
            self._send_error(ctx.peer, header, InternalServerError(
                f"handler of {header.tag} returned {type(reply).__name__}, "
                f"not {expected.__name__}"))
            return
        self._send_reply(ctx.peer, header, reply, ctx.reply_payload, ctx.reply_digests)

    def _serve_direct(self, incoming: Incoming, ctx: Context) -> None:
        """Run a direct handler now; its future's outcome is answered as a task's would be
        (at once when the handler returns it resolved)."""
        header = incoming.header
        request = incoming.body
        request_type = cast("type[Request[Any]]", type(request))  # only requests go direct
        began = time.perf_counter()
        try:
            future = self._direct[request_type](request, ctx)
        except TqError as exc:
            self.stats.record(header.tag, time.perf_counter() - began, type(exc).__name__)
            self._send_error(ctx.peer, header, exc)
            return
        except Exception as exc:
            self.stats.record(header.tag, time.perf_counter() - began, "InternalServerError")
            log.exception("rpc server %s: handler of %s failed", self.endpoint, header.tag)
            self._send_error(ctx.peer, header, InternalServerError(
                f"handler of {header.tag} failed: {type(exc).__name__}: {exc}"))
            return
        if future.done():  # answered already: no deadline to track, no hop through the loop
            self._direct_done(request_type.reply_type, header, ctx, 0, began, future)
            return
        deadlines = self._deadlines
        assert deadlines is not None  # set by start(), before any message
        local_id = deadlines.next_id()
        deadlines.track(local_id, ctx.deadline, (future, ctx))
        self._tasks.add(future)
        future.add_done_callback(functools.partial(self._direct_done, request_type.reply_type,
                                                   header, ctx, local_id, began))

    def _direct_done(self, expected: type, header: Header, ctx: Context, local_id: int,
                     began: float, future: asyncio.Future[Any]) -> None:
        """A direct handler's future resolved (`local_id` 0: it was resolved when the handler
        returned it, and never tracked)."""
        if local_id:
            self._tasks.discard(future)
            if self._deadlines is not None:
                self._deadlines.forget(local_id)
        if future.cancelled():
            if ctx.expired:
                self._drops["handler_deadline"] += 1
                self.stats.record(header.tag, time.perf_counter() - began,
                                  "DeadlineExceededError")
            return  # else the server is closing
        exc = future.exception()
        self.stats.record(header.tag, time.perf_counter() - began,
                          None if exc is None else type(exc).__name__
                          if isinstance(exc, TqError) else "InternalServerError")
        if exc is not None:
            if isinstance(exc, TqError):
                self._send_error(ctx.peer, header, exc)
                return
            log.error("rpc server %s: handler of %s failed", self.endpoint, header.tag,
                      exc_info=exc)
            self._send_error(ctx.peer, header, InternalServerError(
                f"handler of {header.tag} failed: {type(exc).__name__}: {exc}"))
            return
        reply = future.result()
        if not isinstance(reply, expected):
            log.error("rpc server %s: handler of %s returned %r, not a %s", self.endpoint,
                      header.tag, type(reply).__name__, expected.__name__)
            self._send_error(ctx.peer, header, InternalServerError(
                f"handler of {header.tag} returned {type(reply).__name__}, "
                f"not {expected.__name__}"))
            return
        self._send_reply(ctx.peer, header, cast(Reply, reply), ctx.reply_payload,
                         ctx.reply_digests)

    async def _serve_notify(self, handler: Handler, incoming: Incoming, ctx: Context) -> None:
        began = time.perf_counter()
        error: str | None = None
        try:
            await handler(incoming.body, ctx)
        except Exception:
            # Nobody waits for a notify's outcome: the traceback is the only report.
            error = "InternalServerError"
            self._drops["notify_handler_error"] += 1
            log.exception("rpc server %s: notify handler of %s failed", self.endpoint,
                          incoming.header.tag)
        finally:
            self.stats.record(incoming.header.tag, time.perf_counter() - began, error)

    def _send_reply(self, peer: bytes, header: Header, reply: Reply,
                    payload: list[Buffer], digests: list[bytes] | None = None) -> None:
        try:
            if not payload:
                self._queue_reply(peer, header.session, self._codec.reply_entry(header.id,
                                                                                reply))
                return
            frames = self._codec.reply(header.id, reply, to=header.session, now=time.time(),
                                       payload=payload, digests=digests or None)
        except RpcProtocolError as exc:  # the reply itself is over the limits
            self._send_error(peer, header, InternalServerError(f"reply not sendable: {exc}"))
            return
        if self._replies:
            self._flush_replies(peer)  # what was answered to it before goes out before
        self._send(peer, frames)

    def _send_error(self, peer: bytes, header: Header, exc: TqError) -> None:
        self._queue_reply(peer, header.session, self._codec.error_entry(header.id, exc))

    def _queue_reply(self, peer: bytes, session: bytes, entry: Entry) -> None:
        """Hold a reply until this loop turn ends, to go with the others ready by then."""
        if self._closed or self._pump is None:
            return
        sessions = self._replies.get(peer)
        if sessions is None:
            self._replies[peer] = {session: [entry]}
        elif (queued := sessions.get(session)) is None:
            sessions[session] = [entry]
        else:
            queued.append(entry)
        if not self._flush_scheduled and not self._pump.in_burst:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_replies)

    def _burst_ended(self) -> None:
        """The pump's receive burst ends: the replies it answered go now, in this turn."""
        if self._replies:
            self._flush_replies()

    def _flush_replies(self, peer: bytes | None = None) -> None:
        """Send the queued replies: to each client one BATCH message (more past the batch
        bounds; a lone reply as a plain message). `peer`: only those to that client (a
        message to it is about to go; the others wait for the turn's end, DESIGN §5 "Fair
        service")."""
        if peer is None:
            self._flush_scheduled = False
            replies, self._replies = self._replies, {}
        else:
            own = self._replies.pop(peer, None)
            if own is None:
                return
            replies = {peer: own}
        if self._closed:
            return
        now = time.time()
        for to, sessions in replies.items():
            for session, entries in sessions.items():
                try:
                    for _, frames in self._codec.messages(entries, to=session, now=now):
                        self._send(to, frames)
                except PeerUnreachableError:  # its session was forgotten meanwhile
                    self._drops["unroutable"] += 1

    def _send(self, peer: bytes, frames: list[Buffer]) -> None:
        if self._closed or self._pump is None:
            return
        self._pump.send_soon([peer, *frames])

    def _send_failed(self, exc: zmq.ZMQError) -> None:
        """A reply or error could not be sent (FramePump.send_soon)."""
        if isinstance(exc, zmq.Again):
            self._drops["peer_busy"] += 1  # its queue is full: it hits its deadline instead
        elif exc.errno == zmq.EHOSTUNREACH:
            self._drops["unroutable"] += 1  # it disconnected meanwhile
        else:
            self._drops["send_error"] += 1
            log.warning("rpc server %s: send failed: %s", self.endpoint, exc)


async def _direct_marker(request: Any, ctx: Context) -> None:
    """Stands in `_handlers` for a type served by a direct handler (never called)."""
    raise AssertionError("direct handlers are called by _serve_direct")


def _token_of(key: bytes, token: bytes) -> bool:
    """Whether `token` is the handshake token of `key` (in constant time)."""
    return hmac.compare_digest(handshake_token(key), token)
