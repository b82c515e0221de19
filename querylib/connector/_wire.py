"""Byte-level building blocks shared by both connector dialects.

A dialect module declares each frame as a `Frame` struct plus a `layout`: the field names in wire
order, each with a field kind (`Int`, `Bytes`, `Rest`, `Pairs`, `IfFlag`, `Bool`). `Codec` encodes
and decodes any declared frame from its layout, so the byte layout lives in exactly one place per
frame. `FrameDecoder` splits a byte stream into frames with bounded buffering.

Hostile input rules kept here: every length read from the wire is checked against the bytes
actually present (or against the maximum frame size) before anything is allocated; a frame whose
fields do not consume the body exactly is malformed; after the first error a decoder re-raises it
forever instead of guessing where the next frame starts. Nothing here does I/O or knows a
dialect's tags beyond what the dialect module passes in.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

import msgspec

from ._errors import (
    ConnectorProtocolError,
    FrameTooLargeError,
    LocalProtocolError,
    MalformedFrameError,
    UnknownTagError,
)
from ._state import FrameType

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "HEADER_SIZE",
    "U16_MAX",
    "U32_MAX",
    "U64_MAX",
    "Bool",
    "Bytes",
    "Codec",
    "Frame",
    "FrameDecoder",
    "IfFlag",
    "Int",
    "Pairs",
    "Reader",
    "Rest",
]

U16_MAX = 0xFFFF
U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
HEADER_SIZE = 4  # the u32 length prefix of every frame, in both dialects
# The seed's [B1]: "a more conservative size of a few megabytes with a configuration option".
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024


class Frame(msgspec.Struct, frozen=True):
    """Base of every frame struct. Subclasses set the three class attributes below."""

    tag: ClassVar[int]  # the byte after the length prefix
    frame_type: ClassVar[FrameType]
    layout: ClassVar[tuple[tuple[str, Any], ...]]  # (field name, field kind) in wire order


class Reader:
    """A cursor over one frame body that never reads past its end."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def unpack(self, st: struct.Struct) -> tuple:
        end = self.pos + st.size
        if end > len(self.data):
            raise MalformedFrameError(f"needs {st.size} bytes, {self.remaining} left")
        values = st.unpack_from(self.data, self.pos)
        self.pos = end
        return values

    def take(self, n: int) -> bytes:
        if n > self.remaining:
            raise MalformedFrameError(f"announces {n} bytes, {self.remaining} left")
        start = self.pos
        self.pos += n
        return self.data[start : self.pos]

    def rest(self) -> bytes:
        start = self.pos
        self.pos = len(self.data)
        return self.data[start:]


def _require_int(value: object, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise LocalProtocolError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise LocalProtocolError(f"{value} is outside {what} range [{low}, {high}]")
    return value


def _require_bytes(value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise LocalProtocolError(f"expected bytes, not {type(value).__name__}")
    return bytes(value)


class Int:
    """A fixed-width integer, e.g. Int("<H") for a little-endian u16, Int(">q") for i64."""

    def __init__(self, fmt: str) -> None:
        self.struct = struct.Struct(fmt)
        self.order, self.code = fmt[0], fmt[1:]
        bits = 8 * self.struct.size
        signed = fmt[-1].islower()
        self.low = -(1 << (bits - 1)) if signed else 0
        self.high = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
        self.what = f"{'i' if signed else 'u'}{bits}"

    def read(self, reader: Reader, seen: dict[str, Any]) -> int:
        return reader.unpack(self.struct)[0]

    def write(self, out: list[bytes], value: Any, frame: Frame) -> None:
        out.append(self.struct.pack(_require_int(value, self.low, self.high, self.what)))


class Bool:
    """A u8 that must be 0 or 1 (anything else is malformed, so decode->encode is exact)."""

    def read(self, reader: Reader, seen: dict[str, Any]) -> bool:
        (value,) = reader.unpack(_U8)
        if value > 1:
            raise MalformedFrameError(f"boolean byte is {value}, not 0 or 1")
        return value == 1

    def write(self, out: list[bytes], value: Any, frame: Frame) -> None:
        if not isinstance(value, bool):
            raise LocalProtocolError(f"expected a bool, not {type(value).__name__}")
        out.append(b"\x01" if value else b"\x00")


_U8 = struct.Struct("B")


class Bytes:
    """Length-prefixed bytes: Bytes("<H") is the seed's short_bytes, Bytes(">I") a u32 prefix."""

    def __init__(self, prefix_fmt: str) -> None:
        self.prefix = struct.Struct(prefix_fmt)
        self.max = (1 << (8 * self.prefix.size)) - 1

    def read(self, reader: Reader, seen: dict[str, Any]) -> bytes:
        (length,) = reader.unpack(self.prefix)
        return reader.take(length)  # checked against the body before slicing

    def write(self, out: list[bytes], value: Any, frame: Frame) -> None:
        data = _require_bytes(value)
        if len(data) > self.max:
            raise LocalProtocolError(f"{len(data)} bytes do not fit a {self.max}-byte field")
        out.append(self.prefix.pack(len(data)))
        out.append(data)


class Rest:
    """The remaining bytes of the frame (the seed's "implicitly use the remaining length")."""

    def read(self, reader: Reader, seen: dict[str, Any]) -> bytes:
        return reader.rest()

    def write(self, out: list[bytes], value: Any, frame: Frame) -> None:
        out.append(_require_bytes(value))


class Pairs:
    """A sequence of (u64, u64) pairs: counted by a u32 prefix, or filling the rest of the frame."""

    def __init__(self, order: str, *, counted: bool) -> None:
        self.pair = struct.Struct(order + "QQ")
        self.count = struct.Struct(order + "I") if counted else None

    def read(self, reader: Reader, seen: dict[str, Any]) -> tuple[tuple[int, int], ...]:
        if self.count is not None:
            (count,) = reader.unpack(self.count)
            if count * self.pair.size > reader.remaining:
                raise MalformedFrameError(
                    f"announces {count} pairs, only {reader.remaining} bytes left"
                )
        else:
            count, extra = divmod(reader.remaining, self.pair.size)
            if extra:
                raise MalformedFrameError(
                    f"{reader.remaining} bytes is not a whole number of pairs"
                )
        data = reader.take(count * self.pair.size)
        return tuple(self.pair.iter_unpack(data))

    def write(self, out: list[bytes], value: Any, frame: Frame) -> None:
        pairs = tuple(value)
        if self.count is not None:
            out.append(self.count.pack(_require_int(len(pairs), 0, U32_MAX, "pair count")))
        for pair in pairs:
            first, second = pair
            out.append(
                self.pair.pack(
                    _require_int(first, 0, U64_MAX, "u64"), _require_int(second, 0, U64_MAX, "u64")
                )
            )


class IfFlag:
    """A field present only when `bit` is set in the earlier integer field `flags_field`.

    Its value is None when absent; encoding insists that presence and the bit agree, so a frame
    always encodes to bytes that decode back to the same frame.
    """

    def __init__(self, kind: Any, flags_field: str, bit: int) -> None:
        self.kind = kind
        self.flags_field = flags_field
        self.bit = bit

    def read(self, reader: Reader, seen: dict[str, Any]) -> Any:
        if seen[self.flags_field] & self.bit:
            return self.kind.read(reader, seen)
        return None

    def write(self, out: list[bytes], value: Any, frame: Frame) -> None:
        present = bool(getattr(frame, self.flags_field) & self.bit)
        if present != (value is not None):
            raise LocalProtocolError(
                f"must be {'set' if present else 'None'} when flag {self.bit} is "
                f"{'set' if present else 'clear'}"
            )
        if present:
            self.kind.write(out, value, frame)


class _Plan(NamedTuple):
    """How a frame class is coded: its leading run of fixed-width integers is packed with one
    precompiled struct (the hot MESSAGE path), the rest field by field."""

    tag_byte: bytes
    prefix: struct.Struct | None
    prefix_names: tuple[str, ...]
    tail: tuple[tuple[str, Any], ...]


def _plan(cls: type[Frame]) -> _Plan:
    run: list[tuple[str, Int]] = []
    for name, kind in cls.layout:
        if not isinstance(kind, Int) or (run and kind.order != run[0][1].order):
            break
        run.append((name, kind))
    prefix = None
    if run:
        prefix = struct.Struct(run[0][1].order + "".join(k.code for _, k in run))
    return _Plan(bytes((cls.tag,)), prefix, tuple(n for n, _ in run), cls.layout[len(run) :])


class Codec:
    """Encodes and decodes the frames of one dialect from their declared layouts."""

    def __init__(self, name: str, length_fmt: str, frames: Iterable[type[Frame]]) -> None:
        self.name = name
        self.length = struct.Struct(length_fmt)
        assert self.length.size == HEADER_SIZE
        self.by_tag: dict[int, type[Frame]] = {}
        self.by_type: dict[FrameType, type[Frame]] = {}
        self._plans: dict[type[Frame], _Plan] = {}
        for cls in frames:
            names = tuple(name for name, _ in cls.layout)
            assert names == cls.__struct_fields__, f"{cls.__name__} layout != fields"
            assert cls.tag not in self.by_tag, f"duplicate tag {cls.tag}"
            self.by_tag[cls.tag] = cls
            self.by_type[cls.frame_type] = cls
            self._plans[cls] = _plan(cls)

    def frame_class(self, tag: int) -> type[Frame]:
        """The frame class for `tag`, or UnknownTagError."""
        try:
            return self.by_tag[tag]
        except KeyError:
            raise UnknownTagError(
                f"unknown {self.name} frame tag {tag} ({bytes([tag])!r})"
            ) from None

    def encode(self, frame: Frame) -> bytes:
        """The complete frame: length prefix, tag, fields. LocalProtocolError on a bad value."""
        cls = type(frame)
        plan = self._plans.get(cls)
        if plan is None:
            raise LocalProtocolError(f"{cls.__name__} is not a {self.name} frame")
        out = [b"", plan.tag_byte]
        tail = plan.tail
        if plan.prefix is not None:
            values = [getattr(frame, name) for name in plan.prefix_names]
            try:
                if not all(type(v) is int for v in values):  # struct would take bools, floats
                    raise struct.error
                out.append(plan.prefix.pack(*values))
            except struct.error:
                tail = cls.layout  # the slow path names the bad field
        for name, kind in tail:
            try:
                kind.write(out, getattr(frame, name), frame)
            except LocalProtocolError as exc:
                raise LocalProtocolError(f"{cls.__name__}.{name}: {exc}") from None
            except (TypeError, ValueError) as exc:  # e.g. a pair that is not two values
                raise LocalProtocolError(f"{cls.__name__}.{name}: {exc}") from None
        size = sum(map(len, out))
        if size > U32_MAX:
            raise LocalProtocolError(f"{cls.__name__} of {size} bytes exceeds the u32 length")
        out[0] = self.length.pack(size)
        return b"".join(out)

    def decode_body(self, tag: int, body: bytes) -> Frame:
        """Decode the bytes after the tag of a frame tagged `tag`."""
        cls = self.frame_class(tag)
        plan = self._plans[cls]
        reader = Reader(body)
        seen: dict[str, Any] = {}
        tail = cls.layout
        if plan.prefix is not None and len(body) >= plan.prefix.size:
            seen = dict(zip(plan.prefix_names, plan.prefix.unpack_from(body), strict=True))
            reader.pos = plan.prefix.size
            tail = plan.tail
        for name, kind in tail:
            try:
                seen[name] = kind.read(reader, seen)
            except MalformedFrameError as exc:
                raise MalformedFrameError(
                    f"{cls.frame_type.value} frame, field {name}: {exc}"
                ) from None
        if reader.remaining:
            raise MalformedFrameError(
                f"{cls.frame_type.value} frame has {reader.remaining} trailing bytes"
            )
        return cls(*seen.values())

    def peek_first_field(self, tag: int, body: bytes) -> Any:
        """The first field of a `tag` frame, or None when the body is too short to hold it.

        The worker reads a HELLO's version this way before decoding the rest, as the seed asks,
        so a HELLO of another protocol version is reported as such even if its layout differs.
        """
        _, kind = self.frame_class(tag).layout[0]
        try:
            return kind.read(Reader(body), {})
        except MalformedFrameError:
            return None


class FrameDecoder:
    """Splits a byte stream into frames of one dialect (sans-I/O).

    `receive_data(data)` returns every complete frame. Between calls it keeps at most one partial
    frame: fewer than `HEADER_SIZE + max_frame_size` bytes. A length prefix beyond the maximum
    raises `FrameTooLargeError` as soon as its 4 bytes arrive, without waiting for the body. After
    any error the decoder is dead and raises the same error on every later call.

    `feed` + `next_raw`/`next_frame` are the incremental form (the connections use it to deliver
    the frames that precede a bad one); the buffer bound holds when every `feed` is followed by
    draining until None.
    """

    def __init__(self, codec: Codec, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if not 1 <= max_frame_size <= U32_MAX:
            raise LocalProtocolError(f"max_frame_size must be in [1, {U32_MAX}]")
        self.codec = codec
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._pos = 0
        self._error: ConnectorProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not form a complete frame yet (after draining)."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error.with_traceback(None)
        self._buffer += data

    def next_raw(self) -> tuple[int, bytes] | None:
        """The next complete frame as (tag, body after the tag); None if more bytes are needed."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        buffer, pos = self._buffer, self._pos
        available = len(buffer) - pos
        if available >= HEADER_SIZE:
            (length,) = self.codec.length.unpack_from(buffer, pos)
            if length == 0:
                self._fail(MalformedFrameError("frame of length 0 has no tag"))
            if length > self.max_frame_size:
                self._fail(
                    FrameTooLargeError(
                        f"frame of {length} bytes exceeds the maximum of {self.max_frame_size}"
                    )
                )
            end = pos + HEADER_SIZE + length
            if end <= len(buffer):
                tag = buffer[pos + HEADER_SIZE]
                body = bytes(buffer[pos + HEADER_SIZE + 1 : end])
                if end == len(buffer):
                    buffer.clear()
                    self._pos = 0
                else:
                    self._pos = end
                return tag, body
        # Need more bytes: drop what was consumed so only the partial frame stays buffered.
        if pos:
            del buffer[:pos]
            self._pos = 0
        return None

    def next_frame(self) -> Frame | None:
        """The next complete decoded frame, or None if more bytes are needed."""
        raw = self.next_raw()
        if raw is None:
            return None
        try:
            return self.codec.decode_body(*raw)
        except ConnectorProtocolError as exc:
            self._fail(exc)
            raise  # unreachable: _fail raises

    def receive_data(self, data: bytes) -> list[Frame]:
        """Feed `data` and return every frame it completes."""
        self.feed(data)
        frames = []
        while (frame := self.next_frame()) is not None:
            frames.append(frame)
        return frames

    def _fail(self, error: ConnectorProtocolError) -> None:
        self._error = error
        self._buffer = bytearray()
        self._pos = 0
        raise error
