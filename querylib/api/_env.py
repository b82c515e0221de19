"""The `TQ_*` variables an executor sets for a query process, read once.

    TQ_QUERY_ID, TQ_QUERY_NAME, TQ_PROCESS_INDEX, TQ_PROCESS_COUNT, TQ_WORKERS, TQ_COORDINATOR,
    TQ_CREDENTIALS (the process's credential file, principal query:ID), TQ_BROKER

Without TQ_QUERY_ID the process runs on its own (`python job.py`): one process, a client
session, TQ_WORKERS workers (default 1). A query process is titled from them for ps and top
(`process_title`). Must not: connect anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from catalog.errors import UserError

__all__ = ["QueryEnv", "process_title", "set_process_title"]

_MAX_TITLE_NAME = 40  # query names are labels of up to 256 characters: ps shows the start


def process_title(env: Mapping[str, str]) -> str | None:
    """What a query process is called in ps and top: `tq query 12 clicks 1/2` (its query's id
    and name, its process index, 0-based as everywhere in tq, and the process count); None
    outside a query (no TQ_QUERY_ID)."""
    query_id = env.get("TQ_QUERY_ID", "")
    if not query_id:
        return None
    name = " ".join(env.get("TQ_QUERY_NAME", "").split())[:_MAX_TITLE_NAME]
    where = f"{env.get('TQ_PROCESS_INDEX', '0')}/{env.get('TQ_PROCESS_COUNT', '1')}"
    return " ".join(part for part in ("tq query", query_id, name, where) if part)


def set_process_title(env: Mapping[str, str] | None = None) -> None:
    """Title this process as `process_title` says, if it is a query's (setproctitle rewrites
    what ps and /proc/PID/cmdline show; the executor's fork server calls this in each child,
    `execute()` in every query process)."""
    title = process_title(os.environ if env is None else env)
    if title is not None:
        import setproctitle

        setproctitle.setproctitle(title)


def _int(env: Mapping[str, str], name: str, default: int | None, low: int) -> int | None:
    text = env.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not a whole number") from None
    if value < low:
        raise UserError(f"{name}={value} must be >= {low}")
    return value


@dataclass(frozen=True)
class QueryEnv:
    """This process's place in its query: id (None when run directly), process index and
    count, workers per process, and where and as whom to connect."""

    query_id: int | None
    process: int
    processes: int
    workers: int
    coordinator: str | None
    secret_file: str | None
    broker: str | None

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> QueryEnv:
        env = os.environ if env is None else env
        query_id = _int(env, "TQ_QUERY_ID", None, 0)
        process = _int(env, "TQ_PROCESS_INDEX", 0, 0)
        processes = _int(env, "TQ_PROCESS_COUNT", 1, 1)
        workers = _int(env, "TQ_WORKERS", 1, 1)
        assert process is not None and processes is not None and workers is not None
        if process >= processes:
            raise UserError(f"TQ_PROCESS_INDEX={process} but TQ_PROCESS_COUNT={processes}")
        if query_id is None and processes > 1:
            raise UserError("TQ_PROCESS_COUNT > 1 needs TQ_QUERY_ID (the query they share)")
        return cls(query_id, process, processes, workers, env.get("TQ_COORDINATOR") or None,
                   env.get("TQ_CREDENTIALS") or None, env.get("TQ_BROKER") or None)
