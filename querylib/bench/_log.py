"""Benchmark suite "log": PartitionLog append and read throughput against raw file I/O.

Batches of 100-byte records, just under 1 MiB each, 128 MiB in all, in a temporary directory.
Baselines move the same bytes in the same run: sequential os.write of the batches to one file
(append), sequential 1 MiB os.pread of that file (read). Both sides use the same fsync policy:
none while writing, one fsync at the end. Reads are warm: nothing is dropped from the page
cache for either side; the log is reopened once before its read passes, as a broker opens a
log once and then serves it. Figures are medians over five runs (four read passes each, the
sides alternating which goes first), in wall-clock MB/s and, because a shared machine makes
wall time noisy, also in MB per CPU-second of this process.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch

RECORD_BYTES = 100
BATCH_BYTES = 1 << 20
TOTAL_BYTES = 128 << 20
RUNS = 5
READ_PASSES = 4
GOAL = 0.8

Timing = tuple[float, float]  # (wall seconds, CPU seconds)
T = TypeVar("T")


def _batch(seed: int) -> bytes:
    """One batch of 100-byte values that stays under 1 MiB (a record adds ~12 bytes)."""
    count = (BATCH_BYTES - 61) // (RECORD_BYTES + 12)
    return encode_batch([
        (1_700_000_000_000 + i, None, (seed * 1_000_000 + i).to_bytes(RECORD_BYTES, "big"), ())
        for i in range(count)
    ])


def _timed(fn: Callable[[], T]) -> tuple[Timing, T]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return (time.perf_counter() - wall, time.process_time() - cpu), result


def _append_log(path: str, batches: list[bytes], count: int) -> Timing:
    log = PartitionLog.open(path, LogConfig(flush="never"))

    def work() -> None:
        for i in range(count):
            log.append(batches[i % len(batches)])
        log.flush()

    timing, _ = _timed(work)
    log.close()
    return timing


def _append_raw(path: str, batches: list[bytes], count: int) -> Timing:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def work() -> None:
        for i in range(count):
            os.write(fd, batches[i % len(batches)])
        os.fsync(fd)

    timing, _ = _timed(work)
    os.close(fd)
    return timing


def _next_offset(data: bytes) -> int:
    """The offset after the last of the whole batches in `data`."""
    pos = 0
    while True:
        length = int.from_bytes(data[pos + 8 : pos + 12], "big")
        if pos + 12 + length >= len(data):
            base = int.from_bytes(data[pos : pos + 8], "big")
            return base + int.from_bytes(data[pos + 23 : pos + 27], "big") + 1
        pos += 12 + length


def _read_log(log: PartitionLog) -> tuple[Timing, int]:
    def work() -> int:
        offset, end, nbytes = log.log_start_offset, log.log_end_offset, 0
        while offset < end:
            data = log.read(offset, BATCH_BYTES)
            nbytes += len(data)
            offset = _next_offset(data)
        return nbytes

    return _timed(work)


def _read_raw(path: str) -> tuple[Timing, int]:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size

    def work() -> int:
        pos = 0
        while pos < size:
            data = os.pread(fd, BATCH_BYTES, pos)  # held until the next read, as in _read_log
            pos += len(data)
        return pos

    timing, nbytes = _timed(work)
    os.close(fd)
    return timing, nbytes


def _figures(nbytes: int, timings: list[Timing]) -> dict[str, float]:
    return {
        "MB_per_s": round(statistics.median(nbytes / w for w, _ in timings) / 1e6, 1),
        "MB_per_cpu_s": round(statistics.median(nbytes / max(c, 1e-9) for _, c in timings) / 1e6,
                              1),
    }


def run() -> Iterator[dict]:
    batches = [_batch(seed) for seed in range(4)]
    count = TOTAL_BYTES // len(batches[0])
    nbytes = sum(len(batches[i % len(batches)]) for i in range(count))
    append: list[Timing] = []
    append_raw: list[Timing] = []
    read: list[Timing] = []
    read_raw: list[Timing] = []
    with tempfile.TemporaryDirectory(prefix="tq-bench-log-") as tmp:
        for run_ in range(RUNS):
            directory = os.path.join(tmp, f"run-{run_}")
            os.mkdir(directory)
            log_path, raw_path = os.path.join(directory, "bench-0"), os.path.join(directory, "raw")
            # Alternate which side goes first: the disk and the page cache carry state over.
            for side in ((1, 0) if run_ % 2 else (0, 1)):
                if side:
                    append.append(_append_log(log_path, batches, count))
                else:
                    append_raw.append(_append_raw(raw_path, batches, count))
            # Both files are warm (just written): nothing is dropped from the page cache. The
            # log is reopened once, as a broker opens its logs once and then serves reads.
            log = PartitionLog.open(log_path, LogConfig())
            for _ in range(READ_PASSES):
                for side in ((1, 0) if run_ % 2 else (0, 1)):
                    if side:
                        timing, got = _read_log(log)
                        assert got == nbytes, (got, nbytes)
                        read.append(timing)
                    else:
                        timing, got = _read_raw(raw_path)
                        assert got == nbytes, (got, nbytes)
                        read_raw.append(timing)
            log.close()
            shutil.rmtree(directory)
    setup = {"record_bytes": RECORD_BYTES, "batch_bytes": len(batches[0]),
             "records_per_batch": int.from_bytes(batches[0][57:61], "big"),
             "total_MiB": round(nbytes / 2**20, 1), "runs": RUNS, "read_passes": READ_PASSES,
             "goal_ratio": GOAL}
    for name, ours, theirs, note in (
        ("log_append", append, append_raw,
         "PartitionLog.append (header and CRC-32C check, stamp, writev) vs os.write of the same "
         "batches; flush policy never, one fsync at the end for both"),
        ("log_read", read, read_raw,
         "PartitionLog.read(offset, 1 MiB) vs sequential 1 MiB os.pread of the same bytes; "
         "warm page cache, nothing dropped for either"),
    ):
        figures, baseline = _figures(nbytes, ours), _figures(nbytes, theirs)
        yield {
            "name": name,
            "figures": figures,
            "baseline": baseline,
            "ratio": round(figures["MB_per_s"] / baseline["MB_per_s"], 3),
            "cpu_ratio": round(figures["MB_per_cpu_s"] / baseline["MB_per_cpu_s"], 3),
            "setup": setup,
            "note": note,
        }
