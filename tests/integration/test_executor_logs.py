"""Query output reaches the `__logs` topic: a real broker in this process (the forwarder
writes through its in-process door, as tq itself), real query processes under a Supervisor
whose sink is a LogForwarder, read back over RPC with querylib.broker.AsyncSubscriber."""

from __future__ import annotations

import asyncio

from executor import (
    LOGS_TOPIC,
    ArtifactCache,
    LogForwarder,
    SpawnSpec,
    Supervisor,
    line_of_record,
    pack_path,
)
from querylib.broker import AsyncSubscriber, Data
from querylib.server.broker import BrokerServer
from tests.executor._support import write_program
from tests.integration._broker_helpers import secret_file

CHATTY = """
    import os, sys
    me = os.environ["TQ_PROCESS_INDEX"]
    for i in range(500):
        print(f"p{me} out {i}")
        if i % 50 == 0:
            print(f"p{me} err {i}", file=sys.stderr)
    print("L" * 2500)
    sys.stdout.write(f"p{me} last words")
"""


def test_lines_of_two_processes_reach_the_logs_partition_in_order(tmp_path):
    _, secret = secret_file(tmp_path)
    src = write_program(tmp_path / "src" / "chatty.py", CHATTY)
    artifact = ArtifactCache(tmp_path / "artifacts").install(pack_path(src, max_bytes=1 << 20))

    async def go():
        broker = BrokerServer(tmp_path / "broker", secret)
        address = await broker.start()
        forwarder = await LogForwarder(broker.port).start()
        sup = Supervisor(work_root=tmp_path / "work", sink=forwarder, max_line=1000)
        try:
            runs = [await sup.spawn(SpawnSpec(query_id=21, process=p, processes=2),
                                    artifact.program) for p in (0, 1)]
            codes = [(await run.wait()).exit_code for run in runs]
            await forwarder.flush()
            async with AsyncSubscriber(address, LOGS_TOPIC, 0, secret=secret,
                                       start="earliest", follow=False) as sub:
                records = [r async for event in sub if isinstance(event, Data)
                           for r in event.records]
        finally:
            await sup.close()
            await forwarder.close()
            await broker.close()
        return codes, forwarder, records

    codes, forwarder, records = asyncio.run(go())
    assert codes == [0, 0]
    assert forwarder.failures == 0
    assert forwarder.forwarded == len(records) == 2 * (500 + 10 + 3 + 1)
    assert [r.offset for r in records] == list(range(len(records)))
    for p in (0, 1):
        lines = [line_of_record(r) for r in records if r.key == f"21/{p}".encode()]
        assert all(line is not None and (line.query_id, line.process) == (21, p)
                   for line in lines)
        out = [line for line in lines if line.stream == "stdout"]
        err = [line for line in lines if line.stream == "stderr"]
        assert [line.text for line in out[:500]] == [f"p{p} out {i}" for i in range(500)]
        assert [(len(x.text), x.continues) for x in out[500:503]] == [
            (1000, True), (1000, True), (500, False)]
        assert out[503].text == f"p{p} last words" and len(out) == 504
        assert [line.text for line in err] == [f"p{p} err {i}" for i in range(0, 500, 50)]
        stamps = [r.timestamp for r in records if r.key == f"21/{p}".encode()]
        assert all(s > 0 for s in stamps)
        headers = {dict(r.headers)["stream"] for r in records if r.key == f"21/{p}".encode()}
        assert headers == {b"stdout", b"stderr"}


def test_a_dead_broker_costs_log_lines_not_the_query(processes, tmp_path):
    """The broker dies before the query writes: the query runs to its end, its exit is
    reported, and the forwarder counts the failure instead of raising into the agent."""
    _, secret = secret_file(tmp_path)
    src = write_program(tmp_path / "src" / "chatty.py", CHATTY)
    artifact = ArtifactCache(tmp_path / "artifacts").install(pack_path(src, max_bytes=1 << 20))

    async def go():
        broker = BrokerServer(tmp_path / "broker", secret)
        await broker.start()
        forwarder = await LogForwarder(broker.port, timeout=1.0, linger=0.001).start()
        await broker.close()
        sup = Supervisor(work_root=tmp_path / "work", sink=forwarder)
        try:
            await sup.spawn(SpawnSpec(query_id=22, process=0), artifact.program)
            report = await sup.wait((22, 0))
        finally:
            await sup.close()
            await forwarder.close()  # counts the failed batches rather than raising
        return report, forwarder

    report, forwarder = asyncio.run(go())
    assert report.exit_code == 0
    assert forwarder.failures >= 1
