"""A query's output lines for the console's query page, live (DESIGN §13 "Console").

Each executor writes its processes' lines to the `__logs` topic of its own broker, one record
per line keyed `<query>/<process>` (executor/_logs.py). `query_lines` subscribes to every
executor broker's `__logs` from the earliest offset, keeps one query's lines and yields them
in batches: what exists, then what comes, until the caller stops iterating. Only a page that
shows a query asks, so nobody pays for it otherwise.

Must not: buffer without bound (a batch holds at most `MAX_BATCH` lines; the page keeps the
last lines only), or act on the query.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from querylib.broker import AsyncSubscriber, Data
from querylib.broker.messages import ListPartitions, StartAt
from querylib.rpc import BROKER, Credential, RpcClient

__all__ = ["MAX_BATCH", "query_lines"]

MAX_BATCH = 500  # lines per batch handed to the page
RECENT = 50_000  # lines of every query's output read back before the live ones
_QUEUE = 64      # batches waiting for the page before the readers wait for it


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


async def query_lines(addresses: Iterable[str], credential: Credential, query_id: int
                      ) -> AsyncIterator[list[dict[str, Any]]]:
    """Batches of `query_id`'s lines from the `__logs` of the brokers at `addresses`."""
    queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue(_QUEUE)

    async def read(address: str) -> None:
        async with AsyncSubscriber(address, "__logs", [0], secret=credential,
                                   start=await _recent(address, credential),
                                   follow=True) as subscriber:
            async for event in subscriber:
                if isinstance(event, Data):
                    lines = lines_of(query_id, event.records)
                    for start in range(0, len(lines), MAX_BATCH):
                        await queue.put(lines[start:start + MAX_BATCH])

    readers = [asyncio.create_task(read(address)) for address in sorted(set(addresses))]
    try:
        while True:
            yield await queue.get()
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def _recent(address: str, credential: Credential) -> StartAt:
    """Where reading the last `RECENT` records of a broker's `__logs` starts."""
    async with RpcClient(address, credential, audience=BROKER, timeout=10.0) as client:
        reply = await client.request(ListPartitions(topic="__logs"))
    for info in reply.partitions:
        if info.partition == 0:
            return max(info.log_start, info.log_end - RECENT)
    return "earliest"
