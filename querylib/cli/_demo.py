"""`tq demo`: the README's main job.

Until the end-to-end pipeline exists it exercises the storage layer the rest of tq stands on:
it writes a topic partition (`clicks-0`) under ./tq-data in Kafka's log format — data batches in
every compression codec, with tq's logical-time headers, frontier control batches and an
end-of-stream marker — reopens the log, reads every batch back, checks the records, and prints
`tq log dump` of the segment.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the main job (a small end-to-end pipeline)")
    demo.add_argument("--data", default="tq-data", help="data directory (default ./tq-data)")
    demo.add_argument("--events", type=int, default=2000, help="click events to write")
    demo.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from querylib.cli import main as tq_main
    from querylib.log import LogConfig, PartitionLog
    from querylib.records import (
        TIME_HEADER,
        Compression,
        end_of_stream_batch,
        frontier_batch,
        iter_batches,
    )
    from querylib.records import encode_batch as encode

    data = Path(args.data)
    part_dir = data / "clicks-0"
    if part_dir.exists():
        shutil.rmtree(part_dir)
    rng = random.Random(7)
    pages = ["/", "/docs", "/pricing", "/blog", "/signup"]
    now = int(time.time() * 1000)
    codecs = list(Compression)
    per_batch = max(1, args.events // 10)
    sent: list[tuple[bytes, bytes]] = []

    log = PartitionLog.open(part_dir, LogConfig(flush="always"))
    for i, start in enumerate(range(0, args.events, per_batch)):
        window = start // per_batch  # one logical time per batch
        entries = []
        for n in range(start, min(start + per_batch, args.events)):
            key = f"user-{rng.randrange(50)}".encode()
            value = json.dumps({"page": rng.choice(pages), "n": n}).encode()
            entries.append((now + n, key, value, [(TIME_HEADER, window.to_bytes(8, "big"))]))
            sent.append((key, value))
        log.append(encode(entries, compression=codecs[i % len(codecs)]))
        log.append(frontier_batch(window + 1, timestamp=now + start))
    log.append(end_of_stream_batch(timestamp=now + args.events))
    log.close()

    log = PartitionLog.open(part_dir, LogConfig())
    got: list[tuple[bytes, bytes]] = []
    controls = 0
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        chunk = log.read(offset, 1 << 20)
        for batch in iter_batches(chunk):
            if batch.is_control:
                controls += 1
            else:
                got.extend((r.key, r.value) for r in batch.records)
            offset = batch.next_offset
    log.close()
    if got != sent:
        print(f"demo: read back {len(got)} records, wrote {len(sent)}: MISMATCH")
        return 1
    segment = next(part_dir.glob("*.log"))
    print(f"$ tq log dump {segment}")
    tq_main(["log", "dump", str(segment)])
    print(f"\ndemo: wrote and read back {len(sent)} records and {controls} control batches "
          f"in {part_dir}/ (try: tq log dump {segment} --records)")
    return 0
