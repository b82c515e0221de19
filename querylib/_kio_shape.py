"""The shape guard: walk a Kafka body by its kio schema, without building objects, before kio
decodes it.

kio's native decoder trusts the lengths and counts it reads: an array claiming ~10^10 entries
makes it allocate tens of GB, and a failed allocation ABORTS the process (Rust's
"memory allocation of N bytes failed"), which Python cannot catch. So every kio decode of bytes
from the network or a log (the listener's requests, tq's Kafka client's responses, consumer-
protocol subscriptions and assignments, `__consumer_offsets` records) is preceded by
`check_shape`: it walks the body field by field as the schema of that entity says
(fixed-width primitives, legacy and compact strings and bytes, records, arrays of primitives
or entities, nested and nullable entities, tagged fields of flexible versions) and checks every
length and count against the bytes that remain (an array of n entries of at least k bytes each
needs n * k bytes; a string of n bytes needs n bytes). Each entity's walker is compiled once
from its dataclass fields and cached.

Light, like `_kio`: imports kio's schema introspection, the error base and the record
codec's unsigned varint reader only, so clients use it without loading a server. Must not:
build objects, read string or record contents (they are skipped), or judge values
(nullability, UTF-8, enum values, unknown tags are kio's to refuse: it raises for those).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import Field, fields
from typing import Any, cast

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.static.protocol import Entity

from catalog.errors import TqError
from querylib.errors import BadVarintError
from querylib.records._varint import read_uvarint

__all__ = ["ShapeMisfit", "check_shape", "min_size"]


class ShapeMisfit(Exception):
    """A length or count that does not fit the bytes left (internal: `check_shape` raises
    the caller's error class from it)."""


# (buf, pos, end) -> the position after this field; raises ShapeMisfit.
Step = Callable[[bytes, int, int], int]

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

_FIXED = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2,
          "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8,
          "float64": 8, "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16}
_SIZED = ("string", "bytes", "records")


def check_shape(cls: type[Entity], buf: bytes, offset: int, error: type[TqError]) -> None:
    """Raise `error` unless the body of entity `cls` at `buf[offset:]` fits `buf` in every
    length and count. Bytes after the body are the caller's to judge."""
    try:
        _walker(cls)(buf, offset, len(buf))
    except ShapeMisfit as exc:
        raise error(f"{cls.__name__}: {exc}") from None
    except BadVarintError as exc:
        raise error(f"{cls.__name__}: {exc}") from None
    except (IndexError, struct.error):  # a read at or past the end of `buf`
        raise error(f"{cls.__name__}: cut short") from None


def _uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """kio's unsigned varint (at most 5 bytes), within `end`."""
    value, after = read_uvarint(buf, pos)
    if after > end:
        raise ShapeMisfit("varint runs past the end")
    return value, after


def _count(buf: bytes, pos: int, end: int, flexible: bool, legacy: struct.Struct
           ) -> tuple[int, int]:
    """A length or count: compact (uvarint n + 1, 0 for null) or legacy (signed, -1 for
    null). Null reads as 0."""
    if flexible:
        value, pos = _uvarint(buf, pos, end)
        return max(value - 1, 0), pos
    if pos + legacy.size > end:
        raise ShapeMisfit("cut short")
    (value,) = legacy.unpack_from(buf, pos)
    if value < -1:
        raise ShapeMisfit(f"negative length {value}")
    return max(value, 0), pos + legacy.size


@functools.cache
def min_size(cls: type[Entity]) -> int:
    """The fewest bytes an entity of `cls` takes (tagged fields absent)."""
    total = 1 if cls.__flexible__ else 0
    for f in fields(cls):
        if get_field_tag(f) is None:
            total += _field_min_size(f, cls.__flexible__)
    return total


def _field_min_size(f: Field[Any], flexible: bool) -> int:
    kind = classify_field(f)
    if kind.is_array:
        return 1 if flexible else 4
    if isinstance(kind, EntityField):
        return 1 if is_optional(f) else min_size(kind.type_)
    kafka_type = get_schema_field_type(f)
    if kafka_type in _FIXED:
        return _FIXED[kafka_type]
    return 1 if flexible else (2 if kafka_type == "string" else 4)


@functools.cache
def _walker(cls: type[Entity]) -> Step:
    """The walk of one entity as one generated function: straight-line code per field (the
    guard runs before every decode, so it avoids a call per field); nested entities call
    their own walkers, tagged fields go through `_tagged_step`'s closures (rarely sent)."""
    flexible: bool = cls.__flexible__
    namespace: dict[str, object] = {"M": ShapeMisfit, "uv": _uvarint, "i16": _I16.unpack_from,
                                    "i32": _I32.unpack_from}
    lines = ["def walk(buf, pos, end):"]
    tagged: dict[int, Step] = {}
    fixed = 0  # fixed-width bytes not yet skipped: consecutive ones are one step

    def flush() -> None:
        nonlocal fixed
        if fixed:
            lines.extend([f"    pos += {fixed}", "    if pos > end: raise M('cut short')"])
            fixed = 0

    for i, f in enumerate(fields(cls)):
        tag = get_field_tag(f)
        if tag is not None:
            tagged[int(tag)] = _field_step(f, flexible, is_tag=True)
            continue
        kind = classify_field(f)
        kafka_type = None if isinstance(kind, (EntityField, EntityTupleField)) else (
            get_schema_field_type(f))
        if isinstance(kind, PrimitiveField) and kafka_type in _FIXED:
            fixed += _FIXED[kafka_type]
            continue
        flush()
        if isinstance(kind, PrimitiveField):
            lines.extend(_sized_lines(flexible, kafka_type, "    "))
        elif isinstance(kind, EntityField):
            namespace[f"w{i}"] = _walker(kind.type_)
            if is_optional(f):
                lines.append(f"    pos = pos + 1 if buf[pos] >= 128 else w{i}(buf, pos + 1, end)")
            else:
                lines.append(f"    pos = w{i}(buf, pos, end)")
        else:
            lines.extend(_count_lines(flexible, "n", "    "))
            if isinstance(kind, EntityTupleField):
                namespace[f"w{i}"] = _walker(kind.type_)
                size = max(min_size(kind.type_), 1)
                lines.extend([
                    f"    if n * {size} > end - pos: raise M(f'an array of {{n}} entries in "
                    "{end - pos} bytes')",
                    "    for _ in range(n):", f"        pos = w{i}(buf, pos, end)"])
            elif kafka_type in _FIXED:
                lines.extend([f"    pos += n * {_FIXED[kafka_type]}",
                              "    if pos > end: raise M(f'an array of {n} entries runs "
                              "past the end')"])
            else:
                size = 1 if flexible else (2 if kafka_type == "string" else 4)
                lines.extend([
                    f"    if n * {size} > end - pos: raise M(f'an array of {{n}} entries in "
                    "{end - pos} bytes')",
                    "    for _ in range(n):", *_sized_lines(flexible, kafka_type, "        ")])
    flush()
    if flexible:
        namespace["tags"] = _tagged_step(tagged)
        lines.append("    pos = pos + 1 if buf[pos] == 0 else tags(buf, pos, end)")
    lines.extend(["    if pos > end: raise M('cut short')", "    return pos"])
    exec(compile("\n".join(lines), f"<shape of {cls.__qualname__}>", "exec"), namespace)
    return cast(Step, namespace["walk"])  # defined by the exec above


def _count_lines(flexible: bool, name: str, indent: str) -> list[str]:
    """Read a count or length into `name` (null: 0); compact: a one-byte varint inline."""
    if flexible:
        return [f"{indent}{name} = buf[pos]",
                f"{indent}if {name} < 128: pos += 1",
                f"{indent}else: {name}, pos = uv(buf, pos, end)",
                f"{indent}if {name}: {name} -= 1"]
    return [f"{indent}({name},) = i32(buf, pos)",
            f"{indent}pos += 4",
            f"{indent}if {name} < 0:",
            f"{indent}    if {name} != -1: raise M(f'negative length {{{name}}}')",
            f"{indent}    {name} = 0"]


def _sized_lines(flexible: bool, kafka_type: str | None, indent: str) -> list[str]:
    """Skip a string, bytes or records field, its length checked against the end."""
    if flexible:
        lines = _count_lines(True, "s", indent)
    elif kafka_type == "string":
        lines = [f"{indent}(s,) = i16(buf, pos)", f"{indent}pos += 2",
                 f"{indent}if s < 0:",
                 f"{indent}    if s != -1: raise M(f'negative length {{s}}')",
                 f"{indent}    s = 0"]
    elif kafka_type in _SIZED:
        lines = _count_lines(False, "s", indent)
    else:
        raise TypeError(f"no shape for kafka_type {kafka_type!r}")
    return [*lines, f"{indent}pos += s",
            f"{indent}if pos > end: raise M(f'a length of {{s}} runs past the end')"]


def _skip(width: int) -> Step:
    def skip(buf: bytes, pos: int, end: int) -> int:
        pos += width
        if pos > end:
            raise ShapeMisfit("cut short")
        return pos
    return skip


def _sized(flexible: bool, legacy: struct.Struct) -> Step:
    def sized(buf: bytes, pos: int, end: int) -> int:
        size, pos = _count(buf, pos, end, flexible, legacy)
        pos += size
        if pos > end:
            raise ShapeMisfit(f"a length of {size} runs past the end")
        return pos
    return sized


def _field_step(f: Field[Any], flexible: bool, *, is_tag: bool) -> Step:
    kind = classify_field(f)
    if isinstance(kind, EntityTupleField):
        item, item_size = _walker(kind.type_), max(min_size(kind.type_), 1)
        return _array(item, item_size, flexible)
    if isinstance(kind, EntityField):
        walk = _walker(kind.type_)
        if is_tag or not is_optional(f):
            return walk
        return _nullable(walk)
    kafka_type = get_schema_field_type(f)
    if kafka_type in _FIXED:
        step, width = _skip(_FIXED[kafka_type]), _FIXED[kafka_type]
    elif kafka_type in _SIZED:
        step = _sized(flexible, _I16 if kafka_type == "string" else _I32)
        width = 1 if flexible else (2 if kafka_type == "string" else 4)
    else:
        raise TypeError(f"no shape for kafka_type {kafka_type!r} of {f}")
    if isinstance(kind, PrimitiveTupleField):
        return _array(step, width, flexible, fixed=kafka_type in _FIXED)
    return step


def _array(item: Step, item_size: int, flexible: bool, *, fixed: bool = False) -> Step:
    def array(buf: bytes, pos: int, end: int) -> int:
        count, pos = _count(buf, pos, end, flexible, _I32)
        if count * item_size > end - pos:
            raise ShapeMisfit(f"an array of {count} entries in {end - pos} bytes")
        if fixed:
            return pos + count * item_size
        for _ in range(count):
            pos = item(buf, pos, end)
        return pos
    return array


def _nullable(walk: Step) -> Step:
    def nullable(buf: bytes, pos: int, end: int) -> int:
        if pos >= end:
            raise ShapeMisfit("cut short")
        (marker,) = _I8.unpack_from(buf, pos)
        return pos + 1 if marker < 0 else walk(buf, pos + 1, end)
    return nullable


def _tagged_step(tagged: dict[int, Step]) -> Step:
    def tagged_fields(buf: bytes, pos: int, end: int) -> int:
        count, pos = _uvarint(buf, pos, end)
        if count > end - pos:
            raise ShapeMisfit(f"{count} tagged fields in {end - pos} bytes")
        for _ in range(count):
            tag, pos = _uvarint(buf, pos, end)
            size, pos = _uvarint(buf, pos, end)
            stop = pos + size
            if stop > end:
                raise ShapeMisfit(f"tagged field {tag} of {size} bytes runs past the end")
            walk = tagged.get(tag)
            if walk is not None:
                walk(buf, pos, stop)
            pos = stop
        return pos
    return tagged_fields
