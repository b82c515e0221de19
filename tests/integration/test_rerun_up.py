"""Re-running on a real `tq up` (issue 14, problem 5): the same publisher submitted twice
appends to its topic, the second query taking it over from the first (which ended), in a new
epoch: its times start at 0 again and readers see the frontier only move forward by (epoch,
time); a publisher whose topic's owner still runs fails saying what to do. DESIGN §3
"Ownership", §5 "Epochs"."""

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
            out.send(0, [base + 10 * ctx.process + i for i in range(3)])  # as a first run does
            out.advance_to(1)
            while gate is not None and not gate.exists():
                time.sleep(0.05)

    querylib.execute(main)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


def _events(up: Up, topic: str) -> list[object]:
    """Every event of `topic` from its start to its current end of stream, checking the
    frontier promise on the way: Progress only moves forward by (epoch, time), and no Data
    comes below the last Progress."""
    events: list[object] = []
    promised = (0, 0)
    with up.connect() as ctx, ctx.subscribe(topic, timeout=30) as sub:
        for event in sub:
            events.append(event)
            if isinstance(event, querylib.Progress):
                assert (event.epoch, event.frontier) > promised, events
                promised = (event.epoch, event.frontier)
            elif isinstance(event, querylib.Data):
                assert (event.epoch, event.time) >= promised, events
    assert isinstance(events[-1], querylib.EndOfStream), events
    return events


def _values(up: Up, topic: str) -> list[int]:
    """Every value of `topic` from its start to its current end of stream."""
    return sorted(v for e in _events(up, topic) if isinstance(e, querylib.Data)
                  for v in e.records)


def _by_epoch(up: Up, topic: str) -> dict[int, dict[int, list[int]]]:
    """epoch -> time -> values (sorted: records of one time from different partitions come
    in no set order), of every record of `topic`."""
    found: dict[int, dict[int, list[int]]] = {}
    for event in _events(up, topic):
        if isinstance(event, querylib.Data):
            found.setdefault(event.epoch, {}).setdefault(event.time, []).extend(event.records)
    return {epoch: {t: sorted(values) for t, values in times.items()}
            for epoch, times in found.items()}


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
    # Both runs sent at time 0: the second in an epoch of its own, after the first's.
    first_epoch, second_epoch = sorted(_by_epoch(up, "nums"))
    assert first_epoch == 0 < second_epoch
    assert _by_epoch(up, "nums")[second_epoch] == {0: [200, 201, 202, 210, 211, 212]}


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
    # Both runs' numbers at times 0..4, the second's in a later epoch.
    epochs = _by_epoch(up, topic)
    assert len(epochs) == 2 and min(epochs) == 0
    for times in epochs.values():
        assert sorted(times) == list(range(5))
        assert sorted(n for values in times.values() for n in values) == list(range(400))
        assert all(n % 5 == t for t, values in times.items() for n in values)


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
