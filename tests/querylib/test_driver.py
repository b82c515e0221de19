"""The feed loop every shell drives its pure core with (`querylib.driver`): order under
re-entrancy, dispatch by type, bugs counted and logged with the recent stimuli while the loop
goes on, invariant checks after every step, cancellation never a bug."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest

from querylib.driver import Driver


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Shout(Say):
    pass


@dataclass(frozen=True)
class Echo:
    text: str


class Core:
    """Echoes each stimulus twice (its text, then its text + "!"); "boom" is a bug."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.broken = False

    def handle(self, stimulus: Say) -> list[Echo]:
        if stimulus.text == "boom":
            raise KeyError("boom")
        self.seen.append(stimulus.text)
        return [Echo(stimulus.text), Echo(stimulus.text + "!")]

    def check(self) -> None:
        assert not self.broken, "the core is broken"


def _driver(core: Core, performed: list[str], **options: Any) -> Driver:
    return Driver("test", core.handle, {Echo: lambda e: performed.append(e.text)}, **options)


def test_instructions_run_in_order_and_reentrant_stimuli_queue_behind() -> None:
    core, performed = Core(), []
    driver: Driver

    def perform(echo: Echo) -> None:
        performed.append(echo.text)
        if echo.text == "a":  # an instruction whose I/O answers at once
            driver.feed(Say("b"))
            assert core.seen == ["a"]  # not handled in the middle of "a"'s instructions

    driver = Driver("test", core.handle, {Echo: perform})
    driver.feed(Say("a"))
    assert performed == ["a", "a!", "b", "b!"]
    assert core.seen == ["a", "b"] and driver.pending == 0 and driver.steps == 2


def test_dispatch_by_the_nearest_registered_type_and_an_unknown_one_is_a_bug() -> None:
    kinds: list[str] = []
    driver = Driver("test", lambda s: [s], {Say: lambda s: kinds.append(type(s).__name__)})
    driver.feed(Shout("x"))
    driver.feed(Say("y"))
    assert kinds == ["Shout", "Say"] and driver.bugs == 0
    driver.feed(Echo("z"))
    assert driver.bugs == 1


def test_a_bug_is_counted_logged_with_the_recent_stimuli_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    core, performed = Core(), []
    answered: list[tuple[Say, Exception]] = []
    driver = _driver(core, performed, on_bug=lambda s, e: answered.append((s, e)), history=2)
    driver.feed(Say("first"))
    driver.feed(Say("second"))
    with caplog.at_level(logging.ERROR, logger="test"):
        driver.feed(Say("boom"))
    driver.feed(Say("after"))
    assert driver.bugs == 1 and performed[-2:] == ["after", "after!"]
    assert [(s.text, type(e)) for s, e in answered] == [("boom", KeyError)]
    [record] = caplog.records
    assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)
    message = record.getMessage()
    assert "Say(text='second')" in message and "Say(text='boom')" in message
    assert "first" not in message  # the ring buffer keeps the last two


def test_a_failing_handler_is_a_bug_and_the_next_instructions_still_run() -> None:
    performed: list[str] = []

    def perform(echo: Echo) -> None:
        if echo.text == "x":
            raise RuntimeError("handler bug")
        performed.append(echo.text)

    driver = Driver("test", Core().handle, {Echo: perform})
    driver.feed(Say("x"))
    assert driver.bugs == 1 and performed == ["x!"]


def test_invariants_are_checked_after_every_step_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, performed = Core(), []
    checks: list[int] = []

    def check() -> None:
        checks.append(len(performed))
        core.check()

    driver = _driver(core, performed, invariants=check)
    monkeypatch.setattr(Driver, "check_invariants", False)
    driver.feed(Say("a"))
    assert checks == []
    monkeypatch.setattr(Driver, "check_invariants", True)
    driver.feed(Say("b"))
    assert checks == [4]  # after the step's instructions
    core.broken = True
    driver.feed(Say("c"))
    assert driver.bugs == 1
    assert len(Driver.broken) == 1 and "the core is broken" in Driver.broken[0]
    Driver.broken.clear()  # (this test broke it on purpose)


def test_strict_raises_what_a_step_raises() -> None:
    driver = _driver(Core(), [])
    driver.strict = True
    with pytest.raises(KeyError):
        driver.feed(Say("boom"))
    driver.feed(Say("fine"))  # the guard was released
    assert driver.bugs == 0


def test_cancellation_is_never_a_bug() -> None:
    def handle(stimulus: Say) -> list[Echo]:
        raise asyncio.CancelledError

    driver = Driver("test", handle, {})
    with pytest.raises(asyncio.CancelledError):
        driver.feed(Say("a"))
    assert driver.bugs == 0


def test_the_history_keeps_bulky_stimuli_slimmed_and_is_bounded() -> None:
    """The ring buffer must not keep record batches alive: stimuli of a `slim` type are kept
    as what their function returns, and only the last `history` of them."""
    core, performed = Core(), []
    driver = _driver(core, performed, history=3, slim={Shout: lambda s: ("Shout", len(s.text))})
    for text in ("a", "b", "c"):
        driver.feed(Say(text))
    driver.feed(Shout("x" * 10_000))
    assert list(driver.recent) == [Say("b"), Say("c"), ("Shout", 10_000)]
    assert core.seen == ["a", "b", "c", "x" * 10_000]  # the core saw the whole stimulus
