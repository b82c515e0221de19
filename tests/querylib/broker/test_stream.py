"""What a subscriber sees: delivered bytes -> Data runs by logical time, frontier marks,
and the merged frontier over partitions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.broker import Data, EndOfStream, Progress, Values
from querylib.broker._stream import (
    FrontierMerge,
    PartitionMark,
    encode_records,
    encode_runs,
    events_of,
    value_events_of,
)
from querylib.errors import CorruptRecordError, InvalidRecordError
from querylib.records import (
    TIME_HEADER,
    TIME_HEADER_PREFIX,
    Compression,
    TimestampType,
    decode_batch,
    decode_int64,
    encode_batch,
    encode_int64,
    end_of_stream_batch,
    frontier_batch,
    read_header,
    reopen_batch,
)
from querylib.records._header import stamp_base_offset
from querylib.records._varint import encode_varint
from tests.querylib.records._build import raw_batch
from tests.querylib.records.test_hostile import CASES as HOSTILE


def stored(*batches: bytes) -> bytes:
    """Batches as a log serves them: consecutive base offsets stamped."""
    from querylib.records import read_header

    out, offset = [], 0
    for batch in batches:
        out.append(stamp_base_offset(batch, offset))
        offset += read_header(batch).last_offset_delta + 1
    return b"".join(out)


def entries(times: list[int | None]) -> list:
    return [(None, f"v{i}".encode(), (("h", b"x"),), 1000 + i, t) for i, t in enumerate(times)]


def test_records_are_grouped_in_runs_of_equal_time():
    data = stored(encode_records(entries([1, 1, 2, 2, 2, None, 3])))
    runs = list(events_of(data, 4))
    assert [(r.time, [x.offset for x in r.records], r.partition) for r in runs] == [
        (1, [0, 1], 4), (2, [2, 3, 4], 4), (None, [5], 4), (3, [6], 4)]
    first = runs[0].records[0]
    assert first.value == b"v0" and first.timestamp == 1000
    assert first.headers[0][0] == "tq.time" and ("h", b"x") in first.headers


def test_control_batches_become_marks_with_their_end():
    data = stored(encode_records(entries([0, 0])), frontier_batch(1, timestamp=0),
                  end_of_stream_batch(timestamp=0))
    items = list(events_of(data, 0))
    assert items[1:] == [PartitionMark(0, 1, 3), PartitionMark(0, None, 4)]


def test_records_below_the_start_offset_are_skipped():
    data = stored(encode_records(entries([0, 0, 0])), encode_records(entries([1, 1])))
    runs = list(events_of(data, 0, skip_below=2))
    assert [[r.offset for r in run.records] for run in runs] == [[2], [3, 4]]
    assert list(events_of(data, 0, skip_below=5)) == []


def test_merged_frontier_is_the_minimum_and_ends_when_all_end():
    merge = FrontierMerge({0: 0, 1: 0})
    assert merge.mark(PartitionMark(0, 5)) == []
    assert merge.mark(PartitionMark(1, 3)) == [Progress(3)]
    assert merge.mark(PartitionMark(1, 8)) == [Progress(5)]
    assert merge.mark(PartitionMark(0, None)) == [Progress(8)]
    assert merge.mark(PartitionMark(1, None)) == [EndOfStream()]
    merge.data(1)  # a producer came back to partition 1
    assert merge.mark(PartitionMark(1, 9)) == [Progress(9)]


def test_a_reopening_after_an_end_is_a_mark_of_its_own():
    data = stored(end_of_stream_batch(timestamp=0), reopen_batch(timestamp=0),
                  encode_records(entries([2])))
    items = list(events_of(data, 3))
    assert items[:2] == [PartitionMark(3, None, 1), PartitionMark(3, None, 2, reopen=True)]


def test_an_end_superseded_in_the_history_is_read_past_and_the_current_one_ends():
    # Subscribed when the log ended at offset 5: the end at 1 was followed by a reopening.
    merge = FrontierMerge({0: 0}, history={0: 5})
    assert merge.mark(PartitionMark(0, None, 1)) == []  # superseded: read past it
    assert merge.mark(PartitionMark(0, None, 2, reopen=True)) == []
    assert merge.mark(PartitionMark(0, 4, 4)) == [Progress(4)]
    assert merge.mark(PartitionMark(0, None, 5)) == [EndOfStream()]  # the end it found
    # A live reader past that end: a later reopening makes the partition live again.
    assert merge.mark(PartitionMark(0, None, 6, reopen=True)) == []
    assert merge.mark(PartitionMark(0, 7, 7)) == [Progress(7)]
    assert merge.mark(PartitionMark(0, None, 8)) == [EndOfStream()]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 50))),
                max_size=40))
def test_merged_frontier_never_goes_back_and_stays_below_live_partitions(marks):
    merge = FrontierMerge({0: 0, 1: 0, 2: 0})
    last = None
    for partition, frontier in marks:
        for event in merge.mark(PartitionMark(partition, frontier)):
            if isinstance(event, Progress):
                assert last is None or event.frontier > last
                last = event.frontier
                live = [f for p, f in merge.frontiers.items() if not merge.ended[p]]
                assert event.frontier == min(live)


def test_data_events_are_plain_values():
    assert Data(1, [], 0) == Data(1, [], 0)
    assert Progress(2) != Progress(3)


def _as_values(items: list) -> list:
    """events_of's items as a values-only subscriber must see them."""
    return [Values(i.time, [r.value for r in i.records], i.partition, i.records[-1].offset + 1,
                   any(r.value is None for r in i.records))
            if isinstance(i, Data) else i for i in items]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 120), st.booleans()),
                min_size=1, max_size=6), st.integers(0, 300))
def test_value_events_are_events_of_values_only(chunks: list, skip_below: int) -> None:
    """Runs from `encode_runs` (the fast path), records with other headers (the general
    decoder), and control batches, in one delivery: the same as events_of, values only."""
    batches = []
    for t, n, general in chunks:
        values = [bytes([n % 256]) * (n % 7)] * n
        if general:
            batches.append(encode_records([(None, v, (("h", b"x"),), 5, t) for v in values]))
        else:
            batches.append(encode_runs([(5, t, (), values[:n // 2]), (6, t + 1, (), values)]))
        batches.append(frontier_batch(t + 2, timestamp=0))
    data = stored(*batches)
    assert list(value_events_of(data, 3, skip_below=skip_below)) == \
        _as_values(list(events_of(data, 3, skip_below=skip_below)))
    assert list(value_events_of(memoryview(data), 3)) == _as_values(list(events_of(data, 3)))


def test_encode_runs_is_encode_records_of_the_same_records() -> None:
    runs = [(7, 1, (("h", b"x"),), [b"a", b"bb"]), (9, None, (), [b"c"]), (9, 2, (), [None])]
    records = [(None, v, h, ts, t) for ts, t, h, values in runs for v in values]
    assert encode_runs(runs) == encode_records(records)


# -- events_of against a plain reference (every record's time read on its own) -------------

def _reference_events(data: bytes, partition: int, skip_below: int = 0) -> Iterator:
    """What events_of must yield: each batch decoded, each record's time read from its first
    tq.time header (decode_int64 of its value), runs cut wherever that time changes, records
    below skip_below left out one by one; control batches as marks. Errors as they come."""
    pos = 0
    while pos < len(data):
        header = read_header(data, pos)
        end = pos + header.size
        if header.next_offset > skip_below:
            batch = decode_batch(data[pos:end])
            if batch.is_control:
                yield from events_of(data[pos:end], partition)
            else:
                run: list = []
                run_time = None
                for record in batch.records:
                    if record.offset < skip_below:
                        continue
                    t = next((decode_int64(v) for n, v in record.headers if n == TIME_HEADER),
                             None)
                    if run and t != run_time:
                        yield Data(run_time, run, partition)
                        run = []
                    run_time = t
                    run.append(record)
                if run:
                    yield Data(run_time, run, partition)
        pos = end


def _outcome(events, *args, **kwargs) -> tuple[list, object]:
    """The items yielded before any error, and the error (type and message) or None."""
    items: list = []
    try:
        for item in events(*args, **kwargs):
            items.append(item)
    except Exception as exc:  # noqa: BLE001  (any error must be the reference's)
        return items, (type(exc), str(exc))
    return items, None


# a record's headers: none, the tq.time header first (as tq writes it), after another header,
# other headers only, or a malformed tq.time value (not 8 bytes, or null)
_TIMES = st.sampled_from([0, 1, 2, -1, 1 << 40])
_HEADERS = st.one_of(
    st.just(()),
    _TIMES.map(lambda t: ((TIME_HEADER, encode_int64(t)),)),
    _TIMES.map(lambda t: (("h", b"x"), (TIME_HEADER, encode_int64(t)), (TIME_HEADER, b"12345678"))),
    st.just((("h", None),)),
    st.sampled_from([((TIME_HEADER, b"1234567"),), ((TIME_HEADER, None),)]),
)
_BATCH = st.tuples(
    st.lists(st.tuples(_HEADERS, st.none() | st.binary(max_size=3)), min_size=1, max_size=12),
    st.sampled_from([Compression.NONE, Compression.GZIP]),
    st.sampled_from(list(TimestampType)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_BATCH | st.integers(0, 9), min_size=1, max_size=5), st.integers(0, 40),
       st.booleans())
def test_events_of_is_the_reference_for_any_mix_of_times(batches: list, skip_below: int,
                                                          as_view: bool) -> None:
    """Records with and without times, time changes within and across batches, other headers,
    malformed times, compression, LogAppendTime, a start inside a batch, control batches in
    between: every Data run (and record) exactly as the reference, the same error if any."""
    encoded = []
    for batch in batches:
        if isinstance(batch, int):
            encoded.append(frontier_batch(batch, timestamp=0))
            continue
        records, compression, timestamp_type = batch
        encoded.append(encode_batch(
            [(1000 + i, None, value, headers) for i, (headers, value) in enumerate(records)],
            compression=compression, timestamp_type=timestamp_type))
    data = stored(*encoded)
    got = _outcome(events_of, memoryview(data) if as_view else data, 2, skip_below=skip_below)
    assert got == _outcome(_reference_events, data, 2, skip_below)


def _raw_record(offset_delta: int, value: bytes, headers: bytes = b"\x00") -> bytes:
    body = b"\x00\x00" + encode_varint(offset_delta) + b"\x01" + encode_varint(len(value)) \
        + value + headers
    return encode_varint(len(body)) + body


@pytest.mark.parametrize("skip_below", [0, 3, 5, 6, 7, 9, 12])
@pytest.mark.parametrize("timed", [False, True])
def test_records_out_of_offset_order_are_skipped_one_by_one(skip_below: int,
                                                            timed: bool) -> None:
    """A batch whose offset deltas go backwards (hostile, but well formed): each record below
    skip_below is left out on its own, as before, whatever the batch's base offset."""
    headers = b"\x02" + TIME_HEADER_PREFIX[1:] + encode_int64(4) if timed else b"\x00"
    deltas = [0, 3, -2, 1, 7, -5, 2]
    data = raw_batch(b"".join(_raw_record(d, b"v%d" % i, headers) for i, d in enumerate(deltas)),
                     len(deltas), base_offset=6)
    got = list(events_of(data, 0, skip_below=skip_below))
    assert got == list(_reference_events(data, 0, skip_below))
    assert [r.offset for e in got for r in e.records] == \
        [6 + d for d in deltas if 6 + d >= skip_below]


def test_a_corrupt_batch_is_refused_after_the_good_ones() -> None:
    good = stored(encode_records([(None, b"v", (), 5, 1)] * 3))
    bad = bytearray(stored(encode_records([(None, b"v", (), 5, 1)] * 6)))
    bad[-1] ^= 1  # a value byte of the last record: the CRC no longer matches
    items = []
    with pytest.raises(CorruptRecordError):
        for item in events_of(good + bytes(bad), 0):
            items.append(item)
    assert items == list(_reference_events(good, 0))


def test_a_malformed_time_is_refused_as_before() -> None:
    data = stored(encode_batch([(5, None, b"a", ((TIME_HEADER, encode_int64(3)),)),
                                (5, None, b"b", ((TIME_HEADER, b"short"),))]))
    with pytest.raises(InvalidRecordError):
        list(events_of(data, 0))


def test_a_batch_without_times_is_one_run_of_its_records() -> None:
    data = stored(encode_records([(None, b"%d" % i, (), 5, None) for i in range(50)]))
    (run,) = events_of(data, 1)
    assert run == Data(None, decode_batch(data).records, 1)


def test_records_without_headers_between_records_of_one_time_split_the_run() -> None:
    timed = ((TIME_HEADER, encode_int64(4)),)
    other = (("h", b"x"),)
    shape = [timed, timed, (), timed, other, timed, (), (), timed, timed]
    data = stored(encode_batch([(5, None, b"%d" % i, h) for i, h in enumerate(shape)]))
    runs = list(events_of(data, 0))
    assert runs == list(_reference_events(data, 0))
    assert [(r.time, [x.offset for x in r.records]) for r in runs] == [
        (4, [0, 1]), (None, [2]), (4, [3]), (None, [4]), (4, [5]), (None, [6, 7]), (4, [8, 9])]


@pytest.mark.parametrize("raw", [c[1] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
@pytest.mark.parametrize("view", [False, True])
def test_a_hostile_batch_is_refused_by_events_of_as_by_decode_batch(raw: bytes,
                                                                    view: bool) -> None:
    """After a good batch: the good one's run first, then the error decode_batch raises for
    the hostile one, word for word (the reference decodes each batch with decode_batch)."""
    good = stored(encode_records([(None, b"v", (), 5, 1)]))
    data = good + (stamp_base_offset(raw, 1) if len(raw) >= 8 else raw)
    got = _outcome(events_of, memoryview(data) if view else data, 0)
    assert got == _outcome(_reference_events, data, 0)
    assert got[0] == list(_reference_events(good, 0))
