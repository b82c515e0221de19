"""The rules: one handler per command; a refused command raises and leaves no trace.

A handler reads the committed catalog, raises a CatalogError if the command breaks an invariant,
and otherwise stages updates (and new ids) in a `Txn`. The catalog commits the Txn only if the
handler returns, so a refused command leaves no trace.

Cascades (a session ends -> its executors leave -> queries on them fail -> their publications
leave) are computed over disjoint sets so that no record is retracted twice.

Must not: mutate the catalog (only `Catalog._commit` does), read clocks, do I/O.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from catalog._access import (
    is_admin,
    is_executor,
    leads_back,
    manages_query,
    may_alter_topic,
    may_delete_topic,
    may_take_over,
    owner_active,
    owner_principal,
    party_principal,
    placed_on_session,
    publishes_as_owner,
    quota_principal,
    root_principal,
    successor_owner,
)
from catalog._commands import (
    AddUser,
    AlterPartition,
    AlterTopic,
    CloseSession,
    CreateToken,
    CreateTopic,
    DecommissionBroker,
    DeleteTopic,
    FailQuery,
    KillQuery,
    OpenSession,
    PartitionsDropped,
    PlaceQuery,
    ProcessExited,
    Publish,
    RedeemToken,
    RegisterBroker,
    RegisterExecutor,
    RemoveBroker,
    RemoveExecutor,
    RemoveUser,
    RevokeToken,
    RotateUser,
    SessionExpired,
    StartQuery,
    SubmitQuery,
    Subscribe,
    Unpublish,
    Unsubscribe,
)
from catalog._names import TopicName
from catalog._principals import (
    PrincipalKind,
    Role,
    check_principal,
    principal_kind,
)
from catalog._query_state import QueryEvent, classify_exit, next_query_state
from catalog._records import (
    INGEST,
    SYSTEM,
    TOPIC_CONFIGS,
    Broker,
    BrokerHome,
    CollectionName,
    Counters,
    Executor,
    JoinToken,
    Owner,
    Party,
    PendingDrop,
    PrincipalRef,
    Publication,
    Query,
    QueryRef,
    QueryState,
    Record,
    Session,
    SessionRef,
    Subscription,
    SystemRef,
    Topic,
    Update,
    User,
    check_topic_config,
)
from catalog.errors import (
    AlreadyPublishedError,
    AlreadySubscribedError,
    BrokerExistsError,
    BrokerInUseError,
    BrokerRetiredError,
    FencedLeaderEpochError,
    InvalidCommandError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    JoinTokenError,
    NotAuthorizedError,
    NotFoundError,
    NotOwnerError,
    NotPublishedError,
    NotSubscribedError,
    PrincipalExistsError,
    ProcessAlreadyExitedError,
    QueryEndedError,
    QueryStateError,
    QuotaExceededError,
    RecordTypeMismatchError,
    ReservedTopicNameError,
    StaleIsrError,
    TopicBeingDroppedError,
    TopicExistsError,
    UnknownBrokerError,
    UnknownPrincipalError,
    UnknownTopicError,
)

if TYPE_CHECKING:
    from catalog._catalog import Catalog

__all__ = ["ENDED_QUERIES_KEPT", "HANDLERS", "MAX_PARTITIONS", "MAX_PARTITIONS_PER_USER",
           "MAX_TOKEN_TTL_MS", "Txn", "describe_owner"]

# Partition directories are `<name>-<partition>`; names are at most 249 characters, so four
# digits keep a directory name under the 255-byte limit of common file systems.
MAX_PARTITIONS = 10_000
# A user's topics (its own, its queries', the ingest topics it created) hold at most this many
# partitions in all; an admin's, the system's, are not counted (`_require_partition_quota`).
MAX_PARTITIONS_PER_USER = 10_000
MAX_BROKER_SLOT = 1023  # a host's brokers: its own (0) and its shards (1..)
# A join token lives at most a week (default one hour, `tq token create --ttl`): a token that
# lies around for longer is a credential nobody watches.
MAX_TOKEN_TTL_MS = 7 * 86_400_000
# Ended queries kept per submitter (history for `tq status`): as one more ends, its submitter's
# oldest beyond this are forgotten, except one a kept record still names (`_forget_ended`).
ENDED_QUERIES_KEPT = 1000


class Txn:
    """The updates and id allocations of one command, staged until the catalog commits them."""

    def __init__(self, counters: Counters) -> None:
        self.updates: list[Update] = []
        self.counters = counters
        self.created: Record | None = None

    def insert(self, collection: CollectionName, record: Record) -> None:
        self.updates.append(Update(collection, record, 1))

    def retract(self, collection: CollectionName, record: Record) -> None:
        self.updates.append(Update(collection, record, -1))

    def retract_all(self, collection: CollectionName, records: Iterable[Record]) -> None:
        for record in records:
            self.retract(collection, record)

    def replace(self, collection: CollectionName, old: Record, new: Record) -> None:
        self.retract(collection, old)
        self.insert(collection, new)

    def allocate(self, field: str) -> int:
        """The next id of a kind (`next_query_id`, ...). Ids start at 1 and never repeat."""
        new_id: int = getattr(self.counters, field)
        self.counters = msgspec.structs.replace(self.counters, **{field: new_id + 1})
        return new_id


def describe_owner(owner: Owner) -> str:
    """An owner or party for people: 'query 3', 'session 7', 'user:alice', 'ingest', 'the
    system'."""
    if isinstance(owner, QueryRef):
        return f"query {owner.query_id}"
    if isinstance(owner, SessionRef):
        return f"session {owner.session_id}"
    if isinstance(owner, PrincipalRef):
        return owner.principal
    return "ingest" if owner == INGEST else "the system"


def _require_live(catalog: Catalog, party: Owner) -> None:
    if isinstance(party, QueryRef):
        query = catalog.query(party.query_id)
        if query.ended:
            raise QueryEndedError(f"query {query.query_id} has ended ({query.state.value})")
    elif isinstance(party, SessionRef):
        catalog.session(party.session_id)


def _require_party(party: Owner) -> None:
    """Publishers and subscribers are queries, sessions or the system; owners such as ingest
    or a principal are not parties."""
    if not isinstance(party, QueryRef | SessionRef | SystemRef):
        raise InvalidCommandError(f"{describe_owner(party)} cannot publish or subscribe; "
                                  "a query or a session does")


def _require_session(catalog: Catalog, session_id: int | None) -> None:
    if session_id is not None:
        catalog.session(session_id)


def _require_host_agent(catalog: Catalog, session_id: int | None, what: str) -> None:
    """Executors and brokers are registered by host agents (or an admin), never by users."""
    if session_id is None:
        return  # the coordinator's own
    principal = catalog.session(session_id).principal
    if not is_executor(catalog, principal):
        raise NotAuthorizedError(f"{principal} may not register {what}: that takes an "
                                 "executor credential (tq user add NAME --role executor)")


# -- queries ------------------------------------------------------------------------------------


def _transition(
    catalog: Catalog,
    txn: Txn,
    query: Query,
    event: QueryEvent,
    at_ms: int,
    *,
    reason: str = "",
    exit_codes: tuple[int | None, ...] | None = None,
    executors: tuple[int, ...] | None = None,
) -> None:
    """Move a query along the table; when it ends, its publications and subscriptions leave."""
    try:
        state = next_query_state(query.state, event)
    except QueryStateError as exc:
        raise QueryStateError(
            f"query {query.query_id} is {query.state.value}: it does not accept {event.value!r}",
            exc.state,
            exc.event,
        ) from None
    ends_now = state.ended and not query.ended
    new = msgspec.structs.replace(
        query,
        state=state,
        executors=query.executors if executors is None else executors,
        exit_codes=query.exit_codes if exit_codes is None else exit_codes,
        started_at_ms=at_ms if event is QueryEvent.START else query.started_at_ms,
        ended_at_ms=at_ms if ends_now else query.ended_at_ms,
        reason=reason if ends_now else query.reason,
    )
    txn.replace("queries", query, new)
    if ends_now:
        party = QueryRef(query.query_id)
        txn.retract_all("publications", catalog.publications_of(party))
        txn.retract_all("subscriptions", catalog.subscriptions_of(party))
        _forget_ended(catalog, txn, query)


def _forget_ended(catalog: Catalog, txn: Txn, ending: Query) -> None:
    """`ending` ends: its submitter keeps its ENDED_QUERIES_KEPT newest ended queries, this one
    included; older ones go, by id, except those `leads_back` names (one goes at a later end once
    nothing names it)."""
    ended = [q for q in catalog.queries if isinstance(q, Query) and q.owner == ending.owner
             and q.ended and q.query_id != ending.query_id]
    excess = len(ended) + 1 - ENDED_QUERIES_KEPT
    if excess <= 0:
        return
    named = leads_back(catalog)
    for query in sorted(ended, key=lambda q: q.query_id):
        if excess <= 0:
            break
        if query.query_id not in named:
            txn.retract("queries", query)
            excess -= 1


def _lose_executors(catalog: Catalog, txn: Txn, executors: list[Executor], at_ms: int) -> None:
    """Executors leave; every live query with a process still running on one of them fails."""
    lost = {e.executor_id for e in executors}
    for query in list(catalog.queries):
        assert isinstance(query, Query)
        if query.ended or not query.placed:
            continue
        gone = sorted(
            {e for e, code in zip(query.executors, query.exit_codes, strict=True) if code is None}
            & lost
        )
        if gone:
            which = ", ".join(str(e) for e in gone)
            _transition(
                catalog, txn, query, QueryEvent.FAIL, at_ms, reason=f"lost executor {which}"
            )
    txn.retract_all("executors", executors)


def _submit_query(catalog: Catalog, txn: Txn, cmd: SubmitQuery) -> None:
    if cmd.processes < 1 or cmd.workers < 1:
        raise InvalidCommandError(
            f"a query needs at least one process and one worker per process, got "
            f"processes={cmd.processes} workers={cmd.workers}"
        )
    pending = not cmd.executors
    _check_placement(catalog, cmd.processes, cmd.executors, pending)
    if cmd.start_timeout_ms < 0:
        raise InvalidCommandError(f"a start timeout is not negative, got {cmd.start_timeout_ms}")
    query = Query(
        query_id=txn.allocate("next_query_id"),
        name=cmd.name,
        program=cmd.program,
        args=tuple(cmd.args),
        processes=cmd.processes,
        workers=cmd.workers,
        executors=tuple(cmd.executors),
        state=QueryState.PENDING if pending else QueryState.SUBMITTED,
        exit_codes=() if pending else (None,) * cmd.processes,
        submitted_at_ms=cmd.at_ms,
        owner=check_principal(cmd.owner),
        start_timeout_ms=cmd.start_timeout_ms,
    )
    txn.insert("queries", query)
    txn.created = query


def _check_placement(catalog: Catalog, processes: int, executors: tuple[int, ...],
                     pending_ok: bool) -> None:
    if len(executors) != processes and not (pending_ok and not executors):
        raise InvalidCommandError(
            f"placement names {len(executors)} executors for {processes} processes"
        )
    for executor_id in executors:
        catalog.executor(executor_id)


def _place_query(catalog: Catalog, txn: Txn, cmd: PlaceQuery) -> None:
    query = catalog.query(cmd.query_id)
    _check_placement(catalog, query.processes, cmd.executors, pending_ok=False)
    _transition(catalog, txn, query, QueryEvent.PLACE, cmd.at_ms,
                executors=tuple(cmd.executors), exit_codes=(None,) * query.processes)


def _start_query(catalog: Catalog, txn: Txn, cmd: StartQuery) -> None:
    _transition(catalog, txn, catalog.query(cmd.query_id), QueryEvent.START, cmd.at_ms)


def _process_exited(catalog: Catalog, txn: Txn, cmd: ProcessExited) -> None:
    query = catalog.query(cmd.query_id)
    if not 0 <= cmd.process < query.processes:
        raise InvalidCommandError(
            f"query {query.query_id} has processes 0..{query.processes - 1}, not {cmd.process}"
        )
    if not query.placed:
        raise QueryStateError(
            f"query {query.query_id} is {query.state.value}: no process of it was started",
            query.state.value, QueryEvent.PROCESS_EXITED.value)
    if cmd.session_id is not None:
        _require_placed_on(catalog, query, cmd.process, cmd.session_id)
    if query.exit_codes[cmd.process] is not None:
        raise ProcessAlreadyExitedError(
            f"process {cmd.process} of query {query.query_id} exited already "
            f"(code {query.exit_codes[cmd.process]})"
        )
    event = classify_exit(query.exit_codes, cmd.process, cmd.exit_code)
    codes = list(query.exit_codes)
    codes[cmd.process] = cmd.exit_code
    reason = exit_reason(cmd.process, cmd.exit_code, cmd.reason)
    _transition(
        catalog,
        txn,
        query,
        event,
        cmd.at_ms,
        reason=reason if event is QueryEvent.PROCESS_FAILED else "",
        exit_codes=tuple(codes),
    )
    if not next_query_state(query.state, event).ended:
        _release_process(catalog, txn, query.query_id, cmd.process)


def exit_reason(process: int, exit_code: int, said: str = "") -> str:
    """A failed query's reason for a non-zero exit: the code (or the signal), then what the
    process said about it, e.g. `process 0 exited with code 1: ZeroDivisionError: division
    by zero (at job.py:4 in main)`."""
    if exit_code < 0:
        try:
            name = f" ({signal.Signals(-exit_code).name})"
        except ValueError:
            name = ""
        text = f"process {process} was killed by signal {-exit_code}{name}"
    else:
        text = f"process {process} exited with code {exit_code}"
    return f"{text}: {said}" if said else text


def _require_placed_on(catalog: Catalog, query: Query, process: int, session_id: int) -> None:
    """Only the executor a process was placed on reports what became of it."""
    if not placed_on_session(catalog, query, process, session_id):
        raise NotAuthorizedError(
            f"process {process} of query {query.query_id} runs on executor "
            f"{query.executors[process]}; only that executor reports its exit")


def _release_process(catalog: Catalog, txn: Txn, query_id: int, process: int) -> None:
    """An exited process holds no publication, whether or not it closed its publishers: it
    leaves each one it held, which leaves the catalog with its last process (an ending query
    retracts them all in `_transition` instead)."""
    for publication in catalog.publications_of(QueryRef(query_id)):
        if process not in publication.processes:
            continue
        txn.retract("publications", publication)
        left = tuple(p for p in publication.processes if p != process)
        if left:
            txn.insert("publications", msgspec.structs.replace(publication, processes=left))


def _kill_query(catalog: Catalog, txn: Txn, cmd: KillQuery) -> None:
    query = catalog.query(cmd.query_id)
    if not manages_query(catalog, cmd.requester, query):
        raise NotOwnerError(f"query {query.query_id} belongs to {query.owner}; "
                            f"{cmd.requester} may not kill it")
    _transition(catalog, txn, query, QueryEvent.KILL, cmd.at_ms, reason=cmd.reason)


def _fail_query(catalog: Catalog, txn: Txn, cmd: FailQuery) -> None:
    query = catalog.query(cmd.query_id)
    _transition(catalog, txn, query, QueryEvent.FAIL, cmd.at_ms, reason=cmd.reason)


# -- sessions, brokers, executors ---------------------------------------------------------------


def _open_session(catalog: Catalog, txn: Txn, cmd: OpenSession) -> None:
    session = Session(
        session_id=txn.allocate("next_session_id"),
        kind=cmd.kind,
        peer=cmd.peer,
        opened_at_ms=cmd.at_ms,
        principal=check_principal(cmd.principal),
    )
    txn.insert("sessions", session)
    txn.created = session


def _end_session(catalog: Catalog, txn: Txn, cmd: CloseSession | SessionExpired) -> None:
    session = catalog.session(cmd.session_id)
    brokers = [
        b for b in catalog.brokers if isinstance(b, Broker) and b.session_id == session.session_id
    ]
    gone_brokers = {b.broker_id for b in brokers}
    # An executor leaves with its session, and with its broker (whoever registered that).
    executors = [
        e
        for e in catalog.executors
        if isinstance(e, Executor)
        and (e.session_id == session.session_id or e.broker_id in gone_brokers)
    ]
    _lose_executors(catalog, txn, executors, cmd.at_ms)
    txn.retract_all("brokers", brokers)
    _elect_leaders(catalog, txn, gone_brokers)
    party = SessionRef(session.session_id)
    txn.retract_all("publications", catalog.publications_of(party))
    txn.retract_all("subscriptions", catalog.subscriptions_of(party))
    txn.retract("sessions", session)


def _register_broker(catalog: Catalog, txn: Txn, cmd: RegisterBroker) -> None:
    _require_host_agent(catalog, cmd.session_id, "a broker")
    if not 0 <= cmd.slot <= MAX_BROKER_SLOT:
        raise InvalidCommandError(f"a broker's slot is 0..{MAX_BROKER_SLOT}, not {cmd.slot}")
    principal = None if cmd.session_id is None else catalog.session(cmd.session_id).principal
    registered = {b.broker_id for b in catalog.brokers if isinstance(b, Broker)}
    if cmd.broker_id is None:
        broker_id = _home_id(catalog, cmd, principal, registered)
        if broker_id is None:
            broker_id = txn.allocate("next_broker_id")
    else:
        broker_id = cmd.broker_id
        if not 1 <= broker_id < txn.counters.next_broker_id:
            raise UnknownBrokerError(
                f"broker id {broker_id} was never assigned; register without an id to get one"
            )
        if broker_id in registered:
            raise BrokerExistsError(f"broker {broker_id} is registered already")
        home = catalog.find_home(broker_id)
        if home is not None and home.retired:
            raise BrokerRetiredError(f"broker {broker_id} was decommissioned; register without "
                                     "an id to get a new one")
        if (home is not None and principal is not None and home.principal != principal
                and not is_admin(catalog, principal)):
            raise NotOwnerError(f"broker {broker_id} belongs to {home.principal}, not "
                                f"{principal}")
    broker = Broker(
        broker_id=broker_id, host=cmd.host, address=cmd.address, session_id=cmd.session_id,
        kafka_address=cmd.kafka_address, curve_key=cmd.curve_key,
    )
    txn.insert("brokers", broker)
    if principal is not None:
        home = BrokerHome(broker_id=broker_id, host=cmd.host, principal=principal, slot=cmd.slot)
        old = catalog.find_home(broker_id)
        if old != home:
            if old is not None:
                txn.retract("homes", old)
            txn.insert("homes", home)
    txn.created = broker


def _home_id(catalog: Catalog, cmd: RegisterBroker, principal: str | None,
             registered: set[int]) -> int | None:
    """The id a broker asking for none gets back (DESIGN §6 "Executor broker ids"): the
    lowest one last registered on its host, by its principal, in its slot, that is down now,
    unless that id is the last in-sync replica of a partition (a broker that lost its data
    would lead an empty log there: its acknowledged records are on no other replica, so the
    partition stays offline for that broker to return with them, or for `--broker-id`)."""
    if principal is None:
        return None
    last_in_sync = {b for topic in catalog.topics if isinstance(topic, Topic) for isr in topic.isr
            for b in isr}
    for home in sorted(catalog.homes, key=lambda h: h.broker_id):
        assert isinstance(home, BrokerHome)
        if ((home.host, home.principal, home.slot) == (cmd.host, principal, cmd.slot)
                and home.broker_id not in registered and home.broker_id not in last_in_sync
                and not home.retired):
            return home.broker_id
    return None


def _remove_broker(catalog: Catalog, txn: Txn, cmd: RemoveBroker) -> None:
    broker = catalog.broker(cmd.broker_id)
    users = sorted(
        e.executor_id
        for e in catalog.executors
        if isinstance(e, Executor) and e.broker_id == broker.broker_id
    )
    if users:
        raise BrokerInUseError(
            f"broker {broker.broker_id} still serves executor {', '.join(map(str, users))}"
        )
    txn.retract("brokers", broker)
    _elect_leaders(catalog, txn, {broker.broker_id})


def _elect_leaders(catalog: Catalog, txn: Txn, gone: set[int]) -> None:
    """The controller's part when brokers leave (DESIGN §5 "Replication"), in the change that
    removes them: each replicated partition they led moves to the first other member of its
    ISR, in replica order, at the next leader epoch; they leave every ISR. A partition whose
    ISR has no other member keeps its leader and ISR (no unclean election: it is offline
    until that broker returns, holding every acknowledged record)."""
    if not gone:
        return
    for topic in list(catalog.topics):
        assert isinstance(topic, Topic)
        if not topic.replicas or not any(gone.intersection(isr) for isr in topic.isr):
            continue
        locations, isrs, epochs = list(topic.locations), list(topic.isr), list(topic.leader_epochs)
        for i, isr in enumerate(topic.isr):
            staying = tuple(b for b in isr if b not in gone)
            if not staying:
                continue
            if locations[i] in gone:
                locations[i] = staying[0]
                epochs[i] += 1
            isrs[i] = staying
        txn.replace("topics", topic, msgspec.structs.replace(
            topic, locations=tuple(locations), isr=tuple(isrs), leader_epochs=tuple(epochs)))


def _decommission_broker(catalog: Catalog, txn: Txn, cmd: DecommissionBroker) -> None:
    """DESIGN §5 "Decommissioning a broker": the moves the coordinator chose, each checked;
    the broker retired once nothing stays on it. A move refused refuses the whole command."""
    if not is_admin(catalog, cmd.requester):
        raise NotAuthorizedError(f"decommissioning a broker takes the admin role; "
                                 f"{cmd.requester} has not")
    gone = cmd.broker_id
    if not 1 <= gone < txn.counters.next_broker_id:
        raise UnknownBrokerError(f"no broker {gone}: that id was never assigned (tq catalog "
                                 "homes lists the executors' broker ids)")
    live = next((b for b in catalog.brokers if isinstance(b, Broker) and b.broker_id == gone),
                None)
    if live is not None and live.session_id is None:
        raise InvalidCommandError(f"broker {gone} is the coordinator's own broker: it holds "
                                  "the catalog and is never decommissioned")
    home = catalog.find_home(gone)
    if home is None:
        raise UnknownBrokerError(f"no broker {gone} of an executor: only an executor's "
                                 "brokers are decommissioned (tq catalog homes lists them)")
    if home.retired:
        raise BrokerRetiredError(f"broker {gone} was decommissioned already")
    if live is not None and not cmd.force:
        raise BrokerInUseError(
            f"broker {gone} is up (host {live.host}): stop its executor for good first, or "
            f"drain it while it runs with --force (its replicas move, it takes no new ones)")
    retired = catalog.retired_brokers()
    changed: dict[int, tuple[Topic, list[tuple[int, ...]], list[tuple[int, ...]], list[int],
                             list[int]]] = {}
    seen: set[tuple[int, int]] = set()
    for topic_id, partition, replacement in cmd.moves:
        if topic_id not in changed:
            topic = catalog.topic(topic_id)
            changed[topic_id] = (topic, list(topic.replicas), list(topic.isr),
                                 list(topic.locations), list(topic.leader_epochs))
        topic, replicas, isrs, locations, epochs = changed[topic_id]
        where = f"partition {partition} of {topic.short_name!r}"
        if not 0 <= partition < topic.partitions:
            raise InvalidPartitionsError(f"topic {topic.short_name!r} has no partition "
                                         f"{partition}")
        if (topic_id, partition) in seen:
            raise InvalidCommandError(f"{where} is moved twice")
        seen.add((topic_id, partition))
        if not topic.replicas or gone not in replicas[partition]:
            raise InvalidCommandError(f"broker {gone} is no replica of {where}")
        if replacement in replicas[partition]:
            raise InvalidCommandError(f"broker {replacement} is a replica of {where} already")
        catalog.broker(replacement)  # registered now (UnknownBrokerError otherwise)
        if replacement in retired:
            raise BrokerRetiredError(f"broker {replacement} was decommissioned")
        rest = tuple(b for b in isrs[partition] if b != gone)
        if not rest:
            raise InvalidCommandError(
                f"broker {gone} is the only in-sync replica of {where}: its acknowledged "
                "records are on no other replica (no unclean election)")
        # The new replica goes last and out of the ISR: it starts empty and fetches from the
        # leader, which adds it once it caught up (as a rebuilt lost disk).
        replicas[partition] = tuple(b for b in replicas[partition] if b != gone) + (replacement,)
        isrs[partition] = rest
        if locations[partition] == gone:
            locations[partition] = rest[0]
            epochs[partition] += 1
    for topic, replicas, isrs, locations, epochs in changed.values():
        txn.replace("topics", topic, msgspec.structs.replace(
            topic, replicas=tuple(replicas), isr=tuple(isrs), locations=tuple(locations),
            leader_epochs=tuple(epochs)))
    after = [(t.locations, t.replicas) for t in catalog.topics
             if isinstance(t, Topic) and t.topic_id not in changed]
    after += [(tuple(locations), tuple(replicas))
              for _, replicas, _, locations, _ in changed.values()]
    if any(gone in locations or any(gone in r for r in replicas)
           for locations, replicas in after):
        return  # something stays on it: not retired (the coordinator's reply says why)
    txn.replace("homes", home, msgspec.structs.replace(home, retired=True))
    if live is None:
        # Its disk is gone with it: drops of deleted topics waiting for it never come.
        txn.retract_all("drops", catalog.pending_drops(gone))


def _register_executor(catalog: Catalog, txn: Txn, cmd: RegisterExecutor) -> None:
    _require_host_agent(catalog, cmd.session_id, "an executor")
    broker = catalog.broker(cmd.broker_id)
    resources = cmd.resources
    if min(resources.cores, resources.memory, resources.disk, resources.slots) < 0:
        raise InvalidCommandError(f"resources cannot be negative: {resources!r}")
    for shard in cmd.shards:
        if shard == broker.broker_id or cmd.shards.count(shard) > 1:
            raise InvalidCommandError(f"broker {shard} is named twice among the executor's")
    _require_own_brokers(catalog, cmd.session_id, (broker.broker_id, *cmd.shards))
    executor = Executor(
        executor_id=txn.allocate("next_executor_id"),
        session_id=cmd.session_id,
        host=cmd.host,
        broker_id=broker.broker_id,
        broker=broker.address,
        resources=resources,
        registered_at_ms=cmd.at_ms,
        shards=tuple(cmd.shards),
    )
    txn.insert("executors", executor)
    txn.created = executor


def _require_own_brokers(catalog: Catalog, session_id: int | None,
                         broker_ids: Sequence[int]) -> None:
    """An executor names its host's brokers: those registered by its own principal (its
    session's and its shards'), not another host's (an admin's executor may name any)."""
    brokers = [catalog.broker(b) for b in broker_ids]  # registered (UnknownBrokerError)
    if session_id is None:
        return  # the coordinator's own
    principal = catalog.session(session_id).principal
    if is_admin(catalog, principal):
        return
    for broker_id, broker in zip(broker_ids, brokers, strict=True):
        holder = None if broker.session_id is None else catalog.session(broker.session_id)
        if holder is None or holder.principal != principal:
            raise NotOwnerError(f"broker {broker_id} was registered by "
                                f"{holder.principal if holder else 'the coordinator'}, not "
                                f"{principal}: an executor names its own host's brokers")


def _remove_executor(catalog: Catalog, txn: Txn, cmd: RemoveExecutor) -> None:
    _lose_executors(catalog, txn, [catalog.executor(cmd.executor_id)], cmd.at_ms)


# -- topics -------------------------------------------------------------------------------------


def _create_topic(catalog: Catalog, txn: Txn, cmd: CreateTopic) -> None:
    name = TopicName.parse(cmd.name)
    if name.internal and cmd.owner != SYSTEM:
        raise ReservedTopicNameError(
            f"topic names starting with '__' are reserved for the system: {name.short!r}"
        )
    if not 1 <= cmd.partitions <= MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"a topic has 1 to {MAX_PARTITIONS} partitions, not {cmd.partitions}"
        )
    if len(cmd.locations) != cmd.partitions:
        raise InvalidPartitionsError(
            f"{len(cmd.locations)} partition locations given for {cmd.partitions} partitions"
        )
    _require_in_service(catalog, cmd.locations)
    _check_replicas(catalog, cmd.replicas, cmd.locations, None if name.internal else ())
    _require_live(catalog, cmd.owner)
    if catalog.find_topic(name.full) is not None:
        raise TopicExistsError(f"topic {name.short!r} exists already")
    _require_partition_quota(catalog, quota_principal(catalog, cmd.owner, cmd.creator),
                             cmd.partitions, f"topic {name.short!r}")
    # An earlier incarnation's files on one of these brokers go first: the partition
    # directories are named by the topic, so the drop would take the new topic's data too.
    hosting = set(cmd.locations).union(*cmd.replicas)
    dropping = sorted({d.broker_id for d in catalog.pending_drops()
                       if d.name == name.full and d.broker_id in hosting})
    if dropping:
        raise TopicBeingDroppedError(
            f"topic {name.short!r} was deleted and broker {dropping[0]} has not dropped its old "
            f"partitions yet; retry in a moment"
        )
    topic = Topic(
        topic_id=txn.allocate("next_topic_id"),
        name=name.full,
        partitions=cmd.partitions,
        record_type=cmd.record_type,
        kind=cmd.kind,
        owner=cmd.owner,
        locations=tuple(cmd.locations),
        internal=name.internal,
        created_at_ms=cmd.at_ms,
        creator=cmd.creator,
        replicas=cmd.replicas,
        isr=cmd.replicas,
        leader_epochs=(0,) * len(cmd.replicas),
    )
    txn.insert("topics", topic)
    txn.created = topic


def _require_partition_quota(catalog: Catalog, user: str | None, more: int, what: str) -> None:
    if user is None:
        return
    held = sum(t.partitions for t in catalog.topics
               if isinstance(t, Topic) and quota_principal(catalog, t.owner, t.creator) == user)
    if held + more > MAX_PARTITIONS_PER_USER:
        raise QuotaExceededError(
            f"{user}'s topics hold {held} partitions; {what} would add {more}, and a user's "
            f"topics hold at most {MAX_PARTITIONS_PER_USER}: delete topics no longer needed "
            f"(tq topic delete NAME), or ask an admin to")


def _delete_topic(catalog: Catalog, txn: Txn, cmd: DeleteTopic) -> None:
    topic = catalog.topic(cmd.topic_id)
    if topic.internal:
        if cmd.requester != SYSTEM:
            raise NotOwnerError(f"topic {topic.short_name!r} is a system topic; it cannot be "
                                "deleted")
    elif not may_delete_topic(catalog, cmd.principal, topic, force=cmd.force):
        raise NotOwnerError(_why_not_delete(catalog, cmd, topic))
    txn.retract_all("publications", catalog.publications_on(topic.topic_id))
    txn.retract_all("subscriptions", catalog.subscriptions_on(topic.topic_id))
    txn.retract("topics", topic)
    # Its files go too, by the brokers hosting them, told by the coordinator; remembered in
    # this same change so that neither a crash nor a broker that is down loses a drop.
    hosted: dict[int, list[int]] = {}
    for partition, broker_id in enumerate(topic.locations):
        for holder in topic.replicas[partition] if topic.replicas else (broker_id,):
            hosted.setdefault(holder, []).append(partition)
    for broker_id, partitions in sorted(hosted.items()):
        txn.insert("drops", PendingDrop(topic_id=topic.topic_id, name=topic.name,
                                        broker_id=broker_id, partitions=tuple(partitions)))


def _alter_topic(catalog: Catalog, txn: Txn, cmd: AlterTopic) -> None:
    topic = catalog.topic(cmd.topic_id)
    if topic.internal:
        raise NotOwnerError(f"topic {topic.short_name!r} is a system topic; it cannot be "
                            "altered")
    if not may_alter_topic(catalog, cmd.principal, topic):
        raise NotOwnerError(f"topic {topic.short_name!r} is owned by "
                            f"{describe_owner(topic.owner)}; {cmd.principal} may not alter it")
    locations = topic.locations
    grown: dict[str, Any] = {}
    if cmd.partitions is not None and cmd.partitions != topic.partitions:
        if cmd.partitions < topic.partitions:
            raise InvalidPartitionsError(
                f"topic {topic.short_name!r} has {topic.partitions} partitions; a topic's "
                f"partitions only grow, not to {cmd.partitions}")
        if cmd.partitions > MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"a topic has 1 to {MAX_PARTITIONS} partitions, not {cmd.partitions}")
        if len(cmd.locations) != cmd.partitions - topic.partitions:
            raise InvalidPartitionsError(
                f"{len(cmd.locations)} locations given for "
                f"{cmd.partitions - topic.partitions} new partitions")
        _require_in_service(catalog, cmd.locations)
        if bool(cmd.replicas) != bool(topic.replicas) or (
                topic.replicas and len(cmd.replicas[0]) != topic.replication_factor):
            raise InvalidReplicationFactorError(
                f"topic {topic.short_name!r} has {topic.replication_factor} replicas per "
                f"partition; its new partitions must have as many")
        _check_replicas(catalog, cmd.replicas, cmd.locations, ())
        _require_partition_quota(catalog, quota_principal(catalog, topic.owner, topic.creator),
                                 cmd.partitions - topic.partitions,
                                 f"growing topic {topic.short_name!r}")
        locations = topic.locations + tuple(cmd.locations)
        grown = {"replicas": topic.replicas + cmd.replicas, "isr": topic.isr + cmd.replicas,
                 "leader_epochs": topic.leader_epochs + (0,) * len(cmd.replicas)}
    elif cmd.locations or cmd.replicas:
        raise InvalidPartitionsError("locations given without new partitions")
    configs = dict(topic.configs)
    for name, value in cmd.configs:
        if value is None:
            if name not in TOPIC_CONFIGS:
                check_topic_config(name, "0")  # says which names there are
            configs.pop(name, None)
        else:
            configs[name] = check_topic_config(name, value)
    altered = msgspec.structs.replace(topic, partitions=len(locations), locations=locations,
                                      configs=tuple(sorted(configs.items())), **grown)
    if altered != topic:
        txn.replace("topics", topic, altered)
    txn.created = altered


def _check_replicas(catalog: Catalog, replicas: tuple[tuple[int, ...], ...],
                    locations: tuple[int, ...], allowed: tuple[()] | None) -> None:
    """`replicas` (none, or one set per partition of `locations`) are placeable: each set at
    least two distinct registered brokers, all sets alike in size, led by the partition's
    location. `allowed` None: a system topic, which stays unreplicated."""
    if not replicas:
        return
    if allowed is None:
        raise InvalidReplicationFactorError("system topics have one replica")
    if len(replicas) != len(locations):
        raise InvalidReplicationFactorError(
            f"{len(replicas)} replica sets given for {len(locations)} partitions")
    factor = len(replicas[0])
    for partition, (brokers, leader) in enumerate(zip(replicas, locations, strict=True)):
        if len(brokers) != factor or factor < 2 or len(set(brokers)) != factor:
            raise InvalidReplicationFactorError(
                f"partition {partition} has replicas {list(brokers)}: each partition needs "
                f"the same number (2 or more) of distinct brokers")
        if brokers[0] != leader:
            raise InvalidReplicationFactorError(
                f"partition {partition}'s replicas {list(brokers)} do not start with its "
                f"leader, broker {leader}")
    _require_in_service(catalog, set().union(*replicas))


def _require_in_service(catalog: Catalog, brokers: Iterable[int]) -> None:
    """Each broker is registered and not decommissioned: a new partition or replica may go
    there."""
    retired = catalog.retired_brokers()
    for broker_id in sorted(set(brokers)):
        catalog.broker(broker_id)  # UnknownBrokerError when it is not registered
        if broker_id in retired:
            raise BrokerRetiredError(f"broker {broker_id} was decommissioned: nothing is "
                                     "placed on it")


def _alter_partition(catalog: Catalog, txn: Txn, cmd: AlterPartition) -> None:
    topic = catalog.topic(cmd.topic_id)
    if not topic.replicas:
        raise InvalidCommandError(f"topic {topic.short_name!r} is not replicated")
    if not 0 <= cmd.partition < topic.partitions:
        raise InvalidPartitionsError(
            f"topic {topic.short_name!r} has no partition {cmd.partition}")
    broker = catalog.broker(cmd.broker_id)
    if broker.session_id is None or broker.session_id != cmd.session_id:
        raise NotAuthorizedError(
            f"session {cmd.session_id} does not hold broker {cmd.broker_id}")
    i = cmd.partition
    if topic.locations[i] != cmd.broker_id or topic.leader_epochs[i] != cmd.leader_epoch:
        raise FencedLeaderEpochError(
            f"broker {cmd.broker_id} at epoch {cmd.leader_epoch} does not lead partition {i} "
            f"of {topic.short_name!r}: broker {topic.locations[i]} does, at epoch "
            f"{topic.leader_epochs[i]}")
    if tuple(cmd.expected_isr) != topic.isr[i]:
        raise StaleIsrError(
            f"partition {i} of {topic.short_name!r} has in-sync replicas "
            f"{list(topic.isr[i])}, not {list(cmd.expected_isr)}")
    replicas = topic.replicas[i]
    wanted = set(cmd.isr)
    if cmd.broker_id not in wanted or not wanted <= set(replicas) or len(wanted) != len(cmd.isr):
        raise InvalidCommandError(
            f"in-sync replicas {list(cmd.isr)} of partition {i} must be distinct replicas "
            f"{list(replicas)} including the leader {cmd.broker_id}")
    for added in sorted(wanted - set(topic.isr[i])):
        catalog.broker(added)  # a broker that is not registered does not join
    isrs = list(topic.isr)
    isrs[i] = tuple(b for b in replicas if b in wanted)  # in replica order, as kept
    altered = msgspec.structs.replace(topic, isr=tuple(isrs))
    if altered != topic:
        txn.replace("topics", topic, altered)
    txn.created = altered


def _why_not_delete(catalog: Catalog, cmd: DeleteTopic, topic: Topic) -> str:
    owner = describe_owner(topic.owner)
    if topic.owner == INGEST:
        return (f"topic {topic.short_name!r} is an ingest topic: deleting one needs --force, "
                "by its creator or an admin")
    if is_admin(catalog, cmd.principal):
        return (f"topic {topic.short_name!r} is owned by {owner}, which is alive; an admin "
                f"deletes it with --force (tq topic delete --force {topic.short_name})")
    return f"topic {topic.short_name!r} is owned by {owner}; {cmd.principal} may not delete it"


def _partitions_dropped(catalog: Catalog, txn: Txn, cmd: PartitionsDropped) -> None:
    drop = catalog.pending_drop(cmd.topic_id, cmd.broker_id)
    if drop is None:
        raise UnknownTopicError(f"no pending drop of deleted topic {cmd.topic_id} on broker "
                                f"{cmd.broker_id}")
    txn.retract("drops", drop)


def _publish(catalog: Catalog, txn: Txn, cmd: Publish) -> None:
    stored = topic = catalog.topic(cmd.topic_id)
    _require_party(cmd.publisher)
    _require_live(catalog, cmd.publisher)
    if not publishes_as_owner(catalog, cmd.publisher, topic):
        if not may_take_over(catalog, cmd.publisher, topic):
            raise NotOwnerError(_why_not_publish(catalog, cmd.publisher, topic))
        # Re-running: the publisher becomes the owner in this same change, which is all the
        # brokers need to learn to admit its writers (DESIGN §3 "Ownership").
        successor = successor_owner(catalog, cmd.publisher)
        assert successor is not None
        topic = msgspec.structs.replace(topic, owner=successor)
    process = _process_of(catalog, cmd.publisher, cmd.process)
    current = _publication(catalog, topic.topic_id, cmd.publisher)
    if current is not None and (process is None or not current.processes
                                or process in current.processes):
        raise AlreadyPublishedError(
            f"{describe_owner(cmd.publisher)} publishes {topic.short_name!r} already"
            + (f" from process {process}" if process is not None else "")
        )
    held = () if process is None else (process,)
    if current is not None:
        txn.retract("publications", current)
        held = tuple(sorted((*current.processes, *held)))
        epoch = current.epoch
    elif not topic.published:
        epoch = 0  # the topic's first run
        topic = msgspec.structs.replace(topic, published=True)
    elif isinstance(cmd.publisher, QueryRef) and stored.owner == cmd.publisher:
        # A process of the query whose run this is, after its publication had lapsed (its
        # other processes closed first): the run's epoch, not a new one.
        epoch = stored.epoch
    else:
        # A later run: its writers start a new epoch (DESIGN §5 "Epochs"), numbered by this
        # change's catalog version, above every earlier run's.
        epoch = catalog.version + 1
        topic = msgspec.structs.replace(topic, epoch=epoch)
    if topic != stored:
        txn.replace("topics", stored, topic)
    publication = Publication(topic_id=topic.topic_id, publisher=cmd.publisher, processes=held,
                              epoch=epoch)
    txn.insert("publications", publication)
    txn.created = publication


def _unpublish(catalog: Catalog, txn: Txn, cmd: Unpublish) -> None:
    topic = catalog.topic(cmd.topic_id)
    process = _process_of(catalog, cmd.publisher, cmd.process)
    current = _publication(catalog, topic.topic_id, cmd.publisher)
    if current is None or (process is not None and current.processes
                           and process not in current.processes):
        raise NotPublishedError(
            f"{describe_owner(cmd.publisher)} does not publish {topic.short_name!r}"
            + (f" from process {process}" if process is not None else "")
        )
    txn.retract("publications", current)
    left = tuple(p for p in current.processes if p != process)
    if process is not None and left:
        txn.insert("publications", Publication(topic_id=topic.topic_id,
                                               publisher=cmd.publisher, processes=left))


def _why_not_publish(catalog: Catalog, publisher: Party, topic: Topic) -> str:
    """Why `publisher` may not publish `topic`, and what to do instead."""
    name = topic.short_name
    owner = topic.owner
    theirs = owner_principal(owner)
    mine = party_principal(catalog, publisher)
    if theirs is None or mine is None or topic.internal:
        return (f"topic {name!r} is owned by {describe_owner(owner)}; only its owner "
                "publishes to it (anyone may publish to an ingest topic)")
    root = root_principal(catalog, theirs)
    same = root == root_principal(catalog, mine)
    who = describe_owner(owner)
    if isinstance(owner, QueryRef) and not same:
        who += f" of {root}"
    if owner_active(catalog, topic):
        if isinstance(owner, QueryRef):
            query = catalog.query(owner.query_id)
            still = ("which is still running" if query.state is QueryState.RUNNING
                     else f"which has not ended ({query.state.value})")
        else:
            still = "which is still publishing it"
        if not same:
            return (f"topic {name!r} is owned by {who}, {still}: publish to another topic, "
                    f"or have an admin delete it (tq topic delete --force {name})")
        if isinstance(owner, QueryRef):
            return (f"topic {name!r} is owned by {who}, {still}: stop it first "
                    f"(tq kill {owner.query_id}) or publish to another topic")
        return f"topic {name!r} is owned by {who}, {still}: stop that publisher first or " \
               "publish to another topic"
    if isinstance(owner, PrincipalRef):
        return (f"topic {name!r} is owned by {who}; only {root} publishes to it: publish to "
                f"another topic, or have {root} or an admin delete it (tq topic delete {name})")
    return (f"topic {name!r} belongs to {who}; only {root} may publish to it again: publish to "
            f"another topic, or have {root} or an admin delete it (tq topic delete {name})")


def _publication(catalog: Catalog, topic_id: int, publisher: Party) -> Publication | None:
    """The one publication of `publisher` on the topic (the invariants allow one)."""
    for publication in catalog.publications_on(topic_id):
        if publication.publisher == publisher:
            return publication
    return None


def _process_of(catalog: Catalog, publisher: Party, process: int | None) -> int | None:
    """The process index a publish names: only a query's, and within its process count."""
    if process is None:
        return None
    if not isinstance(publisher, QueryRef):
        raise InvalidCommandError(f"{describe_owner(publisher)} has no processes")
    count = catalog.query(publisher.query_id).processes
    if not 0 <= process < count:
        raise InvalidCommandError(f"query {publisher.query_id} has {count} processes; there is "
                                  f"no process {process}")
    return process


def _subscribe(catalog: Catalog, txn: Txn, cmd: Subscribe) -> None:
    topic = catalog.topic(cmd.topic_id)
    _require_party(cmd.subscriber)
    _require_live(catalog, cmd.subscriber)
    if cmd.record_type is not None and cmd.record_type != topic.record_type:
        raise RecordTypeMismatchError(
            f"topic {topic.short_name!r} carries {topic.record_type!r} records, "
            f"not {cmd.record_type!r}"
        )
    if cmd.kind is not None and cmd.kind != topic.kind:
        raise RecordTypeMismatchError(
            f"topic {topic.short_name!r} is a {topic.kind.value}, not a {cmd.kind.value}"
        )
    subscription = Subscription(topic_id=topic.topic_id, subscriber=cmd.subscriber)
    if subscription in catalog.subscriptions:
        raise AlreadySubscribedError(
            f"{describe_owner(cmd.subscriber)} subscribes to {topic.short_name!r} already"
        )
    txn.insert("subscriptions", subscription)
    txn.created = subscription


def _unsubscribe(catalog: Catalog, txn: Txn, cmd: Unsubscribe) -> None:
    topic = catalog.topic(cmd.topic_id)
    subscription = Subscription(topic_id=topic.topic_id, subscriber=cmd.subscriber)
    if subscription not in catalog.subscriptions:
        raise NotSubscribedError(
            f"{describe_owner(cmd.subscriber)} does not subscribe to {topic.short_name!r}"
        )
    txn.retract("subscriptions", subscription)


# -- users --------------------------------------------------------------------------------------


def _require_admin(catalog: Catalog, requester: str) -> None:
    if not is_admin(catalog, requester):
        raise NotAuthorizedError(f"managing users takes the admin role; {requester} has not")


def _named(principal: str) -> str:
    if principal_kind(principal) not in (PrincipalKind.USER, PrincipalKind.EXECUTOR):
        raise InvalidCommandError(f"{principal!r} is not a user or executor name (user:NAME, "
                                  "executor:NAME)")
    return principal


def _user(catalog: Catalog, principal: str) -> User:
    user = catalog.user(_named(principal))
    if user is None:
        raise UnknownPrincipalError(f"no {principal}")
    return user


def _add_user(catalog: Catalog, txn: Txn, cmd: AddUser) -> None:
    _require_admin(catalog, cmd.requester)
    kind = principal_kind(_named(cmd.principal))
    role = Role.parse(cmd.role)
    if (kind is PrincipalKind.EXECUTOR) != (role is Role.EXECUTOR):
        raise InvalidCommandError(f"{cmd.principal}: executor:NAME takes the executor role and "
                                  "user:NAME the user or admin role")
    if catalog.user(cmd.principal) is not None:
        raise PrincipalExistsError(f"{cmd.principal} exists already")
    user = User(principal=cmd.principal, role=role.value, generation=0,
                created_at_ms=cmd.at_ms)
    txn.insert("users", user)
    txn.created = user


def _remove_user(catalog: Catalog, txn: Txn, cmd: RemoveUser) -> None:
    _require_admin(catalog, cmd.requester)
    txn.retract("users", _user(catalog, cmd.principal))


def _rotate_user(catalog: Catalog, txn: Txn, cmd: RotateUser) -> None:
    _require_admin(catalog, cmd.requester)
    user = _user(catalog, cmd.principal)
    rotated = msgspec.structs.replace(user, generation=user.generation + 1)
    txn.replace("users", user, rotated)
    txn.created = rotated


# -- join tokens (DESIGN §12 "Joining a host") -------------------------------------------------


def _create_token(catalog: Catalog, txn: Txn, cmd: CreateToken) -> None:
    _require_admin(catalog, cmd.requester)
    if not 1000 <= cmd.ttl_ms <= MAX_TOKEN_TTL_MS:
        raise InvalidCommandError(f"a join token lives 1 s to {MAX_TOKEN_TTL_MS // 3_600_000} h, "
                                  f"not {cmd.ttl_ms} ms")
    if cmd.name:
        principal = _named(check_principal(f"executor:{cmd.name}"))
        if catalog.user(principal) is not None:
            raise PrincipalExistsError(f"{principal} exists already")
    token = JoinToken(token_id=txn.allocate("next_token_id"), salt=cmd.salt, name=cmd.name,
                      created_by=cmd.requester, created_at_ms=cmd.at_ms,
                      expires_at_ms=cmd.at_ms + cmd.ttl_ms)
    txn.insert("tokens", token)
    txn.created = token


def _token(catalog: Catalog, token_id: int) -> JoinToken:
    token = catalog.find_token(token_id)
    if token is None:
        raise JoinTokenError(f"join token {token_id} was revoked")
    return token


def _revoke_token(catalog: Catalog, txn: Txn, cmd: RevokeToken) -> None:
    _require_admin(catalog, cmd.requester)
    token = catalog.find_token(cmd.token_id)
    if token is None:
        raise NotFoundError(f"no join token {cmd.token_id}")
    txn.retract("tokens", token)


def _redeem_token(catalog: Catalog, txn: Txn, cmd: RedeemToken) -> None:
    """Once and before it expires: the check and the marking are one change, so of two
    joiners racing with one token exactly one gets the credential."""
    token = _token(catalog, cmd.token_id)
    if token.used:
        raise JoinTokenError(f"join token {token.token_id} was used already (by "
                             f"{token.used_by}); create another with tq token create")
    if cmd.at_ms >= token.expires_at_ms:
        raise JoinTokenError(f"join token {token.token_id} expired; create another with "
                             "tq token create")
    principal = _named(check_principal(f"executor:{token.name or cmd.name}"))
    if catalog.user(principal) is not None:
        raise PrincipalExistsError(f"{principal} exists already: join under another name "
                                   "(--host NAME), or remove it first (tq user remove NAME)")
    txn.replace("tokens", token, msgspec.structs.replace(token, used_at_ms=cmd.at_ms,
                                                         used_by=principal))
    user = User(principal=principal, role=Role.EXECUTOR.value, generation=0,
                created_at_ms=cmd.at_ms)
    txn.insert("users", user)
    txn.created = user


HANDLERS: dict[type, Callable[[Catalog, Txn, Any], None]] = {
    OpenSession: _open_session,
    CloseSession: _end_session,
    SessionExpired: _end_session,
    RegisterBroker: _register_broker,
    RemoveBroker: _remove_broker,
    DecommissionBroker: _decommission_broker,
    RegisterExecutor: _register_executor,
    RemoveExecutor: _remove_executor,
    SubmitQuery: _submit_query,
    PlaceQuery: _place_query,
    StartQuery: _start_query,
    ProcessExited: _process_exited,
    KillQuery: _kill_query,
    FailQuery: _fail_query,
    CreateTopic: _create_topic,
    DeleteTopic: _delete_topic,
    AlterTopic: _alter_topic,
    AlterPartition: _alter_partition,
    PartitionsDropped: _partitions_dropped,
    Publish: _publish,
    Unpublish: _unpublish,
    Subscribe: _subscribe,
    Unsubscribe: _unsubscribe,
    AddUser: _add_user,
    RemoveUser: _remove_user,
    RotateUser: _rotate_user,
    CreateToken: _create_token,
    RevokeToken: _revoke_token,
    RedeemToken: _redeem_token,
}
