"""Zigzag varints: golden bytes at every width boundary, the lookup tables against the reference
functions, and hostile varints (too long, overflowing, cut short)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querylib.errors import BadVarintError
from querylib.records._varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    TABLE_SIZE,
    UNZIGZAG,
    UNZIGZAG2,
    VARINT_OF,
    encode_varint,
    encode_varlong,
    read_varint,
    read_varlong,
    unzigzag,
    wrap_int64,
    zigzag,
)

# (value, exact varint bytes): zigzag maps 0,-1,1,-2,... to 0,1,2,3,...; 7 bits per byte, LSB first
VARINT_CASES = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),  # first 2-byte value
    (-65, "8101"),
    (8191, "fe7f"),
    (-8192, "ff7f"),
    (8192, "808001"),  # first 3-byte value
    (INT32_MAX, "feffffff0f"),
    (INT32_MIN, "ffffffff0f"),
]
VARLONG_CASES = VARINT_CASES + [
    (INT32_MAX + 1, "8080808010"),
    (INT64_MAX, "feffffffffffffffff01"),
    (INT64_MIN, "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "hexbytes"), VARINT_CASES)
def test_varint_golden(value: int, hexbytes: str) -> None:
    raw = bytes.fromhex(hexbytes)
    assert encode_varint(value) == raw
    assert read_varint(raw, 0) == (value, len(raw))


@pytest.mark.parametrize(("value", "hexbytes"), VARLONG_CASES)
def test_varlong_golden(value: int, hexbytes: str) -> None:
    raw = bytes.fromhex(hexbytes)
    assert encode_varlong(value) == raw
    assert read_varlong(b"\xaa" + raw + b"\xbb", 1) == (value, len(raw) + 1)


@given(st.integers(INT32_MIN, INT32_MAX))
def test_varint_round_trip(value: int) -> None:
    raw = encode_varint(value)
    assert 1 <= len(raw) <= 5
    assert read_varint(raw + b"\x00", 0) == (value, len(raw))


@given(st.integers(INT64_MIN, INT64_MAX))
def test_varlong_round_trip(value: int) -> None:
    raw = encode_varlong(value)
    assert read_varlong(raw, 0) == (value, len(raw))
    assert unzigzag(zigzag(value)) == value


def test_tables_agree_with_the_functions() -> None:
    for n in range(TABLE_SIZE):
        assert VARINT_OF[n] == encode_varint(n)
    for z, value in enumerate(UNZIGZAG):
        raw = bytes([z]) if z < 0x80 else bytes([(z & 0x7F) | 0x80, z >> 7])
        assert read_varint(raw, 0)[0] == value
        if z >= 0x80:
            assert UNZIGZAG2[raw[1]][raw[0]] == value


@pytest.mark.parametrize("n", [INT32_MAX + 1, INT32_MIN - 1])
def test_encode_varint_rejects_out_of_range(n: int) -> None:
    with pytest.raises(ValueError):
        encode_varint(n)


@pytest.mark.parametrize("n", [INT64_MAX + 1, INT64_MIN - 1])
def test_encode_varlong_rejects_out_of_range(n: int) -> None:
    with pytest.raises(ValueError):
        encode_varlong(n)


@pytest.mark.parametrize(("reader", "raw"), [
    (read_varint, b"\x80\x80\x80\x80\x80\x00"),  # 6 bytes
    (read_varint, b"\xff\xff\xff\xff\x1f"),  # 5 bytes but more than 32 bits
    (read_varint, b"\x80\x80"),  # cut short
    (read_varint, b""),
    (read_varlong, b"\x80" * 10 + b"\x00"),  # 11 bytes
    (read_varlong, b"\xff" * 9 + b"\x7f"),  # 10 bytes but more than 64 bits
    (read_varlong, b"\xff\xff"),
])
def test_bad_varints(reader, raw: bytes) -> None:
    with pytest.raises(BadVarintError):
        reader(raw, 0)


def test_a_reader_never_looks_further_than_its_width() -> None:
    # a megabyte of continuation bytes costs five reads, not a scan
    with pytest.raises(BadVarintError, match="longer than 5"):
        read_varint(b"\x80" * (1 << 20), 0)


@pytest.mark.parametrize(("n", "wrapped"), [
    (INT64_MAX + 1, INT64_MIN), (INT64_MIN - 1, INT64_MAX), (5, 5), (-5, -5)])
def test_wrap_int64_is_java_long_arithmetic(n: int, wrapped: int) -> None:
    assert wrap_int64(n) == wrapped


def test_unsigned_varints_read_back_and_are_bounded_to_uint32() -> None:
    from querylib.records import read_uvarint
    from querylib.records._varint import encode_uvarint

    for value in (0, 1, 127, 128, 300, 2**31, 2**32 - 1):
        data = b"\x07" + encode_uvarint(value) + b"\x09"
        assert read_uvarint(data, 1) == (value, len(data) - 1)
    with pytest.raises(BadVarintError, match="overflows"):
        read_uvarint(encode_uvarint(2**32), 0)
    with pytest.raises(BadVarintError, match="longer than 5"):
        read_uvarint(b"\xff" * 6, 0)
    with pytest.raises(BadVarintError, match="cut short"):
        read_uvarint(b"\x80\x80", 0)
