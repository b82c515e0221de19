"""The first hour (issue 14): a newcomer's path through tq, as they meet it.

Each test is one thing a new user did and what they now see: the README quickstart word for
word, then each of the issue's numbered problems.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
