"""Lazy exports: the `if TYPE_CHECKING:` block read without `ast`, and names loaded on use."""

from __future__ import annotations

import pytest

import querylib.broker
from querylib._lazy import read_exports

SOURCE = '''"""doc"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import draft, released  # submodules
    from ._a import A, B as C
    from ._b import (
        D,
        E,  # with a comment
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
'''


def test_the_block_reads_as_a_type_checker_reads_it() -> None:
    assert read_exports(SOURCE) == {"draft": (".", "draft"), "released": (".", "released"),
                                    "A": ("._a", "A"), "C": ("._a", "B"),
                                    "D": ("._b", "D"), "E": ("._b", "E")}


def test_anything_else_in_the_block_is_refused() -> None:
    with pytest.raises(ImportError, match="unexpected"):
        read_exports("x = 1\nif TYPE_CHECKING:\n    import os\n")
    with pytest.raises(ImportError, match="TYPE_CHECKING"):
        read_exports("from ._a import A\n")


def test_a_package_lists_only_its_exports_and_loads_them_on_use() -> None:
    assert "Producer" in querylib.broker.__all__
    assert "lazy_exports" not in vars(querylib.broker)
    assert querylib.broker.Producer.__module__ == "querylib.broker._blocking"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        querylib.broker.Nope  # noqa: B018
