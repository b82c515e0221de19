"""Record-batch codec throughput: `python -m querylib.bench records`.

The issue's workload: records with a 100-byte value, a null key and no headers, in batches of
about 1 MiB uncompressed (8000 records). Goal: encode and decode >= 1,000,000 records/s each.
The baseline is kafka-python's pure-Python codec (DefaultRecordBatchBuilder/DefaultRecordBatch)
on the same records, when it is installed. Extra rows (no goal) cover headers and compression.
Measures CPU time of the calling thread only; prints nothing itself.
"""

from __future__ import annotations

import functools
import gc
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from querylib.records import TIME_HEADER, Compression, decode_batch, encode_batch

RECORDS_PER_BATCH = 8000
VALUE_SIZE = 100
GOAL = 1_000_000
_ROUND_SECONDS = float(os.environ.get("TQ_BENCH_SECONDS", "1.0"))


def _entries(headers: bool = False) -> list[tuple[int, None, bytes, Any]]:
    t0 = 1_700_000_000_000
    value = bytes(range(VALUE_SIZE))
    if headers:
        return [(t0 + i // 100, None, value, ((TIME_HEADER, (i // 10).to_bytes(8, "big")),))
                for i in range(RECORDS_PER_BATCH)]
    # a producer's batch spans some milliseconds: deltas of 1 and 2 bytes both occur
    return [(t0 + i // 100, None, value, ()) for i in range(RECORDS_PER_BATCH)]


def _rate(work: Callable[[], object], records: int) -> float:
    """Records per second of `work`, the best of rounds taking about _ROUND_SECONDS in all.
    Best-of, because the machine is shared: slower rounds measure the neighbours."""
    gc.collect()
    best = 0.0
    deadline = time.perf_counter() + _ROUND_SECONDS
    rounds = 0
    while rounds < 3 or time.perf_counter() < deadline:
        start = time.thread_time()
        work()
        elapsed = time.thread_time() - start
        if elapsed > 0:
            best = max(best, records / elapsed)
        rounds += 1
    return best


def _kafka_python() -> tuple[Callable[[list], bytes], Callable[[bytes], list]] | None:
    try:
        from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    except ImportError:
        return None

    def encode(entries: list) -> bytes:
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
        for i, (ts, key, value, headers) in enumerate(entries):
            builder.append(i, ts, key, value, list(headers))
        return bytes(builder.build())

    def decode(data: bytes) -> list:
        return list(DefaultRecordBatch(data))

    return encode, decode


def _row(name: str, figure: float, baseline: float | None, goal: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "figures": {"records_per_s": round(figure)}}
    if goal:
        row["goal"] = {"records_per_s": GOAL}
        row["meets_goal"] = figure >= GOAL
    if baseline:
        row["baseline"] = {"kafka_python_records_per_s": round(baseline)}
        row["ratio"] = round(figure / baseline, 2)
    return row


def run() -> Iterator[dict[str, Any]]:
    entries = _entries()
    batch = encode_batch(entries)
    oracle = _kafka_python()
    base_enc = _rate(lambda: oracle[0](entries), len(entries)) if oracle else None
    base_dec = _rate(lambda: oracle[1](batch), len(entries)) if oracle else None
    yield _row("record_encode", _rate(lambda: encode_batch(entries), len(entries)),
               base_enc, True)
    yield _row("record_decode", _rate(lambda: decode_batch(batch), len(entries)),
               base_dec, True)
    yield {"name": "record_batch", "figures": {"records": len(entries), "bytes": len(batch)}}

    tagged = _entries(headers=True)
    tagged_batch = encode_batch(tagged)
    yield _row("record_encode_tq_time_header",
               _rate(lambda: encode_batch(tagged), len(tagged)), None, False)
    yield _row("record_decode_tq_time_header",
               _rate(lambda: decode_batch(tagged_batch), len(tagged)), None, False)

    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        name = codec.name.lower()
        packed = encode_batch(entries, compression=codec)
        yield _row(f"record_encode_{name}",
                   _rate(functools.partial(encode_batch, entries, compression=codec),
                         len(entries)),
                   None, False)
        yield _row(f"record_decode_{name}",
                   _rate(functools.partial(decode_batch, packed), len(entries)), None, False)
