"""`querylib.submit(fn, ...)`: run a Python function as a query, from a script or a notebook.

    def count(ctx, limit):
        with ctx.publish("counts") as out:
            out.send(0, range(ctx.index, limit, ctx.peers))
            out.advance_to(1)

    with querylib.submit(count, processes=2, workers=2, args=(1000,)) as query:
        print(query.wait().state)

The function is pickled with cloudpickle and packed with a small runner (`_runner.py`) into a
program, uploaded as `tq submit` uploads a program file (content-addressed, over the
submitter's authenticated session), and run by the executors like any other program: each
process calls `fn(ctx, *args, **kwargs)` once per worker under `querylib.execute`.

Security: pickle runs arbitrary code when it is loaded. That is what submitting a query means
anyway (the executor runs whatever program a cluster member submits), and only packs uploaded
over a session signed with the cluster secret reach an executor; never unpickle anything else.
Must not: decide placement or start processes (the coordinator and executors do).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle

from catalog import Query
from catalog.errors import UserError
from querylib.artifacts import pack_path, sha256_hex
from querylib.cluster import Cluster, find_query, wait_for_exits, wait_for_query_end

from ._runner import FUNCTION_FILE, MAIN_SOURCE, META_FILE

__all__ = ["MAX_PROGRAM_BYTES", "SubmittedQuery", "build_program", "own_modules", "submit"]

# The executor's artifact cache takes no bigger pack.
MAX_PROGRAM_BYTES = 64 * 1024 * 1024

# cloudpickle's by-value registry is process-wide: one submit at a time may change it.
_BY_VALUE_LOCK = threading.Lock()


def own_modules() -> list[ModuleType]:
    """The imported top-level modules that are the user's own (`by_value=True`): not the
    standard library's, not installed (site-packages), not tq's, not `__main__`."""
    paths = sysconfig.get_paths()
    foreign = [os.path.join(paths[k], "") for k in ("stdlib", "platstdlib", "purelib",
                                                     "platlib") if k in paths]
    tq_root = Path(__file__).resolve().parents[2]
    foreign += [os.path.join(tq_root, name, "") for name in ("querylib", "executor",
                                                             "catalog", "coordinator")]
    own = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." in name or name == "__main__" or not isinstance(path, str):
            continue
        if not os.path.abspath(path).startswith(tuple(foreign)):
            own.append(module)
    return own


def _pickle(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
            by_value: Iterable[ModuleType] | bool) -> bytes:
    if by_value is True:
        modules = own_modules()
    elif by_value is False:
        modules = []
    else:
        modules = list(by_value)
    with _BY_VALUE_LOCK:
        added = []
        try:
            for module in modules:
                try:
                    cloudpickle.register_pickle_by_value(module)
                    added.append(module)
                except ValueError:  # already registered by the caller: leave it so
                    pass
            return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
        except Exception as exc:  # noqa: BLE001 - pickling errors vary by object
            raise UserError(f"cannot pickle {_name(fn)} with its arguments: "
                            f"{type(exc).__name__}: {exc}") from exc
        finally:
            for module in added:
                cloudpickle.unregister_pickle_by_value(module)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def build_program(fn: Callable[..., Any], args: tuple[Any, ...] = (),
                  kwargs: Mapping[str, Any] | None = None, *,
                  by_value: Iterable[ModuleType] | bool = ()) -> bytes:
    """The program pack that runs `fn(ctx, *args, **kwargs)` on every worker: `__main__.py`,
    `submitted.json` and `function.pkl` (see `_runner`). UserError if it cannot be pickled."""
    if not callable(fn):
        raise UserError(f"submit needs a function taking a Context, not {type(fn).__name__}")
    blob = _pickle(fn, args, kwargs or {}, by_value)
    meta = {"name": _name(fn), "python": list(sys.version_info[:2]),
            "sha256": hashlib.sha256(blob).hexdigest()}
    code = getattr(fn, "__code__", None)
    if code is not None:  # cloudpickle drops it: the runner puts it back, for tracebacks
        meta["file"] = code.co_filename
    with tempfile.TemporaryDirectory(prefix="tq-submit-") as folder:
        root = Path(folder)
        (root / "__main__.py").write_text(MAIN_SOURCE)
        (root / META_FILE).write_text(json.dumps(meta, sort_keys=True) + "\n")
        (root / FUNCTION_FILE).write_bytes(blob)
        return pack_path(root, max_bytes=MAX_PROGRAM_BYTES)


class SubmittedQuery:
    """A query started by `submit`: its id, its catalog record, waiting for its end, killing
    it. Holds a coordinator session until closed (the query itself does not depend on it)."""

    def __init__(self, cluster: Cluster, query: Query, *, owns_cluster: bool = True) -> None:
        self.cluster = cluster
        self.query_id = query.query_id
        self.name = query.name
        self.query = query  # the latest record this handle saw
        self._owns_cluster = owns_cluster

    def info(self) -> Query:
        """The query's current catalog record."""
        self.query = find_query(self.cluster, self.query_id)
        return self.query

    def wait(self, timeout: float | None = None) -> Query:
        """The query's record once it ended: `state` finished, failed or killed, and
        `exit_codes` per process. QueryTimeoutError after `timeout` seconds (it runs on)."""
        self.query = wait_for_query_end(self.cluster, self.query_id, timeout=timeout)
        return self.query

    def kill(self, reason: str = "killed by querylib.submit", *,
             wait: float = 60.0) -> Query:
        """Kill every process of the query (TERM, then KILL after the executor's grace) and
        return once they are gone, as `tq kill` does: the query's record (state killed) with
        every process's exit code, or, after `wait` seconds, with None for a process that
        did not report its exit (its executor lost). `wait=0` returns at once."""
        started = self.info().state.value != "pending"  # a pending query has no processes
        self.query = self.cluster.kill_query(self.query_id, reason)
        if wait > 0 and started and any(code is None for code in self.query.exit_codes):
            self.query = wait_for_exits(self.cluster, self.query_id, settle=wait)
        return self.query

    def close(self) -> None:
        """Close the session this handle holds (the query goes on). Idempotent."""
        if self._owns_cluster:
            self.cluster.close()

    def __enter__(self) -> SubmittedQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SubmittedQuery(query_id={self.query_id}, name={self.name!r})"


def submit(fn: Callable[..., Any], *, processes: int = 1, workers: int = 1,
           name: str | None = None, args: tuple[Any, ...] = (),
           kwargs: Mapping[str, Any] | None = None, wait: bool = False,
           executors: tuple[int, ...] | None = None, start_timeout: float | None = None,
           by_value: Iterable[ModuleType] | bool = (), coordinator: str | None = None,
           secret_file: str | None = None, cluster: Cluster | None = None) -> SubmittedQuery:
    """Run `fn(ctx, *args, **kwargs)` as a query of `processes` x `workers` workers.

    Returns once every process has registered (the query runs), or raises QueryFailedError
    with the reason it could not start: a query that does not fit the executors' free process
    slots waits for them (pending, in submission order), and the coordinator fails it unless
    it runs `start_timeout` seconds after submission (None: the coordinator's default, 60);
    with `wait=True` it returns once the query ended (`handle.query` is then its final
    record; a failed one's `reason` says why). `executors` pins process i to an executor.
    Functions of `__main__` (a script, a notebook) travel by value; name other modules whose
    functions should too in `by_value`, or pass `by_value=True` for all your own modules
    (imported, neither installed nor the standard library's); the executors import every
    other module by name. The arguments
    travel in the same pickle. Pickle runs code when loaded: submit only what you would run.
    Uses `cluster` if given (left open), else connects (discovery as in DESIGN §9)."""
    if processes < 1 or workers < 1:
        raise UserError("a query has at least one process of at least one worker")
    if executors is not None and len(executors) != processes:
        raise UserError(f"executors names {len(executors)} executors for {processes} "
                        "processes: pin every process or none")
    pack = build_program(fn, args, kwargs, by_value=by_value)
    owns = cluster is None
    if cluster is None:
        cluster = Cluster.connect(coordinator, secret_file=secret_file)
    try:
        source = cluster.upload_artifact(sha256_hex(pack), pack)
        query = cluster.submit_query(
            name or str(getattr(fn, "__name__", "function")), source, processes=processes,
            workers=workers, executors=executors, start_timeout=start_timeout)
        query = cluster.await_start(query.query_id)
        handle = SubmittedQuery(cluster, query, owns_cluster=owns)
        if wait:
            handle.wait()
    except BaseException:
        if owns:
            cluster.close()
        raise
    return handle
