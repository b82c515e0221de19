"""Re-running on a real `tq up` (issue 14, problem 5): the same publisher submitted twice
appends to its topic, the second query taking it over from the first (which ended); a
publisher whose topic's owner still runs fails saying what to do. DESIGN §3 "Ownership"."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import querylib
from catalog import PrincipalRef, QueryRef, QueryState
from tests.conftest import wait_for
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(300)

PUBLISHER = textwrap.dedent('''
    import sys
    import time
    from pathlib import Path
    import querylib

    def main(ctx):
        base = int(sys.argv[1])
        gate = Path(sys.argv[2]) if len(sys.argv) > 2 else None
        with ctx.publish("nums") as out:
            start = out.resumed_at  # a re-run appends: it goes on from the topic's time
            out.send(start, [base + 10 * ctx.process + i for i in range(3)])
            out.advance_to(start + 1)
            while gate is not None and not gate.exists():
                time.sleep(0.05)

    querylib.execute(main)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


def _values(up: Up, topic: str) -> list[int]:
    """Every value of `topic` from its start to its current end of stream."""
    values: list[int] = []
    with up.connect() as ctx, ctx.subscribe(topic, timeout=30) as sub:
        for event in sub:
            if isinstance(event, querylib.Data):
                values += event.records
    return sorted(values)


def test_the_same_publisher_submitted_twice_appends(up: Up, tmp_path: Path) -> None:
    program = tmp_path / "nums.py"
    program.write_text(PUBLISHER)
    first = up.submit(program, "--processes", "2", "--", "100")
    assert up.ended(first).state is QueryState.FINISHED
    again = up.submit(program, "--processes", "2", "--", "200")
    done = up.ended(again)
    logs = up.tq("logs", str(again)).stdout
    assert done.state is QueryState.FINISHED, logs
    with up.cluster() as cluster:
        assert cluster.lookup_topic("nums").topic.owner == QueryRef(again)
    assert _values(up, "nums") == [100, 101, 102, 110, 111, 112,
                                   200, 201, 202, 210, 211, 212]


def test_a_running_owners_topic_is_refused_with_what_to_do(up: Up, tmp_path: Path) -> None:
    program = tmp_path / "held.py"
    program.write_text(PUBLISHER.replace('"nums"', '"held"'))
    gate = tmp_path / "gate"
    first = up.submit(program, "--", "1", str(gate))
    wait_for(lambda: up.query(first).state is QueryState.RUNNING, timeout=60,
             what="the first query to run")
    try:
        second = up.submit(program, "--", "2")
        assert up.ended(second).state is QueryState.FAILED
        logs = up.tq("logs", str(second)).stdout
        assert (f"topic 'held' is owned by query {first}, which is still running: stop it "
                f"first (tq kill {first}) or publish to another topic") in logs, logs
    finally:
        gate.write_text("")
    assert up.ended(first).state is QueryState.FINISHED
    with up.cluster() as cluster:
        assert cluster.lookup_topic("held").topic.owner == QueryRef(first)


@pytest.mark.parametrize("merge", [False, True], ids=["per-worker", "merge"])
def test_the_numbers_example_run_twice_appends(up: Up, merge: bool) -> None:
    """Problem 5 as a user meets it: `tq submit querylib/examples/numbers_query.py` twice."""
    topic = f"numbers-{'merge' if merge else 'pw'}"
    program = Path(querylib.__file__).parent / "examples" / "numbers_query.py"
    args = ["--processes", "2", "--workers", "2", "--", "--topic", topic, "--times", "5"]
    if merge:
        args.append("--merge")
    runs = [up.submit(program, *args)]
    assert up.ended(runs[0]).state is QueryState.FINISHED
    runs.append(up.submit(program, *args))
    second = up.ended(runs[1])
    assert second.state is QueryState.FINISHED, up.tq("logs", str(runs[1])).stdout
    times: dict[int, list[int]] = {}
    with up.connect() as ctx, ctx.subscribe(topic, timeout=30) as sub:
        for event in sub:
            if isinstance(event, querylib.Data):
                times.setdefault(event.time, []).extend(event.records)
    # Both runs' numbers, the second's at the times after the first's.
    assert sorted(times) == list(range(10))
    assert sorted(n for t in range(5) for n in times[t]) == list(range(400))
    assert sorted(n for t in range(5, 10) for n in times[t]) == list(range(400))
    assert all(n % 5 == t % 5 for t, values in times.items() for n in values)


def test_a_script_run_directly_after_a_query_appends(up: Up) -> None:
    """`python job.py` (a client session of the same principal) takes over the topic the
    submitted query left, and a second direct run appends again."""
    topic = "numbers-direct"
    program = Path(querylib.__file__).parent / "examples" / "numbers_query.py"
    args = ["--", "--topic", topic, "--times", "2"]
    assert up.ended(up.submit(program, *args)).state is QueryState.FINISHED
    for _ in range(2):
        done = subprocess.run([sys.executable, str(program), *args[1:]], env=up.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    with up.cluster() as cluster:
        assert cluster.lookup_topic(topic).topic.owner == PrincipalRef("admin")
    assert _values(up, topic) == sorted(list(range(100)) * 3)


def test_a_rerun_of_another_shape_says_to_delete_the_topic(up: Up, tmp_path: Path) -> None:
    program = tmp_path / "shape.py"
    program.write_text(PUBLISHER.replace('"nums"', '"shaped"'))
    assert up.ended(up.submit(program, "--", "1")).state is QueryState.FINISHED
    wider = up.submit(program, "--processes", "2", "--", "2")
    assert up.ended(wider).state is QueryState.FAILED
    logs = up.tq("logs", str(wider)).stdout
    assert ("topic 'shaped' has 1 partition; this publication needs 2: publish to another "
            "topic, or delete it first (tq topic delete shaped)") in logs, logs
