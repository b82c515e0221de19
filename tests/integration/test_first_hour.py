"""The first hour (issue 14): a newcomer's path through tq, as they meet it.

Each test is one thing a new user did and what they now see: the README quickstart word for
word, then each of the issue's numbered problems.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from catalog import QueryState
from tests.conftest import wait_for
from tests.integration._up import Up
from tests.integration.test_queries_wait import (
    NEVER_REGISTERS,
    PUBLISHER,
    SLOW_SIBLING,
    SUBSCRIBER,
)
from tests.integration.test_query_cli_up import BROKEN, ECHO, SLEEPER
from tests.integration.test_up_start import _holding, _UpDefaults

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_12_the_tests_ignore_a_cluster_the_user_exported(tmp_path: Path) -> None:
    """The demo's closing hint says `export TQ_HOME=...; tq up &`: a user who then runs the
    tests has TQ_HOME (and maybe TQ_COORDINATOR, TQ_CREDENTIALS) pointing at their own live
    cluster. The tests must not see it (two executor tests used to fail)."""
    with Up(tmp_path / "users-home") as up:
        env = {**os.environ, "TQ_HOME": str(up.home), "TQ_COORDINATOR": "tcp://127.0.0.1:1",
               "TQ_CREDENTIALS": str(tmp_path / "missing.credential")}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/integration/test_executor_processes.py", "-k", "environment"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 passed" in result.stdout


# -- the README quickstart, word for word ----------------------------------------------------

_STEP = re.compile(r"<!-- quickstart: (terminal 1|run|output|file (?P<file>\S+)) -->\n"
                   r"```\w*\n(?P<body>.*?)```\n", re.S)


def quickstart_steps(readme: str) -> list[tuple[str, str, str]]:
    """The README quickstart's marked blocks, in order: (kind, file name, body), kind being
    `terminal 1` (runs on, in a terminal of its own), `run` (commands of the second
    terminal), `file` (saved under its name) or `output` (what the run before prints)."""
    steps = []
    for match in _STEP.finditer(readme):
        kind = "file" if match["file"] else match[1]
        steps.append((kind, match["file"] or "", match["body"]))
    return steps


def test_quickstart_steps_are_found_in_order() -> None:
    readme = ("<!-- quickstart: terminal 1 -->\n```sh\ntq up\n```\ntext\n"
              "<!-- quickstart: file a.py -->\n```python\nprint(1)\n```\n"
              "<!-- quickstart: run -->\n```sh\npython a.py\n```\n"
              "<!-- quickstart: output -->\n```text\n1\n```\n")
    assert quickstart_steps(readme) == [("terminal 1", "", "tq up\n"),
                                        ("file", "a.py", "print(1)\n"),
                                        ("run", "", "python a.py\n"), ("output", "", "1\n")]


def _marker(index: int) -> str:
    return f"=== quickstart step {index} ==="


def test_the_readme_quickstart_runs_word_for_word(tmp_path: Path) -> None:
    """A newcomer's five minutes: `tq up` in one terminal; in another their own query, its
    output, `tq consume` and a Spark read, exactly as README.md says, with what it says they
    print. Their home is a fresh directory, the repository a stand-in holding the venv."""
    steps = quickstart_steps((REPO / "README.md").read_text())
    kinds = [kind for kind, _, _ in steps]
    assert kinds[0] == "terminal 1" and kinds.count("terminal 1") == 1
    assert {"run", "file", "output"} <= set(kinds)
    home, repo = tmp_path / "home", tmp_path / "repo"
    home.mkdir()
    repo.mkdir()
    (repo / ".venv").symlink_to(sys.prefix)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TQ_", "VIRTUAL_ENV", "PYTHON"))} | {"HOME": str(home)}
    # The second terminal: one shell, as the user's, each run block after a marker line.
    script = ["set -e", "exec 2>&1", "source .venv/bin/activate"]
    expected: dict[int, list[str]] = {}
    runs = 0
    for kind, name, body in steps[1:]:
        if kind == "file":
            script.append(f"cat > {name} <<'TQ_QUICKSTART_FILE'\n{body}TQ_QUICKSTART_FILE")
        elif kind == "run":
            runs += 1
            script += [f"echo '{_marker(runs)}'", body]
        else:
            expected.setdefault(runs, []).extend(body.splitlines())
    up_log = (tmp_path / "tq-up.log").open("w")
    up = subprocess.Popen(["bash", "-c", steps[0][2]], cwd=repo, env=env, stdout=up_log,
                          stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (home / ".tq" / "cluster.json").exists() or up.poll() is not None,
                 timeout=90, what="tq up to write ~/.tq/cluster.json")
        assert up.poll() is None, (tmp_path / "tq-up.log").read_text()
        done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)  # Ctrl-C in its terminal
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        up_log.close()
    assert done.returncode == 0, done.stdout[-4000:]
    outputs = _split_by_markers(done.stdout, runs)
    for run, lines in expected.items():
        seen = iter(line.rstrip() for line in outputs[run])
        for line in lines:
            assert any(s == line.rstrip() for s in seen), (
                f"README quickstart: after run {run} expected {line!r} in order; got:\n"
                + "\n".join(outputs[run]))
    assert not (home / ".tq" / "cluster.json").exists()  # Ctrl-C stopped it cleanly


def _split_by_markers(output: str, runs: int) -> dict[int, list[str]]:
    parts: dict[int, list[str]] = {0: []}
    current = 0
    for line in output.splitlines():
        for index in range(1, runs + 1):
            if line == _marker(index):
                current = index
                parts[current] = []
                break
        else:
            parts[current].append(line)
    return parts


# -- the numbered problems, on one `tq up` with its default slots -----------------------------

@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("first-hour"), slots=None) as running:
        yield running


def _program(up: Up, name: str, text: str) -> Path:
    path = up.home / name
    path.write_text(text)
    return path


def _finished(up: Up, query_id: int) -> None:
    query = up.ended(query_id)
    assert query.state == QueryState.FINISHED, (query, up.tq("logs", str(query_id)).stdout)


def test_01_consume_prints_a_default_topic_as_text(up: Up) -> None:
    with up.connect() as ctx, ctx.publish("nums") as out:  # the defaults: msgpack
        out.send(0, list(range(2000)))
        out.advance_to(1)
    done = up.tq("consume", "nums")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(n) for n in range(2000)]


def test_03_a_failure_says_why(up: Up) -> None:
    done = up.tq("submit", str(_program(up, "broken.py", BROKEN)), "--wait")
    assert done.returncode == 1
    why = "ZeroDivisionError: division by zero (at broken.py:4 in ratio)"
    assert why in done.stderr.strip().splitlines()[-1], done.stderr
    assert why in up.tq("status", "broken").stdout
    typo = up.tq("submit", str(_program(up, "typo.py", "import querylib\n\nprint((\n")),
                 "--wait")
    assert typo.returncode == 1
    assert "SyntaxError" in typo.stderr and "(at typo.py:3)" in typo.stderr, typo.stderr


def test_04_the_default_slots_take_a_subscriber_and_a_two_process_publisher(up: Up) -> None:
    sub = up.submit(_program(up, "sub.py", SUBSCRIBER), "--", "pairs", "200")
    pub = up.submit(_program(up, "pub.py", PUBLISHER), "--processes", "2", "--", "pairs")
    _finished(up, pub)
    _finished(up, sub)


def test_05_running_the_same_publisher_again_appends(up: Up) -> None:
    """The README's squares.py submitted twice, as a newcomer does: the second run takes the
    topic over and appends its squares at times 0..9 again, in a new epoch that readers see
    after the first run's (DESIGN §5 "Epochs")."""
    (text,) = [body for kind, name, body in quickstart_steps((REPO / "README.md").read_text())
               if kind == "file" and name == "squares.py"]
    squares = _program(up, "squares.py", text)
    for _ in range(2):
        done = up.tq("submit", str(squares), "--wait")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "finished; exit codes 0" in done.stdout + done.stderr, done.stdout + done.stderr
    lines = up.tq("consume", "squares", "--format", "%L %s\n").stdout.splitlines()
    assert lines == [f'{n} {{"n":{n},"square":{n * n}}}' for n in range(10)] * 2
    # A subscriber sees both runs, the second in a later epoch, and one end.
    import querylib

    with up.connect() as ctx, ctx.subscribe("squares", timeout=30) as sub:
        events = list(sub)
    epochs = [(e.epoch, e.time) for e in events if isinstance(e, querylib.Data)]
    later = epochs[-1][0]
    assert later > 0 and epochs == [(0, n) for n in range(10)] + [(later, n) for n in range(10)]
    assert isinstance(events[-1], querylib.EndOfStream)
    described = up.tq("topic", "describe", "squares").stdout
    assert f"ended (epoch {later})" in described, described
    # A reader starting inside the second run (offset 14: the first run's 10 squares, its
    # frontier and end, the REOPEN at 12, the square at time 0) knows its epoch from the first
    # record it reads.
    with up.connect() as ctx, ctx.subscribe("squares", start=14, timeout=30) as sub:
        inside = [(e.epoch, e.time) for e in sub if isinstance(e, querylib.Data)]
    assert inside == [(later, n) for n in range(10)][1:], inside


def test_06_07_submit_wait_shows_the_output_and_logs_take_a_name(up: Up) -> None:
    done = up.tq("submit", str(_program(up, "echo.py", ECHO)), "--name", "echo", "--wait")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # In order within each of the program's streams (stdout and stderr travel apart).
    assert [line for line in lines if line.startswith("[0] ")] == [
        "[0] line 0", "[0] line 1", "[0] line 2", "[0] bye"]
    assert "[0 stderr] a warning" in lines
    follow = up.tq("logs", "echo", "--follow", timeout=60)  # ends: the query has ended
    assert follow.returncode == 0 and "[0] bye" in follow.stdout.splitlines()


def test_07_08_09_a_running_query_is_seen_in_ps_and_status_and_killed_by_name(up: Up) -> None:
    pids = up.home / "sleeper-pids"
    pids.mkdir()
    query_id = up.submit(_program(up, "sleeper.py", SLEEPER), "--name", "sleepy", "--",
                         str(pids))
    (pid,) = wait_for(lambda: [int(p.name) for p in pids.iterdir()], timeout=60,
                      what="the sleeper to start")
    assert " ".join(psutil.Process(pid).cmdline()).strip() == f"tq query {query_id} sleepy 0/1"

    def status_with_pid() -> str | None:
        shown = up.tq("status").stdout
        return shown if f"pid {pid}," in shown else None

    status = wait_for(status_with_pid, timeout=60, interval=0.5,
                      what="tq status to show the process's pid")
    assert "load: cpu" in status
    killed = up.tq("kill", "sleepy")
    assert killed.returncode == 0, killed.stderr
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert up.query(query_id).state == QueryState.KILLED


def test_10_main_waits_for_every_process_and_the_start_timeout_is_the_coordinators(
        up: Up) -> None:
    _finished(up, up.submit(_program(up, "slow.py", SLOW_SIBLING), "--processes", "2", "--",
                            str(up.home / "slow-marker")))
    never = up.tq("submit", str(_program(up, "never.py", NEVER_REGISTERS)), "--processes", "2",
                  "--start-timeout", "3")
    assert never.returncode == 1, never.stderr
    assert "not every process registered within 3s" in never.stderr


SPARK_SINK = """\
import querylib.spark

spark = querylib.spark.session()
rows = spark.createDataFrame([(f"n{i}",) for i in range(5)], "value string")
rows.write.format("tq").option("topic", "fresh").save()
rows.write.format("tq").option("topic", "fresh").save()
print(spark.read.format("tq").option("subscribe", "fresh").load().count())
"""


def test_11_a_spark_save_under_the_default_mode_creates_the_topic_and_appends(up: Up) -> None:
    done = subprocess.run([sys.executable, str(_program(up, "sink.py", SPARK_SINK))],
                          env=up.env, cwd=up.home, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["10"]
    # Spark's tasks write in any order; both saves are there.
    assert sorted(up.tq("consume", "fresh").stdout.splitlines()) == sorted(
        [f"n{i}" for i in range(5)] * 2)


def test_02_tq_up_beside_taken_ports_and_beside_a_running_cluster(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with _holding((7400, 7401)) as held:  # the default coordinator ports, taken
        first = _UpDefaults(home)
        try:
            again = first.tq("up", "--slots", "1", timeout=60)  # the same TQ_HOME
            assert again.returncode == 2, again.stderr
            (line,) = again.stderr.splitlines()
            assert f"a tq cluster already runs under TQ_HOME={home}" in line, line
            assert f"pid {first.proc.pid}" in line and "another TQ_HOME" in line, line
            assert json.loads((home / "cluster.json").read_text())["pid"] == first.proc.pid
            assert first.tq("topics").returncode == 0  # the first one still answers
        finally:
            err = first.stop()
    assert "cannot listen" not in err, err
    for port in held:
        assert f"port {port} is taken" in err, err
