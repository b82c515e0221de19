"""A writer process for the log fault tests: `python -m tests.querylib.log._writer DIR SEED
COUNT MODE [HUGE]`.

Opens the log at DIR with fsync on every append, prints `ready <log end offset>`, then appends
COUNT batches (`batch_for(SEED, i, HUGE)`), printing `ack <i> <offset>` on stdout after each
append returns. MODE `close` then closes the log cleanly and prints `closed`; MODE `hang` waits
to be killed. The parent kills it with SIGKILL whenever it likes.
"""

from __future__ import annotations

import functools
import random
import sys

from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch

CONFIG = LogConfig(segment_bytes=256 * 1024, flush="always")
HUGE_BYTES = 16 << 20


@functools.lru_cache(maxsize=4)
def batch_for(seed: int, i: int, huge_at: int = -1) -> bytes:
    """Batch number i of a writer: 1..5 records of up to ~100 KiB; batch `huge_at` is one
    record of 16 MiB, whose write takes long enough (milliseconds) for a kill to land inside
    it."""
    rng = random.Random(seed * 1_000_003 + i)
    if i == huge_at:  # cheap to build: the parent rebuilds it to compare
        value = (seed.to_bytes(8, "big") + i.to_bytes(8, "big")) * (HUGE_BYTES // 16)
        return encode_batch([(1000 + i, None, value, [])])
    count = rng.randint(1, 5)
    size = rng.choice([10, 200, 3000, rng.randint(0, 100_000)])
    entries = [(1000 + i, f"{seed}-{i}".encode(), rng.randbytes(size), [("n", bytes([j]))])
               for j in range(count)]
    return encode_batch(entries)


def main(argv: list[str]) -> int:
    path, seed, count, mode = argv[0], int(argv[1]), int(argv[2]), argv[3]
    huge_at = int(argv[4]) if len(argv) > 4 else -1
    log = PartitionLog.open(path, CONFIG)
    out = sys.stdout
    out.write(f"ready {log.log_end_offset}\n")
    out.flush()
    for i in range(count):
        offset = log.append(batch_for(seed, i, huge_at))
        out.write(f"ack {i} {offset}\n")
        out.flush()
    if mode == "close":
        log.close()
        out.write("closed\n")
        out.flush()
        return 0
    sys.stdin.read()  # hang until killed (or the parent closes our stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
