"""Keeping a leased session alive, for every client that holds one: `LeaseKeeper`.

A session with a lease (a broker session, `querylib.broker._session`; a coordinator session,
`querylib.cluster._session`, which an executor agent watches) lives as long as its holder
renews it within the lease. The keeper does what every holder did by hand:

    keeper = LeaseKeeper(lambda: "broker session 7", lease=10.0, renew=heartbeat,
                         verdict=classify, reopen=open_again, give_up_after=60.0)
    keeper.opened()          # the first open answered: the lease runs from now
    keeper.start()           # renews every third of the lease, on this loop
    ...
    await keeper.reopen(keeper.generation)   # an owner saw a call fail: open again, once
    await keeper.close()     # stops renewing (the owner closes the session itself)

- Renewal: `renew(timeout)` every `lease / 3` (at least `min_period` seconds; `lease` may be
  changed while it runs, as a coordinator grants another), waiting up to
  `max(period, min_renew_timeout)` for the answer. Any answer moves `renewed_at`.
- A failed renewal is sorted by `verdict(exc)` (`Renewal`): LAPSED (the other side forgot
  the session: it lapsed), AWAY (no answer, connection trouble: the session lapses only once
  nothing renewed it for a whole lease, and only when `unheard_lapses`; after an unanswered
  renewal the keeper wakes at the lease's end to check, so a lapse is noticed then, not a
  period later), REFUSED (logged; renewing goes on, but a refused renewal renewed nothing: it
  counts toward a lease unheard as AWAY does), CLOSED (our transport is closed: renewing
  stops). An exception that is not a TqError is a bug: it ends the renewals and is
  logged with its traceback.
- Lapse: a keeper given `reopen` opens the session again (`reopen`, below); one without it
  sets `lapsed`, tells `on_lapse` callbacks once (the cause, or None for a lease unheard) and
  stops: its holder decides what a lapse means.
- `reopen(seen_generation)`: unless someone reopened since `seen_generation`, tries
  `reopen(attempt_timeout)` and then every `on_reopen` callback (owners re-establish what the
  other side lost), with `Backoff` between attempts, while `retry(exc)` says the failure is a
  lost connection. After each failed attempt `relocate()` may move the transport (True: it
  moved, which earns one more attempt past the deadline). After `give_up_after` seconds
  (None: never) it gives up: `failure` is set to `give_up()`'s error, `on_failure` callbacks
  are told once, and every later reopen raises it. `ready` is clear while a reopen runs.

Where the holders differ, as parameters: a broker link reopens the same session, presumes it
lapsed when unheard for a lease, and gives up after its reconnect timeout; a coordinator
session never reopens (the coordinator retracted what it owned: the holder must open a new
one), and waits for the coordinator's word (`unheard_lapses=False`) unless its holder is an
executor, which must assume the worst after a lease unheard (`presume_lost`) and stop its
processes. The Kafka consumer-group member (`querylib.api._group_client`) is not a keeper: its
heartbeats and rejoins are decided by the pure `MemberMachine`, on a thread.

`clock` and `sleep` default to the running loop's; tests pass fake ones.
Must not: know the messages of any protocol; the holder's callables speak them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from catalog.errors import TqError

__all__ = ["Backoff", "LeaseKeeper", "Renewal"]

logger = logging.getLogger("querylib.lease")


class Renewal(enum.Enum):
    """What a failed renewal means (the holder's `verdict`)."""

    LAPSED = "lapsed"    # the other side forgot the session
    AWAY = "away"        # no answer: lapsed only after a lease unheard (`unheard_lapses`)
    REFUSED = "refused"  # refused this renewal; keep renewing
    CLOSED = "closed"    # our own transport is closed: stop renewing


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: `first` seconds, doubling up to `most`."""

    first: float = 0.05
    most: float = 1.0

    def delays(self) -> Iterator[float]:
        delay = self.first
        while True:
            yield delay
            delay = min(delay * 2, self.most)


def _always(_exc: TqError) -> bool:
    return True


class LeaseKeeper:
    """Renews one leased session, notices when it lapsed, reopens it (see the module
    docstring). Runs on one asyncio loop."""

    def __init__(self, describe: Callable[[], str], *, lease: float,
                 renew: Callable[[float], Awaitable[object]],
                 verdict: Callable[[TqError], Renewal],
                 reopen: Callable[[float], Awaitable[object]] | None = None,
                 retry: Callable[[TqError], bool] = _always,
                 relocate: Callable[[], Awaitable[bool]] | None = None,
                 give_up_after: float | None = None,
                 give_up: Callable[[], TqError] | None = None,
                 attempt_timeout: float = 2.0, unheard_lapses: bool = True,
                 min_period: float = 0.05, min_renew_timeout: float = 1.0,
                 backoff: Backoff = Backoff(),
                 clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], Awaitable[object]] | None = None) -> None:
        self.describe = describe
        self.lease = lease
        self._renew = renew
        self._verdict = verdict
        self._reopen = reopen
        self._retry = retry
        self._relocate = relocate
        self.give_up_after = give_up_after
        self._give_up = give_up or (lambda: TqError(
            f"{self.describe()}: no answer for {self.give_up_after:g}s; giving up"))
        self.attempt_timeout = attempt_timeout
        self.unheard_lapses = unheard_lapses
        self.min_period = min_period
        self.min_renew_timeout = min_renew_timeout
        self.backoff = backoff
        self._clock = clock
        self._sleep = sleep or asyncio.sleep
        self.generation = 0  # how many times the session was (re)opened
        self.renewed_at = 0.0  # clock time of the last answer to an open or a renewal
        self.renewals = 0
        self.on_reopen: list[Callable[[], Awaitable[None]]] = []
        self.on_failure: list[Callable[[TqError], None]] = []
        self.on_lapse: list[Callable[[BaseException | None], None]] = []
        self.failure: TqError | None = None  # gave up reopening
        self.lapse: BaseException | None = None  # why it lapsed (a keeper without reopen)
        self.lapsed = asyncio.Event()  # set once it lapsed (a keeper without reopen)
        # Set while the session is open and every owner re-established its state: new calls
        # wait for it, so nothing overtakes what is being sent again.
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._failing = False  # the last renewal went unanswered
        self._reopen_lock = asyncio.Lock()
        self._closed = False

    def now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    @property
    def period(self) -> float:
        return max(self.lease / 3, self.min_period)

    @property
    def closed(self) -> bool:
        return self._closed

    def expired(self) -> bool:
        """Whether nothing renewed the session for a whole lease."""
        return self.now() - self.renewed_at >= self.lease

    def opened(self) -> None:
        """The session was (re)opened just now: its lease runs from now."""
        self.renewed_at = self.now()
        self.generation += 1
        self._failing = False

    def start(self) -> None:
        """The session is open: renew it in the background (after `opened`)."""
        self.ready.set()
        if self.task is None and not self._closed:
            self.task = asyncio.get_running_loop().create_task(
                self.run(), name=f"lease of {self.describe()}")
            self.task.add_done_callback(_report_crash)

    async def run(self) -> None:
        """Renew until closed, lapsed (without reopen), given up, or the transport closed."""
        while not self._closed and self.failure is None and not self.lapsed.is_set():
            wait = self.period
            if self._failing and self.unheard_lapses:  # wake when the lease ends, not later
                wait = min(wait, max(self.renewed_at + self.lease - self.now(), 0.0))
            await self._sleep(wait)
            if self._closed or self.failure is not None:
                return
            generation = self.generation
            cause: BaseException | None = None
            if not (self._failing and self.unheard_lapses and self.expired()):
                try:
                    await self._renew(max(self.period, self.min_renew_timeout))
                    self.renewed_at = self.now()
                    self.renewals += 1
                    self._failing = False
                    continue
                except TqError as exc:
                    if self._closed:
                        return
                    verdict = self._verdict(exc)
                    if verdict is Renewal.CLOSED:
                        return
                    if verdict is Renewal.LAPSED:
                        cause = exc
                    else:  # not renewed: lapsed once that lasted a lease (`unheard_lapses`)
                        if verdict is Renewal.REFUSED:
                            logger.warning("%s: renewal refused: %s", self.describe(), exc)
                        else:
                            logger.debug("%s: renewal: %s", self.describe(), exc)
                        self._failing = True
                        if not (self.unheard_lapses and self.expired()):
                            continue  # a slow peer may still hold our session
            await self._lapsed(generation, cause)

    async def _lapsed(self, generation: int, cause: BaseException | None) -> None:
        if self._reopen is None:
            self.lapse_now(cause)
            return
        try:
            await self.reopen(generation)
        except TqError as exc:
            if self.failure is None:
                logger.warning("%s: reopening the session failed: %s", self.describe(), exc)

    def lapse_now(self, cause: BaseException | None) -> None:
        """A keeper without reopen: the session is gone (`cause`, or None: a lease unheard).
        Its holder calls this too when a call of its own learned it. Once."""
        if self.lapsed.is_set():
            return
        self.lapse = cause
        self.lapsed.set()
        for callback in list(self.on_lapse):
            callback(cause)

    async def reopen(self, seen_generation: int) -> None:
        """Open the session again, unless someone did since `seen_generation` (see the module
        docstring). Raises the `give_up` error once `give_up_after` passed unanswered, and
        what `retry` calls no lost connection at once."""
        if self._reopen is None:
            raise TqError(f"{self.describe()}: this session is not reopened")
        async with self._reopen_lock:
            if self.failure is not None:
                raise self.failure
            if self.generation != seen_generation or self._closed:
                return
            self.ready.clear()
            give_up_at = None if self.give_up_after is None else self.now() + self.give_up_after
            delays = self.backoff.delays()
            try:
                while not self._closed:
                    left = self.attempt_timeout if give_up_at is None else \
                        give_up_at - self.now()
                    try:
                        await self._reopen(max(min(self.attempt_timeout, left), 0.1))
                        self.opened()
                        for callback in list(self.on_reopen):
                            await callback()
                        return
                    except TqError as exc:
                        if not self._retry(exc) or self._closed:
                            raise
                        logger.info("%s: reopening the session: %s", self.describe(), exc)
                    moved = await self._relocate() if self._relocate is not None else False
                    if give_up_at is not None and self.now() >= give_up_at and not moved:
                        self._fail()
                        assert self.failure is not None  # set by _fail
                        raise self.failure
                    await self._sleep(next(delays))
            finally:
                self.ready.set()  # done, or failed: nobody waits for a session that will not come

    def _fail(self) -> None:
        self.failure = self._give_up()
        logger.warning("%s", self.failure)
        for callback in list(self.on_failure):
            callback(self.failure)

    async def close(self) -> None:
        """Stop renewing (a renewal under way is cancelled). Idempotent."""
        self._closed = True
        self.ready.set()
        task, self.task = self.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("%s crashed", task.get_name(), exc_info=exc)
