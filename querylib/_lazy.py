"""Lazy package exports (PEP 562), declared once where a type checker sees them.

A package lists its public names as imports under `if TYPE_CHECKING:` and ends with

    if not TYPE_CHECKING:  # a type checker reads the imports above, not this
        __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())

A type checker reads the imports as they are (and, seeing no module `__getattr__`, rejects a
name the package does not export); at run time they never execute, and this
module reads them from the package's own source instead: each name is imported from its
module on first use, then cached in the package's namespace. A query process imports only
what registering needs, so packages whose names pull in codecs, clients or servers export
this way (DESIGN §6 "Query process start").
Must not: import anything beyond importlib (it is on every process's start path: no `ast`,
no `re`); the block it reads holds nothing but `from .module import names` statements.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports", "read_exports"]

_MARK = "if TYPE_CHECKING:"


def read_exports(source: str) -> dict[str, tuple[str, str]]:
    """Public name -> (module, its name there) of the `if TYPE_CHECKING:` block; the module
    as written (relative), "." for a submodule imported by name."""
    start = source.find("\n" + _MARK + "\n")
    if start < 0:
        raise ImportError("lazy exports need an `if TYPE_CHECKING:` block of imports")
    block: list[str] = []
    for line in source[start + len(_MARK) + 2:].split("\n"):
        if line and not line[0].isspace():
            break
        block.append(line.split("#", 1)[0])
    exports: dict[str, tuple[str, str]] = {}
    text = " ".join(block).replace("(", " ").replace(")", " ").replace(",", " ")
    words = text.split()
    i = 0
    while i < len(words):
        if words[i] != "from" or i + 2 >= len(words) or words[i + 2] != "import":
            raise ImportError(f"unexpected {words[i]!r} among lazy exports")
        module, i = words[i + 1], i + 3
        while i < len(words) and words[i] != "from":
            name = original = words[i]
            if i + 2 < len(words) and words[i + 1] == "as":
                name, i = words[i + 2], i + 2
            exports[name] = (module, original)
            i += 1
    return exports


def lazy_exports(package: str, namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The module-level `__getattr__`, `__dir__` and `__all__` of `package`."""
    with open(namespace["__file__"], encoding="utf-8") as source:
        exports = read_exports(source.read())
    # What declaring took is not part of the package: `dir()` and `vars()` show exports only.
    for helper in ("annotations", "TYPE_CHECKING", "lazy_exports"):
        namespace.pop(helper, None)

    def __getattr__(name: str) -> Any:
        found = exports.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, original = found
        if module == ".":
            value = import_module(f".{original}", package)
        else:
            value = getattr(import_module(module, package), original)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__, sorted(exports)
