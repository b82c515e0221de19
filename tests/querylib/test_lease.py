"""The lease keeper, on a fake clock and a scripted transport: when it renews, when a session
lapses, how it reopens (backoff, callbacks, giving up), and closing in the middle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from catalog.errors import TqError
from querylib._lease import Backoff, LeaseKeeper, Renewal


class Forgotten(TqError):
    """The other side does not know the session."""


class Away(TqError):
    """No answer."""


class Refused(TqError):
    """Said no to this renewal."""


class Closed(TqError):
    """Our transport is closed."""


class Denied(TqError):
    """A refusal that reopening again cannot change."""


VERDICTS = {Forgotten: Renewal.LAPSED, Away: Renewal.AWAY, Refused: Renewal.REFUSED,
            Closed: Renewal.CLOSED}


def verdict(exc: TqError) -> Renewal:
    return VERDICTS[type(exc)]


class Clock:
    """Fake time: sleeping moves it on at once (after letting other tasks run)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds
        await asyncio.sleep(0)


class Script:
    """A transport answering from a list (None: answered; an exception: raised); past the
    end, a call waits until cancelled, and `exhausted` is set."""

    def __init__(self, clock: Clock, outcomes: list[BaseException | None]) -> None:
        self.clock = clock
        self.outcomes = list(outcomes)
        self.calls: list[float] = []
        self.timeouts: list[float] = []
        self.exhausted = asyncio.Event()
        self.cancelled = False
        self.hook: Callable[[int], None] | None = None

    async def __call__(self, timeout: float) -> None:
        self.calls.append(round(self.clock.now, 6))
        self.timeouts.append(timeout)
        if self.hook is not None:
            self.hook(len(self.calls))
        if not self.outcomes:
            self.exhausted.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome


def keeper_of(clock: Clock, renew: Script, *, lease: float = 3.0, **options: Any) -> LeaseKeeper:
    return LeaseKeeper(lambda: "test session", lease=lease, renew=renew, verdict=verdict,
                       clock=clock.time, sleep=clock.sleep, min_period=0.01,
                       min_renew_timeout=0.5, **options)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_renews_every_third_of_the_lease_and_follows_a_new_lease() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [None, None, None])
        keeper = keeper_of(clock, renew, lease=3.0)
        renew.hook = lambda n: setattr(keeper, "lease", 6.0) if n == 2 else None
        keeper.opened()
        keeper.start()
        await renew.exhausted.wait()
        assert renew.calls == [1.0, 2.0, 4.0, 6.0]
        assert renew.timeouts == [1.0, 1.0, 2.0, 2.0]  # max(period, min_renew_timeout)
        assert keeper.renewals == 3 and keeper.renewed_at == 4.0 and keeper.generation == 1
        await keeper.close()
        assert renew.cancelled  # close cancels the renewal under way

    run(main)


def test_unanswered_renewals_lapse_only_after_a_whole_lease_then_it_reopens() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [Away(), Away()])
        reopen = Script(clock, [None])
        reopened: list[float] = []

        async def owner() -> None:
            reopened.append(clock.now)
            assert not keeper.ready.is_set()  # new calls wait for the owners

        keeper = keeper_of(clock, renew, reopen=reopen, lease=3.0)
        keeper.on_reopen.append(owner)
        keeper.opened()
        keeper.start()
        await renew.exhausted.wait()
        # Unanswered at 1 and 2 (a slow peer may still hold it); at 3 a whole lease passed.
        assert renew.calls == [1.0, 2.0, 4.0]
        assert reopen.calls == [3.0] and reopened == [3.0]
        assert keeper.generation == 2 and keeper.renewed_at == 3.0 and keeper.ready.is_set()
        await keeper.close()

    run(main)


def test_a_holder_that_waits_for_the_word_of_the_other_side_never_lapses_on_its_own() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [Away()] * 10)
        lapses: list[BaseException | None] = []
        keeper = keeper_of(clock, renew, lease=3.0, unheard_lapses=False)
        keeper.on_lapse.append(lapses.append)
        keeper.opened()
        keeper.start()
        await renew.exhausted.wait()
        assert renew.calls == [float(n) for n in range(1, 12)]
        assert lapses == [] and not keeper.lapsed.is_set()
        await keeper.close()

    run(main)


def test_a_forgotten_session_is_reopened_with_backoff_and_once_for_every_owner() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [Forgotten()])
        reopen = Script(clock, [Away(), Away(), None])
        keeper = keeper_of(clock, renew, reopen=reopen, lease=3.0,
                           backoff=Backoff(0.05, 1.0))
        calls = 0

        async def owner() -> None:
            nonlocal calls
            calls += 1

        keeper.on_reopen.append(owner)
        keeper.opened()
        keeper.start()
        await renew.exhausted.wait()
        assert reopen.calls == [1.0, 1.05, 1.15]  # backoff 0.05, then 0.1
        assert keeper.generation == 2 and calls == 1
        await keeper.reopen(1)  # an owner that saw the old session fail: already done
        assert keeper.generation == 2 and calls == 1 and len(reopen.calls) == 3
        await keeper.close()

    run(main)


def test_it_gives_up_after_its_deadline_and_tells_its_owners_once() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [Forgotten()])
        reopen = Script(clock, [Away()] * 20)
        failures: list[TqError] = []
        keeper = keeper_of(clock, renew, reopen=reopen, lease=3.0, give_up_after=1.0,
                           give_up=lambda: Denied("gave up"), backoff=Backoff(0.05, 1.0))
        keeper.on_failure.append(failures.append)
        keeper.opened()
        keeper.start()
        assert keeper.task is not None
        await keeper.task  # renewing ends with the failure
        assert reopen.calls == [1.0, 1.05, 1.15, 1.35, 1.75, 2.55]
        assert len(failures) == 1 and keeper.failure is failures[0]
        assert keeper.ready.is_set()  # nobody waits for a session that will not come
        with pytest.raises(Denied):
            await keeper.reopen(keeper.generation)
        assert len(reopen.calls) == 6 and len(failures) == 1

    run(main)


@pytest.mark.parametrize("moves", [True, False])
def test_a_transport_that_moved_gets_one_more_attempt_past_the_deadline(moves: bool) -> None:
    async def main() -> None:
        clock = Clock()
        reopen = Script(clock, [Away(), Away(), None])
        answers = [False, moves]

        async def relocate() -> bool:
            return answers.pop(0)

        keeper = keeper_of(clock, Script(clock, []), reopen=reopen, relocate=relocate,
                           give_up_after=0.01, backoff=Backoff(0.05, 1.0))
        keeper.opened()
        if moves:
            await keeper.reopen(1)
            assert reopen.calls == [0.0, 0.05, 0.15] and keeper.generation == 2
        else:  # past the deadline after the second attempt, and not moved: gave up
            with pytest.raises(TqError, match="giving up"):
                await keeper.reopen(1)
            assert reopen.calls == [0.0, 0.05] and keeper.failure is not None

    run(main)


def test_a_refusal_that_is_no_lost_connection_is_raised_at_once() -> None:
    async def main() -> None:
        clock = Clock()
        reopen = Script(clock, [Denied("no")])
        keeper = keeper_of(clock, Script(clock, []), reopen=reopen,
                           retry=lambda exc: not isinstance(exc, Denied))
        keeper.opened()
        with pytest.raises(Denied):
            await keeper.reopen(1)
        assert reopen.calls == [0.0] and keeper.failure is None and keeper.ready.is_set()

    run(main)


def test_without_reopen_a_lapse_is_told_once_and_renewing_stops() -> None:
    async def main() -> None:
        clock = Clock()
        forgotten = Forgotten("dropped")
        renew = Script(clock, [Refused(), None, forgotten])
        lapses: list[BaseException | None] = []
        keeper = keeper_of(clock, renew, lease=3.0, unheard_lapses=False)
        keeper.on_lapse.append(lapses.append)
        keeper.opened()
        keeper.start()
        await asyncio.wait_for(keeper.lapsed.wait(), 10)
        assert keeper.task is not None
        await keeper.task
        assert renew.calls == [1.0, 2.0, 3.0]  # a refusal does not stop renewing
        assert lapses == [forgotten] and keeper.lapse is forgotten
        keeper.lapse_now(None)  # the holder learned it too: told once only
        assert lapses == [forgotten]

    run(main)


def test_a_presumed_lapse_after_a_lease_unheard_is_told_with_no_cause() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [Refused(), Refused(), Refused()])  # refused: nothing renewed
        lapses: list[BaseException | None] = []
        keeper = keeper_of(clock, renew, lease=3.0)
        keeper.on_lapse.append(lapses.append)
        keeper.opened()
        keeper.start()
        await keeper.lapsed.wait()
        assert lapses == [None] and renew.calls == [1.0, 2.0] and clock.now == 3.0

    run(main)


def test_a_closed_transport_stops_renewing_quietly() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [Closed()])
        keeper = keeper_of(clock, renew, reopen=Script(clock, []))
        keeper.opened()
        keeper.start()
        assert keeper.task is not None
        await keeper.task
        assert renew.calls == [1.0] and keeper.generation == 1 and not keeper.lapsed.is_set()

    run(main)


def test_close_during_a_reopen_stops_it() -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [Forgotten()])
        reopen = Script(clock, [])  # the broker never answers the open
        keeper = keeper_of(clock, renew, reopen=reopen)
        keeper.opened()
        keeper.start()
        await reopen.exhausted.wait()
        await keeper.close()
        assert reopen.cancelled and keeper.task is None and keeper.ready.is_set()
        assert keeper.generation == 1

    run(main)


def test_a_bug_in_a_renewal_is_reported_not_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        clock = Clock()
        renew = Script(clock, [ZeroDivisionError("a bug")])
        keeper = keeper_of(clock, renew)
        keeper.opened()
        keeper.start()
        task = keeper.task
        assert task is not None
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # done callbacks run
        assert isinstance(task.exception(), ZeroDivisionError)

    with caplog.at_level(logging.ERROR, logger="querylib.lease"):
        run(main)
    assert any("lease of test session crashed" in r.getMessage() and r.exc_info
               for r in caplog.records)
