"""The broker (DESIGN §5): partitions stored as Kafka logs, produce with credit windows,
subscriptions pushed from disk then live, frontiers as control batches. Its clients and its
messages are `querylib.broker`; everything outside this package comes in through its exports
(the RPC server, or `BrokerPort`, the in-process door), never its private modules.

    _state.py       BrokerState: the pure core, handle(stimulus) -> [instructions]
    _events.py      its stimuli and instructions;  _bookkeeping.py its records (sessions,
                    partitions, producers, BrokerLimits)
    _admission.py       Admission, composed by the core: writers rules, partitions to open
    _subscriptions.py   Subscriptions, composed by the core: credit, catch-up, tail, retention
    _cohorts.py         Cohorts, composed by the core: process exits, pending cohorts
    _replication.py     a replicated partition's rules: roles, leader epochs, high watermark
    _fetcher.py     ReplicaFetcher: a follower's fetches from one leader
    _write_access.py  principals and topics' writers rules (who may write what)
    _frontier.py    PartitionFrontier: the minimum over live producers, cohorts
    _idempotence.py the table of idempotent producers (a batch sent again is stored once)
    _cohort_store.py    pending cohorts on disk beside the log
    _server.py      BrokerServer: the asyncio shell (RPC, appends, reads, clock)
    _door.py        BrokerPort: the in-process door (PortLink sessions, reads, directories)
    _disk.py        partitions on disk, recovery of frontiers
    _appender.py    one partition's ordered appends, group commit, off the event loop
    _read_cache.py  ReadCache: recent catch-up reads, shared by subscriptions at one offset
    _drop.py        drop_hosted / drop_partitions: a deleted topic's partitions leave
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from ._bookkeeping import BrokerLimits
    from ._door import BrokerPort, OpenDirectory, PortLink, TopicDirectory
    from ._drop import drop_hosted, drop_partitions
    from ._events import ProposeIsr, TopicAccess
    from ._frontier import PartitionFrontier
    from ._replication import PartitionRole
    from ._server import BrokerServer
    from ._state import BrokerState
    from ._write_access import catalog_access, writers_of

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
