"""The design documents hold together: every `DESIGN §N "Title"` citation in the code, the tests
and the docs names a section of DESIGN.md (and, when it gives a title, a `###` heading of that
section), and every entry of docs/decisions.md has a date, a context, a decision and a
consequence, in date order, each listed in the index.

Must not: import tq (it reads files only), or accept a citation it cannot parse as valid.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "DESIGN.md"
DECISIONS = ROOT / "docs" / "decisions.md"

_SECTION = re.compile(r"^## (\d+)\. (.+)$")
_SUBSECTION = re.compile(r"^### (.+)$")
# A line break inside a comment or docstring: the newline, indentation and a comment's `#`.
_CONTINUATION = re.compile(r"\n[ \t]*(?:#[ \t]*)?")
# One citation: `§N` with an optional quoted title (quotes may be escaped inside a string).
_ONE = r'§\s*(\d+)(?:\s*\\?"([^"\\]+)\\?")?'
_CITATION = re.compile(r"DESIGN(?:\.md)?\s*(" + _ONE + r"(?:\s*(?:,|and)\s*" + _ONE + r")*)")
_EACH = re.compile(_ONE)
# The design itself (checked below), and this file, whose samples cite wrongly on purpose.
_NOT_SCANNED = {"DESIGN.md", "tests/test_docs.py"}


def design_outline(text: str) -> dict[int, set[str]]:
    """Section number -> the titles a citation may name: the section's own and its `###`s."""
    outline: dict[int, set[str]] = {}
    current: int | None = None
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if m := _SECTION.match(line):
            current = int(m.group(1))
            outline[current] = {m.group(2).strip()}
        elif (m := _SUBSECTION.match(line)) and current is not None:
            outline[current].add(m.group(1).strip())
    return outline


def citations(text: str) -> list[tuple[int, str | None]]:
    """Every (section, title or None) cited as `DESIGN §N "Title"`, across wrapped lines."""
    joined = _CONTINUATION.sub(" ", text)
    found = []
    for m in _CITATION.finditer(joined):
        for one in _EACH.finditer(m.group(1)):
            found.append((int(one.group(1)), one.group(2)))
    return found


def broken_citations(outline: dict[int, set[str]], files: dict[str, str]) -> list[str]:
    broken = []
    for name, text in files.items():
        for number, title in citations(text):
            if number not in outline:
                broken.append(f"{name}: DESIGN §{number} (no such section)")
            elif title is not None and title not in outline[number]:
                broken.append(f'{name}: DESIGN §{number} "{title}" (not a heading of §{number})')
    return sorted(set(broken))


def _tracked_files() -> dict[str, str]:
    listed = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml", "scripts/*"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = {}
    for name in listed:
        if name in _NOT_SCANNED:
            continue
        path = ROOT / name
        if path.is_file():
            files[name] = path.read_text(encoding="utf-8", errors="replace")
    return files


def test_citation_parser_reads_wrapped_and_listed_citations() -> None:
    text = ('x = 1  # held (DESIGN §5, §11 "Collective\n'
            '       # publishing") and DESIGN\n    §3 "Ownership", §5 "Epochs".\n'
            '"""see DESIGN.md §4 \\"Damaged logs\\" and §12."""')
    assert citations(text) == [(5, None), (11, "Collective publishing"), (3, "Ownership"),
                               (5, "Epochs"), (4, "Damaged logs"), (12, None)]


def test_a_broken_citation_is_found() -> None:
    outline = {5: {"Data plane", "Epochs"}}
    files = {"a.py": '# DESIGN §5 "Epochs", §5 "Epoch", §6'}
    assert broken_citations(outline, files) == [
        'a.py: DESIGN §5 "Epoch" (not a heading of §5)',
        "a.py: DESIGN §6 (no such section)",
    ]


def test_every_design_citation_names_a_heading() -> None:
    outline = design_outline(DESIGN.read_text(encoding="utf-8"))
    assert list(outline) == list(range(1, len(outline) + 1)), "sections are numbered 1..N"
    files = _tracked_files()
    assert sum(len(citations(t)) for t in files.values()) > 100, "the scan finds the citations"
    assert broken_citations(outline, files) == []


def test_design_cites_its_own_headings() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    outline = design_outline(text)
    # Inside DESIGN.md a citation reads `§N "Title"`, or a bare "Title" of the same section.
    broken = []
    for m in re.finditer(r'§(\d+)\s+"([^"]+)"', text):
        number, title = int(m.group(1)), " ".join(m.group(2).split())
        if number not in outline or title not in outline[number]:
            broken.append(m.group(0))
    assert broken == []


_ENTRY = re.compile(r"^### (\d{4}-\d{2}-\d{2}) (.+)$", re.MULTILINE)


def test_every_decision_has_a_date_and_three_parts() -> None:
    text = DECISIONS.read_text(encoding="utf-8")
    body = text.split("\n## Entries\n", 1)[1]
    headings = re.findall(r"^### .*$", body, re.MULTILINE)
    entries = list(_ENTRY.finditer(body))
    assert len(entries) == len(headings) > 50, "every entry heading starts with its date"
    dates = [m.group(1) for m in entries]
    assert dates == sorted(dates), "entries are in date order"
    problems = []
    for m, nxt in zip(entries, [*entries[1:], None], strict=True):
        entry = body[m.end():nxt.start() if nxt else len(body)]
        for part in ("Status:", "**Context.**", "**Decision.**", "**Consequence.**"):
            if part not in entry:
                problems.append(f"{m.group(1)} {m.group(2)}: no {part}")
        status = " ".join(entry.split("Status:", 1)[-1].split("\n\n", 1)[0].split())
        if "uperseded" in status:
            named = re.findall(r'"([^"]+)" \((\d{4}-\d{2}-\d{2})\)', status)
            titles = {(e.group(2), e.group(1)) for e in entries}
            if not named or not all(n in titles for n in named):
                problems.append(f"{m.group(1)} {m.group(2)}: superseded by an unknown entry")
    assert problems == []
    index = text.split("\n## Entries\n", 1)[0]
    missing = [m.group(2) for m in entries if f"[{m.group(2)}]" not in index]
    assert missing == [], "every entry is in the index"
