"""The offset and time indexes: Kafka's file formats and entry rule, and lookups through them."""

from __future__ import annotations

import os
import struct
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from querylib.log import LogConfig, PartitionLog
from tests.querylib.log._batches import as_stored, base_offset_of, make_batch, split_batches


def _kafka_entries(batches: list[bytes], interval: int, base: int = 0):
    """Kafka's LogSegment.append rule, computed independently of the log: an index entry
    (last offset, position) once more than `interval` bytes were appended since the last one,
    and a time index entry (max timestamp so far, its offset) at the same moments."""
    index, times = [], []
    since, pos, offset = 0, 0, base
    max_ts, max_off = -1, base
    for batch in batches:
        count = struct.unpack_from(">i", batch, 57)[0]
        ts = struct.unpack_from(">q", batch, 35)[0]
        last = offset + count - 1
        if ts > max_ts:
            max_ts, max_off = ts, last
        if since > interval:
            index.append((last - base, pos))
            if not times or max_ts > times[-1][0]:
                times.append((max_ts, max_off - base))
            since = 0
        since += len(batch)
        pos += len(batch)
        offset = last + 1
    return index, times, (max_ts, max_off - base)


def _read_index(path: str, fmt: str) -> list[tuple[int, int]]:
    with open(path, "rb") as f:
        return list(struct.iter_unpack(fmt, f.read()))


def test_index_files_have_kafkas_entries_and_format(tmp_path):
    batches = [make_batch(1 + i % 4, value_size=50 * (i % 7), seed=i,
                          timestamp=1000 + (i * 37) % 200) for i in range(400)]
    with PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=1000)) as log:
        log.append_batches(batches[:150])
        for batch in batches[150:]:
            log.append(batch)
    index, times, final = _kafka_entries(batches, 1000)
    assert len(index) > 20
    base = os.path.join(tmp_path, "t-0", "00000000000000000000")
    assert _read_index(base + ".index", ">ii") == index
    # the close added the segment's largest timestamp, as Kafka's close does
    assert _read_index(base + ".timeindex", ">qi") == times + (
        [final] if final[0] > times[-1][0] else [])


def test_a_reopened_log_keeps_its_index_files_byte_for_byte(tmp_path):
    config = LogConfig(index_interval_bytes=500)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        log.append_batches([make_batch(3, value_size=90, seed=i) for i in range(100)])
    base = os.path.join(tmp_path, "t-0", "00000000000000000000")
    before = [open(base + s, "rb").read() for s in (".index", ".timeindex")]
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        assert log.log_end_offset == 300
    assert [open(base + s, "rb").read() for s in (".index", ".timeindex")] == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 400)), min_size=1, max_size=40),
    interval=st.integers(0, 1500),
    segment_bytes=st.integers(300, 6000),
    reads=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 5000)), max_size=20),
)
def test_every_offset_reads_from_the_batch_that_holds_it(shapes, interval, segment_bytes, reads):
    batches = [make_batch(n, value_size=size, seed=i) for i, (n, size) in enumerate(shapes)]
    with tempfile.TemporaryDirectory() as tmp:
        config = LogConfig(index_interval_bytes=interval, segment_bytes=segment_bytes)
        with PartitionLog.open(os.path.join(tmp, "t-0"), config) as log:
            stored, owner = [], {}
            for batch in batches:
                offset = log.append(batch)
                stored.append(as_stored(batch, offset))
                for o in range(offset, offset + struct.unpack_from(">i", batch, 57)[0]):
                    owner[o] = len(stored) - 1
            segment_of = {}
            for info in log.segments:
                for o in range(info.base_offset, info.next_offset):
                    segment_of[o] = info.base_offset
            for offset in range(log.log_end_offset):
                got = split_batches(log.read(offset, 1))
                assert got == [stored[owner[offset]]]
            for offset, max_bytes in reads:
                offset %= log.log_end_offset
                got = split_batches(log.read(offset, max_bytes))
                first = owner[offset]
                assert got[0] == stored[first]
                assert got == stored[first : first + len(got)]
                # as many whole batches of the same segment as fit in max_bytes
                total = sum(map(len, got))
                assert len(got) == 1 or total <= max_bytes
                following = first + len(got)
                if following < len(stored):
                    next_base = base_offset_of(stored[following])
                    same_segment = segment_of[next_base] == segment_of[offset]
                    assert not same_segment or total + len(stored[following]) > max(
                        max_bytes, len(got[0]))


def test_an_independent_reader_reads_our_segments_and_indexes(tmp_path):
    """kafka-python's MemoryRecords parses a segment file as the concatenation of batches it
    is; every offset index entry names the start of a batch whose last offset it holds (what
    kafka-dump-log --index-sanity-check verifies)."""
    from kafka.record.memory_records import MemoryRecords

    batches = [make_batch(1 + i % 3, value_size=300, seed=i) for i in range(40)]
    config = LogConfig(segment_bytes=8000, index_interval_bytes=1000)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        offsets = log.append_batches(batches)
        infos = log.segments
    seen, indexed = [], 0
    for info in infos:
        data = open(info.path, "rb").read()
        records = MemoryRecords(data)
        starts = {}
        pos = 0
        while records.has_next():
            batch = records.next_batch()
            assert batch.validate_crc()
            starts[pos] = batch.base_offset + batch.last_offset_delta
            pos += batch.size_in_bytes
            seen += [(batch.base_offset, [r.offset for r in batch])]
        index = _read_index(info.path[:-4] + ".index", ">ii")
        for rel, position in index:
            assert starts[position] == info.base_offset + rel
        indexed += len(index)
    assert indexed >= len(infos)
    assert [base for base, _ in seen] == offsets
    assert all(rs == list(range(b, b + len(rs))) for b, rs in seen)
