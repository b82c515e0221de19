"""Drive a CoordinatorState by hand in tests: requests, ticks and commits, time as input."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from catalog import Resources, SessionKind
from coordinator import (
    Bootstrap,
    Committed,
    CoordinatorConfig,
    CoordinatorState,
    Instruction,
    KillProcesses,
    Persist,
    Received,
    Respond,
    SessionEnded,
    Tick,
    WriteCheckpoint,
)
from querylib.cluster import messages as m

RESOURCES = Resources(cores=4, memory=8 << 30, disk=100 << 30, slots=8)


class Driver:
    """A core plus a clock. `call` sends a request, commits everything, returns the reply (or
    raises the error); the instructions of the last step are kept in `out`."""

    def __init__(self, state: CoordinatorState | None = None, *, now: float = 0.0,
                 config: CoordinatorConfig | None = None, bootstrap: bool = True) -> None:
        self.state = state or CoordinatorState(config=config, now=now)
        self.now = now
        self.tokens = itertools.count(1)
        self.out: list[Instruction] = []
        self.answers: dict[Any, Respond] = {}
        self.persisted: list[Persist] = []
        self.kills: list[KillProcesses] = []
        self.ended: list[SessionEnded] = []
        self.checkpoints: list[WriteCheckpoint] = []
        if bootstrap:
            self.feed(Bootstrap("coord-host", "tcp://127.0.0.1:7401", self.wall))
            self.commit()

    @property
    def wall(self) -> int:
        return 1_000_000 + int(self.now * 1000)

    def feed(self, stimulus: Any) -> list[Instruction]:
        out = self.state.handle(stimulus)
        self.out = out
        for instruction in out:
            if isinstance(instruction, Respond):
                assert instruction.token not in self.answers, "answered twice"
                self.answers[instruction.token] = instruction
            elif isinstance(instruction, Persist):
                self.persisted.append(instruction)
            elif isinstance(instruction, KillProcesses):
                self.kills.append(instruction)
            elif isinstance(instruction, SessionEnded):
                self.ended.append(instruction)
            elif isinstance(instruction, WriteCheckpoint):
                self.checkpoints.append(instruction)
        return out

    def send(self, request: Any, *, peer: bytes = b"peer", principal: str = "admin") -> int:
        token = next(self.tokens)
        self.feed(Received(token, request, self.now, self.wall, peer, principal))
        return token

    def commit(self) -> list[Instruction]:
        return self.feed(Committed(self.state.catalog.version))

    def tick(self, seconds: float) -> list[Instruction]:
        self.now += seconds
        return self.feed(Tick(self.now, self.wall))

    def answer(self, token: int) -> Any:
        respond = self.answers[token]
        if respond.error is not None:
            raise respond.error
        return respond.reply

    def call(self, request: Any, *, principal: str = "admin") -> Any:
        token = self.send(request, principal=principal)
        self.commit()
        return self.answer(token)

    # -- builders ----------------------------------------------------------------------------

    def session(self, kind: SessionKind = SessionKind.CLIENT, lease_ms: int = 1000, *,
                principal: str = "admin", **binding: Any) -> int:
        reply = self.call(m.OpenSession(kind=kind, peer="test", lease_ms=lease_ms, **binding),
                          principal=principal)
        return reply.session_id

    def host(self, name: str = "host-a", lease_ms: int = 1000,
             slots: int = RESOURCES.slots) -> tuple[int, int, int]:
        """An executor agent of `slots` process slots: (session id, broker id, executor id)."""
        session = self.session(SessionKind.EXECUTOR, lease_ms)
        broker = self.call(m.RegisterBroker(session_id=session, host=name,
                                            address=f"tcp://{name}:7411")).broker
        executor = self.call(m.RegisterExecutor(session_id=session, host=name,
                                                broker_id=broker.broker_id,
                                                resources=msgspec.structs.replace(
                                                    RESOURCES, slots=slots))).executor
        return session, broker.broker_id, executor.executor_id
