"""The first hour (issue 14): a newcomer's path through tq, as they meet it.

Each test is one thing a new user did and what they now see: the README quickstart word for
word, then each of the issue's numbered problems.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_for
from tests.integration._up import Up

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
