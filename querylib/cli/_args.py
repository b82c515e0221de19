"""Argument types shared by tq's commands: checked at parse time, so a bad value gets
argparse's one-line error naming the option (exit status 2) before anything connects."""

from __future__ import annotations

import argparse
import math

__all__ = ["MAX_SECONDS", "seconds", "seconds_or_zero"]

MAX_SECONDS = 86400.0  # a day: longer timeouts and leases are mistakes (and overflow timers)


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
