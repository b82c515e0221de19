"""Kafka's zigzag varints (int32, at most 5 bytes) and varlongs (int64, at most 10 bytes).

The codec's hot loops do not call these functions for small values: they index the tables
below instead (a list index is far cheaper than a call in CPython). The functions are the
general path for everything the tables do not cover, and the reference the tables are built from.

Nothing here allocates more than the varint it returns, and a reader never looks past
`MAX_VARINT_BYTES` / `MAX_VARLONG_BYTES` bytes.
"""

from __future__ import annotations

from querylib.errors import BadVarintError

MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# Encoder tables. VARINT_OF[n] is the varint of n for 0 <= n < TABLE_SIZE (record lengths, offset
# deltas, key and value lengths). TABLE_SIZE covers every 1- and 2-byte varint of a non-negative n.
TABLE_SIZE = 1 << 13
# Decoder tables. UNZIGZAG[z] is the signed value of the zigzag number z for every z a 1- or 2-byte
# varint can hold; UNZIGZAG2[c][b] is the value of the 2-byte varint b c (b >= 0x80 > c).
UNZIGZAG_SIZE = 1 << 14


def zigzag(n: int) -> int:
    """Signed int64 to unsigned, small magnitudes to small numbers: 0, -1, 1, -2 -> 0, 1, 2, 3."""
    return (n << 1) ^ (n >> 63)


def unzigzag(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


def encode_uvarint(z: int) -> bytes:
    """An unsigned varint: Kafka's record varints after zigzag, and the compact lengths and
    tag counts of its flexible protocol versions."""
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_varint(n: int) -> bytes:
    """The varint (zigzag int32) of n. Raises ValueError outside int32."""
    if not INT32_MIN <= n <= INT32_MAX:
        raise ValueError(f"varint out of int32 range: {n}")
    return encode_uvarint((n << 1) ^ (n >> 31))


def encode_varlong(n: int) -> bytes:
    """The varlong (zigzag int64) of n. Raises ValueError outside int64."""
    if not INT64_MIN <= n <= INT64_MAX:
        raise ValueError(f"varlong out of int64 range: {n}")
    return encode_uvarint((n << 1) ^ (n >> 63))


def _read(buf: bytes | bytearray | memoryview, pos: int, max_bytes: int, max_z: int,
          what: str) -> tuple[int, int]:
    """The unsigned varint at pos, at most `max_bytes` long and `max_z` large: (z, next)."""
    z = 0
    shift = 0
    end = min(len(buf), pos + max_bytes)
    p = pos
    while p < end:
        b = buf[p]
        p += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            if z > max_z:
                raise BadVarintError(f"{what} at {pos} overflows its type")
            return z, p
        shift += 7
    if end - pos == max_bytes:
        raise BadVarintError(f"{what} at {pos} is longer than {max_bytes} bytes")
    raise BadVarintError(f"{what} at {pos} is cut short by the end of the buffer")


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode the unsigned varint (a uint32) at pos: the compact lengths, counts and tags of
    Kafka's flexible versions. (value, position after it); BadVarintError as read_varint."""
    return _read(buf, pos, MAX_VARINT_BYTES, 0xFFFFFFFF, "unsigned varint")


def read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode the varint at pos: (value, position after it). Raises BadVarintError if it is
    longer than 5 bytes, does not fit int32, or runs past the end of buf."""
    z, p = _read(buf, pos, MAX_VARINT_BYTES, 0xFFFFFFFF, "varint")
    return (z >> 1) ^ -(z & 1), p


def read_varlong(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode the varlong at pos: (value, position after it); BadVarintError as read_varint."""
    z, p = _read(buf, pos, MAX_VARLONG_BYTES, 0xFFFFFFFFFFFFFFFF, "varlong")
    return (z >> 1) ^ -(z & 1), p


def wrap_int64(n: int) -> int:
    """n modulo 2**64 as a signed int64: what Java's long arithmetic gives for timestamp deltas."""
    return ((n + (1 << 63)) & 0xFFFFFFFFFFFFFFFF) - (1 << 63)


VARINT_OF: list[bytes] = [encode_uvarint(n << 1) for n in range(TABLE_SIZE)]
UNZIGZAG: list[int] = [unzigzag(z) for z in range(UNZIGZAG_SIZE)]
UNZIGZAG2: list[list[int]] = [
    [0] * 0x80 + UNZIGZAG[c << 7:(c + 1) << 7] for c in range(0x80)]
