"""What goes into the coordinator's core and what comes out (`CoordinatorState.handle`).

Stimuli carry every input the core needs, times included: `now` is the shell's monotonic clock
in seconds (leases, waits), `wall_ms` the wall clock in milliseconds (the times the catalog
records). Instructions are what the shell must perform, in the order given.

A request's `token` is opaque to the core (the shell uses a future); the core hands it back in
the `Respond` that answers it, possibly much later (a blocking subscribe), and never twice.

Must not: hold logic, do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from catalog import Record, Update

__all__ = [
    "Bootstrap",
    "Checkpointed",
    "Committed",
    "DropPartitions",
    "Instruction",
    "KillProcesses",
    "SpawnProcesses",
    "Persist",
    "Received",
    "Respond",
    "SessionEnded",
    "Stimulus",
    "Tick",
    "WriteCheckpoint",
]


# -- stimuli ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """A decoded request from a client. `peer` is its transport identity, for notifies;
    `principal` who it authenticated as (DESIGN §12)."""

    token: Any
    request: Any
    now: float
    wall_ms: int
    peer: bytes = b""
    principal: str = "admin"


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: leases may have run out, waiting requests may have timed out."""

    now: float
    wall_ms: int


@dataclass(frozen=True, slots=True)
class Committed:
    """Every change up to `version` is durably appended to the catalog topics."""

    version: int


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """The coordinator's own broker listens at `address`: register it (or move its record
    there), drop what a previous run of this process owned, create missing catalog topics."""

    host: str
    address: str
    wall_ms: int
    kafka_address: str = ""  # HOST:PORT of its Kafka listener (the group coordinator), or ""
    curve_key: str = ""  # its CURVE public key when it is a CURVE server, else ""


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A checkpoint at `version` is durable and indexed: each collection's block offset."""

    version: int
    offsets: dict[str, int]


Stimulus: TypeAlias = Received | Tick | Committed | Bootstrap | Checkpointed


# -- instructions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Persist:
    """Append this change to the catalog topics, after every change before it."""

    version: int
    updates: tuple[Update, ...]
    wall_ms: int


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the request behind `token` with a reply, or with `error` (a TqError)."""

    token: Any
    reply: Any = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class KillProcesses:
    """Tell the executors still running processes of a query that failed or was killed to
    terminate them: (process index, executor id, that executor's session or None)."""

    query_id: int
    processes: tuple[tuple[int, int, int | None], ...]
    reason: str


@dataclass(frozen=True, slots=True)
class SpawnProcesses:
    """Tell the executors to start a query's processes: (process index, executor id, that
    executor's session or None)."""

    query_id: int
    program: str
    processes: tuple[tuple[int, int, int | None], ...]
    process_count: int
    workers: int
    args: tuple[str, ...]
    name: str = ""  # the query's name: its processes are titled with it (`tq query 12 clicks 1/2`)


@dataclass(frozen=True, slots=True)
class DropPartitions:
    """Tell the executor holding broker `broker_id` (through its session `session_id`) to
    drop these partitions of deleted topic `topic_id` (`name`, canonical) and report it."""

    session_id: int
    topic_id: int
    name: str
    broker_id: int
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """A session left (closed or expired): the shell forgets its transport identity."""

    session_id: int
    expired: bool


@dataclass(frozen=True, slots=True)
class WriteCheckpoint:
    """Append a checkpoint of the catalog at `version`, after every change up to it:
    collection -> its (record, multiplicity) pairs."""

    version: int
    contents: dict[str, list[tuple[Record, int]]]


Instruction: TypeAlias = (Persist | Respond | KillProcesses | SpawnProcesses | SessionEnded
                          | WriteCheckpoint | DropPartitions)
