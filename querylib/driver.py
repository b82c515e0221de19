"""The one feed loop of tq's shells around their pure cores (DESIGN §1 "Pure cores and their
driver"): the coordinator's, the broker's and the executor agent's.

A shell owns a core whose `handle(stimulus) -> [instructions]` decides everything and does no
I/O, and performs the instructions it returns. `Driver` is what sits between the two:

    driver = Driver("broker", state.handle, {Reply: self._reply, Append: self._append},
                    on_bug=self._answer_bug, invariants=state.check_invariants)
    driver.feed(stimulus)

- **Inbox and re-entrancy guard.** `feed` may be called while the driver performs an
  instruction (an instruction whose I/O fails at once feeds the failure back): the stimulus
  queues behind, so instructions run in the order the core gave them and the core never sees
  a stimulus in the middle of another.
- **Dispatch.** Each instruction goes to the handler registered for its type (or for the
  nearest base class); an instruction of no registered type is a bug. `after(stimulus)`, if
  given, runs once a stimulus's instructions are performed (the broker wakes its listeners).
- **Bugs.** The core raising, or a handler raising, is a bug (ours): it is logged once with its
  traceback and the last `history` stimuli (a ring buffer kept for exactly this; `slim` says
  how to keep the bulky ones, without their bytes), counted in `bugs`, handed to
  `on_bug(stimulus, exc)` (which answers the request that stimulus carried), and the loop goes
  on with the next instruction and stimulus: one bug must not stop the service for everyone
  else. Cancellation is never a bug: it propagates.
- **Invariant checks.** With `Driver.check_invariants` on (the tests' conftest sets it; the
  environment variable TQ_CHECK_INVARIANTS=1 sets it in any process), `invariants()` runs after
  every stimulus's step; what it raises is a bug like any other (counted, logged with the
  stimuli that led there) and is also recorded in `Driver.broken`, which the tests' conftest
  checks after every test; `strict` re-raises it instead.

Must not: decide anything the core decides, do I/O, or know any component's types.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["DEFAULT_HISTORY", "Driver"]

DEFAULT_HISTORY = 32  # stimuli kept for the log of a bug


def _from_environment() -> bool:
    return os.environ.get("TQ_CHECK_INVARIANTS", "") not in ("", "0")


class Driver:
    """Feeds stimuli to `handle` one at a time and performs its instructions by `handlers`."""

    # Run `invariants` after every step (tests turn this on for every driver in the process).
    check_invariants: bool = _from_environment()
    # Raise what a step raises instead of counting it (tests of a core that want it loud).
    strict: bool = False
    # Every broken invariant any driver of this process saw ("name: stimulus: error"): the
    # tests' conftest fails a test that leaves one here.
    broken: list[str] = []

    def __init__(self, name: str, handle: Callable[[Any], Iterable[Any]],
                 handlers: Mapping[type, Callable[[Any], object]], *,
                 on_bug: Callable[[Any, Exception], object] | None = None,
                 invariants: Callable[[], object] | None = None,
                 after: Callable[[Any], object] | None = None,
                 history: int = DEFAULT_HISTORY,
                 slim: Mapping[type, Callable[[Any], Any]] | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.name = name
        self._handle = handle
        self._handlers: dict[type, Callable[[Any], object]] = dict(handlers)
        self._on_bug = on_bug
        self._invariants = invariants
        self._after = after
        self._inbox: deque[Any] = deque()
        self._feeding = False
        self.recent: deque[Any] = deque(maxlen=history)  # the last stimuli, newest last
        # Stimuli of these types are kept in `recent` as what their function returns (their
        # bulk, a record batch or read data, dropped): the ring buffer must not hold `history`
        # batches of up to the maximum batch size alive after their step.
        self._slim: dict[type, Callable[[Any], Any]] = dict(slim or {})
        self.bugs = 0
        self.steps = 0
        self._logger = logger or logging.getLogger(name)

    def feed(self, stimulus: Any) -> None:
        """Hand `stimulus` to the core and perform its instructions; one fed while this runs
        (from a handler) is handled after the current one's instructions."""
        self._inbox.append(stimulus)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._inbox:
                self._step(self._inbox.popleft())
        finally:
            self._feeding = False

    @property
    def pending(self) -> int:
        """Stimuli queued behind the one being handled."""
        return len(self._inbox)

    def _step(self, stimulus: Any) -> None:
        slim = self._slim.get(type(stimulus))
        self.recent.append(stimulus if slim is None else slim(stimulus))
        self.steps += 1
        try:
            instructions = self._handle(stimulus)
            if type(instructions) is not list:
                instructions = list(instructions)
        except Exception as exc:
            self._bug(stimulus, exc, f"handling {type(stimulus).__name__}")
            return
        handlers = self._handlers
        for instruction in instructions:
            try:
                # Most instructions are of a registered type: one dict lookup per instruction.
                (handlers.get(type(instruction)) or self._handler(instruction))(instruction)
            except Exception as exc:
                self._bug(stimulus, exc, f"performing {type(instruction).__name__} "
                                         f"(after {type(stimulus).__name__})")
        if self._after is not None:
            try:
                self._after(stimulus)
            except Exception as exc:
                self._bug(stimulus, exc, f"after {type(stimulus).__name__}")
        if self.check_invariants and self._invariants is not None:
            try:
                self._invariants()
            except Exception as exc:
                Driver.broken.append(f"{self.name}: after {_brief(stimulus)}: {exc!r}")
                self._bug(stimulus, exc, f"invariant broken after {type(stimulus).__name__}")

    def _handler(self, instruction: Any) -> Callable[[Any], object]:
        kind = type(instruction)
        handler = self._handlers.get(kind)
        if handler is None:
            handler = next((self._handlers[base] for base in kind.__mro__[1:]
                            if base in self._handlers), None)
            if handler is None:
                raise TypeError(f"{self.name}: no handler for instruction {instruction!r}")
            self._handlers[kind] = handler  # found once per type
        return handler

    def _bug(self, stimulus: Any, exc: Exception, what: str) -> None:
        if self.strict:
            raise exc
        self.bugs += 1
        recent = "\n".join(f"  {_brief(s)}" for s in self.recent)
        self._logger.error("%s: bug %s; the last %d stimuli, newest last:\n%s", self.name,
                           what, len(self.recent), recent, exc_info=exc)
        if self._on_bug is not None:
            self._on_bug(stimulus, exc)


def _brief(stimulus: Any, limit: int = 300) -> str:
    """A stimulus for the log: its repr, bounded (a batch's bytes would flood it)."""
    text = repr(stimulus)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
