"""An earlier tq, measured in the same run as this one: a benchmark's baseline for a change.

`baseline_tree(ref)` unpacks commit `ref` of this checkout's repository (`git archive`) into a
temporary folder once; `run_in(tree, code)` runs Python `code` there, in a child process whose
imports (and whose spawned children's) resolve to that tree's tq, and returns the JSON lines it
prints. The venv's compiled dependencies serve both trees.

Must not: change the repository (no worktrees, no checkouts) or the caller's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["PRE_ISSUE_13", "baseline_tree", "run_in", "spread"]

ROOT = Path(__file__).resolve().parents[2]
# main just before the guarded entrances (issue 13: one door, principals, SASL, limits, ...).
PRE_ISSUE_13 = "57e33fe"


def baseline_tree(ref: str) -> Path | None:
    """The sources of commit `ref`, unpacked (None when there is no git history here)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    dest = Path(tempfile.gettempdir()) / f"tq-bench-baseline-{ref}"
    if (dest / "querylib").is_dir():
        return dest
    scratch = Path(tempfile.mkdtemp(prefix=f"tq-bench-baseline-{ref}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True)
    if archive.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        return None
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
    try:
        os.replace(scratch, dest)
    except OSError:  # another run unpacked it meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def run_in(tree: Path, code: str, timeout: float = 600.0) -> list[dict[str, Any]]:
    """The JSON objects `code` prints, run with `tree`'s tq first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark in {tree} failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max of repeated measurements."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {"min": round(ordered[0]), "median": round(median), "max": round(ordered[-1])}
