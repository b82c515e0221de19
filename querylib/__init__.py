"""The library every tq process uses: record-batch codec, partition log storage, RPC, the broker,
the pub/sub API and the `tq` command.

The user-facing API (`execute`, `Context`, `connect`, `submit`, `PerWorker`, `Merge`, `Hash`,
`Data`, `Progress`, `serdes`, ...) lives in `querylib.api` and is re-exported here lazily, so that
importing a small part of querylib (the record codec, the CLI) does not load the broker and
cluster clients.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Context",
    "Data",
    "EndOfStream",
    "Hash",
    "Merge",
    "PerWorker",
    "Progress",
    "Publisher",
    "Record",
    "Snapshot",
    "SubmittedQuery",
    "Subscription",
    "connect",
    "execute",
    "serdes",
    "submit",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from querylib import api

        value = globals()[name] = getattr(api, name)  # later lookups skip this function
        return value
    raise AttributeError(f"module 'querylib' has no attribute {name!r}")
