"""Import contracts between tq's packages (STYLE.md "one door into each component").

The broker has one door: `querylib.broker`'s public exports (the RPC messages, the clients,
the server and its in-process `BrokerPort`). Its private modules (`querylib.broker._*`) are
imported only from inside the package, so no listener, writer or tool drives the broker
through its event types or reads its state behind the core's back."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ["catalog", "coordinator", "executor", "querylib", "pyspark_tq.py"]
BROKER = ROOT / "querylib" / "broker"


def _sources() -> list[Path]:
    found: list[Path] = []
    for name in PRODUCT:
        path = ROOT / name
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return found


def _imported(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_only_the_broker_package_imports_its_private_modules() -> None:
    offenders = []
    for path in _sources():
        if BROKER in path.parents:
            continue
        private = sorted(n for n in _imported(path.read_text())
                         if n.startswith("querylib.broker._"))
        if private:
            offenders.append(f"{path.relative_to(ROOT)}: {', '.join(private)}")
    assert offenders == []


def test_the_scan_finds_both_spellings_of_a_private_import() -> None:
    found = _imported("from querylib.broker._events import Produce\n"
                      "from querylib.broker import _state\n"
                      "import querylib.broker._server\n")
    assert {"querylib.broker._events", "querylib.broker._state",
            "querylib.broker._server"} <= found
