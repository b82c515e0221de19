"""Credit accounting for one connector session: a small pure counter, no policy.

Both ends keep one and agree because they count the same frames: the worker grants credits (OK,
ACK, draft NACK) and every NOTIFY and MESSAGE the connector sends spends one. How many credits to
grant, and when, is the endpoint's policy; this class only answers "may one more be spent".
"""

from __future__ import annotations

__all__ = ["Credits"]


class Credits:
    """How many more NOTIFY/MESSAGE frames the connector may send in this session."""

    __slots__ = ("available", "granted", "spent")

    def __init__(self) -> None:
        self.available = 0
        self.granted = 0  # lifetime totals, for statistics
        self.spent = 0

    def grant(self, credits: int) -> None:
        self.available += credits
        self.granted += credits

    def try_spend(self) -> bool:
        """Spend one credit if there is one; False (and nothing changes) if there is none."""
        if self.available <= 0:
            return False
        self.available -= 1
        self.spent += 1
        return True

    def __repr__(self) -> str:
        return f"Credits(available={self.available}, granted={self.granted}, spent={self.spent})"
