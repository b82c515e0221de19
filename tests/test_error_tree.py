"""One error tree (STYLE.md "errors"; issue 16): every exception class tq defines descends
from `catalog.errors.TqError`, no two share a name, and `catalog/errors.py` maps the whole tree.

The scan imports every module of the four packages and collects the exception classes each
defines, so an error added anywhere (not only in an `errors` module) is seen."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest

import catalog
import catalog.errors
import querylib.rpc._client
from catalog.errors import TqError

PACKAGES = ("catalog", "coordinator", "executor", "querylib")

# The deliberate exceptions: signals raised and caught inside one component to steer control
# flow. They never reach a caller, so they carry no traits and are no TqError (an
# `except TqError` must not catch them).
NOT_ERRORS = {
    "coordinator._state.WaitForStart": "a handler's signal to answer once the query started",
    "coordinator._state.WaitForTopic": "a handler's signal to answer once the topic exists",
    "coordinator._drops.WaitForDrops": "a handler's signal to answer once brokers dropped",
    "querylib.server.kafka._listener._Close": "the listener's signal: answered, now close",
    "querylib.records._runs.Irregular": "the fast decoder's signal to take the general path",
    "querylib._kio_shape.ShapeMisfit": "the shape walk's signal: check_shape raises the "
                                       "caller's error from it",
    "querylib._tcp.TlsHandshakeError": "a connection's signal to its listener: its TLS "
                                       "handshake failed, counted as a refusal",
}

# The roots in catalog.errors that families hang from.
ROOTS = {catalog.errors.TqError, catalog.errors.UserError, catalog.errors.ProtocolError,
         catalog.errors.StorageError, catalog.errors.CatalogError}


def _modules() -> list[ModuleType]:
    found = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if info.name.endswith(".__main__"):
                continue  # runs the CLI when imported; defines nothing
            found.append(importlib.import_module(info.name))
    return found


def _full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@pytest.fixture(scope="module")
def exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _modules():
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == module.__name__):
                found[_full_name(value)] = value
    return sorted(found.values(), key=_full_name)


def test_the_scan_sees_errors_of_every_package(
        exceptions: list[type[BaseException]]) -> None:
    packages = {cls.__module__.split(".")[0] for cls in exceptions}
    assert packages == set(PACKAGES)
    assert len(exceptions) > 100  # the tree is large; an import that found nothing fails here


def test_no_two_exception_classes_share_a_name(exceptions: list[type[BaseException]]) -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for cls in exceptions:
        by_name[cls.__name__].append(_full_name(cls))
    assert {name: where for name, where in by_name.items() if len(where) > 1} == {}


def test_every_exception_is_a_tq_error_or_a_listed_signal(
        exceptions: list[type[BaseException]]) -> None:
    strays = [_full_name(cls) for cls in exceptions
              if not issubclass(cls, TqError) and _full_name(cls) not in NOT_ERRORS]
    assert strays == []
    signals = {_full_name(cls): cls for cls in exceptions if _full_name(cls) in NOT_ERRORS}
    assert set(signals) == set(NOT_ERRORS), "a listed signal is gone: drop it from the list"
    assert not any(issubclass(cls, TqError) for cls in signals.values())


def test_every_error_says_what_it_means(exceptions: list[type[BaseException]]) -> None:
    undocumented = [_full_name(cls) for cls in exceptions
                    if issubclass(cls, TqError) and not cls.__dict__.get("__doc__")]
    assert undocumented == []


def _family(cls: type) -> type:
    """The topmost ancestor of `cls` that is not one of catalog.errors' roots."""
    family = cls
    for base in cls.__mro__:
        if base in ROOTS or not issubclass(base, TqError):
            break
        family = base
    return family


def test_the_root_module_maps_every_family_and_where_it_lives(
        exceptions: list[type[BaseException]]) -> None:
    """catalog/errors.py's docstring is the map of the one tree: it names every family (the
    topmost class below the roots) and the module that defines it, whose docstring draws the
    family's members."""
    doc = catalog.errors.__doc__ or ""
    errors = [cls for cls in exceptions if issubclass(cls, TqError)]
    families = {_family(cls) for cls in errors if cls.__module__ != "catalog.errors"}
    missing = sorted(_full_name(f) for f in families
                     if not re.search(rf"\b{f.__name__}\b", doc))
    assert missing == []
    modules = {cls.__module__ for cls in errors}
    unnamed = sorted(m for m in modules if not re.search(rf"\b{re.escape(m)}\b", doc))
    assert unnamed == []
    # Each member is drawn in its own module's docstring (or in the root's).
    undrawn = sorted(
        _full_name(cls) for cls in errors
        if not re.search(rf"\b{cls.__name__}\b",
                         (importlib.import_module(cls.__module__).__doc__ or "") + doc))
    assert undrawn == []


def test_the_map_names_no_class_that_does_not_exist(
        exceptions: list[type[BaseException]]) -> None:
    known = {cls.__name__ for cls in exceptions} | set(dir(builtins))
    # A foreign class is named with its module (`asyncio.CancelledError`).
    drawn = set(re.findall(r"(?<![.\w])([A-Z]\w*Error)\b", catalog.errors.__doc__ or ""))
    assert drawn - known == set()
    assert len(drawn) > 50


# Where each foreign library's exceptions may be caught (and raised again as TqErrors): its
# edges. Anywhere else they were translated already, or are a bug to see.
FOREIGN_EDGES = {
    "zmq.": {"querylib/rpc/"},  # the RPC transport
    "msgspec.": {"catalog/_codec.py", "querylib/rpc/_codec.py", "coordinator/_journal.py",
                 "coordinator/_failover.py",
                 "querylib/server/broker/_cohort_store.py",
                 "querylib/server/connector/_offsets.py",
                 "querylib/cli/_records_text.py"},  # the codecs and files that hold msgspec
    "KIO_DECODE_ERRORS": {"querylib/kafka/_apis.py", "querylib/server/kafka/_offsets_format.py",
                          "querylib/kafka/_client.py", "querylib/api/_group.py"},
    "SerialError": {"querylib/_kio.py"},  # kio's: only through KIO_DECODE_ERRORS
}


def _handlers(path: Path) -> list[str]:
    """The source of each `except` clause's type in the file."""
    source = path.read_text()
    return [ast.get_source_segment(source, node.type) or ""
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ExceptHandler) and node.type is not None]


def test_foreign_errors_are_caught_at_their_edges_only() -> None:
    root = Path(catalog.__file__).resolve().parent.parent
    strays = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            for caught in _handlers(path):
                for marker, edges in FOREIGN_EDGES.items():
                    if marker in caught and not any(name.startswith(e) for e in edges):
                        strays.append(f"{name}: except {caught}")
    assert strays == []


def test_the_edge_scan_sees_a_foreign_handler() -> None:
    assert _handlers(Path(querylib.rpc._client.__file__)).count("zmq.Again") >= 1
