"""Runs of values: `encode_value_runs` against `encode_batch`, `value_runs` against
`decode_batch`, byte for byte and value for value."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from querylib.errors import CorruptRecordError
from querylib.records import (
    TIME_HEADER,
    Compression,
    Irregular,
    RunBatch,
    decode_batch,
    decode_int64,
    encode_batch,
    encode_int64,
    encode_value_runs,
    end_of_stream_batch,
    value_runs,
)

from .strategies import headers, near

T0 = 1_700_000_000_000


def _time(t: int | None) -> tuple[tuple[str, bytes], ...]:
    return () if t is None else ((TIME_HEADER, encode_int64(t)),)


def _reference(batch: bytes, skip_below: int = 0) -> list[tuple[int | None, list, int]]:
    """What value_runs must return, from the general decoder."""
    runs: list[tuple[int | None, list, int]] = []
    for r in decode_batch(batch).records:
        if r.offset < skip_below:
            continue
        t = decode_int64(r.headers[0][1]) if r.headers else None
        if runs and runs[-1][0] == t:
            runs[-1][1].append(r.value)
            runs[-1] = (t, runs[-1][1], r.offset + 1, runs[-1][3] or r.value is None)
        else:
            runs.append((t, [r.value], r.offset + 1, r.value is None))
    return runs


same_length = st.integers(0, 300).flatmap(
    lambda n: st.lists(st.binary(min_size=n, max_size=n), min_size=1, max_size=90))
any_values = st.lists(st.none() | st.binary(max_size=200), min_size=1, max_size=40)
runs = st.lists(st.tuples(near, headers | st.integers(-5, 3).map(_time), same_length | any_values),
                min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(runs)
def test_encode_value_runs_is_encode_batch_of_the_records(given_runs: list) -> None:
    entries = [(ts, None, v, h) for ts, h, values in given_runs for v in values]
    assert encode_value_runs(given_runs) == encode_batch(entries)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), same_length), min_size=1, max_size=5),
       st.integers(0, 400), st.booleans())
def test_value_runs_of_what_tq_writes(given: list, skip_below: int, timed: bool) -> None:
    """tq's own shape (no key, none or one tq.time header) always takes the fast path."""
    batch = encode_value_runs([(T0 + i, _time(t if timed else None), values)
                               for i, (t, values) in enumerate(given)])
    assert value_runs(batch, 0, skip_below) == _reference(batch, skip_below)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(near, st.none() | st.binary(max_size=4), st.none() | st.binary(
    max_size=70), headers | st.integers(0, 2).map(_time)), min_size=1, max_size=80))
def test_value_runs_is_the_general_decode_or_irregular(entries: list) -> None:
    batch = encode_batch(entries)
    try:
        got = value_runs(batch, 0)
    except Irregular:
        return
    assert got == _reference(batch)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 255, 256, -1, 2**40, -(2**63), 2**63 - 1]),
                min_size=1, max_size=150), st.integers(0, 130))
@example(times=[0, 1, 2] * 40, skip_below=0)  # a new time at every record
def test_value_runs_times_changing_often_and_in_any_byte(times: list, skip_below: int) -> None:
    """One run of equal-sized records whose tq.time changes anywhere, in any byte, and more
    often than the column walk handles before it switches to comparing neighbours."""
    batch = encode_batch([(T0, None, bytes([i % 256]) * 7, _time(t))
                          for i, t in enumerate(times)])
    assert value_runs(batch, 0, skip_below) == _reference(batch, skip_below)


def test_a_batch_inside_a_buffer_and_mixed_times_within_a_run() -> None:
    values = [bytes([i]) * 10 for i in range(200)]
    entries = [(T0, None, v, _time(i // 50)) for i, v in enumerate(values)]
    batch = encode_batch(entries, base_offset=1000)
    buf = b"x" * 17 + batch
    got = value_runs(buf, 17, 1010)
    assert got == [(0, values[10:50], 1050, False), (1, values[50:100], 1100, False),
                   (2, values[100:150], 1150, False), (3, values[150:], 1200, False)]


def test_not_regular_batches_are_irregular_and_corruption_is_an_error() -> None:
    entries = [(T0, None, b"v" * 10, _time(1))] * 20
    with pytest.raises(Irregular):  # compressed
        value_runs(encode_batch(entries, compression=Compression.GZIP), 0)
    with pytest.raises(Irregular):  # control
        value_runs(end_of_stream_batch(timestamp=T0), 0)
    with pytest.raises(Irregular):  # a header other than tq.time
        value_runs(encode_batch([(T0, None, b"v" * 10, (("h", b"1"),))] * 20), 0)
    keyed = encode_batch([(T0, b"k", b"v" * 10, _time(1))] * 20)  # keys are skipped over
    assert value_runs(keyed, 0) == _reference(keyed)
    batch = bytearray(encode_value_runs([(T0, _time(1), [b"v" * 10] * 20)]))
    batch[-3] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        value_runs(bytes(batch), 0)


def test_encode_value_runs_refuses_nothing_and_wrong_types() -> None:
    with pytest.raises(ValueError):
        encode_value_runs([(T0, (), [])])
    with pytest.raises(TypeError):
        encode_value_runs([(T0, (), ["text"])])


def test_values_whose_length_is_not_their_size_take_the_general_path() -> None:
    """A memoryview of 4-byte items has len() 25 for 100 bytes: the joined size gives it
    away, and the record encoder copies its bytes, as encode_batch does."""
    from array import array

    wide = memoryview(array("i", range(25)))
    values = [wide, bytes(25), wide]
    entries = [(T0, None, v, _time(1)) for v in values]
    assert encode_value_runs([(T0, _time(1), values)]) == encode_batch(entries)


def test_a_run_batch_copies_as_it_encodes_and_changes_nothing_on_errors() -> None:
    batch = RunBatch()
    mutable = [bytearray(b"ab"), bytearray(b"cd")]
    first = batch.encode(T0, _time(0), mutable)
    with pytest.raises(TypeError):
        batch.encode(T0, _time(0), [b"ok", "text"])
    with pytest.raises(TypeError):
        batch.encode(T0, _time(0), [b"ok", None], allow_none=False)
    batch.add(first)
    mutable[0][:] = b"zz"
    stale = batch.encode(T0 + 1, _time(1), [b"ef"])
    batch.add(batch.encode(T0 + 2, _time(1), [None, b"gh"]))
    with pytest.raises(ValueError, match="offset delta 2"):
        batch.add(stale)  # encoded for where the batch ended before the last add
    assert batch.count == 4
    assert batch.build() == encode_batch([(T0, None, b"ab", _time(0)), (T0, None, b"cd", _time(0)),
                                          (T0 + 2, None, None, _time(1)),
                                          (T0 + 2, None, b"gh", _time(1))])
    with pytest.raises(ValueError, match="at least one record"):
        RunBatch().build()
