"""The public surface of `catalog`: what __all__ promises is there, and nothing private leaks."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path

import catalog
import catalog.errors


def test_all_names_exist_and_are_sorted_uniquely() -> None:
    assert len(set(catalog.__all__)) == len(catalog.__all__)
    for name in catalog.__all__:
        assert hasattr(catalog, name), name
        assert not name.startswith("_"), name


def test_error_root_is_unchanged_and_reexported() -> None:
    for name in ("TqError", "UserError", "ProtocolError", "StorageError", "CatalogError"):
        assert getattr(catalog, name) is getattr(catalog.errors, name)
    assert catalog.CatalogError.exit_code == 2
    assert issubclass(catalog.CatalogError, catalog.TqError)


def test_every_public_error_is_exported() -> None:
    errors = {
        name
        for name, value in vars(catalog.errors).items()
        if isinstance(value, type) and issubclass(value, catalog.TqError)
    }
    assert errors <= set(catalog.__all__)


def test_every_private_module_lists_what_it_exports() -> None:
    for info in pkgutil.iter_modules(catalog.__path__):
        module = importlib.import_module(f"catalog.{info.name}")
        assert module.__doc__, f"catalog.{info.name} needs a docstring"
        for name in getattr(module, "__all__", ()):
            assert hasattr(module, name), f"catalog.{info.name}.{name}"


def test_catalog_imports_only_stdlib_and_msgspec() -> None:
    allowed = set(sys.stdlib_module_names) | {"msgspec", "catalog"}
    for path in Path(catalog.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in allowed, f"{path.name} imports {root}"
