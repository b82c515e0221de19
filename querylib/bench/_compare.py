"""`python -m querylib.bench --against REF [--rounds N] SUITE ...`: a change measured against
an earlier tq in the same run.

Each round runs every named suite once in the tree of commit REF (unpacked by `_baseline`) and
once in this tree, alternating which goes first, so both see the same machine. Every numeric
figure of a row that both trees print under the same row name and key is compared: one JSON
line per row with, per figure, min/median/max of each side and the ratio of the medians
(this tree over REF), plus the load average before and after. Rows only one tree prints are
listed by name, not compared.

Must not: change the repository or the caller's environment (see `_baseline`), or treat a
figure whose name says lower is better (latency, CPU, bytes) like a rate: its ratio is
printed as it is, and the key says which it is.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from querylib.bench._baseline import ROOT, baseline_tree, run_in

__all__ = ["compare", "numeric_figures", "row_name"]

_SUITE_CODE = (
    "import json, importlib\n"
    "from querylib.bench.__main__ import SUITES\n"
    "for module in SUITES[{suite!r}]:\n"
    "    for row in importlib.import_module(module).run():\n"
    "        print(json.dumps(row), flush=True)\n"
)


def numeric_figures(row: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in `row` (nested mappings flattened to dotted keys), but its name."""
    for key, value in row.items():
        if key in ("name", "suite"):
            continue
        path = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            yield path, float(value)
        elif isinstance(value, Mapping):
            yield from numeric_figures(value, path + ".")


def _sides(values: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, seen in values.items():
        out[side] = {"min": min(seen), "median": statistics.median(seen), "max": max(seen),
                     "n": len(seen)}
    before, after = out["before"]["median"], out["after"]["median"]
    out["ratio"] = round(after / before, 3) if before else None
    return out


# What names a row: most suites print "name"; the Kafka suite a "case", the Spark suite a
# "source" and a "query".
_IDENTITY = ("name", "case", "source", "query")


def row_name(row: Mapping[str, Any]) -> str:
    """The name a row is matched by across the two trees ("?" when it has none)."""
    return "/".join(str(row[key]) for key in _IDENTITY if key in row) or "?"


def compare(ref: str, suites: list[str], rounds: int = 3) -> Iterator[dict[str, Any]]:
    """One row per (suite, row name) both trees print, as the module docstring says."""
    before = baseline_tree(ref)
    if before is None:
        yield {"name": "compare", "error": f"no tree for {ref!r} (no git history here?)"}
        return
    trees: dict[str, Path] = {"before": before, "after": ROOT}
    seen: dict[tuple[str, str], dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    names: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    load_before = os.getloadavg()
    for round_ in range(rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for suite in suites:
            for side in order:
                for row in run_in(trees[side], _SUITE_CODE.format(suite=suite), timeout=3600):
                    name = row_name(row)
                    names[suite][side].add(name)
                    for key, value in numeric_figures(row):
                        seen[(suite, name)][key][side].append(value)
    load_after = os.getloadavg()
    for (suite, name), figures in seen.items():
        compared = {key: _sides(values) for key, values in figures.items()
                    if set(values) == {"before", "after"}}
        if compared:
            yield {"suite": suite, "name": f"{name}_against_{ref}", "figures": compared,
                   "rounds": rounds, "load": [list(load_before), list(load_after)]}
    for suite, sides in names.items():
        alone = {side: sorted(sides[side] - sides[other])
                 for side, other in (("before", "after"), ("after", "before"))}
        if alone["before"] or alone["after"]:
            yield {"suite": suite, "name": f"rows_not_compared_against_{ref}", **alone}


def main(ref: str, suites: list[str], rounds: int) -> int:
    for row in compare(ref, suites, rounds):
        print(json.dumps(row), flush=True)
    return 0
