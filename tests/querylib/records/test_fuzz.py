"""Fuzzing the decoders: random bytes and mutated valid batches (with and without a CRC that
matches the mutation) must decode or raise a RecordError subclass, nothing else."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from querylib.errors import RecordError
from querylib.records import (
    Compression,
    decode_batch,
    decode_legacy,
    encode_batch,
    frontier_batch,
    iter_batches,
)
from querylib.records._compression import compress

from ._build import legacy_message, recrc

_ITEMS = [(1_700_000_000_000 + 3 * i, None if i % 2 else b"key", b"value-%d" % i * (i % 7),
           [("tq.time", b"\x00" * 8)] if i % 3 == 0 else ()) for i in range(40)]
SEEDS = [encode_batch(_ITEMS, compression=c, base_offset=7) for c in Compression] + [
    frontier_batch(5, timestamp=1),
    encode_batch([(0, None, b"x" * 200, [("a", None), ("b", b"y" * 70)])]),
    legacy_message(3, b"legacy", key=b"k"),
    legacy_message(9, compress(Compression.GZIP, legacy_message(0, b"a") + legacy_message(1, b"b")),
                   attributes=1),
    legacy_message(9, compress(Compression.SNAPPY, legacy_message(0, b"a", magic=0)),
                   magic=0, attributes=2),
]
LIMIT = 1 << 22  # keep any accidental bomb small


def decode_everything(data: bytes) -> None:
    """Every decoder entry point, CRC checked and not: only RecordError may come out."""
    for verify in (True, False):
        for decoder in (decode_batch, iter_batches, decode_legacy):
            try:
                result = decoder(data, verify_crc=verify, max_decompressed=LIMIT)
                if decoder is iter_batches:
                    list(result)
            except RecordError:
                pass


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes(data: bytes) -> None:
    decode_everything(data)


@settings(max_examples=200)
@given(st.binary(min_size=17, max_size=200), st.sampled_from([0, 1, 2]))
def test_random_bytes_behind_a_plausible_prefix(data: bytes, magic: int) -> None:
    # force the magic byte so the bytes reach the v2 or legacy parser, then fix the CRC
    raw = data[:16] + bytes([magic]) + data[17:]
    decode_everything(raw)
    if magic == 2 and len(raw) > 21:
        decode_everything(recrc(raw))


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("set"), st.integers(0, 1 << 16), st.sampled_from([0, 1, 0x7F, 0x80, 0xFF])),
    st.tuples(st.just("cut"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.integers(1, 8)),
)


def mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, at, arg in mutations:
        if not buf:
            break
        at %= len(buf)
        if kind == "flip":
            buf[at] ^= arg
        elif kind == "set":
            buf[at] = arg
        elif kind == "cut":
            del buf[at:]
        elif kind == "insert":
            buf[at:at] = bytes([arg])
        else:
            del buf[at:at + arg]
    return bytes(buf)


@settings(max_examples=200)
@given(st.sampled_from(range(len(SEEDS))), st.lists(mutation, min_size=1, max_size=4))
def test_mutated_batches(seed: int, mutations) -> None:
    raw = mutate(SEEDS[seed], mutations)
    decode_everything(raw)
    if len(raw) > 21 and raw[16] == 2:
        decode_everything(recrc(raw))  # the parser, not the CRC, must catch it


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_single_byte_mutations_everywhere(seed: int) -> None:
    # every position of every seed, with a CRC made to match: a bounded, deterministic sweep
    rng = random.Random(seed)
    original = SEEDS[seed]
    for at in range(min(len(original), 400)):
        raw = bytearray(original)
        raw[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, raw[at] ^ 0x40])
        raw = bytes(raw)
        decode_everything(recrc(raw) if raw[16:17] == b"\x02" else raw)


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_every_truncation(seed: int) -> None:
    original = SEEDS[seed]
    for end in range(0, len(original), max(1, len(original) // 300)):
        with pytest.raises(RecordError):
            list(iter_batches(original[:end] if end else b"\x00"))
