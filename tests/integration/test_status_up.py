"""Seeing processes on a real `tq up` (issue 14, problems 8 and 9): `tq status` shows each
query process's pid, CPU and RSS and each executor's load, from the executors' heartbeats;
the pid it shows is a process titled `tq query ID NAME i/n`."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from catalog import QueryState
from tests.conftest import wait_for
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(240)

WAITER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        while not Path(sys.argv[1]).exists():
            time.sleep(0.05)

    querylib.execute(main)
''')

PROCESS_LINE = re.compile(r"^ +process (\d+): pid (\d+), cpu (\d+\.\d)%, rss (\d+) MiB$")
EXECUTOR_LINE = re.compile(r"^  executor \d+ on .*; load: cpu \d+%, memory \d+ MiB used, "
                           r"\d+ MiB available, disk \d+ GiB free$")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


def test_status_shows_each_process_pid_cpu_rss_and_the_executors_load(up: Up,
                                                                        tmp_path: Path) -> None:
    program = tmp_path / "waiter.py"
    program.write_text(WAITER)
    gate = tmp_path / "gate"
    query_id = up.submit(program, "--processes", "2", "--name", "clicks", "--", str(gate))
    try:
        wait_for(lambda: up.query(query_id).state is QueryState.RUNNING, timeout=60,
                 what="the query to run")

        def shown() -> list[str] | None:
            out = up.tq("status").stdout.splitlines()
            found = [line for line in out if PROCESS_LINE.match(line)]
            return out if len(found) == 2 else None

        lines = wait_for(shown, timeout=60, interval=0.2,
                         what="tq status to show both processes (a heartbeat's load)")
        assert any(EXECUTOR_LINE.match(line) for line in lines), "\n".join(lines)
        processes = {int(m[1]): int(m[2]) for line in lines if (m := PROCESS_LINE.match(line))}
        assert sorted(processes) == [0, 1]
        for index, pid in processes.items():
            title = " ".join(psutil.Process(pid).cmdline()).strip()  # as ps shows it
            assert title == f"tq query {query_id} clicks {index}/2", title
        # The same, for scripts.
        body = json.loads(up.tq("status", "--json").stdout)
        loads = body["loads"]
        (load,) = loads.values()
        assert sorted((p["query_id"], p["process"], p["pid"]) for p in load["per_process"]) == \
            sorted((query_id, i, pid) for i, pid in processes.items())
    finally:
        gate.write_text("")
    assert up.ended(query_id).state is QueryState.FINISHED


BULK_WRITER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        with ctx.publish("backlog") as out:   # the stream stays open until told
            for t in range(60):
                out.send(t, ["x" * 200] * 500)
                out.advance_to(t + 1)
            while not Path(sys.argv[1]).exists():
                time.sleep(0.05)

    querylib.execute(main)
''')

SLOW_READER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        with ctx.subscribe("backlog", timeout=60) as sub:
            while not Path(sys.argv[1]).exists():   # holds its credit, reads nothing
                time.sleep(0.05)
            for event in sub:
                pass

    querylib.execute(main)
''')

LAG = re.compile(r"^ +subscribes backlog \(1 partition\), lag (\d+) records?$")


def test_status_shows_a_subscribers_lag_until_it_catches_up(up: Up, tmp_path: Path) -> None:
    (tmp_path / "writer.py").write_text(BULK_WRITER)
    (tmp_path / "reader.py").write_text(SLOW_READER)
    done, read = tmp_path / "done", tmp_path / "read"
    writer = up.submit(tmp_path / "writer.py", "--name", "backlog-writer", "--", str(done))
    reader = up.submit(tmp_path / "reader.py", "--name", "backlog-reader", "--", str(read))
    try:
        def lag() -> int | None:
            for line in up.tq("status").stdout.splitlines():
                if m := LAG.match(line):
                    return int(m[1])
            return None

        # 60 x 500 records of ~200 bytes; the reader's 4 MiB of credit holds a part of them
        wait_for(lambda: (n := lag()) is not None and n > 1000, timeout=90, interval=0.3,
                 what="tq status to show the reader's lag")
        body = json.loads(up.tq("status", "--json").stdout)
        (entry,) = [e for e in body["lags"] if e["principal"] == f"query:{reader}"]
        assert entry["topic"].endswith("/backlog") and entry["lag_records"] > 1000
        read.write_text("")
        wait_for(lambda: lag() == 0, timeout=90, interval=0.3, what="the lag to fall to 0")
        out = up.tq("status", str(reader)).stdout  # the query's own status says it too
        assert "subscribes backlog (1 partition), lag 0 records" in out, out
    finally:
        done.write_text("")
        read.write_text("")
    assert up.ended(writer).state is QueryState.FINISHED
