"""The executor agent's pure core (`executor._agent_state`): its races, step by step (a rejoin
during a spawn, a kill during a spawn, a session lost with processes running, spawns waiting
for dying processes' slots), then any sequence of events (hypothesis): slots, processes and the
dying set always agree, every slot comes back, and nothing of a lost session is reported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from executor._agent_state import (
    DRAIN_ALLOWANCE,
    AgentState,
    Attached,
    CleanDisk,
    CleanDone,
    DropDone,
    DropRequested,
    DropTopic,
    Exited,
    Fetch,
    Fetched,
    Forget,
    Kill,
    KillAll,
    KillRequested,
    Launch,
    Launched,
    ReportExit,
    ReportSpawnFailed,
    SessionLost,
    SpawnRequested,
    StartFailed,
    Tick,
    WakeAt,
)
from executor._slots import Slots

GRACE = 5.0


@dataclass(frozen=True)
class Note:
    query_id: int
    topic_id: int = 0


def _state(slots: int = 2) -> AgentState:
    state = AgentState(Slots(slots), grace=GRACE)
    state.handle(Attached(1))
    return state


def _kinds(instructions: list[Any]) -> list[str]:
    return [type(i).__name__ for i in instructions]


def _spawn(state: AgentState, query: int, process: int = 0, now: float = 0.0) -> list[Any]:
    return state.handle(SpawnRequested(Note(query), process, now))


def _run(state: AgentState, query: int, process: int = 0) -> None:
    """Spawn process `process` of `query` until it runs."""
    key = (query, process)
    assert _kinds(_spawn(state, query, process)) == ["Fetch"]
    assert _kinds(state.handle(Fetched(key, "artifact"))) == ["Launch"]
    assert state.handle(Launched(key)) == []


def _exit(state: AgentState, key: tuple[int, int]) -> list[Any]:
    return state.handle(Exited(key, f"report {key}"))


def test_a_spawn_takes_a_slot_until_its_exit_which_is_reported() -> None:
    state = _state()
    assert _spawn(state, 1) == [Fetch((1, 0), Note(1))]
    assert state.handle(Fetched((1, 0), "art")) == [Launch((1, 0), Note(1), "art")]
    assert state.handle(Launched((1, 0))) == []
    assert state.slots.used == 1
    assert _exit(state, (1, 0)) == [ReportExit("report (1, 0)"), CleanDisk(), Forget((1, 0))]
    assert state.slots.used == 0
    assert _exit(state, (1, 0)) == [Forget((1, 0))]  # no second cleanup while one runs
    state.handle(CleanDone())
    state.check_invariants()


def test_a_failed_start_releases_the_slot_and_is_reported() -> None:
    state = _state()
    _spawn(state, 1)
    out = state.handle(StartFailed((1, 0), "ExecFailedError: no entry"))
    assert out == [ReportSpawnFailed(1, 0, "ExecFailedError: no entry"), Forget((1, 0))]
    assert state.slots.used == 0


def test_a_duplicate_spawn_is_refused_and_keeps_the_first() -> None:
    state = _state()
    _spawn(state, 1)
    [refused] = _spawn(state, 1)
    assert isinstance(refused, ReportSpawnFailed) and "ProcessExistsError" in refused.reason
    assert state.slots.used == 1 and (1, 0) in state.processes


def test_a_kill_during_the_fetch_means_it_never_launches() -> None:
    state = _state()
    _spawn(state, 1)
    assert state.handle(KillRequested((1, 0))) == []
    assert state.handle(Fetched((1, 0), "art")) == [Forget((1, 0))]
    assert state.slots.used == 0


def test_a_kill_during_the_launch_kills_it_once_it_runs() -> None:
    state = _state()
    _spawn(state, 1)
    state.handle(Fetched((1, 0), "art"))
    assert state.handle(KillRequested((1, 0))) == []
    assert state.handle(Launched((1, 0))) == [Kill((1, 0))]
    assert state.dying == {(1, 0)}
    out = _exit(state, (1, 0))
    assert ReportExit("report (1, 0)") in out and state.slots.used == 0 and not state.dying


def test_a_kill_during_a_launch_that_fails_reports_nothing() -> None:
    state = _state()
    _spawn(state, 1)
    state.handle(Fetched((1, 0), "art"))
    state.handle(KillRequested((1, 0)))
    assert state.handle(StartFailed((1, 0), "boom")) == [Forget((1, 0))]


def test_a_session_lost_with_processes_running_kills_them_and_reports_nothing() -> None:
    state = _state()
    _run(state, 1)
    _run(state, 2)
    assert state.handle(SessionLost()) == [KillAll()]
    assert state.dying == {(1, 0), (2, 0)} and state.generation == 1
    # Their exits come while the agent has no session: nothing to report to.
    assert ReportExit("report (1, 0)") not in _exit(state, (1, 0))
    state.handle(Attached(2))  # rejoined before the second one was drained
    assert _kinds(_exit(state, (2, 0))) == ["Forget"]  # not reported to the new session
    assert state.slots.used == 0 and not state.dying


def test_a_rejoin_during_a_fetch_voids_the_spawn() -> None:
    state = _state()
    _spawn(state, 1)
    state.handle(SessionLost())
    state.handle(Attached(2))
    assert state.handle(Fetched((1, 0), "art")) == [Forget((1, 0))]
    assert state.slots.used == 0 and state.counters["void_spawns"] == 1


def test_a_rejoin_during_a_launch_kills_the_process_once_it_runs() -> None:
    state = _state()
    _spawn(state, 1)
    state.handle(Fetched((1, 0), "art"))
    assert state.handle(SessionLost()) == [KillAll()]  # it is not running: KillAll misses it
    state.handle(Attached(2))
    assert state.handle(Launched((1, 0))) == [Kill((1, 0))]
    assert _kinds(_exit(state, (1, 0))) == ["CleanDisk", "Forget"]  # not reported
    # A new spawn of the same process under the new session runs normally.
    _run(state, 1)


def test_a_failed_start_of_a_lost_session_is_not_reported() -> None:
    state = _state()
    _spawn(state, 1)
    state.handle(SessionLost())
    state.handle(Attached(2))
    assert state.handle(StartFailed((1, 0), "boom")) == [Forget((1, 0))]


def test_a_spawn_waits_for_a_dying_process_slot() -> None:
    state = _state(slots=1)
    _run(state, 1)
    state.handle(KillRequested((1, 0)))
    assert _spawn(state, 2, now=10.0) == [WakeAt(10.0 + GRACE + DRAIN_ALLOWANCE)]
    assert state.handle(Tick(11.0)) == []  # still dying, deadline not reached
    out = _exit(state, (1, 0))
    assert out[-1] == Fetch((2, 0), Note(2)) and state.slots.held() == {(2, 0)}


def test_a_waiting_spawn_is_refused_at_its_deadline() -> None:
    state = _state(slots=1)
    _run(state, 1)
    state.handle(KillRequested((1, 0)))
    [wake] = _spawn(state, 2, now=10.0)
    [refused] = state.handle(Tick(wake.when))
    assert isinstance(refused, ReportSpawnFailed) and "NoFreeSlotsError" in refused.reason
    assert not state.waiting


def test_a_spawn_with_every_slot_held_by_live_processes_is_refused_at_once() -> None:
    state = _state(slots=1)
    _run(state, 1)
    [refused] = _spawn(state, 2)
    assert isinstance(refused, ReportSpawnFailed) and "NoFreeSlotsError" in refused.reason


def test_a_kill_of_a_waiting_spawn_means_it_never_starts() -> None:
    state = _state(slots=1)
    _run(state, 1)
    state.handle(KillRequested((1, 0)))
    _spawn(state, 2, now=0.0)
    state.handle(KillRequested((2, 0)))
    assert _kinds(_exit(state, (1, 0))) == ["ReportExit", "CleanDisk", "Forget"]
    assert state.slots.used == 0


def test_waiting_spawns_of_a_lost_session_are_dropped() -> None:
    state = _state(slots=1)
    _run(state, 1)
    state.handle(KillRequested((1, 0)))
    _spawn(state, 2)
    state.handle(SessionLost())
    assert not state.waiting
    assert _kinds(_exit(state, (1, 0))) == ["CleanDisk", "Forget"]


def test_a_drop_runs_once_at_a_time() -> None:
    state = _state()
    note = Note(0, topic_id=7)
    assert state.handle(DropRequested(note)) == [DropTopic(note)]
    assert state.handle(DropRequested(note)) == []
    state.handle(DropDone(7))
    assert state.handle(DropRequested(note)) == [DropTopic(note)]


# -- any sequence ----------------------------------------------------------------------------

KEYS = [(q, p) for q in (1, 2) for p in (0, 1)]


class AgentMachine(RuleBasedStateMachine):
    """Events in any order the shell could feed them; the model remembers which I/O is in
    flight (a fetch, a launch, a running process) so outcomes come only for what was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.state = AgentState(Slots(3), grace=GRACE)
        self.now = 0.0
        self.fetching: set[tuple[int, int]] = set()
        self.launching: set[tuple[int, int]] = set()
        self.running: set[tuple[int, int]] = set()   # as the supervisor sees it
        self.session = 0                              # bumped at each loss
        self.attached = False
        self.generation_of: dict[tuple[int, int], int] = {}
        self.doomed: set[tuple[int, int]] = set()   # killed, or of a lost session
        self.kill_sent: set[tuple[int, int]] = set()

    def _apply(self, event: Any) -> list[Any]:
        out = self.state.handle(event)
        for instruction in out:
            if isinstance(instruction, Fetch):
                assert instruction.key not in self.fetching | self.launching | self.running
                self.fetching.add(instruction.key)
                self.generation_of[instruction.key] = self.session
                self.doomed.discard(instruction.key)
                self.kill_sent.discard(instruction.key)
            elif isinstance(instruction, Launch):
                self.launching.add(instruction.key)
            elif isinstance(instruction, Kill):
                assert instruction.key in self.running
                self.kill_sent.add(instruction.key)
            elif isinstance(instruction, KillAll):
                self.kill_sent |= self.running
            elif isinstance(instruction, ReportSpawnFailed | ReportExit):
                assert self.attached, "reported without a session"
                # An exit or a failed start is reported only to the session that asked for
                # it (a refused request is the current session's own).
                if isinstance(event, Exited | StartFailed):
                    assert self.generation_of[event.key] == self.session, \
                        "reported to a later session"
        return out

    @precondition(lambda self: not self.attached)
    @rule()
    def attach(self) -> None:
        self.attached = True
        self._apply(Attached(1))

    @precondition(lambda self: self.attached)
    @rule()
    def lose_session(self) -> None:
        self.attached = False
        self.session += 1
        self.doomed |= self.fetching | self.launching | self.running
        self._apply(SessionLost())

    @precondition(lambda self: self.attached)
    @rule(key=st.sampled_from(KEYS))
    def spawn(self, key: tuple[int, int]) -> None:
        self._apply(SpawnRequested(Note(key[0]), key[1], self.now))

    @precondition(lambda self: self.fetching)
    @rule(data=st.data(), ok=st.booleans())
    def fetch_done(self, data: st.DataObject, ok: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.fetching)))
        self.fetching.discard(key)
        self._apply(Fetched(key, "art") if ok else StartFailed(key, "fetch failed"))

    @precondition(lambda self: self.launching)
    @rule(data=st.data(), ok=st.booleans())
    def launch_done(self, data: st.DataObject, ok: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.launching)))
        self.launching.discard(key)
        if ok:
            self.running.add(key)
        self._apply(Launched(key) if ok else StartFailed(key, "launch failed"))

    @precondition(lambda self: self.attached)
    @rule(key=st.sampled_from(KEYS))
    def kill(self, key: tuple[int, int]) -> None:
        if key in self.fetching | self.launching | self.running:
            self.doomed.add(key)
        self._apply(KillRequested(key))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def exit(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.running)))
        self.running.discard(key)
        out = self._apply(Exited(key, key))
        if any(isinstance(i, CleanDisk) for i in out):
            self._apply(CleanDone())

    @rule(step=st.floats(0.0, 20.0))
    def tick(self, step: float) -> None:
        self.now += step
        self._apply(Tick(self.now))

    @invariant()
    def consistent(self) -> None:
        self.state.check_invariants()
        # Every process the supervisor runs holds its slot; what holds a slot is in flight.
        assert self.running <= set(self.state.processes)
        assert set(self.state.processes) <= self.fetching | self.launching | self.running
        # A process that must die and runs has been told to.
        assert self.running & self.doomed <= self.kill_sent, "a doomed process runs on"
        # Nothing doomed is launched.
        assert not (self.launching & self.doomed - set(self.state.processes))

    def teardown(self) -> None:
        # Finish all I/O until none is left (a freed slot admits a waiting spawn, whose fetch
        # is new I/O): every slot comes back.
        for _ in range(4 * len(KEYS) + 4):
            if not self.fetching | self.launching | self.running:
                break
            for key in sorted(self.fetching):
                self.fetching.discard(key)
                self._finish(StartFailed(key, "closing"))
            for key in sorted(self.launching):
                self.launching.discard(key)
                self._finish(StartFailed(key, "closing"))
            for key in sorted(self.running):
                self.running.discard(key)
                self._finish(Exited(key, key))
        self.now += 3600
        self._finish(Tick(self.now))
        assert self.state.slots.used == 0 and not self.state.dying and not self.state.waiting

    def _finish(self, event: Any) -> None:
        if any(isinstance(i, CleanDisk) for i in self._apply(event)):
            self._apply(CleanDone())


TestAgentMachine = AgentMachine.TestCase
TestAgentMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
