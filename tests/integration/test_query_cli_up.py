"""Queries as a user meets them on a real `tq up` (issue 14, problems 3, 6 and 7): a failure
says why (exception, message, the program's own file:line) in `tq submit --wait`, `tq status`
and the catalog; a SyntaxError reads as one; `tq submit --wait` prints the output and exits
0/1/130; `tq logs --follow` ends with the query; `tq logs` has --tail, --timestamps, --json and
marks stderr; queries are named by name or id; `tq kill` returns once the processes are gone."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.coordinator._cluster import ROOT
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(240)

BROKEN = textwrap.dedent('''\
    import querylib

    def ratio(values):
        return sum(values) / len(values)

    def main(ctx):
        print("computing", flush=True)
        return ratio([])

    querylib.execute(main)
''')  # ratio's division is line 4

ECHO = textwrap.dedent('''\
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        for i in range(3):
            print(f"line {i}", flush=True)
        print("a warning", file=sys.stderr, flush=True)
        if len(sys.argv) > 1:  # wait for the test's go-ahead, then say goodbye
            while not Path(sys.argv[1]).exists():
                time.sleep(0.05)
        print("bye", flush=True)

    querylib.execute(main)
''')

SLEEPER = textwrap.dedent('''\
    import os, sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        Path(sys.argv[1], str(os.getpid())).write_text("")
        while True:
            print("still here", flush=True)
            time.sleep(0.5)

    querylib.execute(main)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


def _program(up: Up, name: str, text: str) -> Path:
    path = up.home / name
    path.write_text(text)
    return path


def _popen(up: Up, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "querylib.cli", *args], env=up.env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_failed_query_says_why_where_the_user_looks(up: Up) -> None:
    broken = _program(up, "broken.py", BROKEN)
    done = up.tq("submit", str(broken), "--wait")
    assert done.returncode == 1, done.stderr
    why = "ZeroDivisionError: division by zero (at broken.py:4 in ratio)"
    last = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"query (\d+) \(broken\) failed; exit codes 1: process 0 exited with "
                        rf"code 1: {re.escape(why)} \(its output: tq logs \d+\)", last), last
    query_id = int(done.stdout.split()[0])
    assert why in up.query(query_id).reason
    status = up.tq("status", "broken")
    assert why in status.stdout, status.stdout
    # The traceback the program printed starts in the program, never in tq's frames.
    output = done.stdout.splitlines()
    assert "[0] computing" in output
    trace = [line for line in output if line.startswith("[0 stderr] ")]
    assert trace[0] == "[0 stderr] Traceback (most recent call last):"
    assert trace[1].startswith('[0 stderr]   File "') and 'broken.py", line 10' in trace[1]
    assert not [line for line in trace if "/querylib/" in line or "_zygote" in line], trace
    assert trace[-1] == "[0 stderr] ZeroDivisionError: division by zero"


def test_a_syntax_error_reads_as_one(up: Up) -> None:
    typo = _program(up, "typo.py", "import querylib\n\ndef main(ctx:\n    pass\n")
    done = up.tq("submit", str(typo), "--wait")
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # one line
    assert "process 0 exited with code 1: SyntaxError: " in done.stderr, done.stderr
    assert "(at typo.py:3)" in done.stderr, done.stderr


def test_submit_wait_prints_the_output_and_exits_0(up: Up) -> None:
    echo = _program(up, "echo.py", ECHO)
    done = up.tq("submit", str(echo), "--wait", "--name", "echo-wait")
    assert done.returncode == 0, done.stderr
    query_id, *lines = done.stdout.splitlines()
    assert sorted(lines) == sorted(["[0] line 0", "[0] line 1", "[0] line 2",
                                    "[0 stderr] a warning", "[0] bye"])
    assert done.stderr.strip().splitlines()[-1] == (
        f"query {query_id} (echo-wait) finished; exit codes 0")


def test_logs_follow_ends_when_the_query_ends(up: Up) -> None:
    echo = _program(up, "echo2.py", ECHO)
    go = up.home / "go-ahead"
    query_id = int(up.tq("submit", str(echo), "--name", "follow-me", "--", str(go))
                   .stdout.split()[0])
    follower = _popen(up, "logs", "follow-me", "--follow")
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()
        assert first == "[0] line 0\n"
        go.write_text("")
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert (first + out).splitlines()[-1] == "[0] bye"
    assert up.query(query_id).state.value == "finished"


def test_logs_tail_timestamps_and_json(up: Up) -> None:
    echo = _program(up, "echo3.py", ECHO)
    up.tq("submit", str(echo), "--name", "tailed", "--wait")
    tail = up.tq("logs", "tailed", "--tail", "2")
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()  # (stdout and stderr are read from separate pipes)
    assert len(lines) == 2 and "[0] bye" in lines, lines
    assert set(lines) - {"[0] bye"} <= {"[0] line 2", "[0 stderr] a warning"}, lines
    stamped = up.tq("logs", "tailed", "--timestamps", "--tail", "1")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
                        r"(\[0\] bye|\[0 stderr\] a warning)\n",
                        stamped.stdout), stamped.stdout
    as_json = [json.loads(line) for line in up.tq("logs", "tailed", "--json").stdout.splitlines()]
    assert {(x["process"], x["stream"], x["text"]) for x in as_json} == {
        (0, "stdout", "line 0"), (0, "stdout", "line 1"), (0, "stdout", "line 2"),
        (0, "stderr", "a warning"), (0, "stdout", "bye")}
    assert all(isinstance(x["timestamp_ms"], int) and x["time"].endswith("Z") for x in as_json)


def test_ctrl_c_on_submit_wait_says_how_to_kill_and_kill_by_name_waits(up: Up) -> None:
    pids = up.home / "ctrl-c-pids"
    pids.mkdir()
    sleeper = _program(up, "sleeper.py", SLEEPER)
    waiting = _popen(up, "submit", str(sleeper), "--name", "forever", "--wait", "--", str(pids))
    try:
        assert waiting.stdout is not None
        query_id = int(waiting.stdout.readline())
        assert waiting.stdout.readline() == "[0] still here\n"
        waiting.send_signal(signal.SIGINT)
        _, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 130, err
    assert f"tq kill {query_id}" in err.strip().splitlines()[-1], err
    assert up.query(query_id).state.value == "running"  # Ctrl-C left it running, and said so
    (pid,) = [int(p.name) for p in pids.iterdir()]
    killed = up.tq("kill", "forever")
    assert killed.returncode == 0, killed.stderr
    assert _gone(pid)  # at once: `tq kill` returned once the processes were gone
    assert up.query(query_id).state.value == "killed"
    assert all(code is not None for code in up.query(query_id).exit_codes)


def test_a_repeated_name_means_its_newest_query(up: Up) -> None:
    echo = _program(up, "echo4.py", ECHO)
    first = int(up.tq("submit", str(echo), "--name", "twice", "--wait").stdout.split()[0])
    second = int(up.tq("submit", str(echo), "--name", "twice", "--wait").stdout.split()[0])
    assert second > first
    shown = up.tq("status", "twice")
    assert shown.stdout.startswith(f"query {second} twice [finished]"), shown.stdout
    unknown = up.tq("logs", "no-such-name")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("tq: error: no query named 'no-such-name'"), unknown.stderr
