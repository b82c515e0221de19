"""The executor agent's pure core: `AgentState.handle(event) -> [instructions]` (DESIGN §6).

It decides what the agent does with its query processes: which spawn takes a slot, which waits
for one, which is void; whom to kill; which exit and which failed spawn to report; which drop of
a deleted topic to start. The shell (`_agent.py`) performs the instructions (fetch an artifact,
launch a process, kill one, report to the coordinator) and feeds their outcomes back, through
`querylib.driver.Driver` like the coordinator's and the broker's shells.

A process's life here, by its key (query id, process index); it holds a slot from its spawn
request until its exit (or failed start):

    SpawnRequested -> Fetch -> Fetched -> Launch -> Launched (running) -> Exited
                        \\______________ StartFailed ________________/

- **Sessions and generations.** Every session loss (`SessionLost`) starts a new generation: the
  coordinator failed the queries of the lost session, so every process of an older generation
  is void. Running ones are killed (`KillAll`); one still starting is not launched (after its
  fetch) or is killed once launched; their exits and failed starts are not reported (nobody
  expects them, and the new session's coordinator would refuse them). `Attached` (the first
  join or a rejoin) says a session is there to report to.
- **The dying set.** A process told to die holds its slot until its exit is drained: the
  coordinator counts a slot free once its query ended, a little before that. A spawn that finds
  no free slot while some are held by dying processes waits for them (`WakeAt` its deadline,
  `grace + DRAIN_ALLOWANCE` seconds) instead of being refused at once; one that finds every
  slot held by live processes is refused (`ReportSpawnFailed`).
- **Kill during a spawn.** A kill of a process that is still starting marks it: it is not
  launched after its fetch, or is killed as soon as it runs; either way its slot comes back.

Must not: do I/O, read clocks (time comes in events), log, or know asyncio.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ._errors import NoFreeSlotsError, ProcessExistsError
from ._slots import Slots

__all__ = [
    "DRAIN_ALLOWANCE", "AgentState", "Attached", "CleanDisk", "CleanDone", "DropDone",
    "DropRequested", "DropTopic", "Exited", "Fetch", "Fetched", "Forget", "Kill", "KillAll",
    "KillRequested", "Launch", "Launched", "Phase", "ReportExit", "ReportSpawnFailed",
    "SessionLost", "SpawnRequested", "StartFailed", "Tick", "WakeAt",
]

Key = tuple[int, int]  # (query id, process index)

DRAIN_ALLOWANCE = 5.0  # seconds past the kill grace a dying process may take to be drained


# -- events (what happened) ------------------------------------------------------------------

@dataclass(frozen=True)
class Attached:
    """A session is open (the first join, or a rejoin): reports have somewhere to go."""

    executor_id: int


@dataclass(frozen=True)
class SessionLost:
    """The session is gone (the coordinator did not hear from us for a lease)."""


@dataclass(frozen=True)
class SpawnRequested:
    """The coordinator asks for process `process` of the query `note` (a SpawnProcesses)."""

    note: Any
    process: int
    now: float

    @property
    def key(self) -> Key:
        return (self.note.query_id, self.process)


@dataclass(frozen=True)
class Fetched:
    """A spawn's artifact is installed here."""

    key: Key
    artifact: Any


@dataclass(frozen=True)
class Launched:
    """A spawn's process runs (under the supervisor)."""

    key: Key


@dataclass(frozen=True)
class StartFailed:
    """A spawn failed before its process ran; `reason` says why (one line)."""

    key: Key
    reason: str


@dataclass(frozen=True)
class KillRequested:
    key: Key


@dataclass(frozen=True)
class Exited:
    """A process's exit was drained (`report`: the supervisor's ExitReport)."""

    key: Key
    report: Any


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class CleanDone:
    """A disk cleanup finished (or failed: the next exit runs another)."""


@dataclass(frozen=True)
class DropRequested:
    """The coordinator asks for a deleted topic's partitions to go (a DropPartitions)."""

    note: Any


@dataclass(frozen=True)
class DropDone:
    topic_id: int


# -- instructions (what to do) ---------------------------------------------------------------

@dataclass(frozen=True)
class Fetch:
    """Install the artifact of spawn `key`; then `Fetched` (or `StartFailed`)."""

    key: Key
    note: Any


@dataclass(frozen=True)
class Launch:
    """Start process `key` from `artifact`; then `Launched` (or `StartFailed`)."""

    key: Key
    note: Any
    artifact: Any


@dataclass(frozen=True)
class Kill:
    """TERM to process `key`'s group, KILL after the grace period (its exit follows)."""

    key: Key


@dataclass(frozen=True)
class KillAll:
    """Kill every process (the session is lost)."""


@dataclass(frozen=True)
class Forget:
    """Process `key` holds nothing any more: drop what the shell keeps for it."""

    key: Key


@dataclass(frozen=True)
class ReportSpawnFailed:
    query_id: int
    process: int
    reason: str


@dataclass(frozen=True)
class ReportExit:
    """Report an exit (after flushing the process's last lines)."""

    report: Any


@dataclass(frozen=True)
class CleanDisk:
    """Prune work dirs and artifacts (then `CleanDone`)."""


@dataclass(frozen=True)
class DropTopic:
    """Drop a deleted topic's partitions and report it (then `DropDone`)."""

    note: Any


@dataclass(frozen=True)
class WakeAt:
    """Feed a `Tick` at (or after) loop time `when`."""

    when: float


# -- the state -------------------------------------------------------------------------------

class Phase(Enum):
    FETCHING = "fetching"
    LAUNCHING = "launching"
    RUNNING = "running"


@dataclass
class Process:
    """A process that holds a slot."""

    note: Any
    generation: int
    phase: Phase = Phase.FETCHING
    killed: bool = False  # a kill came while it was starting


@dataclass
class _Waiting:
    """A spawn waiting for a dying process's slot, until `deadline`."""

    request: SpawnRequested
    generation: int
    deadline: float


@dataclass
class AgentState:
    """The agent's processes, slots, session generation, dying set and drops."""

    slots: Slots
    grace: float = 5.0
    generation: int = 0
    attached: bool = False
    executor_id: int | None = None
    processes: dict[Key, Process] = field(default_factory=dict)
    dying: set[Key] = field(default_factory=set)
    waiting: deque[_Waiting] = field(default_factory=deque)
    dropping: set[int] = field(default_factory=set)
    cleaning: bool = False
    counters: dict[str, int] = field(default_factory=lambda: {
        "spawned": 0, "spawn_failed": 0, "void_spawns": 0})

    def handle(self, event: Any) -> list[Any]:
        handler = getattr(self, f"_on_{type(event).__name__}")
        result: list[Any] = handler(event)
        return result

    # -- sessions ----------------------------------------------------------------------------

    def _on_Attached(self, ev: Attached) -> list[Any]:
        self.attached = True
        self.executor_id = ev.executor_id
        return []

    def _on_SessionLost(self, ev: SessionLost) -> list[Any]:
        self.attached = False
        self.generation += 1
        self.waiting.clear()  # their queries failed with the session
        for key, process in self.processes.items():
            if process.phase is Phase.RUNNING:
                self.dying.add(key)
        return [KillAll()]

    # -- spawns ------------------------------------------------------------------------------

    def _on_SpawnRequested(self, ev: SpawnRequested) -> list[Any]:
        if self.slots.holds(ev.key) or any(w.request.key == ev.key for w in self.waiting):
            return self._refuse(ev.key, self.generation, ProcessExistsError(
                f"process {ev.process} of query {ev.note.query_id} is here already"))
        if self.slots.free == 0 and self.dying:
            deadline = ev.now + self.grace + DRAIN_ALLOWANCE
            self.waiting.append(_Waiting(ev, self.generation, deadline))
            return [WakeAt(deadline)]
        return self._start(ev.key, ev.note, self.generation)

    def _start(self, key: Key, note: Any, generation: int) -> list[Any]:
        try:
            self.slots.reserve(key)
        except (ProcessExistsError, NoFreeSlotsError) as exc:
            return self._refuse(key, generation, exc)
        self.processes[key] = Process(note, generation)
        return [Fetch(key, note)]

    def _refuse(self, key: Key, generation: int, exc: Exception) -> list[Any]:
        self.counters["spawn_failed"] += 1
        return self._report_failed(key, generation, f"{type(exc).__name__}: {exc}")

    def _report_failed(self, key: Key, generation: int, reason: str) -> list[Any]:
        if not self.attached or generation != self.generation:
            return []  # its session, hence its query, is gone
        return [ReportSpawnFailed(key[0], key[1], reason)]

    def _void(self, process: Process) -> bool:
        """Its query is gone: killed while it started, or its session was lost."""
        return process.killed or process.generation != self.generation

    def _on_Fetched(self, ev: Fetched) -> list[Any]:
        process = self.processes.get(ev.key)
        if process is None or process.phase is not Phase.FETCHING:
            return []
        if self._void(process):
            self.counters["void_spawns"] += 1
            return self._release(ev.key)
        process.phase = Phase.LAUNCHING
        return [Launch(ev.key, process.note, ev.artifact)]

    def _on_Launched(self, ev: Launched) -> list[Any]:
        process = self.processes.get(ev.key)
        if process is None or process.phase is not Phase.LAUNCHING:
            return []
        process.phase = Phase.RUNNING
        self.counters["spawned"] += 1
        if self._void(process):  # killed, or the session lost, while it started
            self.counters["void_spawns"] += 1
            self.dying.add(ev.key)
            return [Kill(ev.key)]
        return []

    def _on_StartFailed(self, ev: StartFailed) -> list[Any]:
        process = self.processes.get(ev.key)
        if process is None or process.phase is Phase.RUNNING:
            return []
        self.counters["spawn_failed"] += 1
        report = [] if process.killed else self._report_failed(ev.key, process.generation,
                                                               ev.reason)
        return [*report, *self._release(ev.key)]

    # -- kills and exits ---------------------------------------------------------------------

    def _on_KillRequested(self, ev: KillRequested) -> list[Any]:
        process = self.processes.get(ev.key)
        if process is None:
            # Not here (ended already), or still waiting for a slot: it never starts.
            self.waiting = deque(w for w in self.waiting if w.request.key != ev.key)
            return []
        if process.phase is not Phase.RUNNING:
            process.killed = True  # not launched after its fetch, or killed once it runs
            return []
        self.dying.add(ev.key)
        return [Kill(ev.key)]

    def _on_Exited(self, ev: Exited) -> list[Any]:
        process = self.processes.get(ev.key)
        report = process is not None and self.attached and \
            process.generation == self.generation
        out: list[Any] = [ReportExit(ev.report)] if report else []
        if not self.cleaning:
            self.cleaning = True
            out.append(CleanDisk())
        return [*out, *self._release(ev.key)]

    def _on_CleanDone(self, ev: CleanDone) -> list[Any]:
        self.cleaning = False
        return []

    def _release(self, key: Key) -> list[Any]:
        """Give `key`'s slot back; waiting spawns may take it."""
        self.processes.pop(key, None)
        self.dying.discard(key)
        self.slots.release(key)
        return [Forget(key), *self._wake(None)]

    def _on_Tick(self, ev: Tick) -> list[Any]:
        return self._wake(ev.now)

    def _wake(self, now: float | None) -> list[Any]:
        """Retry the waiting spawns in order (a slot came back, or it is `now`): each takes a
        free slot, keeps waiting while dying processes may free one before its deadline, or
        is refused."""
        out: list[Any] = []
        waiting, self.waiting = self.waiting, deque()
        for w in waiting:
            key = w.request.key
            if w.generation != self.generation:
                continue  # its session, hence its query, is gone
            if self.slots.free > 0:
                out += self._start(key, w.request.note, w.generation)
            elif self.dying and (now is None or now < w.deadline):
                self.waiting.append(w)
            else:
                out += self._refuse(key, w.generation, NoFreeSlotsError(
                    f"all {self.slots.total} process slots of this executor are in use"))
        return out

    # -- drops -------------------------------------------------------------------------------

    def _on_DropRequested(self, ev: DropRequested) -> list[Any]:
        if ev.note.topic_id in self.dropping:  # sent again while we are at it
            return []
        self.dropping.add(ev.note.topic_id)
        return [DropTopic(ev.note)]

    def _on_DropDone(self, ev: DropDone) -> list[Any]:
        self.dropping.discard(ev.topic_id)
        return []

    # -- checks ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError unless slots, processes and the dying set agree (run after
        every step in the tests)."""
        assert set(self.processes) == set(self.slots.held()), \
            f"slots {sorted(self.slots.held(), key=repr)} != processes {sorted(self.processes)}"
        assert self.dying <= set(self.processes), "a dying process holds no slot"
        assert all(self.processes[k].phase is Phase.RUNNING for k in self.dying), \
            "a dying process that never ran"
        assert not {w.request.key for w in self.waiting} & set(self.processes), \
            "a waiting spawn that holds a slot"
