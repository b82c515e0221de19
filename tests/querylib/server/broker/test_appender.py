"""AppendLane: one partition's appends in order, off the loop, with group commit; a bad batch
fails alone; under the "interval" policy a flush follows appends by itself."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from querylib.broker._stream import encode_records
from querylib.errors import CorruptRecordError
from querylib.log import LogConfig, PartitionLog
from querylib.server.broker._appender import AppendLane
from querylib.server.broker._events import AppendCompleted, AppendFailed, DurableAdvanced


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
        async with asyncio.timeout(10):  # a condition with a deadline
            while len(seen) < until:
                await asyncio.sleep(0.005)
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


def test_interval_policy_flushes_after_the_last_append(tmp_path):
    config = LogConfig(flush="interval", flush_interval_ms=20)
    with PartitionLog.open(tmp_path / "t-0", config) as log:
        seen = asyncio.run(run_lane(log, [batch(1)], until=2))
    completed, durable = seen
    assert isinstance(completed, AppendCompleted) and completed.durable_end == 0
    assert durable == DurableAdvanced(("t", 0), 1)
