"""A process whose descriptors run out while two TcpListeners serve (for test_tcp.py).

It lowers its open-files limit, gives its listeners a budget larger than the limit (so accept()
itself fails with EMFILE, as when something else in a process eats its descriptors), takes
every free descriptor, and then obeys commands on stdin, one per line, answering each with a
JSON line: `status` (counters), `release` (give the descriptors back), `stop`. Logs go to
stderr. Each listener echoes the first bytes a connection sends and then waits for its end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import sys

from querylib._tcp import Connection, ConnectionBudget, TcpListener


async def echo(conn: Connection) -> None:
    reader, writer = await conn.streams()
    data = await reader.read(100)
    writer.write(data)
    await writer.drain()
    await reader.read(100)


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    budget = ConnectionBudget(10_000)
    a = TcpListener("listener A", echo, "127.0.0.1", 0, budget=budget)
    b = TcpListener("listener B", echo, "127.0.0.1", 0, budget=budget)
    ports = [(await a.start())[1], (await b.start())[1]]
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()
    # stdin through a reader on the loop: no thread, no new descriptor
    loop.add_reader(sys.stdin.fileno(),
                    lambda: lines.put_nowait(sys.stdin.readline().strip()))
    hog = []
    while True:
        try:
            hog.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            break
    print(json.dumps({"ports": ports, "hogged": len(hog)}), flush=True)
    while True:
        command = await lines.get()
        if command == "release":
            for fd in hog:
                os.close(fd)
            hog.clear()
        elif command in ("stop", ""):
            break
        print(json.dumps({"a": dict(a.counters), "b": dict(b.counters)}), flush=True)
    await a.close()
    await b.close()


if __name__ == "__main__":
    asyncio.run(main())
