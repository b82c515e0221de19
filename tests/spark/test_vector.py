"""The numpy fast path (`_vector`) against the general loop of `_columns`: on mixed data they
must give exactly the same Arrow columns, and the fast path must take the shapes it is for."""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import querylib.spark._columns as columns
import querylib.spark._vector as vector
from querylib.records import TIME_HEADER, Compression, TimestampType, encode_batch, read_header
from querylib.spark import ARROW_SCHEMA
from querylib.spark._columns import ColumnAssembler
from querylib.spark._vector import _binary, vector_batch
from tests.spark.test_columns import batch_boundary, build_log, expected_rows

pytestmark = pytest.mark.spark


def assembled(buf: bytes | memoryview, start: int, stop: int, *, general: bool,
              include_headers: bool = True, min_run: int | None = None) -> pa.Table:
    """All rows as one table, by the fast path where it applies or by the loop alone;
    `min_run` 0 makes the fast path copy every value by strided copies."""
    with pytest.MonkeyPatch.context() as patch:
        if general:
            patch.setattr(columns, "vector_batch", lambda *args: None)
        if min_run is not None:
            patch.setattr(vector, "_binary", partial(_binary, min_run=min_run))
        assembler = ColumnAssembler("t/ns/x", 2, start, stop, include_headers=include_headers)
        out = [*assembler.add(buf), *assembler.finish()]
    schema = assembler.schema
    return pa.Table.from_batches(out, schema=schema).combine_chunks()


def time_header(t: int) -> tuple:
    return ((TIME_HEADER, t.to_bytes(8, "big", signed=True)),)


# Runs of equal values (strided copies), lengths that vary (take), nulls, keys, the tq.time
# header, and deltas whose varints are longer than 2 bytes; "other" headers only in batches
# meant for the general loop.
values = st.one_of(st.none(), st.just(b"v" * 100), st.just(b""), st.binary(max_size=30))


def entries(regular: bool) -> st.SearchStrategy:
    header = st.one_of(st.just(()), st.integers(-(2**63), 2**63 - 1).map(time_header))
    if not regular:
        header = st.one_of(header, st.just((("other", b"x"),)))
    entry = st.tuples(
        st.one_of(st.integers(0, 100), st.integers(0, 2**30)),
        st.one_of(st.none(), st.none(), st.just(b"key"), st.binary(max_size=5)),
        values,
        header,
    )
    return st.one_of(st.lists(entry, min_size=1, max_size=1),  # one shape: strided copies
                     st.lists(entry, min_size=1, max_size=8))


def repeated(shapes: list) -> list:
    """Each drawn run of records written `times` times over, as producers write alike."""
    return [entry for run, times in shapes for entry in run * times]


mixed_batches = st.booleans().flatmap(lambda regular: st.tuples(
    st.lists(st.tuples(entries(regular), st.integers(1, 30)), min_size=1,
             max_size=3).map(repeated),
    st.sampled_from([Compression.NONE] * 4 + [Compression.ZSTD]),
    st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]),
    st.booleans(),  # followed by a frontier (a control batch)
))


@settings(max_examples=60, deadline=None)
@given(st.lists(mixed_batches, min_size=1, max_size=4), st.data())
def test_fast_path_equals_the_general_loop(spec: list, data: st.DataObject) -> None:
    buf = build_log(spec)
    total = sum(len(e) + f for e, _, _, f in spec)
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total + 2))
    include_headers = data.draw(st.booleans())
    min_run = data.draw(st.sampled_from([None, 0]))
    fast = assembled(buf, start, stop, general=False, include_headers=include_headers,
                     min_run=min_run)
    slow = assembled(buf, start, stop, general=True, include_headers=include_headers)
    assert fast.equals(slow)
    # A chunk cut after a whole batch, as LocalDir gives it: the bytes after it are not rows.
    cut = batch_boundary(buf, data.draw(st.integers(0, len(spec))))
    view = assembled(memoryview(buf + b"\x00" * 7)[:cut], start, stop, general=False,
                     include_headers=include_headers)
    assert view.equals(assembled(buf[:cut], start, stop, general=True,
                                 include_headers=include_headers))


def bench_shaped(first_offset: int, count: int, value: bytes, *, time_base: int = 0) -> bytes:
    return encode_batch([(1_700_000_000_000 + i, None, value, time_header(time_base + i))
                         for i in range(count)], base_offset=first_offset)


@pytest.mark.parametrize("value", [b"x" * 100, b"", b"y" * 20_000])
def test_regular_batches_are_decoded_by_the_fast_path(value: bytes) -> None:
    """tq's own shape (tq.time on every record, one value size, 1- to 3-byte varints)."""
    buf = bench_shaped(0, 1000, value) + bench_shaped(1000, 500, value)
    second = batch_boundary(buf, 1)
    batches = [(0, read_header(buf)), (second, read_header(buf, second))]
    got = vector_batch(buf, batches, "t", 1, 10, 1400, True)
    assert got is not None
    assert got.to_pylist() == expected_rows(buf, "t", 1, 10, 1400)


def test_long_timestamp_deltas_take_the_fast_path() -> None:
    entries = [(i * 10**7, b"k%d" % i, b"v" * (i % 3), ()) for i in range(50)]  # 5-byte deltas
    buf = encode_batch(entries, base_offset=7)
    got = vector_batch(buf, [(0, read_header(buf))], "t", 0, 0, 100, False)
    assert got is not None
    rows = expected_rows(buf, "t", 0, 0, 100)
    for row in rows:
        del row["headers"]
    assert got.to_pylist() == rows


def test_other_headers_are_left_to_the_general_loop() -> None:
    buf = encode_batch([(1, None, b"v", (("other", b"x"),))] * 3)
    assert vector_batch(buf, [(0, read_header(buf))], "t", 0, 0, 10, True) is None


@given(st.lists(st.tuples(st.integers(0, 40), st.one_of(st.none(), st.integers(0, 12))),
                max_size=60), st.binary(min_size=1, max_size=8))
def test_binary_copies_runs_exactly(gaps: list, fill: bytes) -> None:
    """Spans chosen to make runs of equal length and stride and to break them: every value
    is its span, nulls are null."""
    buf = (fill * 4000)[:4000]
    starts, lengths, null = [], [], []
    pos = 0
    for gap, length in gaps:
        pos += gap
        starts.append(pos)
        lengths.append(length or 0)
        null.append(length is None)
        pos += length or 0
    expected = [None if n else buf[s:s + k] for s, k, n in zip(starts, lengths, null,
                                                                strict=True)]
    for min_run in (0, 10**9):  # strided copies of runs only; Arrow's take only
        got = _binary(buf, np.array(starts, np.int64), np.array(lengths, np.int64),
                      np.array(null, bool), min_run=min_run)
        assert got.to_pylist() == expected


@given(st.binary(max_size=300), st.integers(-(2**31), 2**31 - 1))
def test_hostile_records_are_left_to_the_general_loop(junk: bytes, count: int) -> None:
    """Garbage after a valid header, with any recordsCount: a batch or None (the general loop
    then names the error), never an exception or an allocation sized by the count."""
    good = encode_batch([(1, b"k", b"v" * 40, time_header(5)), (2, None, b"w", ())])
    body = bytearray(good[:61] + junk)
    body[8:12] = (len(body) - 12).to_bytes(4, "big")
    body[57:61] = count.to_bytes(4, "big", signed=True)
    got = vector_batch(bytes(body), [(0, read_header(bytes(body)))], "t", 0, 0, 10, True)
    assert got is None or got.schema.equals(ARROW_SCHEMA)
