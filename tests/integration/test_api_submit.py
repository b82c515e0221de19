"""`querylib.submit` on a real `tq up`: a cloudpickled closure submitted from a script runs as a
2 x 2 query and a subscriber reads what it published; the handle waits for the end, reports a
failed function with its exit codes and traceback in `tq logs`, and kills a running one;
functions of an importable module travel by value when asked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import querylib
from querylib.cluster import QueryFailedError, QueryTimeoutError
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent('''
    import sys
    import querylib

    def make(topic, offset):
        def job(ctx, scale):
            with ctx.publish(topic) as out:
                out.send(0, [offset + scale * ctx.index])
                out.advance_to(1)
        return job

    with querylib.submit(make(sys.argv[1], 1000), processes=2, workers=2, name="closure",
                         args=(10,), wait=True) as query:
        print(query.query_id, query.query.state.value, *query.query.exit_codes, flush=True)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


@pytest.fixture
def home(up: Up, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TQ_HOME", str(up.home))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    return up.home


def test_a_closure_submitted_from_a_script_publishes(up: Up, home: Path) -> None:
    script = home / "submit_closure.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), "closure"], env=up.env, cwd=home,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    query_id, state, *codes = done.stdout.split()
    assert (state, codes) == ("finished", ["0", "0"])
    assert up.query(int(query_id)).program.startswith("sha256:")
    values: list[int] = []
    with querylib.connect() as ctx, ctx.subscribe("closure", timeout=30) as sub:
        for event in sub:
            if isinstance(event, querylib.Data):
                values += event.records
    assert sorted(values) == [1000, 1010, 1020, 1030]


def _fails(ctx: querylib.Context) -> None:
    raise RuntimeError(f"worker {ctx.index} gives up")


def _sleeps(ctx: querylib.Context, marker: str) -> None:
    Path(marker, str(ctx.index)).write_text("")
    while True:
        time.sleep(0.2)


def test_a_failing_function_fails_its_query(up: Up, home: Path) -> None:
    # `_fails` lives in this test module: by value, so executors need not import it.
    with querylib.submit(_fails, by_value=[sys.modules[__name__]]) as query:
        ended = query.wait(timeout=60)
    assert ended.state.value == "failed" and ended.exit_codes == (1,)
    # The reason names the exception and the function's own line, not tq's frames.
    line = _fails.__code__.co_firstlineno + 1
    assert ended.reason == ("process 0 exited with code 1: RuntimeError: worker 0 gives up "
                            f"(at {__file__}:{line} in _fails)"), ended.reason
    logs = up.tq("logs", str(query.query_id))
    assert "[0 stderr] RuntimeError: worker 0 gives up" in logs.stdout.splitlines()


def test_a_function_executors_cannot_import_names_its_module(up: Up, home: Path,
                                                              tmp_path: Path) -> None:
    # A module only the submitter can import (as a file next to a notebook would be).
    (tmp_path / "my_jobs_14.py").write_text("def job(ctx):\n    print('ran', ctx.index)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import my_jobs_14  # type: ignore[import-not-found]

        with pytest.raises(QueryFailedError) as failed:
            querylib.submit(my_jobs_14.job)
        message = str(failed.value)
        assert "module 'my_jobs_14' is not importable on the executor" in message, message
        assert "by_value=[my_jobs_14]" in message and "by_value=True" in message, message
        assert "\n" not in message
        with querylib.submit(my_jobs_14.job, by_value=True, wait=True) as query:
            assert query.query.state.value == "finished", query.query.reason
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_jobs_14", None)


def test_the_handle_kills_a_running_function(up: Up, home: Path) -> None:
    markers = home / "markers"
    markers.mkdir()
    with querylib.submit(_sleeps, processes=2, args=(str(markers),),
                         by_value=[sys.modules[__name__]]) as query:
        assert query.info().state.value == "running"
        with pytest.raises(QueryTimeoutError):
            query.wait(timeout=0.5)
        killed = query.kill()
        # kill() returns once the processes are gone, as `tq kill` does: every exit code in.
        assert killed.state.value == "killed"
        assert len(killed.exit_codes) == 2 and None not in killed.exit_codes, killed
        ended = query.wait(timeout=60)
    assert ended.state.value == "killed"
    assert up.query(query.query_id).state.value == "killed"
