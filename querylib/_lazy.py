"""Lazy package exports (PEP 562): a package's public names, each imported from its private
module on first use and then cached in the package's namespace.

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

`_EXPORTS` maps a public name to the private module that defines it (an empty string: the name
is a submodule itself). A query process imports only what registering needs, so packages whose
names pull in codecs, clients or servers export this way (DESIGN §11 "Query process start").
Must not: import anything beyond importlib (it is on every process's start path).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package` for these exports."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if module:
            value = getattr(import_module(f"{package}.{module}"), name)
        else:
            value = import_module(f"{package}.{name}")
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace["__all__"]))

    return __getattr__, __dir__
