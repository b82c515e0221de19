"""The connector endpoint (DESIGN §8): a TCP listener inside a broker process that turns
connector streams into appends to the broker's partitions, with ACKs after durability. The
protocol it speaks (both dialects, sans-I/O) and the client library are `querylib.connector`.

    _endpoint.py    ConnectorEndpoint: the listener, its config and cookies
    _connection.py  one connector's TCP connection: a thin loop around BulkWorkerConnection
    _sink.py        one stream's ordered work on the broker (open, append, end)
    _partitions.py  where a stream's partition lives (this broker or another of the host's)
                    and the calls to it: sessions, partition info, scans
    _offsets.py     points of reference per stream, kept in `__connector_offsets`

    python -m querylib.server.connector --data DIR   a broker with only this endpoint
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from ._endpoint import DEFAULT_CONNECTOR_PORT, ConnectorEndpoint, EndpointConfig, derive_cookie
    from ._partitions import Locate, Partitions, Remote

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
