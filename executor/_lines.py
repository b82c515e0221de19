"""Splitting a child's output into lines with bounded memory. Pure: bytes in, lines out.

A line longer than `max_line` bytes is cut into pieces of at most `max_line` bytes, each
marked `continues=True` except the last, so a process printing a gigabyte without a newline
costs `max_line` bytes here, never more. Cuts fall on UTF-8 character boundaries where the
bytes are UTF-8, so no piece ends in half a character. A trailing `\\r` (CRLF output) is
dropped with the newline; a last line without a newline is delivered at `close()`.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_LINE", "LineSplitter"]

DEFAULT_MAX_LINE = 64 * 1024
_MIN_MAX_LINE = 16


def _utf8_cut(buf: bytearray, start: int, limit: int) -> int:
    """The largest cut <= start + limit that does not split a UTF-8 sequence (plain
    start + limit for bytes that are not UTF-8). `buf` holds more than start + limit bytes."""
    end = start + limit
    cut = end
    # A continuation byte (10xxxxxx) at the cut belongs to a character that started before it;
    # a sequence is at most 4 bytes, so look back at most 3.
    while cut > end - 3 and buf[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut if buf[cut] & 0xC0 != 0x80 else end


class LineSplitter:
    """Feed bytes as they arrive; get (line, continues) pairs back, without the newline."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < _MIN_MAX_LINE:
            raise ValueError(f"max_line must be at least {_MIN_MAX_LINE} bytes")
        self.max_line = max_line
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held back waiting for their newline (never more than `max_line`)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        buf = self._buf
        buf += data
        out: list[tuple[bytes, bool]] = []
        start = 0
        while True:
            newline = buf.find(b"\n", start, start + self.max_line + 1)
            if newline >= 0:
                end = newline - 1 if newline > start and buf[newline - 1] == 0x0D else newline
                out.append((bytes(buf[start:end]), False))
                start = newline + 1
            elif len(buf) - start > self.max_line:
                cut = _utf8_cut(buf, start, self.max_line)
                out.append((bytes(buf[start:cut]), True))
                start = cut
            else:
                break
        del buf[:start]
        return out

    def close(self) -> list[tuple[bytes, bool]]:
        """The last line, if it had no newline. The splitter is empty afterwards."""
        if not self._buf:
            return []
        line = bytes(self._buf)
        self._buf.clear()
        return [(line, False)]
