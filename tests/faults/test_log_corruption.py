"""Damage a log's files at random (flipped bytes, truncation, garbage, deleted or scrambled
indexes, lost checkpoint or marker), after a clean close or a SIGKILL; the reopened log must
keep every acknowledged batch whose bytes are intact (before and after the damage), serve
nothing corrupt, and fail reads of the damaged offsets (CorruptDataError) rather than skip
them."""

from __future__ import annotations

import os
import random
import shutil
import struct
from pathlib import Path

import pytest

from querylib.errors import CorruptDataError
from querylib.log import PartitionLog
from tests.querylib.log._faults import Writer, check_log
from tests.querylib.log._writer import CONFIG, batch_for

ROUNDS = 20
BATCHES = 60


def _layout(path: Path) -> list[tuple[str, int, int, int]]:
    """(segment file, position, size, base offset) of every batch, in log order."""
    out = []
    for name in sorted(n for n in os.listdir(path) if n.endswith(".log")):
        data = (path / name).read_bytes()
        pos = 0
        while pos < len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            out.append((name, pos, 12 + length, base))
            pos += 12 + length
    return out


def _damage(rng: random.Random, path: Path) -> tuple[str, int, int] | None:
    """Damage the files one random way; return (segment file, position, end) of the damaged
    or removed bytes of log data, or None when no log byte was damaged."""
    logs = sorted(n for n in os.listdir(path) if n.endswith(".log"))
    indexes = sorted(n for n in os.listdir(path) if n.endswith((".index", ".timeindex")))
    name = rng.choice(logs)
    size = os.path.getsize(path / name)
    kind = rng.choice(["flip", "overwrite", "truncate", "append", "drop-indexes",
                       "scramble-index", "drop-checkpoint"])
    if kind in ("flip", "overwrite") and size:
        pos = rng.randrange(size)
        with open(path / name, "r+b") as f:
            f.seek(pos)
            old = f.read(rng.randint(1, 16) if kind == "overwrite" else 1)
            new = bytes(b ^ rng.randint(1, 255) for b in old)  # every byte really changes
            f.seek(pos)
            f.write(new)
        return name, pos, pos + len(new)
    if kind == "truncate":
        pos = rng.randrange(size + 1)
        os.truncate(path / name, pos)
        return (name, pos, size) if pos < size else None
    if kind == "append":
        with open(path / name, "ab") as f:
            f.write(rng.randbytes(rng.randint(1, 5000)))
        return None  # nothing acknowledged lies after the end of the last segment...
    if kind == "drop-indexes":
        for index in rng.sample(indexes, rng.randint(1, len(indexes))):
            os.unlink(path / index)
        return None
    if kind == "scramble-index" and indexes:
        index = path / rng.choice(indexes)
        data = bytearray(index.read_bytes())
        if data:
            pos = rng.randrange(len(data))
            data[pos] ^= rng.randint(1, 255)
            index.write_bytes(bytes(data))
        return None
    for marker in ("recovery-point-offset-checkpoint", "clean-shutdown"):
        if (path / marker).exists() and rng.random() < 0.7:
            os.unlink(path / marker)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("shutdown", ["clean", "kill"])
def test_damaged_files_lose_nothing_before_the_damage_and_serve_nothing_corrupt(
    tmp_path, shutdown
):
    seed = int(os.environ.get("TQ_FAULT_SEED", "7")) + (shutdown == "kill")
    rng = random.Random(seed)
    original = tmp_path / "topic-0"
    writer = Writer(original, seed=seed, count=BATCHES,
                    mode="close" if shutdown == "clean" else "hang")
    try:
        writer.expect("closed" if shutdown == "clean" else "ack", timeout=60)
        while len(writer.acks) < BATCHES:
            writer.expect("ack", timeout=60)
    finally:
        writer.kill()
    known = {offset: batch_for(seed, i) for i, offset in writer.acks.items()}
    layout = _layout(original)
    assert len(layout) == BATCHES and len({name for name, *_ in layout}) > 3
    for round_ in range(ROUNDS):
        path = tmp_path / f"damaged-{round_}"
        shutil.copytree(original, path)
        point = _damage(rng, path)
        # Acknowledged batches whose bytes are intact must survive, before and after the
        # damage: only bytes that fail their checks are lost.
        intact = {base for name, pos, size, base in layout
                  if point is None or name != point[0]
                  or pos + size <= point[1] or pos >= point[2]}
        with PartitionLog.open(path, CONFIG) as log:
            damaged: list[CorruptDataError] = []
            served = check_log(log, known, intact, damaged=damaged)
            if point is None:
                assert len(served) == BATCHES and not damaged, f"seed {seed} round {round_}"
            lost = set(known) - {int.from_bytes(b[:8], "big") for b in served}
            for base in lost & set(writer.acks.values()):
                # lost: inside a reported range, or (after a kill only) in the torn tail cut
                assert any(e.start_offset <= base < e.end_offset for e in damaged) or (
                    shutdown == "kill" and base >= log.log_end_offset), (
                    f"seed {seed} round {round_}: batch {base} neither served nor reported")
            assert log.log_start_offset == 0
            # the repaired log takes appends again, and keeps them over a clean reopen
            log.append(batch_for(seed, 0))
            end = log.log_end_offset
        with PartitionLog.open(path, CONFIG) as log:
            assert log.log_end_offset == end
        shutil.rmtree(path)
