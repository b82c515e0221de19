"""Serdes: how a topic's record values become bytes and back.

`bytes` (raw), `json` and `msgpack` are always available; `pickle` only when a user names it,
because unpickling runs code chosen by whoever wrote the topic. The serde's name is the first
part of a topic's record type tag (`msgpack` or `msgpack/Point`), so a subscriber with another
serde is refused before it decodes anything, and one that names none decodes with the topic's
(`resolve` of the tag's name; the subscription refuses pickle there).

Must not: guess a serde from the bytes, or fall back to pickle.
"""

from __future__ import annotations

import json as _json
import pickle as _pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from catalog.errors import ProtocolError, UserError

__all__ = ["BYTES", "JSON", "MSGPACK", "PICKLE", "Serde", "ValueDecodeError", "decode_value",
           "resolve", "type_tag"]


class ValueDecodeError(ProtocolError):
    """A record value is not valid for the topic's serde (written by someone else's code)."""


@dataclass(frozen=True)
class Serde:
    """A named pair of functions: `encode(value) -> bytes`, `decode(bytes) -> value`."""

    name: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def _raw(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise UserError(f"the bytes serde sends bytes, not {type(value).__name__}; "
                        "choose serde='json' or 'msgpack' for other values")
    return bytes(value)


_msgpack_encoder = msgspec.msgpack.Encoder()
_msgpack_decoder = msgspec.msgpack.Decoder()

BYTES = Serde("bytes", _raw, bytes)
JSON = Serde("json", lambda v: _json.dumps(v, separators=(",", ":")).encode(),
             lambda b: _json.loads(b))
MSGPACK = Serde("msgpack", _msgpack_encoder.encode, _msgpack_decoder.decode)
PICKLE = Serde("pickle", lambda v: _pickle.dumps(v, protocol=5), _pickle.loads)

_BY_NAME = {s.name: s for s in (BYTES, JSON, MSGPACK, PICKLE)}


def resolve(serde: str | Serde) -> Serde:
    """A serde by name, or a user's own Serde. Unknown names are a UserError."""
    if isinstance(serde, Serde):
        return serde
    try:
        return _BY_NAME[serde]
    except (KeyError, TypeError):
        raise UserError(f"unknown serde {serde!r}; use one of {sorted(_BY_NAME)} "
                        "or a querylib.serdes.Serde") from None


def type_tag(serde: Serde, record_type: str | None) -> str:
    """The record type tag stored with a topic: the serde name, then the user's type name."""
    return serde.name if not record_type else f"{serde.name}/{record_type}"


def decode_values(serde: Serde, values: Iterable[bytes | None], *, nulls: bool = True
                  ) -> list[Any]:
    """`decode_value` over many values (a null value decodes as empty bytes), with one error
    handler for the lot: the per-record call was a large part of a subscriber's cost.
    `nulls=False` says no value is None (the run decoder knows), so bytes pass untouched."""
    if serde is BYTES:  # values are bytes already: only nulls need replacing
        values = values if isinstance(values, list) else list(values)
        return values if not nulls or None not in values else [v or b"" for v in values]
    decode = serde.decode
    try:
        return [decode(v or b"") for v in values]
    except Exception as exc:  # codecs raise many types; the caller gets one
        raise ValueDecodeError(f"a record value is not valid {serde.name}: {exc}") from exc


def decode_value(serde: Serde, data: bytes, what: str = "value") -> Any:
    """`serde.decode(data)`, with whatever the codec raises turned into ValueDecodeError
    (saying it was a record's `what`: its value or its key)."""
    try:
        return serde.decode(data)
    except Exception as exc:  # codecs raise many types; the caller gets one
        raise ValueDecodeError(f"a record {what} is not valid {serde.name}: {exc}") from exc
