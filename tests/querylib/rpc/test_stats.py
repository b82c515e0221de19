"""The RPC server's per-type counters: counts, errors and handler-time buckets."""

from __future__ import annotations

from querylib.rpc import LATENCY_BUCKETS, RequestStats


def test_each_message_lands_in_its_types_bucket_and_errors_by_kind() -> None:
    stats = RequestStats()
    stats.record("broker.produce", 0.00005)          # under the first bound
    stats.record("broker.produce", 0.0001)           # on a bound: that bucket (le)
    stats.record("broker.produce", 0.003, "StreamEndedError")
    stats.record("broker.produce", 99.0)             # past the last bound: +Inf
    entry = stats.types["broker.produce"]
    assert entry.count == 4 and abs(entry.seconds - 99.00315) < 1e-9
    assert entry.buckets[0] == 2
    assert entry.buckets[LATENCY_BUCKETS.index(0.005)] == 1
    assert entry.buckets[-1] == 1 and sum(entry.buckets) == 4
    assert entry.errors == {"StreamEndedError": 1}
    assert set(stats.types) == {"broker.produce"}
