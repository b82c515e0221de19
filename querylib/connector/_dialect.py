"""Which dialect a connector speaks, told from the first frame it sends.

Both dialects open with a HELLO: the draft's tag is ASCII 'H', the released one's is 0, and both
put the tag right after a 4-byte length. So the fifth byte decides, whatever the length's
endianness. Pure function, no state.
"""

from __future__ import annotations

from enum import Enum

from ._errors import DialectError
from ._wire import HEADER_SIZE
from .draft import Hello as _DraftHello
from .released import Hello as _ReleasedHello

__all__ = ["Dialect", "detect_dialect"]


class Dialect(Enum):
    DRAFT = "draft"  # seed 002: little-endian, ASCII tags
    RELEASED = "released"  # the published connector library: big-endian, numeric tags


_BY_HELLO_TAG = {_DraftHello.tag: Dialect.DRAFT, _ReleasedHello.tag: Dialect.RELEASED}


def detect_dialect(first_bytes: bytes) -> Dialect | None:
    """The dialect of a connection whose first received bytes are `first_bytes`.

    None means "need more bytes" (fewer than 5). Raises DialectError when the byte after the
    length is neither HELLO tag: such a peer speaks neither dialect, or did not start with HELLO.
    """
    if len(first_bytes) <= HEADER_SIZE:
        return None
    tag = first_bytes[HEADER_SIZE]
    try:
        return _BY_HELLO_TAG[tag]
    except KeyError:
        raise DialectError(
            f"first frame tag {tag} ({bytes([tag])!r}) is neither a draft HELLO ('H') "
            "nor a released HELLO (0)"
        ) from None
