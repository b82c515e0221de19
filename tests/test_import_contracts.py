"""Import contracts between tq's packages: layers by direction (DESIGN §1 "Layers").

Every package belongs to one layer and imports only from its own layer or the ones below;
a client never imports a server. The broker has one door from outside its package: its
public exports (`querylib.server.broker`), never its private modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ["catalog", "coordinator", "executor", "querylib", "pyspark_tq.py"]
BROKER = ROOT / "querylib" / "server" / "broker"

# Lowest first. A module's layer is the one naming the longest prefix of its name.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("model", ("catalog",)),
    ("foundations", ("querylib.errors", "querylib._lazy", "querylib._pidlock",
                     "querylib._argtypes", "querylib._parent", "querylib._memory",
                     "querylib._tcp", "querylib._lease", "querylib._state_file",
                     "querylib.driver", "querylib.artifacts")),
    ("wire formats", ("querylib.records", "querylib.rpc", "querylib._kio",
                      "querylib._kio_shape")),
    ("storage", ("querylib.log",)),
    ("clients", ("querylib", "querylib.broker", "querylib.cluster", "querylib.kafka",
                 "querylib.connector", "querylib.api", "querylib.spark", "pyspark_tq",
                 "querylib.examples")),
    ("servers", ("querylib.server", "coordinator", "executor")),
    ("command line", ("querylib.cli", "querylib.bench")),
]
# Within a layer, who must not know whom (each is a pair of name prefixes).
APART = [
    ("coordinator", "executor"), ("executor", "coordinator"),
    ("querylib.server", "coordinator"), ("querylib.server", "executor"),
]


def layer_of(module: str) -> int:
    best, rank = "", -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, index
    return rank


def _sources() -> list[Path]:
    found: list[Path] = []
    for name in PRODUCT:
        path = ROOT / name
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return found


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(source: str, module: str = "", package: bool = False) -> set[str]:
    """Every module name `source` imports, relative imports resolved against `module`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                if not package:
                    parts = parts[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _ours(name: str) -> bool:
    return name.split(".")[0] in {"catalog", "coordinator", "executor", "querylib", "pyspark_tq"}


def test_every_module_has_a_layer() -> None:
    assert [m for m in map(_module_of, _sources()) if layer_of(m) < 0] == []


def test_imports_point_down_the_layers() -> None:
    offenders = []
    for path in _sources():
        module = _module_of(path)
        mine = layer_of(module)
        for name in sorted(_imported(path.read_text(), module, path.name == "__init__.py")):
            if not _ours(name):
                continue
            theirs = layer_of(name)
            if theirs > mine:
                offenders.append(f"{module} ({LAYERS[mine][0]}) imports {name} "
                                 f"({LAYERS[theirs][0]})")
            for low, high in APART:
                if module.startswith(low) and (name == high or name.startswith(high + ".")):
                    offenders.append(f"{module} imports {name}")
    assert offenders == []


def test_only_the_broker_package_imports_its_private_modules() -> None:
    offenders = []
    for path in _sources():
        if BROKER in path.parents:
            continue
        private = sorted(n for n in _imported(path.read_text(), _module_of(path))
                         if n.startswith("querylib.server.broker._"))
        if private:
            offenders.append(f"{path.relative_to(ROOT)}: {', '.join(private)}")
    assert offenders == []


def test_the_scans_see_each_spelling_of_an_import() -> None:
    found = _imported("from querylib.server.broker._events import Produce\n"
                      "from querylib.server.broker import _state\n"
                      "import querylib.server.broker._server\n"
                      "from ..server import _endpoints\n",
                      "querylib.broker._producer")
    assert {"querylib.server.broker._events", "querylib.server.broker._state",
            "querylib.server.broker._server", "querylib.server._endpoints"} <= found
    assert layer_of("querylib.server.broker._state") > layer_of("querylib.broker._producer")
    assert layer_of("querylib.cli._up") > layer_of("coordinator._server")
    assert layer_of("querylib.records._decode") < layer_of("querylib.log._log")


CLIENTS = """
import importlib, sys
for name in ("querylib", "querylib.api", "querylib.broker", "querylib.cluster",
             "querylib.kafka", "querylib.connector", "querylib.rpc", "querylib.records"):
    package = importlib.import_module(name)
    for export in package.__all__:
        getattr(package, export)
import querylib.api._group_client  # a consumer-group member
servers = ("querylib.server", "coordinator", "executor", "querylib.cli", "querylib.log",
           "querylib.spark")
print(sorted(m for m in sys.modules if m.startswith(servers)))
"""


def test_clients_import_no_servers() -> None:
    """Every export of the client packages, and a group member, loaded in a fresh process:
    no server, no storage, no command line comes with them."""
    out = subprocess.run([sys.executable, "-c", CLIENTS], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"
