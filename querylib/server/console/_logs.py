"""A query's output lines for the console's query page, live (DESIGN §13 "Console").

Each executor writes its processes' lines to the `__logs` topic of its own broker, one record
per line keyed `<query>/<process>` (executor/_logs.py). `query_lines` subscribes to every
executor broker's `__logs` from the earliest offset, keeps one query's lines and yields them
in batches: what exists, then what comes, until the caller stops iterating. Only a page that
shows a query asks, so nobody pays for it otherwise. A broker that cannot be read (unreachable,
or gone longer than the reader waits for it) is said on the page in a line of the console's
own (process -1, stream "console") and read again, from where it stopped, until it answers.

Must not: buffer without bound (a batch holds at most `MAX_BATCH` lines; the page keeps the
last lines only), or act on the query.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from catalog.errors import TqError
from querylib.broker import AsyncSubscriber, Data
from querylib.broker.messages import ListPartitions, StartAt
from querylib.rpc import BROKER, Credential, RpcClient

__all__ = ["MAX_BATCH", "query_lines"]

MAX_BATCH = 500  # lines per batch handed to the page
RECENT = 50_000  # lines of every query's output read back before the live ones
_QUEUE = 64      # batches waiting for the page before the readers wait for it
RETRY_MAX = 10.0  # seconds at most between tries of a broker that cannot be read


def lines_of(query_id: int, records: Iterable[Any]) -> list[dict[str, Any]]:
    """This query's lines among `records` (the record layout of executor/_logs)."""
    prefix = f"{query_id}/".encode()
    out = []
    for record in records:
        if record.key is None or not record.key.startswith(prefix):
            continue
        process = record.key[len(prefix):].decode(errors="replace")
        headers = dict(record.headers)
        out.append({
            "process": int(process) if process.isdigit() else -1,
            "stream": (headers.get("stream") or b"stdout").decode(errors="replace"),
            "text": (record.value or b"").decode("utf-8", errors="replace"),
            "timestamp_ms": record.timestamp,
        })
    return out


async def query_lines(addresses: Iterable[str], credential: Credential, query_id: int, *,
                      timeout: float = 10.0, retry: float = 1.0
                      ) -> AsyncIterator[list[dict[str, Any]]]:
    """Batches of `query_id`'s lines from the `__logs` of the brokers at `addresses`. A broker
    that does not answer within `timeout` seconds (or is gone that long while read) is said in
    a line of its own and tried again `retry` seconds later, the wait doubling up to
    RETRY_MAX; once it answers, a line says so and its lines go on after the last one read."""
    queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue(_QUEUE)

    async def read(address: str) -> None:
        start: int | None = None  # the offset after the last record read
        wait, failing = retry, False
        while True:
            try:
                at = start if start is not None else await _recent(address, credential, timeout)
                async with AsyncSubscriber(address, "__logs", [0], secret=credential, start=at,
                                           follow=True, timeout=timeout,
                                           reconnect_timeout=timeout) as subscriber:
                    if failing:
                        failing, wait = False, retry
                        await queue.put([_notice(f"reading the output on {address} again")])
                    async for event in subscriber:
                        if isinstance(event, Data) and event.records:
                            start = event.records[-1].offset + 1
                            lines = lines_of(query_id, event.records)
                            for first in range(0, len(lines), MAX_BATCH):
                                await queue.put(lines[first:first + MAX_BATCH])
            except TqError as exc:
                if not failing:
                    failing = True
                    await queue.put([_notice(f"cannot read {address} now ({exc}); its lines "
                                             f"will follow once it answers")])
            await asyncio.sleep(wait)
            wait = min(2 * wait, RETRY_MAX)

    readers = [asyncio.create_task(read(address)) for address in sorted(set(addresses))]
    try:
        while True:
            yield await queue.get()
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


def _notice(text: str) -> dict[str, Any]:
    """A line of the console's own among a query's lines (process -1)."""
    return {"process": -1, "stream": "console", "text": text,
            "timestamp_ms": int(time.time() * 1000)}


async def _recent(address: str, credential: Credential, timeout: float) -> StartAt:
    """Where reading the last `RECENT` records of a broker's `__logs` starts."""
    async with RpcClient(address, credential, audience=BROKER, timeout=timeout) as client:
        reply = await client.request(ListPartitions(topic="__logs"))
    for info in reply.partitions:
        if info.partition == 0:
            return max(info.log_start, info.log_end - RECENT)
    return "earliest"
