"""Records as a person reads and writes them on a command line (`tq consume`, `tq produce`;
DESIGN §9 "Reading and writing topics").

A topic's serde is the first part of its record type tag (`msgpack` or `msgpack/Point`, DESIGN
§4 "Type tags"). Values and keys of `json` and `msgpack` topics read as compact JSON text;
`bytes` read as UTF-8 text with every control character and invalid byte escaped (`\\n`,
`\\x00`); `pickle` values are never unpickled (`<pickle: N bytes>`). Whatever the serde, a
rendered field holds no control character, so one record is one line and nothing raw reaches
a terminal. `--format` strings are kcat's `-f` (`%s %k %p %o %T ...`, plus `%L` for the logical
time). Lines of `tq produce` go the other way: checked against the serde, msgpack encoded.

Must not: do I/O, or unpickle anything.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from catalog.errors import UserError

__all__ = ["FORMAT_HELP", "LineEncoder", "RecordFormat", "ValueText", "escape", "parse_start",
           "serde_of"]

SERDES = ("bytes", "json", "msgpack", "pickle")


def serde_of(record_type: str) -> str:
    """The serde a record type tag names (`json/Point` -> `json`); unknown serdes read as
    bytes."""
    name = record_type.split("/", 1)[0]
    return name if name in SERDES else "bytes"


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def escape(data: bytes) -> str:
    """Bytes as one printable line: UTF-8 text, invalid bytes and control characters as
    escapes."""
    text = data.decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _ESCAPES.get(c) or _char_escape(c) for c in text)


def _char_escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json_text(value: Any) -> str:
    """Compact JSON, any non-printable character (only possible inside strings) escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


class ValueText:
    """Keys and values of one serde as text and as JSON values. Bytes that are not valid for
    the serde read as escaped bytes; `invalid` counts them, so the caller can say so once."""

    def __init__(self, serde: str) -> None:
        if serde not in SERDES:
            raise UserError(f"unknown serde {serde!r}; use one of {', '.join(SERDES)}")
        self.serde = serde
        self.invalid = 0

    def _decode(self, data: bytes) -> tuple[bool, Any]:
        try:
            if self.serde == "json":
                return True, json.loads(data)
            value = msgspec.msgpack.decode(data)
            return True, msgspec.to_builtins(value)  # bytes -> base64, ext -> error
        except (ValueError, TypeError, msgspec.DecodeError):
            self.invalid += 1
            return False, None

    def text(self, data: bytes | None) -> str:
        """One printable line (no newline); a null (absent) key or value is empty, as in
        kcat."""
        if data is None:
            return ""
        if self.serde == "pickle":
            return f"<pickle: {len(data)} bytes>"
        if self.serde == "bytes":
            return escape(data)
        ok, value = self._decode(data)
        return _json_text(value) if ok else escape(data)

    def json(self, data: bytes | None) -> Any:
        """A JSON value: the decoded value (json, msgpack), the text (bytes that are UTF-8),
        else {"base64": ...}."""
        if data is None:
            return None
        if self.serde in ("json", "msgpack"):
            ok, value = self._decode(data)
            if ok:
                return value
        elif self.serde == "bytes":
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return {"base64": base64.b64encode(data).decode()}


# -- --format -----------------------------------------------------------------------------

FORMAT_HELP = ("kcat-style output format: %%s value, %%k key, %%S value size, %%K key size, "
               "%%t topic, %%p partition, %%o offset, %%T timestamp (ms), %%L logical time, "
               "%%h headers (k=v,...), %%%% a percent sign; \\n \\t escapes. Default: "
               "'%%k\\t%%s\\n' for keyed records, else '%%s\\n'")

_FIELDS = frozenset("skSKtpoTLh")
_TOKEN = re.compile(r"%(.)|\\(.)|([^%\\]+)|(%$|\\$)", re.S)
_BACKSLASH = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "0": "\0"}


class RecordFormat:
    """A parsed --format string; `render(**fields)` fills it in. Fields are text already;
    a field a source does not have (an offset read through a consumer group) shows as `-`."""

    def __init__(self, spec: str) -> None:
        self.parts: list[tuple[bool, str]] = []  # (is a field, field letter or literal)
        for m in _TOKEN.finditer(spec):
            field, esc, literal, dangling = m.groups()
            if dangling:
                raise UserError(f"--format {spec!r}: ends with a lone {dangling!r}")
            if field is not None:
                if field == "%":
                    self.parts.append((False, "%"))
                elif field in _FIELDS:
                    self.parts.append((True, field))
                else:
                    raise UserError(f"--format {spec!r}: unknown field %{field} (fields: "
                                    f"%s %k %S %K %t %p %o %T %L %h)")
            elif esc is not None:
                self.parts.append((False, _BACKSLASH.get(esc, "\\" + esc)))
            else:
                self.parts.append((False, literal))
        self.uses = {p for is_field, p in self.parts if is_field}

    def render(self, fields: dict[str, str]) -> str:
        return "".join(fields.get(p, "-") if is_field else p for is_field, p in self.parts)


# -- --from -------------------------------------------------------------------------------


def parse_start(text: str) -> tuple[str, Any]:
    """--from as (kind, value): ("earliest"|"latest", None), ("offset", N), ("last", N),
    ("time", T: records of logical time >= T) or ("timestamp", ms: records stamped at or
    after it)."""
    if text in ("earliest", "latest"):
        return text, None
    if text.startswith("@"):
        when = text[1:]
        try:
            return "time", int(when)
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(when)
        except ValueError:
            raise UserError(f"--from {text!r}: after @ give a logical time (@42) or a date "
                            "and time (@2026-11-25T21:00:00, local time unless it has a "
                            "zone)") from None
        return "timestamp", int(moment.timestamp() * 1000)
    try:
        number = int(text)
    except ValueError:
        raise UserError(f"--from {text!r}: use earliest, latest, an offset, -N (the last N "
                        "records of each partition) or @TIME") from None
    if text.startswith("-"):
        if number == 0:
            raise UserError("--from -0: ask for the last N records with N >= 1")
        return "last", -number
    return "offset", number


# -- tq produce -----------------------------------------------------------------------------


class LineEncoder:
    """Lines of `tq produce` as the bytes a topic's serde holds. A json topic takes lines of
    JSON (sent as written); a msgpack topic takes lines of JSON and encodes them; bytes take
    anything. Keys are values too: a key that is not JSON reads as a JSON string."""

    def __init__(self, serde: str, topic: str, source: str) -> None:
        if serde == "pickle":
            raise UserError(f"topic {topic!r} holds pickle values; tq produce does not write "
                            "pickle (publish from Python, or use a json or msgpack topic)")
        self.serde, self.topic, self.source = serde, topic, source
        self._encode: Callable[[Any], bytes] = (
            msgspec.msgpack.encode if serde == "msgpack"
            else lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode())

    def value(self, line: bytes, number: int) -> bytes:
        if self.serde == "bytes":
            return line
        try:
            value = json.loads(line)
        except ValueError as exc:
            shown = escape(line[:60]) + ("..." if len(line) > 60 else "")
            raise UserError(f"{self.source}, line {number}: not JSON ({exc}): {shown!r}; "
                            f"topic {self.topic!r} holds {self.serde} values, so each line "
                            f"must be one JSON value (lines before it were sent)") from None
        return line if self.serde == "json" else self._encode(value)

    def key(self, key: bytes) -> bytes:
        if self.serde == "bytes":
            return key
        try:
            value = json.loads(key)
        except ValueError:
            value = key.decode("utf-8", "replace")
        return self._encode(value)
