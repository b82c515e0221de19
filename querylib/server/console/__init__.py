"""The web console (DESIGN §13 "Console"): a live view of the cluster in a browser, served by
`tq up` and `tq coordinator`.

    _model.py   ClusterModel: collections and samples in, the pages' view out (pure)
    _feed.py    Feed: the catalog follow, executors' loads and brokers' partitions, sampled
    _app.py     the Starlette application: the page, /api/state, /api/events (server-sent
                events), kill, logins
    _serve.py   Console: uvicorn and the feed on a loop thread of their own
    static/     the page, its script and its style (shipped in the package: works offline)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from ._model import ClusterModel, PartitionSample, SubscriptionSample
    from ._serve import DEFAULT_CONSOLE_PORT, Console, ConsoleUnavailableError

__getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
