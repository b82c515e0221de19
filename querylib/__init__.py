"""The library every tq process uses: record-batch codec, partition log storage, RPC, the broker,
the pub/sub API and the `tq` command.

The user-facing API (`execute`, `Context`, `connect`, `submit`, `PerWorker`, `Merge`, `Hash`,
`Data`, `Progress`, `serdes`, ...) lives in `querylib.api` and is re-exported here lazily, so that
importing a small part of querylib (the record codec, the CLI) does not load the broker and
cluster clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from .api import (
        Context,
        Data,
        EndOfStream,
        Hash,
        Merge,
        PerWorker,
        Progress,
        Publisher,
        Record,
        Snapshot,
        SubmittedQuery,
        Subscription,
        connect,
        execute,
        serdes,
        submit,
    )

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
