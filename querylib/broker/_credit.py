"""Credit accounting for credit-based flow (the connector spec's model, DESIGN §5).

Two small pure classes that send nothing:
- `CreditWindow` is the sender's view: how many bytes it may still put on the wire.
- `CreditGrant` is the receiver's view: how much credit to grant back now. It grants in chunks
  once half the window has been consumed, so a steady stream costs one grant per half window
  rather than one per message (h2's WINDOW_UPDATE strategy).
"""

from __future__ import annotations

from catalog.errors import ProtocolError


class CreditWindow:
    """Bytes a sender may still send. Sending may overshoot by the remainder of one batch (whole
    batches are never split, as in Kafka's fetch); then nothing more goes until credit is
    positive again."""

    def __init__(self, initial: int = 0) -> None:
        if initial < 0:
            raise ValueError("initial credit must be >= 0")
        self._available = initial

    @property
    def available(self) -> int:
        return self._available

    def can_send(self) -> bool:
        return self._available > 0

    def consume(self, nbytes: int) -> None:
        self._available -= nbytes

    def grant(self, nbytes: int, *, limit: int | None = None) -> None:
        if nbytes < 0:
            raise ProtocolError(f"negative credit grant {nbytes}")
        self._available += nbytes
        if limit is not None and self._available > limit:
            raise ProtocolError(f"credit {self._available} exceeds the allowed window {limit}")


class CreditGrant:
    """Receiver side: tracks bytes consumed since the last grant and says when to grant more."""

    def __init__(self, window: int) -> None:
        if window <= 0:
            raise ValueError("window must be > 0")
        self.window = window
        self._consumed = 0

    def initial(self) -> int:
        return self.window

    def consumed(self, nbytes: int) -> int:
        """Record that `nbytes` were processed; return credit to grant now (0 = not yet)."""
        self._consumed += nbytes
        if self._consumed * 2 >= self.window:
            grant, self._consumed = self._consumed, 0
            return grant
        return 0
