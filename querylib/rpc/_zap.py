"""The ZAP handler of a zmq context: where ZeroMQ asks whether a connecting peer may in.

ZeroMQ authenticates a peer during the ZMTP handshake, before the peer may send a single
frame, by asking the ZAP handler (ZeroMQ Authentication Protocol, RFC 27) bound at
`inproc://zeromq.zap.01` in the socket's context. An RpcServer takes PLAIN or CURVE
credentials (DESIGN §2 "Handshake"): the request names the server's ZAP domain, the mechanism
and the peer's credentials (PLAIN: its principal and token; CURVE: its public key), and the
answer is 200 (admitted, with the principal as ZeroMQ's user id) or 400 (refused: ZeroMQ
sends the peer an ERROR command and closes).

There is one handler per context, so every server of a process sharing one (`tq up`: the
coordinator, its catalog broker, the executor's broker; tests: many, on several event loops)
registers under its own domain. The handler runs on a thread of its own because the servers
of one context may run on different event loops, any of which may be busy or gone: it moves
each request to the server owning the domain, on that server's loop (keyrings are only used
from their server's loop), and the server's verdict back through a queue and a wake-up pipe.
A server may also never answer (it cannot tell yet, or it is closing): ZeroMQ then drops the
connection at the server's handshake interval, or with the socket, and the peer, which counts
that as a lost connection, connects again by itself. The thread starts with the first server
of its context and stops with the last, since its socket left open would keep `Context.term`
waiting forever.

Must not: look at keys or credentials (the servers decide), or block on a server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

__all__ = ["ZAP_ENDPOINT", "Verdict", "admit_through", "stop_admitting"]

log = logging.getLogger("querylib.rpc")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_VERSION = b"1.0"

Verdict = Callable[[str | None], None]
"""`verdict(principal)`: the server's answer to one handshake, the admitted principal or None
(refused); callable from any thread."""

Check = Callable[[bytes, list[bytes], Verdict], None]
"""`check(mechanism, credentials, verdict)`, run on the server's loop: b"PLAIN" with
[username, password], or b"CURVE" with [the peer's 32-byte public key]."""

_CREDENTIALS = {b"PLAIN": 2, b"CURVE": 1}  # mechanism -> how many credential frames


class _ZapHandler:
    """The ZAP socket of one context, served by one thread."""

    def __init__(self, context: zmq.Context[Any]) -> None:
        self.context = context
        # domain -> (loop, check): written under _lock by any thread, read by ours.
        self.doors: dict[bytes, tuple[asyncio.AbstractEventLoop, Check]] = {}
        sock = context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            sock.close(0)
            raise
        self._sock = sock
        self._answers: deque[list[bytes]] = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tq-zap", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping = True
        self._wake()
        self._thread.join()
        # Unbound at once (a closed socket's endpoint is released later, by zmq's reaper),
        # so the next server of this context can bind a new handler right away.
        try:
            self._sock.unbind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            pass
        self._sock.close(0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the thread is woken already

    def _answer(self, routing: bytes, request_id: bytes, principal: str | None) -> None:
        status = (b"200", b"OK") if principal is not None else (b"400", b"refused")
        self._answers.append([routing, b"", _VERSION, request_id, *status,
                              (principal or "").encode(), b""])
        self._wake()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while True:
            poller.poll()
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
            while self._answers:
                # A ROUTER drops what it cannot route: a peer that went away meanwhile.
                self._sock.send_multipart(self._answers.popleft())
            if self._stopping:
                return
            while True:
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    self._request(frames)
                except Exception:  # a bug here; every server's handshakes depend on us
                    log.exception("ZAP handler: bug while handling a request")

    def _request(self, frames: list[bytes]) -> None:
        # [routing id][empty][version][request id][domain][address][identity][mechanism]
        # [credentials...]: what libzmq's sessions send (RFC 27).
        if len(frames) < 8 or frames[1] != b"":
            return
        routing, _, version, request_id, domain, _address, _identity, mechanism = frames[:8]
        credentials = frames[8:]
        if version != _VERSION or _CREDENTIALS.get(mechanism) != len(credentials):
            self._answer(routing, request_id, None)
            return
        door = self.doors.get(domain)
        if door is None:
            return  # its server is closing: no verdict (a refusal would say "wrong key")
        loop, check = door
        verdict = functools.partial(self._answer, routing, request_id)
        try:
            loop.call_soon_threadsafe(check, mechanism, credentials, verdict)
        except RuntimeError:  # that server's loop is closed: it serves nobody any more
            pass


_lock = threading.Lock()
_handlers: dict[int, _ZapHandler] = {}  # id(context) -> its handler (which holds the context)


def admit_through(context: zmq.Context[Any], domain: bytes,
                  loop: asyncio.AbstractEventLoop, check: Check) -> None:
    """Have `check` decide every handshake of sockets of `context` in ZAP domain `domain`,
    on `loop`. Starts the context's handler if it has none (zmq.ZMQError when something
    else serves ZAP in that context)."""
    with _lock:
        handler = _handlers.get(id(context))
        if handler is None:
            handler = _handlers[id(context)] = _ZapHandler(context)
        if domain in handler.doors:
            raise ValueError(f"ZAP domain {domain!r} is served already")
        handler.doors[domain] = (loop, check)


def stop_admitting(context: zmq.Context[Any], domain: bytes) -> None:
    """Forget `domain` (its sockets are closed); the last domain of a context stops the
    context's handler. Idempotent."""
    with _lock:
        handler = _handlers.get(id(context))
        if handler is None or handler.doors.pop(domain, None) is None:
            return
        if not handler.doors:
            del _handlers[id(context)]
            handler.close()


def _forget_in_child() -> None:
    # A forked child has no handler thread (and must not use its parent's zmq context).
    global _lock
    _lock = threading.Lock()
    _handlers.clear()


os.register_at_fork(after_in_child=_forget_in_child)
