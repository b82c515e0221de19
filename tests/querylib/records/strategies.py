"""Hypothesis strategies for record entries and batch parameters."""

from __future__ import annotations

from hypothesis import strategies as st

from querylib.records import Compression, TimestampType
from querylib.records._varint import INT64_MAX, INT64_MIN

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(INT64_MIN, INT64_MAX)
# lengths around the 1/2/3-byte varint boundaries (63/64, 8191/8192) matter most; big values
# are a repeated byte, cheap to generate
_small = st.sampled_from([0, 1, 63, 64]).flatmap(lambda n: st.binary(min_size=n, max_size=n))
_big = st.sampled_from([8191, 8192, 10000]).map(lambda n: b"\xab" * n)
nullable_bytes = st.none() | _small | st.binary(max_size=300) | _big
headers = st.lists(st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=40)),
                   max_size=3).map(tuple)
# timestamps: mostly close together (1- and 2-byte deltas), sometimes anywhere in int64
near = st.integers(-20000, 20000).map(lambda d: 1_700_000_000_000 + d)
timestamps = near | INT64 | st.sampled_from([INT64_MIN, INT64_MAX, 0, -1])
entries = st.lists(st.tuples(timestamps, nullable_bytes, nullable_bytes, headers),
                   min_size=1, max_size=25)

batch_params = st.fixed_dictionaries({
    "base_offset": st.integers(0, (1 << 62)) | st.just(0),
    "compression": st.sampled_from(list(Compression)),
    "timestamp_type": st.sampled_from(list(TimestampType)),
    "producer_id": INT64,
    "producer_epoch": st.integers(-(1 << 15), (1 << 15) - 1),
    "base_sequence": INT32,
    "is_transactional": st.booleans(),
    "is_control": st.booleans(),
    "partition_leader_epoch": INT32,
})
