"""The main of a program built by `querylib.submit`: unpickle the submitted function and run it
under `querylib.execute` (DESIGN §6 "Submitting functions").

The program pack holds three files: `__main__.py` (two lines that call `main()` here),
`submitted.json` (the submitter's Python version, the function's name, the pickle's sha256) and
`function.pkl` (cloudpickle of `(fn, args, kwargs)`). The executor runs `__main__.py` with the
TQ_* environment, so `execute` makes this process one process of the submitted query.

The pack is checked (Python version, digest) and the function unpickled before `execute`
registers, as a program's own imports come before it calls `execute`: a function that cannot
load fails the query's start with exit code 2 and one line, and the function's modules are
imported on the main thread.

Unpickling runs arbitrary code: it is done only for a pack the coordinator accepted over an
authenticated session, i.e. code a cluster member chose to submit (as `tq submit` runs any
program). Must not: be imported by anything but that `__main__.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import types
from pathlib import Path
from typing import Any

__all__ = ["FUNCTION_FILE", "MAIN_SOURCE", "META_FILE", "main"]

FUNCTION_FILE = "function.pkl"
META_FILE = "submitted.json"
MAIN_SOURCE = ("# Built by querylib.submit: runs the pickled function under querylib.execute.\n"
               "import sys\n"
               "from querylib.api._runner import main\n\n"
               "sys.exit(main())\n")

_DYNAMIC_CODE = "<dynamic-code>"  # cloudpickle's file name for code pickled by value

# Exit code of a program that cannot even load its function (2: the usual "bad invocation").
_LOAD_FAILED = 2


def _read(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """(pickle, metadata) of the pack in `folder`, once they pass the checks that need no
    unpickling; SystemExit with one line if the pack does not fit this interpreter."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
        blob = (folder / FUNCTION_FILE).read_bytes()
    except (OSError, ValueError) as exc:
        raise _fail(f"not a querylib.submit program: {exc}") from exc
    python = tuple(meta.get("python", ()))
    if python != tuple(sys.version_info[:2]):
        # cloudpickle's code objects only load on the Python version that made them.
        raise _fail(f"the function was pickled on Python {'.'.join(map(str, python))}, this "
                    f"executor runs Python {sys.version_info[0]}.{sys.version_info[1]}")
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        raise _fail(f"{FUNCTION_FILE} does not match its recorded sha256")
    return blob, meta


def _unpickle(blob: bytes, meta: dict[str, Any]
              ) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
    name = meta.get("name", "the function")
    try:
        fn, args, kwargs = pickle.loads(blob)  # noqa: S301 - see the module docstring
    except ImportError as exc:
        # The function (or something it uses) was pickled by reference to a module the
        # executor cannot import: it has to travel by value.
        module = exc.name or "its module"
        raise _fail(f"cannot load {name}: module {module!r} is not importable on the executor "
                    f"({type(exc).__name__}: {exc}); submit with by_value=[{module}] to send "
                    "the module with the function, or by_value=True for all your own "
                    "modules") from exc
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is the user's to read
        raise _fail(f"cannot unpickle {name}: {type(exc).__name__}: {exc}; if it comes "
                    "from a module of yours, submit with by_value=True") from exc
    filename = meta.get("file")
    code = getattr(fn, "__code__", None)
    if isinstance(filename, str) and isinstance(code, types.CodeType):
        fn.__code__ = _refile(code, filename)
    return fn, tuple(args), dict(kwargs), str(meta.get("name", "function"))


def _refile(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` (and the functions defined in it) with the file name cloudpickle dropped (it
    pickles code as "<dynamic-code>"), so tracebacks and the failure line name the file."""
    if code.co_filename != _DYNAMIC_CODE:
        return code
    consts = tuple(_refile(c, filename) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _load(folder: Path) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
    """(fn, args, kwargs, name) from the pack in `folder`; SystemExit with one line if the pack
    does not fit this interpreter."""
    return _unpickle(*_read(folder))


def _fail(message: str) -> SystemExit:
    """Say why on stderr and in the failure file (the query's reason, DESIGN §6)."""
    line = f"querylib.submit: {message}"
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get("TQ_FAILURE_FILE")
    if path:
        try:  # the protocol of executor/_zygote.py's record_failure: the first line wins
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as out:
                out.write(line)
        except OSError:
            pass
    return SystemExit(_LOAD_FAILED)


def main(folder: str | Path | None = None) -> int:
    """Load the function next to `__main__.py` and run `fn(ctx, *args, **kwargs)` on every
    worker of this process. Returns 0; a worker's exception propagates (exit code 1), a
    function that cannot load exits 2."""
    import querylib

    here = Path(folder) if folder is not None else Path(sys.argv[0]).resolve().parent
    fn, args, kwargs, _ = _load(here)
    querylib.execute(lambda ctx: fn(ctx, *args, **kwargs))
    return 0
