"""The console's reading of a query's output lines from `__logs` records."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from executor import LogForwarder, LogLine
from querylib.records import Record
from querylib.rpc import Credential
from querylib.server.broker import BrokerServer
from querylib.server.console._logs import lines_of, query_lines
from tests.conftest import free_port


def test_only_the_querys_lines_with_their_process_and_stream() -> None:
    records = [Record(0, 1000, b"12/0", b"hello", ()),
               Record(1, 1001, b"120/0", b"another query's", ()),
               Record(2, 1002, b"12/1", b"oops \xff", (("stream", b"stderr"),)),
               Record(3, 1003, None, b"no key", ())]
    assert lines_of(12, records) == [
        {"process": 0, "stream": "stdout", "text": "hello", "timestamp_ms": 1000},
        {"process": 1, "stream": "stderr", "text": "oops \ufffd", "timestamp_ms": 1002}]


def test_a_broker_that_cannot_be_read_is_said_on_the_page_and_read_once_it_can(
        tmp_path: Path) -> None:
    """A query's output on an executor whose broker cannot be reached now: before, its reader
    died silently and the page showed the other executors' lines as if they were all. Now
    the page is told, and the lines come once the broker answers again."""
    secret = os.urandom(32)
    credential = Credential.of(secret)
    down_port = free_port()
    down = f"tcp://127.0.0.1:{down_port}"

    async def write(broker: BrokerServer, text: str) -> None:
        forwarder = await LogForwarder(broker.port).start()
        await forwarder(LogLine(query_id=12, process=0, stream="stdout", text=text,
                                timestamp_ms=1))
        await forwarder.flush()
        await forwarder.close()

    async def go() -> list[dict[str, Any]]:
        up = BrokerServer(tmp_path / "up", secret)
        up_address = await up.start()
        await write(up, "from the broker that is up")
        later = BrokerServer(tmp_path / "later", secret)
        seen: list[dict[str, Any]] = []
        lines = query_lines([up_address, down], credential, 12, timeout=1.0, retry=0.2)
        try:
            async def until(text: str) -> None:
                while not any(text in line["text"] for line in seen):
                    seen.extend(await anext(lines))

            await asyncio.wait_for(until("from the broker that is up"), 30)
            await asyncio.wait_for(until(f"cannot read {down}"), 30)
            await later.start(down)
            await write(later, "from the broker that came back")
            await asyncio.wait_for(until("from the broker that came back"), 30)
        finally:
            await lines.aclose()
            await up.close()
            await later.close()
        return seen

    seen = asyncio.run(go())
    notices = [line for line in seen if line["process"] == -1]
    assert notices and all(line["stream"] == "console" for line in notices)
    assert any(f"{down} again" in line["text"] for line in notices)
