"""The control-plane server (DESIGN §2, §3): one event loop, request handlers, sessions with
leases, blocking requests, the catalog persisted as collection topics on an embedded broker, and
recovery from them.

    _events.py     stimuli and instructions of the core
    _state.py      CoordinatorState: the pure core, handle(stimulus) -> [instructions]
    _handlers.py   one handler per request type: requests -> catalog commands -> replies
    _leases.py     session leases and query-process bindings;  _waiters.py blocking requests
    _placement.py  brokers for partitions, executors for processes
    _drops.py      DropTracker: deleted topics' partitions, when to tell which broker to drop
    _journal.py    changes as record batches; recovery from the catalog partitions
    _writer.py     group commit to the catalog topics (counters last), frontiers
    _directory.py  what the embedded broker's core asks about a topic (the catalog)
    _kafka.py      CatalogView: the group coordinator's Kafka listener's view of the catalog
    _failover.py   EtcdCatalog: the election and the catalog in etcd;  _standby.py the warm
                   standby;  _etcd_state.py Kafka groups and transactions in etcd
    _server.py     Coordinator: the asyncio shell (RPC, broker, writer, clock)
    _run.py        run_coordinator: the foreground process (`tq coordinator`, `tq up`)
"""

from coordinator._drops import DropTracker
from coordinator._events import (
    Bootstrap,
    Checkpointed,
    Committed,
    DropPartitions,
    Instruction,
    KillProcesses,
    Persist,
    Received,
    Respond,
    SessionEnded,
    SpawnProcesses,
    Stimulus,
    Tick,
    WriteCheckpoint,
)
from coordinator._journal import Recovered, read_catalog
from coordinator._leases import Leases, binding_of, bound_peer
from coordinator._metrics import coordinator_metrics
from coordinator._run import Attached, run_coordinator
from coordinator._server import Coordinator
from coordinator._state import CoordinatorConfig, CoordinatorState
from coordinator._waiters import Waiter, Waiters

__all__ = [
    "Attached",
    "Bootstrap",
    "Checkpointed",
    "Committed",
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorState",
    "DropPartitions",
    "DropTracker",
    "Instruction",
    "KillProcesses",
    "SpawnProcesses",
    "Leases",
    "Persist",
    "Received",
    "Recovered",
    "Respond",
    "SessionEnded",
    "Stimulus",
    "Tick",
    "Waiter",
    "Waiters",
    "WriteCheckpoint",
    "binding_of",
    "bound_peer",
    "read_catalog",
    "coordinator_metrics",
    "run_coordinator",
]
