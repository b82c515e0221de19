"""The public surfaces of `coordinator` and `querylib.cluster`, and who may import whom: the
core imports no I/O, and `querylib` never imports the server."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import coordinator
import querylib.cluster


@pytest.mark.parametrize("package", [coordinator, querylib.cluster])
def test_all_names_exist_once_and_are_public(package: object) -> None:
    names = package.__all__  # type: ignore[attr-defined]
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(package, name), name
        assert not name.startswith("_"), name


@pytest.mark.parametrize("package", [coordinator, querylib.cluster])
def test_every_module_has_a_docstring_and_keeps_its_promises(package: object) -> None:
    prefix = package.__name__  # type: ignore[attr-defined]
    for info in pkgutil.iter_modules(package.__path__):  # type: ignore[attr-defined]
        module = importlib.import_module(f"{prefix}.{info.name}")
        assert module.__doc__, f"{prefix}.{info.name} needs a docstring"
        for name in getattr(module, "__all__", ()):
            assert hasattr(module, name), f"{prefix}.{info.name}.{name}"


def _imports(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module or "")
    return roots


def test_the_core_does_no_io() -> None:
    io = {"asyncio", "socket", "zmq", "os", "time", "threading", "querylib.rpc",
          "querylib.broker", "querylib.log"}
    root = Path(coordinator.__file__).parent
    for name in ("_state.py", "_handlers.py", "_leases.py", "_waiters.py", "_placement.py",
                 "_events.py"):
        assert not _imports(root / name) & io, name


def test_querylib_never_imports_the_coordinator_at_module_level() -> None:
    root = Path(querylib.cluster.__file__).parent.parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: a command may import it when it runs
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names])
                assert not any(n.split(".")[0] == "coordinator" for n in names), path
