"""The loop-thread bridge: an asyncio event loop on a daemon thread of its own, and blocking
calls into it. Every blocking wrapper of an asyncio client stands on it (`BlockingClient`, the
blocking `Cluster`, the blocking broker `Producer` and `Subscriber`).

    bridge = LoopThread("tq-thing", owner="a Thing")
    try:
        core = bridge.call(AsyncThing(...).start())       # runs on the loop, this thread waits
        reply = bridge.call(core.ask(...), timeout=5)      # DeadlineExceededError after 5 s
        bridge.soon(core.poke, 1)                          # fire and forget, on the loop
    finally:
        bridge.close()   # cancels what is still running there, joins the thread, closes the loop

What it guarantees, for any number of calling threads:
- `call` runs the coroutine on the loop and returns its result or raises its exception (the
  same object, with its traceback from the loop thread). With `timeout`, a call still running
  by then is cancelled and raises DeadlineExceededError; a caller interrupted while it waits
  (KeyboardInterrupt) cancels its coroutine too, so nothing keeps running for nobody.
- Once `close` began, `call` and `soon` raise ClientClosedError, and a call that was still
  running is cancelled and raises ClientClosedError in its caller.
- `close` cancels every task still on the loop (waiting up to `CLOSE_GRACE` seconds for them to
  finish), stops the loop, joins the thread and closes the loop: no thread is left behind.
  Idempotent.
- Calling (or closing) from the loop thread itself, e.g. from a notify callback, would wait for
  the loop it blocks: RuntimeError instead.

No fork handling: none of the wrappers is meant to cross a fork (a child opens its own).
Must not: know what runs on the loop; it only carries calls across threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._errors import ClientClosedError, DeadlineExceededError

__all__ = ["CLOSE_GRACE", "LoopThread"]

T = TypeVar("T")

CLOSE_GRACE = 10.0  # seconds `close` lets cancelled tasks finish their cleanup


class LoopThread:
    """An event loop on a daemon thread named `name`; `owner` names what uses it in errors."""

    def __init__(self, name: str, *, owner: str = "this client") -> None:
        self.owner = owner
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()  # orders `_closed` against scheduling new calls
        self._closed = False
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (see the module docstring)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError(f"{self.owner} cannot be called from its own loop thread "
                               f"(its notify callbacks run there)")
        with self._lock:
            if self._closed:
                coro.close()
                raise ClientClosedError(f"{self.owner} is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._pending.add(future)
        try:
            done, _ = concurrent.futures.wait([future], timeout)
            if not done:
                future.cancel()
                raise DeadlineExceededError(f"{self.owner}: no result within {timeout:g}s")
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:
                raise ClientClosedError(f"{self.owner} was closed during the call") from None
            raise
        except BaseException:
            future.cancel()  # interrupted (Ctrl-C): nothing keeps running for us
            raise
        finally:
            with self._lock:
                self._pending.discard(future)

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(*args)` on the loop thread, without waiting."""
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"{self.owner} is closed")
            self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it, join the thread. Idempotent."""
        if self.in_loop_thread():
            raise RuntimeError(f"{self.owner} cannot be closed from its own loop thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._thread.is_alive():
            # Scheduled after every call accepted before `_closed` was set: their tasks exist.
            stopped = asyncio.run_coroutine_threadsafe(self._cancel_all(), self.loop)
            concurrent.futures.wait([stopped], CLOSE_GRACE + 1.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        with self._lock:
            leftovers, self._pending = list(self._pending), set()
        for future in leftovers:  # never reached the loop: their callers must not wait forever
            future.cancel()
        self.loop.close()

    async def _cancel_all(self) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CLOSE_GRACE
        me = asyncio.current_task()
        while (tasks := [t for t in asyncio.all_tasks() if t is not me]) and \
                (left := give_up - loop.time()) > 0:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=left)  # their cleanup may start new tasks
        await loop.shutdown_asyncgens()
