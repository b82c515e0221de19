"""KeyedLock: one asyncio lock per key, forgotten only when its last holder or waiter is done."""

from __future__ import annotations

import asyncio

import pytest

from querylib._keyed_lock import KeyedLock


def test_a_newcomer_waits_behind_a_waiter_when_the_holder_lets_go():
    """A holds the key, B waits; in the loop turn in which A lets go, C arrives (its wake-up
    was queued before B's). C must queue behind B, not take a fresh lock beside it."""
    async def scenario() -> list[str]:
        locks: KeyedLock[str] = KeyedLock()
        inside: list[str] = []
        order: list[str] = []
        arrive = asyncio.Event()

        async def user(name: str, release: asyncio.Event | None = None) -> None:
            async with locks.hold("k"):
                inside.append(name)
                assert inside == [name], f"{inside} hold the lock at once"
                order.append(name)
                if release is not None:
                    await release.wait()
                await asyncio.sleep(0)
                inside.remove(name)
                if release is not None:
                    arrive.set()  # C's wake-up is queued before B's (queued at the release)

        async def late() -> None:
            await arrive.wait()
            await user("C")

        go = asyncio.Event()
        a = asyncio.create_task(user("A", go))
        c = asyncio.create_task(late())
        await asyncio.sleep(0)
        b = asyncio.create_task(user("B"))
        await asyncio.sleep(0)
        go.set()
        await asyncio.gather(a, b, c)
        assert "k" not in locks and len(locks) == 0
        return order

    assert asyncio.run(scenario()) == ["A", "B", "C"]


def test_a_cancelled_waiter_lets_the_key_go():
    async def scenario() -> None:
        locks: KeyedLock[int] = KeyedLock()
        go = asyncio.Event()

        async def holder() -> None:
            async with locks.hold(1):
                await go.wait()

        async def waiter() -> None:
            async with locks.hold(1):
                pytest.fail("a cancelled waiter never holds the lock")

        h = asyncio.create_task(holder())
        await asyncio.sleep(0)
        w = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        assert 1 in locks
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        go.set()
        await h
        assert 1 not in locks

    asyncio.run(scenario())


def test_keys_do_not_wait_for_each_other():
    async def scenario() -> None:
        locks: KeyedLock[str] = KeyedLock()
        async with locks.hold("a"):
            async with locks.hold("b"):
                assert "a" in locks and "b" in locks
        assert len(locks) == 0

    asyncio.run(scenario())
