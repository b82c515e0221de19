"""Shared by the log fault tests: run the writer process, read its acknowledgements, and check
a log against what was acknowledged."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from querylib.errors import CorruptDataError
from querylib.log import PartitionLog
from querylib.records import decode_batch
from tests.querylib.log._batches import as_stored, split_batches

ROOT = Path(__file__).resolve().parents[3]


class Writer:
    """A writer process (tests/querylib/log/_writer.py) and its acknowledgements."""

    def __init__(self, path: Path, seed: int, count: int, mode: str, huge_at: int = -1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.querylib.log._writer", str(path), str(seed),
             str(count), mode, str(huge_at)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.seed = seed
        self.huge_at = huge_at
        self._buffer = b""
        self.acks: dict[int, int] = {}  # batch number -> offset
        self.start_offset: int | None = None  # the log end offset the writer opened at

    def line(self, deadline: float) -> list[str] | None:
        """The next whole line, split; None at end of output (a partial last line is dropped:
        it was never a complete acknowledgement)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("writer process stopped talking")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        words = line.decode().split()
        if words[0] == "ack":
            self.acks[int(words[1])] = int(words[2])
        elif words[0] == "ready":
            self.start_offset = int(words[1])
        return words

    def expect(self, word: str, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            words = self.line(deadline)
            if words is None:
                raise AssertionError(f"writer exited before {word!r}: rc {self.proc.wait()}")
            if words[0] == word:
                return words

    def kill(self) -> None:
        """SIGKILL, reap, then collect the acknowledgements already in the pipe."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while self.line(deadline) is not None:
            pass
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe and not pipe.closed:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass


def in_flight(writer: Writer, batch_for) -> tuple[int, bytes] | None:
    """(offset, batch) of the append a killed writer may have been in: the one after its last
    acknowledgement. None if it never opened the log."""
    if writer.start_offset is None:
        return None
    if not writer.acks:
        return writer.start_offset, batch_for(writer.seed, 0, writer.huge_at)
    last = max(writer.acks)
    batch = batch_for(writer.seed, last, writer.huge_at)
    count = int.from_bytes(batch[23:27], "big") + 1  # lastOffsetDelta + 1
    return writer.acks[last] + count, batch_for(writer.seed, last + 1, writer.huge_at)


def served_batches(log: PartitionLog, *, damaged: list[CorruptDataError] | None = None
                   ) -> list[bytes]:
    """Every batch from the log start to the log end, checked whole, CRC-valid and gapless.
    With `damaged`, a damaged range (CorruptDataError for its first offset) is collected there
    and stepped over; every offset is still either served or inside such a range."""
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        try:
            data = log.read(offset, 1 << 20)
        except CorruptDataError as exc:
            if damaged is None:
                raise
            assert exc.start_offset == offset < exc.end_offset, (offset, exc)
            damaged.append(exc)
            offset = exc.end_offset
            continue
        pieces = split_batches(data)
        assert pieces, f"nothing served at {offset} < log end {log.log_end_offset}"
        for piece in pieces:
            batch = decode_batch(piece)  # raises on a CRC mismatch or a torn batch
            assert batch.base_offset == offset, (batch.base_offset, offset)
            offset = batch.next_offset
            out.append(piece)
    return out


def check_log(log: PartitionLog, known: dict[int, bytes], acked: set[int], *,
              damaged: list[CorruptDataError] | None = None) -> list[bytes]:
    """Every served batch is CRC-valid, gapless (but for the damaged ranges, with `damaged`)
    and one we know (its bytes as appended at its offset); every acknowledged offset is
    served. `known` maps base offset -> appended batch (acknowledged or possibly in flight
    when killed)."""
    served = served_batches(log, damaged=damaged)
    by_offset = {int.from_bytes(b[:8], "big"): b for b in served}
    for offset, data in by_offset.items():
        assert offset in known, f"served a batch at {offset} that nobody appended there"
        assert data == as_stored(known[offset], offset), f"batch at {offset} differs"
    missing = sorted(acked - by_offset.keys())
    assert not missing, f"acknowledged batches lost: {missing[:10]}"
    return served
