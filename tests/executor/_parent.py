"""An executor-like parent for the death-signal test: supervises one query process, prints
its pid and its output as JSON lines, then waits to be killed.

    python -m tests.executor._parent PROGRAM_DIR WORK_ROOT
"""

from __future__ import annotations

import asyncio
import json
import sys

from executor import LogLine, SpawnSpec, Supervisor


async def main(program: str, work_root: str) -> None:
    async def sink(line: LogLine) -> None:
        print(json.dumps({"line": line.text}), flush=True)

    supervisor = Supervisor(work_root=work_root, sink=sink)
    running = await supervisor.spawn(SpawnSpec(query_id=1, process=0), program)
    print(json.dumps({"child": running.pid}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
