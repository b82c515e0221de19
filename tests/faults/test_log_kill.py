"""SIGKILL a process appending with fsync on every append, at random points, again and again on
the same log; every batch whose append returned must come back intact, and nothing else but the
one append in flight may be served."""

from __future__ import annotations

import os
import random
import shutil
import time

import pytest

from querylib.log import PartitionLog
from tests.querylib.log._faults import Writer, check_log, in_flight
from tests.querylib.log._writer import CONFIG, batch_for

ROUNDS = 12


@pytest.mark.slow
def test_sigkill_in_the_middle_of_appends_loses_nothing_acknowledged(tmp_path):
    seed = int(os.environ.get("TQ_FAULT_SEED", "20240611"))
    rng = random.Random(seed)
    path = tmp_path / "topic-0"
    known: dict[int, bytes] = {}  # base offset -> batch appended there (acked or in flight)
    acked: set[int] = set()
    acked_end = 0
    for round_ in range(ROUNDS):
        kind = rng.random()
        huge_at = rng.randint(0, 10) if kind >= 0.6 else -1
        writer = Writer(path, seed=round_, count=10_000, mode="hang", huge_at=huge_at)
        try:
            if kind < 0.2:
                pass  # killed at once: while importing, opening or recovering the log
            elif kind < 0.6:
                writer.expect("ready")
                for _ in range(rng.randint(0, 25)):
                    writer.expect("ack")
            else:
                # Kill inside the write of a 16 MiB batch: wait for the acknowledgement before
                # it, then for the segment it goes to to start growing.
                writer.expect("ready")
                for _ in range(huge_at):
                    writer.expect("ack")
                _wait_for_a_write_to_start(path, in_flight(writer, batch_for)[0])
        finally:
            writer.kill()
        context = f"seed {seed}, round {round_}"
        if writer.start_offset is not None:
            # the writer's own recovery kept every acknowledged batch
            assert writer.start_offset >= acked_end, context
        for i, offset in writer.acks.items():
            known[offset] = batch_for(round_, i, huge_at)
            acked.add(offset)
            acked_end = max(acked_end, offset + len_of(known[offset]))
        flight = in_flight(writer, batch_for)
        if flight is not None:
            known[flight[0]] = flight[1]
        if not path.exists():  # killed before it created the log
            continue
        # Check a copy, so the next writer still meets the log exactly as the kill left it.
        copy = tmp_path / f"check-{round_}"
        shutil.copytree(path, copy)
        with PartitionLog.open(copy, CONFIG) as log:
            check_log(log, known, acked)
            assert log.log_end_offset >= acked_end, context
        shutil.rmtree(copy)
    assert len(acked) > ROUNDS  # the loop did append
    with PartitionLog.open(path, CONFIG) as log:
        check_log(log, known, acked)


def _size(path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _wait_for_a_write_to_start(directory, offset: int, timeout: float = 10.0) -> None:
    """Return as soon as the batch at `offset` starts reaching the file: the segment it rolls
    to (named by its offset) or the active segment (if that one is empty) grows. A kill now
    likely lands in the middle of that write."""
    logs = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    active = directory / logs[-1]
    active_size = _size(active)
    rolled = directory / f"{offset:020d}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _size(active) > active_size or _size(rolled):
            return


def len_of(batch: bytes) -> int:
    """Records in a batch (lastOffsetDelta + 1)."""
    return int.from_bytes(batch[23:27], "big") + 1
