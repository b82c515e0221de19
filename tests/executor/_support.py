"""Helpers for the executor tests: programs on disk, liveness of pids, a recording sink."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil

from executor import LogLine


def alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie (init here may never reap orphans)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def write_program(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


class Recorder:
    """A supervisor sink keeping every line; `wait_for` waits on the loop with a deadline."""

    def __init__(self) -> None:
        self.lines: list[LogLine] = []
        self._changed = asyncio.Event()

    async def __call__(self, line: LogLine) -> None:
        self.lines.append(line)
        self._changed.set()

    def texts(self, stream: str) -> list[str]:
        return [line.text for line in self.lines if line.stream == stream]

    def json_lines(self, stream: str = "stdout") -> list[dict]:
        return [json.loads(t) for t in self.texts(stream) if t.startswith("{")]

    async def wait_for(self, condition: Callable[[], object], *, timeout: float = 20.0,
                       what: str = "lines") -> object:
        async def poll() -> object:
            while True:
                value = condition()
                if value:
                    return value
                self._changed.clear()
                await self._changed.wait()

        try:
            return await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; got "
                                 f"{[line.text[:80] for line in self.lines]}") from None
