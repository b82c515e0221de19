"""Queries wait for slots and start together, on a real `tq up` (issue 14 problems 4 and 10;
DESIGN §6 "Slots, the pending queue and the start barrier"):

- with tq up's default slots, a 1-process subscriber plus a 2-process publisher both run on a
  2-core machine;
- a query that does not fit the free slots is `pending` (`tq submit` says so, `tq status`
  lists it), starts once slots free, or fails at its `--start-timeout` saying why;
- `execute()` runs `main` only once every process of the query registered, and
  `--start-timeout` is the coordinator's limit: a query whose process never registers fails
  then, not 60 s later."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import QueryState
from tests.conftest import wait_for
from tests.coordinator._cluster import ROOT
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(240)

SUBSCRIBER = """\
import sys
import querylib

def main(ctx):
    want = int(sys.argv[2])
    seen = 0
    with ctx.subscribe(sys.argv[1], serde="json", timeout=60) as sub:
        for event in sub:
            seen += len(getattr(event, "records", ()) or ())
            if seen >= want:
                break
    print("subscriber saw", seen)

querylib.execute(main)
"""

PUBLISHER = """\
import sys
import querylib

def main(ctx):
    with ctx.publish(sys.argv[1], serde="json") as out:
        out.send(0, range(ctx.index * 100, ctx.index * 100 + 100))
        out.advance_to(1)

querylib.execute(main)
"""

BLOCKER = """\
import os, sys, time
import querylib

def main(ctx):
    deadline = time.monotonic() + 120
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)

querylib.execute(main)
"""

# Process 1 starts slowly (imports, loading data) and only then registers; process 0's main
# must not run before: it checks that process 1 got that far.
SLOW_SIBLING = """\
import os, sys, time
import querylib

marker = sys.argv[1]
if os.environ["TQ_PROCESS_INDEX"] == "1":
    time.sleep(2)
    open(marker, "w").close()

def main(ctx):
    if not os.path.exists(marker):
        print("main ran before process 1 registered", file=sys.stderr)
        sys.exit(3)

querylib.execute(main)
"""

# Process 1 never gets to register.
NEVER_REGISTERS = """\
import os, time
import querylib

if os.environ["TQ_PROCESS_INDEX"] == "1":
    time.sleep(120)

querylib.execute(lambda ctx: None)
"""


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


@pytest.fixture
def up2(tmp_path: Path) -> Iterator[Up]:
    with Up(tmp_path / "home", slots=2) as up:
        yield up


def test_default_slots_run_a_subscriber_and_a_two_process_publisher(tmp_path: Path) -> None:
    """Problem 4: on a 2-core machine tq up's default slots (was: one per core) take both."""
    sub = _write(tmp_path, "sub.py", SUBSCRIBER)
    pub = _write(tmp_path, "pub.py", PUBLISHER)
    with Up(tmp_path / "home", slots=None) as up:
        subscriber = up.submit(sub, "--", "nums", "200")
        publisher = up.submit(pub, "--processes", "2", "--", "nums")
        assert up.ended(publisher).state == QueryState.FINISHED, up.query(publisher).reason
        assert up.ended(subscriber).state == QueryState.FINISHED, up.query(subscriber).reason


def test_a_query_that_does_not_fit_waits_pending_then_runs(up2: Up, tmp_path: Path) -> None:
    blocker = _write(tmp_path, "blocker.py", BLOCKER)
    pub = _write(tmp_path, "pub.py", PUBLISHER)
    release = tmp_path / "release"
    blocking = up2.submit(blocker, "--", str(release))  # 1 of the 2 slots
    waiting = subprocess.Popen(
        [sys.executable, "-m", "querylib.cli", "submit", str(pub), "--processes", "2", "--",
         "pending-nums"], env=up2.env, cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        status = wait_for(lambda: "pending queries (1)" in (s := up2.tq("status").stdout) and s,
                          timeout=60, interval=0.1, what="tq status to list the pending query")
        assert "[pending] waits for 2 free process slots" in status
        release.touch()  # the blocker ends: its slot frees, the publisher starts
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 0, err
    query_id = int(out.split()[0])
    assert f"query {query_id} (pub) pending: waits for 2 free process slots" in err
    assert up2.ended(blocking).state == QueryState.FINISHED
    assert up2.ended(query_id).state == QueryState.FINISHED, up2.query(query_id).reason


def test_a_pending_query_fails_at_its_start_timeout_saying_why(up2: Up, tmp_path: Path) -> None:
    blocker = _write(tmp_path, "blocker.py", BLOCKER)
    release = tmp_path / "release"
    blocking = up2.submit(blocker, "--", str(release))
    try:
        done = up2.tq("submit", str(blocker), "--processes", "2", "--start-timeout", "3", "--",
                      str(release))
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert "Traceback" not in done.stderr
        assert "waited 3s for 2 free process slots (1 of the executors' 2 are free)" in lines[-1]
        assert "--slots" in lines[-1]
        (failed,) = [q for q in up2.queries() if q.state == QueryState.FAILED]
        assert failed.reason.startswith("waited 3s for 2 free process slots")
    finally:
        release.touch()
    assert up2.ended(blocking).state == QueryState.FINISHED


def test_main_runs_only_once_every_process_registered(up2: Up, tmp_path: Path) -> None:
    """Problem 10: process 0's workers ran 3 s before process 1 registered."""
    program = _write(tmp_path, "slow.py", SLOW_SIBLING)
    query_id = up2.submit(program, "--processes", "2", "--", str(tmp_path / "registered"))
    query = up2.ended(query_id)
    assert query.state == QueryState.FINISHED, (query.reason, query.exit_codes)


def test_start_timeout_is_the_coordinators_limit(up2: Up, tmp_path: Path) -> None:
    """Problem 10: `--start-timeout 3` bounded only the client's wait; the query stayed
    submitted until the coordinator's fixed 60 s."""
    program = _write(tmp_path, "never.py", NEVER_REGISTERS)
    done = up2.tq("submit", str(program), "--processes", "2", "--start-timeout", "3")
    assert done.returncode != 0
    assert "not every process registered within 3s" in done.stderr.strip().splitlines()[-1]
    (query,) = up2.queries()
    assert query.state == QueryState.FAILED  # at once, in the catalog too
    assert "not every process registered within 3s (process 1 did not)" in query.reason


def _never_runs(ctx: object) -> None:
    raise AssertionError("a query that cannot fit must not run")


def test_submit_start_timeout_is_the_coordinators_limit_too(up2: Up) -> None:
    """`querylib.submit(start_timeout=)`: 3 processes never fit 2 slots; the coordinator fails
    the query at the timeout and the handle's exception says why."""
    import querylib
    from querylib.cluster import QueryFailedError

    with pytest.raises(QueryFailedError, match=r"waited 2s for 3 free process slots \(2 of "
                       r"the executors' 2 are free\)"):
        querylib.submit(_never_runs, processes=3, start_timeout=2,
                        coordinator=up2.info["coordinator"],
                        secret_file=up2.info["secret_file"])
    (query,) = up2.queries()
    assert query.state == QueryState.FAILED and query.executors == ()
