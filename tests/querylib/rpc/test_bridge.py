"""The loop-thread bridge every blocking wrapper stands on: calls, timeouts, closing."""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from collections.abc import Iterator

import pytest

from querylib.rpc import ClientClosedError, DeadlineExceededError
from querylib.rpc._bridge import LoopThread
from tests.conftest import wait_for


@pytest.fixture
def bridge() -> Iterator[LoopThread]:
    running = LoopThread("tq-test-bridge", owner="a test bridge")
    try:
        yield running
    finally:
        running.close()


class Watch:
    """A coroutine that waits forever, saying when it started and when it was cancelled."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    async def forever(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def test_a_call_runs_on_the_loop_thread_and_returns_its_result(bridge: LoopThread) -> None:
    async def where() -> tuple[str, bool]:
        return threading.current_thread().name, asyncio.get_running_loop() is bridge.loop

    assert bridge.call(where()) == ("tq-test-bridge", True)
    seen: list[int] = []
    bridge.soon(seen.append, 7)
    wait_for(lambda: seen == [7], what="the soon callback")


def test_a_call_past_its_timeout_is_cancelled_and_raises_deadline_exceeded(
        bridge: LoopThread) -> None:
    watch = Watch()
    with pytest.raises(DeadlineExceededError):
        bridge.call(watch.forever(), timeout=0.05)
    assert watch.cancelled.wait(10)
    assert bridge.call(asyncio.sleep(0, "still usable")) == "still usable"


def test_a_timeout_raised_by_the_coroutine_itself_passes_through(bridge: LoopThread) -> None:
    async def waits() -> None:
        await asyncio.wait_for(asyncio.Event().wait(), 0.01)

    with pytest.raises(TimeoutError) as caught:
        bridge.call(waits(), timeout=30)
    assert not isinstance(caught.value, DeadlineExceededError)


def _fail_deep() -> None:
    raise ValueError("from the loop")


def test_an_exception_passes_through_with_its_traceback(bridge: LoopThread) -> None:
    async def fails() -> None:
        _fail_deep()

    with pytest.raises(ValueError, match="from the loop") as caught:
        bridge.call(fails())
    names = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert names[-2:] == ["fails", "_fail_deep"]


def test_close_cancels_pending_calls_and_their_callers_see_client_closed() -> None:
    bridge = LoopThread("tq-test-bridge", owner="a test bridge")
    watch = Watch()
    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            bridge.call(watch.forever())
        except BaseException as exc:  # checked below
            outcome.append(exc)

    waiting = threading.Thread(target=caller)
    waiting.start()
    assert watch.started.wait(10)
    background = Watch()  # a task of the loop's own, not a call: cancelled as well
    # Held here: a task only the loop knows can be garbage-collected while it waits on a
    # future nobody else holds (asyncio keeps weak references), and then nobody cancels it.
    tasks: list[asyncio.Task[None]] = []
    bridge.soon(lambda: tasks.append(bridge.loop.create_task(background.forever())))
    assert background.started.wait(10)
    bridge.close()
    waiting.join(10)
    assert not waiting.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError)
    assert watch.cancelled.is_set() and background.cancelled.is_set()


def test_calls_after_close_raise_client_closed_and_leave_nothing_behind() -> None:
    bridge = LoopThread("tq-test-bridge-closed", owner="a test bridge")
    assert bridge.call(asyncio.sleep(0, 1)) == 1
    bridge.close()
    bridge.close()  # idempotent
    coro = asyncio.sleep(0)
    with pytest.raises(ClientClosedError, match="a test bridge is closed"):
        bridge.call(coro)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # no "never awaited"
    with pytest.raises(ClientClosedError):
        bridge.soon(print)
    assert not bridge.thread.is_alive() and bridge.loop.is_closed()
    assert "tq-test-bridge-closed" not in [t.name for t in threading.enumerate()]


def test_calling_or_closing_from_the_loop_thread_is_refused(bridge: LoopThread) -> None:
    async def reenter() -> str:
        inner = asyncio.sleep(0)
        try:
            bridge.call(inner)
        except RuntimeError as exc:
            assert inspect.getcoroutinestate(inner) == inspect.CORO_CLOSED
            first = str(exc)
        try:
            bridge.close()
        except RuntimeError as exc:
            return f"{first} / {exc}"
        return "not refused"

    message = bridge.call(reenter())
    assert "cannot be called from its own loop thread" in message
    assert "cannot be closed from its own loop thread" in message
    assert not bridge.closed
