"""Argument types shared by tq's commands and the servers' development entry points (`python
-m querylib.server.connector`): checked at parse time, so a bad value gets argparse's one-line
error naming the option (exit status 2) before anything connects. A foundation: argparse and
math only."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["MAX_COUNT", "MAX_SECONDS", "integer", "per_second", "port", "port_or_none",
           "seconds", "seconds_or_zero"]

MAX_SECONDS = 86400.0  # a day: longer timeouts and leases are mistakes (and overflow timers)
MAX_COUNT = 2**31 - 1  # Kafka's INT32: counts, sizes and ids past it cannot be sent anyway


def _seconds(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low = "0 <=" if zero else "0 <"
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero) \
            or value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number of seconds ({low} seconds <= {MAX_SECONDS:g})")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, more than 0 and at most a day."""
    return _seconds(text, zero=False)


def seconds_or_zero(text: str) -> float:
    """A duration in seconds, 0 (which the option gives a meaning) up to a day."""
    return _seconds(text, zero=True)


def per_second(text: str) -> float:
    """A rate: a finite number of events per second, 0 (as fast as possible) up to a billion."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= 1e9:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a rate (0 <= per second <= 1e9)")
    return value


def _whole(text: str) -> int | None:
    try:
        return int(text, 10)
    except ValueError:
        return None


def integer(low: int, high: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number from `low` to `high`."""
    def check(text: str) -> int:
        value = _whole(text)
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not a whole number from {low} to {high}")
        return value

    check.__name__ = f"integer({low}, {high})"
    return check


def port(text: str) -> int:
    """A TCP port, 0 meaning any free one."""
    value = _whole(text)
    if value is None or not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port (0-65535, 0: any free "
                                         f"port)")
    return value


def port_or_none(text: str) -> int:
    """A TCP port, 0 meaning any free one and -1 none: the endpoint is not opened."""
    value = _whole(text)
    if value is None or not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port (0-65535, 0: any free "
                                         f"port, -1: none)")
    return value
