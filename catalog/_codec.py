"""MessagePack encoding of catalog updates and records, for the `__catalog.*` topics.

An update is `[collection, record, diff]`; a record is a map with a `type` tag naming its record
type. Decoding is type-checked by msgspec against the tagged union of record types, and then the
record type is checked against the collection, so a `topics` update can only carry a Topic.

Two shapes, for two uses:
- `encode_update` / `decode_update`: one (collection, record, diff) triple, self-describing.
  Encoding a mismatched triple is a bug of the caller: CorruptCatalogError.
- `encode_record` / `decode_record`: a record alone, for a collection topic whose diff travels in
  the `tq.diff` header and whose collection is the topic itself.

Must not: do I/O; accept anything that is not exactly a catalog update.
"""

from __future__ import annotations

import msgspec

from catalog._records import COLLECTIONS, Record, Update
from catalog.errors import CatalogDecodeError, CorruptCatalogError, TqError

__all__ = [
    "decode_record",
    "decode_update",
    "decode_updates",
    "encode_record",
    "encode_update",
    "encode_updates",
]

_encoder = msgspec.msgpack.Encoder()
_update_decoder = msgspec.msgpack.Decoder(Update)
_updates_decoder = msgspec.msgpack.Decoder(list[Update])
_record_decoders: dict[str, msgspec.msgpack.Decoder[Record]] = {
    name: msgspec.msgpack.Decoder(cls) for name, cls in COLLECTIONS.items()}


def _checked(update: Update, error: type[TqError] = CatalogDecodeError) -> Update:
    if type(update.record) is not COLLECTIONS.get(update.collection):
        raise error(
            f"a {type(update.record).__name__} record cannot belong to {update.collection!r}"
        )
    return update


def encode_update(update: Update) -> bytes:
    return _encoder.encode(_checked(Update(*update), CorruptCatalogError))


def decode_update(data: bytes | memoryview) -> Update:
    """Decode one update; CatalogDecodeError if it is not a well-typed catalog update."""
    try:
        update = _update_decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise CatalogDecodeError(f"not a catalog update: {exc}") from exc
    return _checked(update)


def encode_updates(updates: list[Update]) -> bytes:
    """A list of updates (one Change, a snapshot) as one msgpack array."""
    return _encoder.encode([_checked(Update(*u), CorruptCatalogError) for u in updates])


def decode_updates(data: bytes | memoryview) -> list[Update]:
    try:
        updates = _updates_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CatalogDecodeError(f"not a list of catalog updates: {exc}") from exc
    return [_checked(u) for u in updates]


def encode_record(record: Record) -> bytes:
    return _encoder.encode(record)


def decode_record(collection: str, data: bytes | memoryview) -> Record:
    """Decode a record that must belong to `collection` (a collection topic's record value)."""
    decoder = _record_decoders.get(collection)
    if decoder is None:
        raise CatalogDecodeError(f"unknown catalog collection {collection!r}")
    try:
        record: Record = decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CatalogDecodeError(f"not a {collection} record: {exc}") from exc
    return record
