"""AppendLane: one partition's appends in order, off the loop, with group commit; a bad batch
fails alone; under the "interval" policy a flush follows appends by itself; under "always" an
append not synced lands without an fsync, durable with the next synced one or by itself after
the flush interval."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest

from querylib.broker._stream import encode_records
from querylib.errors import CorruptRecordError
from querylib.log import LogConfig, PartitionLog
from querylib.server.broker._appender import AppendLane
from querylib.server.broker._events import AppendCompleted, AppendFailed, DurableAdvanced
from tests.conftest import wait_for_async


def batch(n: int) -> bytes:
    return encode_records([(None, b"x", (), 0, None)] * n)


def corrupt(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


async def run_lane(log: PartitionLog, batches: list[bytes], *, until: int,
                   inline: bool = False) -> list:
    seen: list = []
    with ThreadPoolExecutor(2) as pool:
        lane = AppendLane(("t", 0), log, pool, seen.append, inline=inline)
        for ticket, data in enumerate(batches, 1):
            lane.submit(ticket, data)
        await wait_for_async(lambda: len(seen) >= until, what="the lane's reports")
        await lane.close()
    return seen


@pytest.mark.parametrize("inline", [False, True])
def test_appends_complete_in_order_and_a_bad_batch_fails_alone(tmp_path, inline):
    with PartitionLog.open(tmp_path / "t-0", LogConfig()) as log:
        batches = [batch(2), batch(3), corrupt(batch(1)), batch(1)]
        seen = asyncio.run(run_lane(log, batches, until=4, inline=inline))
    assert [type(s) for s in seen] == [AppendCompleted, AppendCompleted, AppendFailed,
                                       AppendCompleted]
    assert [(s.ticket, s.base_offset, s.next_offset) for s in seen if
            isinstance(s, AppendCompleted)] == [(1, 0, 2), (2, 2, 5), (4, 5, 6)]
    assert isinstance(seen[2].error, CorruptRecordError)


def test_a_commit_says_which_completions_more_of_it_follow(tmp_path):
    # Submitted together, the batches are one commit (one write): every completion but the
    # last says `more`, so a replicated leader answers its followers once, with them all.
    async def main() -> list:
        with PartitionLog.open(tmp_path / "t-0", LogConfig()) as log:
            seen: list = []
            with ThreadPoolExecutor(2) as pool:
                lane = AppendLane(("t", 0), log, pool, seen.append)
                lane.submit_many([(n, batch(1), True) for n in (1, 2, 3)])
                await wait_for_async(lambda: len(seen) >= 3, what="the lane's reports")
                await lane.close()
            return seen

    seen = asyncio.run(main())
    assert [(s.ticket, s.more) for s in seen] == [(1, True), (2, True), (3, False)]


def test_interval_policy_flushes_after_the_last_append(tmp_path):
    # The append is answered before the interval's flush: at 20 ms a loaded machine (load
    # 10) once descheduled the lane's thread past it, and the append came back durable.
    config = LogConfig(flush="interval", flush_interval_ms=250)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        seen = asyncio.run(run_lane(log, [batch(1)], until=2))
    completed, durable = seen
    assert isinstance(completed, AppendCompleted) and completed.durable_end == 0
    assert durable == DurableAdvanced(("t", 0), 1)


def test_an_append_not_synced_lands_without_an_fsync_and_the_next_synced_one_covers_it(
        tmp_path):
    """Under "always": `sync=False` is answered with the log written but not durable; a synced
    append after it fsyncs the file, so both are durable."""
    async def main(log: PartitionLog) -> list:
        seen: list = []
        with ThreadPoolExecutor(2) as pool:
            lane = AppendLane(("t", 0), log, pool, seen.append)
            lane.submit(1, batch(2), False)
            async with asyncio.timeout(10):
                while not seen:
                    await asyncio.sleep(0.005)
            assert log.flushed_end_offset == 0  # written, no fsync
            lane.submit(2, batch(1))
            await wait_for_async(lambda: len(seen) >= 2, what="the lane's reports")
            await lane.close()
        return seen

    config = LogConfig(flush="always", flush_interval_ms=60_000)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        written, synced = asyncio.run(main(log))
        assert log.flushed_end_offset == 3
    assert (written.ticket, written.next_offset, written.durable_end) == (1, 2, 0)
    assert (synced.ticket, synced.next_offset, synced.durable_end) == (2, 3, 3)


def test_an_append_not_synced_is_flushed_by_itself_after_the_interval(tmp_path):
    """Under "always", with no synced append after it, the lane flushes it flush_interval_ms
    later: a written append always becomes durable (and visible)."""
    config = LogConfig(flush="always", flush_interval_ms=20)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        async def main() -> list:
            seen: list = []
            with ThreadPoolExecutor(2) as pool:
                lane = AppendLane(("t", 0), log, pool, seen.append)
                lane.submit(1, batch(1), False)
                await wait_for_async(lambda: len(seen) >= 2, what="the lane's reports")
                await lane.close()
            return seen

        completed, durable = asyncio.run(main())
        assert log.flushed_end_offset == 1
    assert isinstance(completed, AppendCompleted) and completed.durable_end == 0
    assert durable == DurableAdvanced(("t", 0), 1)


class HeldExecutor(Executor):
    """Runs what is submitted only when told (`run_all`), on the caller's thread."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future, Any, tuple]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self.jobs.append((future, fn, args))
        return future

    def run_all(self) -> int:
        ran = 0
        while self.jobs:
            future, fn, args = self.jobs.pop(0)
            future.set_result(fn(*args))
            ran += 1
        return ran


def test_an_inline_append_that_rolls_its_segment_runs_off_the_loop(tmp_path):
    """Under the "never" policy appends are written on the loop, but a commit that may roll
    the segment goes to the executor (a roll fsyncs the segment it seals: a 1 GiB segment
    stalled every partition of the broker for ~400 ms): meanwhile the partition's later
    appends queue behind it in order and another partition's appends are written at once."""
    async def run(a_log: PartitionLog, b_log: PartitionLog) -> tuple[list, int, list]:
        seen: list = []
        held = HeldExecutor()
        a = AppendLane(("a", 0), a_log, held, seen.append, inline=True)
        b = AppendLane(("b", 0), b_log, held, seen.append, inline=True)
        a.submit(1, batch(1))          # fits: written at once
        a.submit(2, batch(30))         # would roll: to the executor
        a.submit(3, batch(1))          # behind it, in order (one commit with it)
        b.submit(4, batch(1))          # another partition: not held up
        await asyncio.sleep(0)         # the lane's task starts and hands the roll over
        before = list(seen)
        ran = held.run_all()
        await wait_for_async(lambda: len(seen) >= 4, what="the lane's reports")
        await a.close()
        await b.close()
        return before, ran, seen

    config = LogConfig(segment_bytes=350)  # 69-byte batch(1), 301-byte batch(30)
    with PartitionLog.open(tmp_path / "a-0", config) as a_log, \
            PartitionLog.open(tmp_path / "b-0", config) as b_log:
        before, ran, seen = asyncio.run(run(a_log, b_log))
        assert a_log.segment_count == 3  # a2 and a3 each rolled (one commit)
    assert [(s.partition[0], s.ticket) for s in before] == [("a", 1), ("b", 4)]
    assert ran == 1
    assert [(s.ticket, s.base_offset, s.next_offset) for s in seen if s.partition[0] == "a"] \
        == [(1, 0, 1), (2, 1, 31), (3, 31, 32)]
    assert all(isinstance(s, AppendCompleted) for s in seen)


def test_an_append_not_synced_is_written_on_the_loop_under_always_and_keeps_its_order(
        tmp_path):
    """Under "always" an append not synced waits for no disk: an idle lane writes it at once,
    on the loop, rather than through the executor (the thread hop cost the transaction
    coordinator's AddPartitionsToTxn most of its time); one submitted while a synced commit is
    under way queues behind it, in order. (That the flush interval then makes it durable:
    test_an_append_not_synced_is_flushed_by_itself_after_the_interval.)"""
    async def run(log: PartitionLog) -> tuple[list, list, int, list]:
        seen: list = []
        held = HeldExecutor()
        lane = AppendLane(("t", 0), log, held, seen.append)
        lane.submit(1, batch(2), False)    # idle, not synced: written now
        first = list(seen)
        lane.submit(2, batch(1))           # synced: to the executor
        lane.submit(3, batch(1), False)    # behind it, in order
        await asyncio.sleep(0)             # the lane's task hands the commit over
        before = list(seen)
        ran = held.run_all()
        await wait_for_async(lambda: len(seen) >= 3, what="the lane's reports")
        await lane.close()
        return first, before, ran, seen

    config = LogConfig(flush="always", flush_interval_ms=60_000)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        first, before, ran, seen = asyncio.run(run(log))
        assert log.flushed_end_offset == 4  # the synced commit covers the first append
    assert [(s.ticket, s.base_offset, s.next_offset, s.durable_end) for s in first] == \
        [(1, 0, 2, 0)]
    assert [s.ticket for s in before] == [1]
    assert ran == 1  # the synced commit, 2 and 3 together
    assert [(s.ticket, s.base_offset, s.next_offset, s.durable_end) for s in seen] == \
        [(1, 0, 2, 0), (2, 2, 3, 0), (3, 3, 4, 4)]
