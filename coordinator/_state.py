"""The coordinator's pure core: `CoordinatorState.handle(stimulus) -> [instructions]`.

What it decides: which request becomes which catalog commands (the handlers in `_handlers`),
which sessions are alive (leases against the time each stimulus carries), which requests wait
for a topic and when they give up, what follows from a change (a query that lost a process
fails; the executors of a failed or killed query are told to kill what is left of it; a query
whose processes all registered starts; pending queries are placed, oldest first, once their
processes fit the free slots), when a query that has not started by its start timeout fails,
and when a request may be answered: only once the change it saw is durable. Every reply is
held until `Committed` reaches the catalog version it was computed at, so no client ever sees
state that a crash could take back.

What it must not do: I/O, clocks, threads, logging. The shell (`_server.py`) performs Persist,
Respond, KillProcesses and SessionEnded, feeds back Committed, and owns every task.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from catalog import (
    COLLECTIONS,
    SYSTEM,
    Broker,
    Catalog,
    Change,
    Command,
    CreateTopic,
    Executor,
    FailQuery,
    InvalidCommandError,
    NotAuthorizedError,
    PlaceQuery,
    Query,
    QueryState,
    RegisterBroker,
    RemoveBroker,
    RemoveExecutor,
    Session,
    SessionExpired,
    StartQuery,
    Topic,
    TopicKind,
    TqError,
    UnknownSessionError,
    UnknownTopicError,
    catalog_topic,
)
from querylib.cluster._errors import QueryFailedError
from querylib.cluster._format import CHECKPOINT_TOPIC
from querylib.cluster.messages import HostLoad, JoinCluster, QueryInfo

from ._drops import DropTracker, WaitForDrops
from ._events import (
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
from ._leases import Leases, binding_of
from ._placement import free_slots, place_processes, total_slots, used_slots
from ._waiters import Waiter, Waiters

__all__ = ["Call", "CoordinatorConfig", "CoordinatorState", "WaitForStart", "WaitForTopic"]

MAX_UPLOADS_KEPT = 4096  # packs whose uploaders are remembered (a submit follows its upload)


@dataclass(frozen=True)
class CoordinatorConfig:
    """Bounds on what clients may ask for, in milliseconds."""

    min_lease_ms: int = 100
    max_lease_ms: int = 300_000
    # The lease every session gets after a restart, until its holder renews with its own.
    recovery_lease_ms: int = 10_000
    # The active coordinator's etcd lease (failover): a standby takes over within it.
    active_lease_ms: int = 5_000
    max_wait_ms: int = 300_000
    max_waiters: int = 10_000
    max_sessions: int = 100_000
    # Sessions of one principal other than the admin and executors (admin-role users too):
    # one user opening sessions in a loop leaves the others room. All such principals
    # together stop this much short of max_sessions, kept for the admin and executors.
    max_sessions_per_principal: int = 10_000
    # Checkpoint once this many updates were appended since the last one, or half the
    # catalog's size if that is more: a late follower then reads at most about one catalog
    # size of history, and checkpoints cost O(1) per update, amortized.
    checkpoint_updates: int = 4096
    # A query whose processes have not all registered this long after its submission fails
    # (it waited for slots too long, a spawn hangs, an executor never answers); its
    # submitter learns why. The default, for a query that names none; at most the maximum.
    start_timeout_ms: int = 60_000
    max_start_timeout_ms: int = 86_400_000
    # The cluster's default `tenant/namespace` asked for (tq up / tq coordinator --tenant
    # --namespace): None takes the one the data dir keeps, else public/default (_namespace).
    namespace: str | None = None
    # Whether the coordinator's own broker hosts data when no other broker is registered
    # (`tq up`); not with failover, whose coordinator that takes over has its own (§3).
    spare_broker: bool = True
    # Bytes of uploaded program packs no live query runs that one user may hold (admins and
    # executors excepted): four of the biggest; a query of one gives its room back.
    max_unclaimed_upload_bytes: int = 4 * 64 * 1024 * 1024

    def start_timeout(self, query: Query) -> int:
        """How long `query` may take to start, in ms."""
        return query.start_timeout_ms or self.start_timeout_ms

    def clamp_lease(self, lease_ms: int) -> int:
        return max(self.min_lease_ms, min(self.max_lease_ms, lease_ms))


@dataclass(frozen=True, slots=True)
class Call:
    """What a handler knows about the request it handles besides the request itself."""

    token: Any
    now: float
    wall_ms: int
    peer: bytes
    principal: str = "admin"  # who the request comes from, authenticated (DESIGN §12)


class WaitForStart(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a handler: answer once the query leaves `pending` and `submitted` (it runs,
    or it ended first)."""

    def __init__(self, query_id: int) -> None:
        super().__init__(query_id)
        self.query_id = query_id


class WaitForTopic(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a handler whose request should wait until topic `name` exists."""

    def __init__(self, name: str, wait_ms: int, session_id: int | None) -> None:
        super().__init__(name)
        self.name = name
        self.wait_ms = wait_ms
        self.session_id = session_id


_HANDLERS: dict[type, Any] = {}


def _handlers() -> dict[type, Any]:
    """The request table of `_handlers` (which imports this module, hence the late import)."""
    if not _HANDLERS:
        from ._handlers import HANDLERS, INTERNAL_HANDLERS

        _HANDLERS.update(HANDLERS)
        _HANDLERS.update(INTERNAL_HANDLERS)
    return _HANDLERS


class CoordinatorState:
    """The catalog plus everything the coordinator tracks beside it, driven by stimuli."""

    def __init__(self, catalog: Catalog | None = None, *,
                 config: CoordinatorConfig | None = None, now: float = 0.0,
                 checkpoint: Checkpointed | None = None, since_checkpoint: int = 0) -> None:
        self.catalog = catalog if catalog is not None else Catalog()
        self.config = config or CoordinatorConfig()
        self.committed = self.catalog.version
        self.leases = Leases()
        self.bindings: dict[int, tuple[int, int]] = {}  # session -> (query, process)
        self.bound: dict[tuple[int, int], int] = {}  # (query, process) -> session
        # Processes of submitted queries that registered, whether or not still connected: a
        # short process may finish before its last sibling registers.
        self.registered: dict[int, set[int]] = {}
        self.waiters = Waiters()
        self.placement_cursor = 0
        # Queries waiting for free slots, oldest first: placed in this order (none jumps the
        # queue, so a large query is not starved by small ones; its start timeout bounds it).
        self.pending: list[int] = []
        self._scheduling = False
        self.start_deadlines: dict[int, float] = {}  # pending/submitted query -> when it fails
        self.start_waiters: dict[int, list[Any]] = {}  # such a query -> tokens to answer
        self.loads: dict[int, HostLoad] = {}  # executor session -> its latest heartbeat load
        # Program packs uploaded since this coordinator started -> who uploaded them (a user
        # runs what it uploaded: `may_run_program`); the most recent MAX_UPLOADS_KEPT.
        self.uploads: OrderedDict[str, set[str]] = OrderedDict()
        self.drops = DropTracker()  # deleted topics' partitions: who to tell, who waits
        self.checkpoint = checkpoint  # the latest durable checkpoint
        self.since_checkpoint = since_checkpoint  # updates appended after it
        self._checkpointing = False
        self._held: deque[tuple[int, Respond | SpawnProcesses | DropPartitions]] = deque()
        self._out: list[Instruction] = []
        # Every session the catalog holds gets a fresh lease: its holder may be alive and
        # about to renew (this is how sessions survive a coordinator restart).
        recovery_lease = self.config.recovery_lease_ms / 1000
        for session in self.catalog.sessions:
            self.leases.grant(session.session_id, recovery_lease, now)
            binding = binding_of(session)
            if binding is not None:
                self.bind(session.session_id, binding)
        # Queries not started yet get their whole start timeout again: the time they waited
        # before the restart is not known to this clock.
        for query in sorted(self.catalog.queries, key=lambda q: q.query_id):
            if query.state in (QueryState.PENDING, QueryState.SUBMITTED):
                self.start_deadlines[query.query_id] = now + self.config.start_timeout(query) / 1000
            if query.state == QueryState.PENDING:
                self.pending.append(query.query_id)

    # -- the one entry point -------------------------------------------------------------------

    def handle(self, stimulus: Stimulus) -> list[Instruction]:
        out: list[Instruction] = []
        self._out = out
        if isinstance(stimulus, Received):
            self._received(stimulus)
        elif isinstance(stimulus, Tick):
            self._tick(stimulus.now, stimulus.wall_ms)
        elif isinstance(stimulus, Committed):
            self._committed(stimulus.version)
        elif isinstance(stimulus, Bootstrap):
            self._bootstrap(stimulus)
        elif isinstance(stimulus, Checkpointed):
            self._checkpointing = False
            if self.checkpoint is None or stimulus.version > self.checkpoint.version:
                self.checkpoint = stimulus
        else:
            raise TypeError(f"not a coordinator stimulus: {stimulus!r}")
        self._out = []
        return out

    # -- what handlers use ---------------------------------------------------------------------

    @property
    def catalog_broker_id(self) -> int | None:
        """The coordinator's own broker: the one registered without a session."""
        for broker in self.catalog.brokers:
            assert isinstance(broker, Broker)
            if broker.session_id is None:
                return broker.broker_id
        return None

    @property
    def catalog_broker(self) -> str:
        broker_id = self.catalog_broker_id
        return "" if broker_id is None else self.catalog.broker(broker_id).address

    @property
    def catalog_broker_key(self) -> str:
        """The catalog broker's CURVE public key, "" when it is a PLAIN server."""
        broker_id = self.catalog_broker_id
        return "" if broker_id is None else self.catalog.broker(broker_id).curve_key

    def apply(self, command: Command, now: float, wall_ms: int) -> Change:
        """Apply one command (raising its CatalogError, changing nothing), persist the change
        and run what follows from it."""
        change = self.catalog.apply(command)
        if change.updates:
            self._out.append(Persist(change.version, change.updates, wall_ms))
            self.since_checkpoint += len(change.updates)
            self._after(command, change, now, wall_ms)
        return change

    def respond(self, token: Any, reply: Any = None, error: BaseException | None = None) -> None:
        """Answer a request once the catalog version it saw is durable."""
        self._when_durable(Respond(token, reply, error))

    def when_durable(self, instruction: Respond | SpawnProcesses | DropPartitions) -> None:
        self._when_durable(instruction)

    def _when_durable(self, instruction: Respond | SpawnProcesses | DropPartitions) -> None:
        """Emit `instruction` once the catalog's current version is durable: nothing outside
        may act on a change a crash could still undo."""
        version = self.catalog.version
        if version <= self.committed:
            self._out.append(instruction)
        else:
            self._held.append((version, instruction))

    def uploaded(self, program: str, principal: str) -> None:
        """`principal` uploaded the pack `program` (`sha256:<hex>`) whole."""
        self.uploads.setdefault(program, set()).add(principal)
        self.uploads.move_to_end(program)
        while len(self.uploads) > MAX_UPLOADS_KEPT:
            self.uploads.popitem(last=False)

    def renew(self, session_id: int, now: float, lease_ms: int | None = None) -> int:
        """Check the session is open and extend its lease; returns the lease in ms."""
        self.catalog.session(session_id)  # UnknownSessionError if it is gone
        length = None if lease_ms is None else self.config.clamp_lease(lease_ms) / 1000
        if session_id not in self.leases:
            self.leases.grant(session_id, length or self.config.recovery_lease_ms / 1000, now)
            return round(self.leases.length(session_id) * 1000)
        return round(self.leases.renew(session_id, now, length) * 1000)

    def bind(self, session_id: int, binding: tuple[int, int]) -> None:
        self.bindings[session_id] = binding
        self.bound[binding] = session_id
        query_id, process = binding
        if self.catalog.query(query_id).state == QueryState.SUBMITTED:
            self.registered.setdefault(query_id, set()).add(process)

    @property
    def held(self) -> int:
        """Replies waiting for their change to become durable."""
        return len(self._held)

    # -- stimuli -------------------------------------------------------------------------------

    def _received(self, stimulus: Received) -> None:
        request = stimulus.request
        handler = _handlers().get(type(request))
        if handler is None:
            self.respond(stimulus.token, error=InvalidCommandError(
                f"the coordinator does not serve {type(request).__name__}"))
            return
        call = Call(stimulus.token, stimulus.now, stimulus.wall_ms, stimulus.peer,
                    stimulus.principal)
        try:
            self._check_holder(request, call.principal)
        except TqError as exc:
            self.respond(call.token, error=exc)
            return
        self._run(handler, request, call, deadline=None)

    def _check_holder(self, request: Any, principal: str) -> None:
        """A session is used only by the principal that opened it: naming another's session
        id gets nothing of it (DESIGN §12)."""
        if principal.startswith("join:") and not isinstance(request, JoinCluster):
            # A join token's holder may redeem it, nothing else (DESIGN §12).
            raise NotAuthorizedError(f"{principal} may only join (tq executor --join); it "
                                     "may not open sessions or ask anything else")
        session_id = getattr(request, "session_id", None)
        if session_id is None:
            return
        session = self.catalog.find_session(session_id)
        if session is not None and session.principal != principal:
            raise NotAuthorizedError(f"session {session_id} belongs to another principal")

    def _run(self, handler: Any, request: Any, call: Call, deadline: float | None) -> None:
        try:
            reply = handler(self, request, call)
        except WaitForTopic as wait:
            self._wait(request, call, wait, deadline)
        except WaitForStart as wait:
            self.start_waiters.setdefault(wait.query_id, []).append(call.token)
        except WaitForDrops as wait:
            self.drops.wait(self, wait, call.token, call.now)
        except TqError as exc:
            self.respond(call.token, error=exc)
        else:
            self.respond(call.token, reply)

    def _wait(self, request: Any, call: Call, wait: WaitForTopic, deadline: float | None) -> None:
        if deadline is None:
            if len(self.waiters) >= self.config.max_waiters:
                self.respond(call.token, error=UnknownTopicError(
                    f"topic {wait.name!r} does not exist, and {len(self.waiters)} requests "
                    "wait for topics already; retry later"))
                return
            wait_ms = min(wait.wait_ms, self.config.max_wait_ms)
            deadline = call.now + wait_ms / 1000
        self.waiters.add(Waiter(call.token, request, wait.name, deadline, wait.session_id,
                                call.peer, call.principal))

    def _tick(self, now: float, wall_ms: int) -> None:
        for session_id in self.leases.expired(now):
            self._expire(session_id, now, wall_ms)
        self.drops.tick(self, now)
        for waiter in self.waiters.expired(now):
            self.respond(waiter.token, error=UnknownTopicError(
                f"topic {waiter.name!r} did not appear in time"))
        late = [q for q, deadline in self.start_deadlines.items() if deadline <= now]
        for query_id in late:
            del self.start_deadlines[query_id]
            query = self.catalog.query(query_id)
            seconds = self.config.start_timeout(query) / 1000
            if query.state == QueryState.SUBMITTED:
                registered = self.registered.get(query_id, set())
                missing = [str(p) for p in range(query.processes)
                           if p not in registered and query.exit_codes[p] is None]
                self.apply(FailQuery(query_id=query_id, at_ms=wall_ms, reason=(
                    f"not every process registered within {seconds:g}s (process"
                    f"{'es' if len(missing) > 1 else ''} {', '.join(missing)} did not)")),
                    now, wall_ms)
            elif query.state == QueryState.PENDING:
                self.apply(FailQuery(query_id=query_id, at_ms=wall_ms,
                                     reason=self._no_slots_reason(query, seconds)),
                           now, wall_ms)

    def _no_slots_reason(self, query: Query, seconds: float) -> str:
        used = used_slots(self.catalog)
        total = total_slots(self.catalog)
        ahead = self.pending.index(query.query_id) if query.query_id in self.pending else 0
        why = (f"{free_slots(self.catalog, used)} of the executors' {total} are free"
               + (f" and {ahead} earlier {'query waits' if ahead == 1 else 'queries wait'}"
                  if ahead else ""))
        return (f"waited {seconds:g}s for {query.processes} free process slots ({why}); "
                "end a running query (tq kill), give executors more slots (--slots), "
                "or allow longer (--start-timeout)")

    def queue_or_place(self, query: Query, now: float, wall_ms: int) -> None:
        """After a query was submitted: spawn its processes if it is placed, else it waits in
        the pending queue. Either way it fails at its start timeout unless running by then."""
        self.start_deadlines[query.query_id] = now + self.config.start_timeout(query) / 1000
        if query.placed:
            self.spawn(query, now, wall_ms)

    def schedule(self, now: float, wall_ms: int) -> None:
        """Place pending queries, oldest first, while the oldest fits the free slots."""
        if self._scheduling:
            return  # placing one query applies a change, which calls back here
        self._scheduling = True
        try:
            while self.pending:
                query = self.catalog.query(self.pending[0])
                try:
                    executors = place_processes(self.catalog, query.processes, self.loads,
                                                only_free=True)
                except InvalidCommandError:
                    return  # no executor at all: wait for one (or the start timeout)
                if executors is None:
                    return
                self.apply(PlaceQuery(query_id=query.query_id, executors=executors,
                                      at_ms=wall_ms), now, wall_ms)
                self.spawn(self.catalog.query(query.query_id), now, wall_ms)
        finally:
            self._scheduling = False

    def spawn(self, query: Query, now: float, wall_ms: int) -> None:
        """Tell the executors to start the processes of a placed query; it fails if they have
        not all registered by its start deadline."""
        processes = []
        for process, executor_id in enumerate(query.executors):
            try:
                session_id: int | None = self.catalog.executor(executor_id).session_id
            except TqError:
                session_id = None
            processes.append((process, executor_id, session_id))
        self.start_deadlines.setdefault(query.query_id,
                                        now + self.config.start_timeout(query) / 1000)
        gone = [executor_id for _, executor_id, session in processes if session is None]
        if gone:
            self.apply(FailQuery(query_id=query.query_id, at_ms=wall_ms, reason=(
                f"executor {gone[0]} is gone")), now, wall_ms)
            return
        # Held until the query is durable: processes of a query a crash forgot could not
        # register, and would run unaccounted for until they gave up.
        self._when_durable(SpawnProcesses(query.query_id, query.program, tuple(processes),
                                          query.processes, query.workers, tuple(query.args),
                                          name=query.name))

    def _started_or_ended(self, query: Query) -> None:
        """The query left pending or submitted: it runs, or it ended before it could."""
        self.start_deadlines.pop(query.query_id, None)
        self.registered.pop(query.query_id, None)
        for token in self.start_waiters.pop(query.query_id, []):
            self.answer_start(token, query)

    def answer_start(self, token: Any, query: Query) -> None:
        """Answer whoever waits for `query` to start: it runs (or even finished), or why not."""
        if query.state in (QueryState.FAILED, QueryState.KILLED):
            self.respond(token, error=QueryFailedError(
                f"query {query.query_id} ({query.name}) {query.state.value}: "
                f"{query.reason or 'no reason given'}"))
        else:
            self.respond(token, QueryInfo(query=query, version=self.catalog.version))

    def _expire(self, session_id: int, now: float, wall_ms: int) -> None:
        binding = self.bindings.get(session_id)
        try:
            self.apply(SessionExpired(session_id=session_id, at_ms=wall_ms), now, wall_ms)
        except UnknownSessionError:
            return  # closed in the same instant; nothing owned is left
        if binding is None:
            return
        query_id, process = binding
        query = self.catalog.query(query_id)
        if not query.ended and query.exit_codes[process] is None:
            # A process that stopped renewing is lost, though no executor reported an exit.
            self.apply(FailQuery(query_id=query_id, at_ms=wall_ms,
                                 reason=f"process {process} lost its session (lease expired)"),
                       now, wall_ms)

    def _committed(self, version: int) -> None:
        if version <= self.committed:
            return
        self.committed = version
        held = self._held
        while held and held[0][0] <= version:
            self._out.append(held.popleft()[1])
        size = sum(len(c) for _, c in self.catalog.collections())
        if not self._checkpointing and self.since_checkpoint >= max(
                self.config.checkpoint_updates, size // 2):
            # Taken at the in-memory version: the writer appends it after every change up to
            # it, and indexes it only once they are all durable.
            self._checkpointing = True
            self.since_checkpoint = 0
            self._out.append(WriteCheckpoint(self.catalog.version, {
                name: list(collection.items()) for name, collection in self.catalog.collections()
            }))

    # -- what follows from a change ------------------------------------------------------------

    def _after(self, command: Command, change: Change, now: float, wall_ms: int) -> None:
        ended_sessions: list[int] = []
        created_topics: list[str] = []
        old_queries: dict[int, Query] = {}
        new_queries: list[Query] = []
        for collection, record, diff in change.updates:
            if collection == "sessions" and diff < 0:
                assert isinstance(record, Session)
                ended_sessions.append(record.session_id)
            elif collection == "topics" and diff > 0:
                assert isinstance(record, Topic)
                created_topics.append(record.name)
            elif collection == "queries":
                assert isinstance(record, Query)
                if diff < 0:
                    old_queries[record.query_id] = record
                else:
                    new_queries.append(record)
        for session_id in ended_sessions:
            self._session_ended(session_id, isinstance(command, SessionExpired))
        waiting = (QueryState.PENDING, QueryState.SUBMITTED)
        for query in new_queries:
            old = old_queries.get(query.query_id)
            if old is None and query.state == QueryState.PENDING:
                self.pending.append(query.query_id)
            elif old is not None and old.state == QueryState.PENDING != query.state:
                self.pending.remove(query.query_id)
            if old is not None and old.state in waiting and query.state not in waiting:
                self._started_or_ended(query)
            if query.state in (QueryState.FAILED, QueryState.KILLED) and (
                    old is None or not old.ended):
                self._kill_remaining(query)
        self.drops.after(self, change, now)
        if self.pending and (new_queries or any(c == "executors" for c, _, _ in change.updates)):
            self.schedule(now, wall_ms)  # slots may have come free, or executors joined
        for name in created_topics:
            for waiter in self.waiters.take(name):
                call = Call(waiter.token, now, wall_ms, waiter.peer, waiter.principal)
                self._run(_handlers()[type(waiter.request)], waiter.request, call,
                          waiter.deadline)

    def _session_ended(self, session_id: int, expired: bool) -> None:
        self.leases.forget(session_id)
        self.loads.pop(session_id, None)
        binding = self.bindings.pop(session_id, None)
        if binding is not None and self.bound.get(binding) == session_id:
            del self.bound[binding]
        self._out.append(SessionEnded(session_id, expired))
        for waiter in self.waiters.take_session(session_id):
            self.respond(waiter.token, error=UnknownSessionError(
                f"session {session_id} ended while waiting for topic {waiter.name!r}"))

    def _kill_remaining(self, query: Query) -> None:
        running = []
        for process, (executor_id, code) in enumerate(
                zip(query.executors, query.exit_codes, strict=True)):
            if code is not None:
                continue
            try:
                session_id = self.catalog.executor(executor_id).session_id
            except TqError:
                session_id = None  # the executor left; its processes went with it
            running.append((process, executor_id, session_id))
        if running:
            self._out.append(KillProcesses(query.query_id, tuple(running), query.reason))

    def start_if_registered(self, query_id: int, now: float, wall_ms: int) -> None:
        """Start a submitted query once each of its processes registered (even if it has closed
        its session since) or exited."""
        query = self.catalog.query(query_id)
        if query.state != QueryState.SUBMITTED:
            return
        registered = self.registered.get(query_id, set())
        if all(p in registered or query.exit_codes[p] is not None
               for p in range(query.processes)):
            self.apply(StartQuery(query_id=query_id, at_ms=wall_ms), now, wall_ms)

    # -- bootstrap -----------------------------------------------------------------------------

    def _bootstrap(self, b: Bootstrap) -> None:
        """Register this process's broker and create the catalog topics on it.

        Executors and brokers registered without a session belong to the coordinator's own
        process (`tq up`); a previous run's are stale by definition, so they leave first.
        """
        now = 0.0
        mine = [r for r in self.catalog.brokers if isinstance(r, Broker) and r.session_id is None]
        keep = next((r for r in mine if r.address == b.address and r.host == b.host
                     and r.kafka_address == b.kafka_address and r.curve_key == b.curve_key),
                    None)
        for executor in list(self.catalog.executors):
            assert isinstance(executor, Executor)
            if executor.session_id is None:
                self.apply(RemoveExecutor(executor_id=executor.executor_id, at_ms=b.wall_ms),
                           now, b.wall_ms)
        for broker in mine:
            if broker is not keep:
                self.apply(RemoveBroker(broker_id=broker.broker_id), now, b.wall_ms)
        if keep is None:
            # Re-join under the old id, so the catalog topics' locations stay right.
            old_id = min((r.broker_id for r in mine), default=None)
            self.apply(RegisterBroker(host=b.host, address=b.address, session_id=None,
                                      broker_id=old_id, kafka_address=b.kafka_address,
                                      curve_key=b.curve_key),
                       now, b.wall_ms)
        broker_id = self.catalog_broker_id
        assert broker_id is not None
        wanted = [(catalog_topic(c), f"tq.catalog.{t.__name__}", TopicKind.COLLECTION)
                  for c, t in COLLECTIONS.items()]
        wanted.append((CHECKPOINT_TOPIC, "tq.catalog.checkpoint", TopicKind.STREAM))
        for name, record_type, kind in wanted:
            if self.catalog.find_topic(name) is None:
                self.apply(CreateTopic(name=name, partitions=1, record_type=record_type,
                                       kind=kind, owner=SYSTEM, locations=(broker_id,),
                                       at_ms=b.wall_ms), now, b.wall_ms)
        self.schedule(now, b.wall_ms)  # queries left pending by the previous run

    def catalog_topics(self) -> dict[str, Topic]:
        """Collection name -> its `__catalog.*` topic, for those that exist."""
        out = {}
        for collection in COLLECTIONS:
            topic = self.catalog.find_topic(catalog_topic(collection))
            if topic is not None:
                out[collection] = topic
        return out
