"""Request handlers: one function per request type, turning a request into catalog commands and
a reply. `HANDLERS` is the table the core dispatches on (keyed by the message class, the one
spelling of a request type).

A handler reads the state, applies commands through `state.apply` (which persists the change
and runs its consequences) and returns the reply, or raises a TqError that answers the request.
Raising `WaitForTopic` parks the request until the topic exists or its wait runs out. The party
a request acts for comes from its session: the query a query-process session runs, else the
session itself. The principal behind it is `call.principal`, authenticated by the RPC layer;
every request naming a session comes from that session's principal (checked before the
handler runs, `CoordinatorState._check_holder`), and the catalog's rules decide what the
principal may do (DESIGN §12).

Must not: answer requests itself, read clocks, do I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from catalog import (
    INGEST,
    AddUser,
    AlterTopic,
    Broker,
    CloseSession,
    ConflictError,
    Executor,
    FailQuery,
    InvalidCommandError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    JoinToken,
    NotAuthorizedError,
    NotFoundError,
    NotOwnerError,
    OpenSession,
    PartitionsDropped,
    Party,
    PrincipalKind,
    PrincipalRef,
    ProcessExited,
    Publication,
    Query,
    QueryEndedError,
    QueryRef,
    QueryState,
    RedeemToken,
    RemoveUser,
    RotateUser,
    Session,
    SessionKind,
    SessionRef,
    Topic,
    TopicKind,
    TopicName,
    UnknownTopicError,
    User,
    default_namespace,
    is_executor,
    manages_query,
    may_run_program,
    placed_on_session,
    principal_kind,
    token_of_principal,
)
from catalog import AlterPartition as AlterPartitionCommand
from catalog import CreateToken as CreateTokenCommand
from catalog import CreateTopic as CreateTopicCommand
from catalog import DecommissionBroker as DecommissionBrokerCommand
from catalog import DeleteTopic as DeleteTopicCommand
from catalog import KillQuery as KillQueryCommand
from catalog import Publish as PublishCommand
from catalog import RegisterBroker as RegisterBrokerCommand
from catalog import RegisterExecutor as RegisterExecutorCommand
from catalog import RemoveBroker as RemoveBrokerCommand
from catalog import RemoveExecutor as RemoveExecutorCommand
from catalog import RevokeToken as RevokeTokenCommand
from catalog import SubmitQuery as SubmitQueryCommand
from catalog import Subscribe as SubscribeCommand
from catalog import Unpublish as UnpublishCommand
from catalog import Unsubscribe as UnsubscribeCommand
from catalog.errors import printable
from querylib.cluster import messages as m
from querylib.cluster._errors import QueryFailedError

from ._drops import WaitForDrops
from ._leases import bound_peer
from ._placement import (
    default_replication_factor,
    place_kafka_partitions,
    place_partitions,
    place_processes,
    place_replicas,
    plan_decommission,
)
from ._state import Call, CoordinatorState, WaitForStart, WaitForTopic

__all__ = ["HANDLERS"]

Handler = Callable[[CoordinatorState, Any, Call], Any]

# Strings clients give are stored in the catalog and copied to every follower: bound them.
MAX_LABEL = 256  # host names, record types, query names
MAX_TEXT = 4096  # addresses, programs
MAX_ARGS_CHARS = 64 * 1024
# Counted too, not only joined: an empty argument costs a byte on the wire but a string object
# (~50 bytes) in the catalog, in every follower's copy and in every process's argv, so a
# message of empty ones would have made millions. 4096 is far more than a command line needs
# (programs take their data from topics, querylib.submit pickles its arguments).
MAX_ARGS = 4096


def _bounded(text: str, limit: int, what: str) -> str:
    if len(text) > limit:
        raise InvalidCommandError(f"{what} is {len(text)} characters long; at most {limit}")
    return text


_HOST = "a host name is printable"


def _label(text: str, what: str, form: str) -> str:
    """A name a client gives that logs, errors and `tq status` show as it is (a query's
    name, a host's, a record type): bounded, and printable, so it can neither start a line
    of its own nor move a terminal. A bad one is described, never repeated; `form` says what
    a good one is."""
    _bounded(text, MAX_LABEL, what)
    if not text.isprintable():
        at = next(i for i, c in enumerate(text) if not c.isprintable())
        raise InvalidCommandError(f"{what} has a character that is not printable "
                                  f"(U+{ord(text[at]):04X} at {at}); {form}")
    return text


def _record_type(text: str) -> str:
    """A record type tag (`serde` or `serde/type`, DESIGN §4 "Type tags") as a client gives
    it, since errors and `tq topic` show it."""
    return _label(text, "the record type", "a record type is serde or serde/type, printable")


def _party(state: CoordinatorState, session_id: int, call: Call) -> Party:
    """The party a session acts as; renews its lease (any request counts as a heartbeat)."""
    state.renew(session_id, call.now)
    binding = state.bindings.get(session_id)
    return QueryRef(binding[0]) if binding is not None else SessionRef(session_id)


def _topic_info(state: CoordinatorState, topic: Topic) -> m.TopicInfo:
    brokers, keys = {}, {}
    for broker_id in sorted(set(topic.locations).union(*topic.replicas)):
        try:
            broker = state.catalog.broker(broker_id)
        except NotFoundError:
            continue  # that broker is down: its partitions have no address right now
        brokers[broker_id] = broker.address
        if broker.curve_key:
            keys[broker_id] = broker.curve_key
    return m.TopicInfo(topic=topic, brokers=brokers, version=state.catalog.version,
                       broker_keys=keys)


def _find(state: CoordinatorState, name: str, wait_ms: int, session_id: int | None) -> Topic:
    topic = state.catalog.find_topic(name)
    if topic is not None:
        return topic
    canonical = TopicName.parse(name)
    if wait_ms > 0:
        raise WaitForTopic(canonical.full, wait_ms, session_id)
    raise UnknownTopicError(f"no topic {canonical.short!r}")


# -- sessions -----------------------------------------------------------------------------------


def open_session(state: CoordinatorState, req: m.OpenSession, call: Call) -> m.SessionOpened:
    lease_ms = state.config.clamp_lease(req.lease_ms)
    if req.resume is not None:
        session = state.catalog.session(req.resume)  # UnknownSessionError: it is gone
        if session.principal != call.principal:
            raise NotAuthorizedError(f"session {req.resume} belongs to another principal")
        if session.kind != req.kind:
            raise InvalidCommandError(f"session {req.resume} is a {session.kind.value} "
                                      f"session, not a {req.kind.value} one")
        state.renew(req.resume, call.now, lease_ms)
        return m.SessionOpened(session_id=req.resume, lease_ms=lease_ms,
                               version=state.catalog.version, resumed=True,
                               catalog_broker=state.catalog_broker, namespace=_namespace(),
                           catalog_broker_key=state.catalog_broker_key)
    peer = printable(req.peer[:200])  # for people to read (tq status): bounded, never parsed
    binding = None
    if req.kind == SessionKind.QUERY:
        binding = _check_binding(state, req, call.principal)
        peer = bound_peer(binding[0], binding[1], peer)
    elif req.query_id is not None or req.process is not None:
        raise InvalidCommandError("only a query session names a query and a process")
    if req.kind == SessionKind.EXECUTOR and not is_executor(state.catalog, call.principal):
        raise NotAuthorizedError(f"{call.principal} may not open an executor session: that "
                                 "takes an executor credential (tq user add NAME --role "
                                 "executor)")
    _check_room(state, call.principal)
    change = state.apply(OpenSession(kind=req.kind, peer=peer, at_ms=call.wall_ms,
                                     principal=call.principal), call.now, call.wall_ms)
    assert isinstance(change.created, Session)
    session_id = change.created.session_id
    state.leases.grant(session_id, lease_ms / 1000, call.now)
    if binding is not None:
        state.bind(session_id, binding)
        state.start_if_registered(binding[0], call.now, call.wall_ms)
    return m.SessionOpened(session_id=session_id, lease_ms=lease_ms,
                           version=state.catalog.version, resumed=False,
                           catalog_broker=state.catalog_broker, namespace=_namespace(),
                           catalog_broker_key=state.catalog_broker_key)


def _check_room(state: CoordinatorState, principal: str) -> None:
    """Room for one more session of `principal`. The admin and executors (admin-role users
    too) are trusted and bounded by the total only; anyone else holds at most
    `max_sessions_per_principal`, and all of them together stop that much short of the
    total, so users never lock the admin and executors out."""
    config = state.config
    share = config.max_sessions_per_principal
    trusted = is_executor(state.catalog, principal)
    total = len(state.catalog.sessions)
    if total >= (config.max_sessions if trusted else config.max_sessions - share):
        kept = "" if trusted else f" users (it keeps {share} for the admin and executors)"
        raise ConflictError(f"{total} sessions are open, the most this coordinator allows"
                            f"{kept}; close some (or wait for their leases)")
    held = state.catalog.sessions_of(principal)
    if not trusted and held >= share:
        raise ConflictError(f"{principal} holds {held} sessions, the most one principal may "
                            f"(max_sessions_per_principal {share}); close some (or wait for "
                            "their leases)")


def _namespace() -> str:
    """The cluster's default tenant/namespace (coordinator/_namespace.py set it at start)."""
    return "/".join(default_namespace())


def _check_binding(state: CoordinatorState, req: m.OpenSession,
                   principal: str) -> tuple[int, int]:
    if req.query_id is None or req.process is None:
        raise InvalidCommandError("a query session names its query_id and process")
    query = state.catalog.query(req.query_id)
    # The query's own credential, or whoever manages the query (a program run directly by
    # the one who submitted it).
    if not manages_query(state.catalog, principal, query):
        raise NotAuthorizedError(f"{principal} may not register a process of query "
                                 f"{query.query_id}")
    if query.ended:
        raise QueryEndedError(f"query {query.query_id} has ended ({query.state.value})")
    if not query.placed:
        raise ConflictError(f"query {query.query_id} is pending: none of its processes was "
                            "started yet")
    if not 0 <= req.process < query.processes:
        raise InvalidCommandError(f"query {query.query_id} has processes 0.."
                                  f"{query.processes - 1}, not {req.process}")
    if query.exit_codes[req.process] is not None:
        raise ConflictError(f"process {req.process} of query {query.query_id} exited already")
    binding = (req.query_id, req.process)
    holder = state.bound.get(binding)
    if holder is not None:
        raise ConflictError(f"process {req.process} of query {query.query_id} is registered "
                            f"already (session {holder})")
    return binding


def heartbeat(state: CoordinatorState, req: m.Heartbeat, call: Call) -> m.Renewed:
    lease_ms = state.renew(req.session_id, call.now, req.lease_ms)
    # Kept for placement and tq status: an executor's only. Any session's would let a user
    # make the coordinator hold a message's worth per session it opens.
    if req.load is not None and state.catalog.session(req.session_id).kind \
            is SessionKind.EXECUTOR:
        state.loads[req.session_id] = req.load
    return m.Renewed(lease_ms=lease_ms, version=state.catalog.version)


def close_session(state: CoordinatorState, req: m.CloseSession, call: Call) -> m.Done:
    state.apply(CloseSession(session_id=req.session_id, at_ms=call.wall_ms), call.now,
                call.wall_ms)
    return m.Done(version=state.catalog.version)


def catalog_info(state: CoordinatorState, req: m.GetCatalogInfo, call: Call) -> m.CatalogInfo:
    topics = {c: t.short_name for c, t in state.catalog_topics().items()}
    checkpoint = state.checkpoint
    return m.CatalogInfo(version=state.catalog.version, catalog_broker=state.catalog_broker,
                         catalog_broker_key=state.catalog_broker_key,
                         collections=topics, checkpoint=None if checkpoint is None else
                         m.CheckpointRef(version=checkpoint.version,
                                         offsets=dict(checkpoint.offsets)),
                         namespace=_namespace())


def loads(state: CoordinatorState, req: m.GetLoads, call: Call) -> m.Loads:
    """What `tq status` shows of each executor and its processes (DESIGN §6)."""
    return m.Loads(loads={e.executor_id: state.loads[e.session_id]
                          for e in state.catalog.executors if e.session_id in state.loads})


# -- topics -------------------------------------------------------------------------------------


def lookup_topic(state: CoordinatorState, req: m.LookupTopic, call: Call) -> m.TopicInfo:
    return _topic_info(state, _find(state, req.name, req.wait_ms, None))


def create_topic(state: CoordinatorState, req: m.CreateTopic, call: Call) -> m.TopicInfo:
    party = _party(state, req.session_id, call)
    factor = req.replication_factor
    if factor is not None and (factor < 1 or factor > 1 and req.locations is not None):
        raise InvalidReplicationFactorError(
            f"replication factor {factor}: at least 1, and 1 when the locations are given")
    locations = req.locations
    replicas: tuple[tuple[int, ...], ...] = ()
    if locations is None:
        if not 1 <= req.partitions <= 10_000:
            raise InvalidCommandError(f"a topic has 1 to 10000 partitions, not {req.partitions}")
        locations = place_partitions(state.catalog, party, req.partitions,
                                     state.placement_cursor, state.catalog_broker_id,
                                     spare=state.config.spare_broker)
        if factor is None:
            factor = 1 if TopicName.parse(req.name).internal \
                else default_replication_factor(state.catalog)
        replicas = place_replicas(state.catalog, tuple(locations), factor,
                                  state.placement_cursor)
        state.placement_cursor += req.partitions
    # A client session's topic is its principal's: a reconnected script still owns it.
    owner = INGEST if req.ingest else (PrincipalRef(call.principal)
                                       if isinstance(party, SessionRef) else party)
    change = state.apply(CreateTopicCommand(
        name=req.name, partitions=req.partitions,
        record_type=_record_type(req.record_type), kind=req.kind,
        owner=owner, locations=tuple(locations), at_ms=call.wall_ms,
        creator=call.principal, replicas=replicas), call.now, call.wall_ms)
    assert isinstance(change.created, Topic)
    return _topic_info(state, change.created)


@dataclass(frozen=True, slots=True)
class CreateIngestTopic:
    """In process only (never on the wire: RPC registers `HANDLERS`, not this): the
    coordinator broker's Kafka listener creates an ingest topic a Kafka client asked for
    (auto-creation, CreateTopics; DESIGN §8). The coordinator has no session of its own."""

    name: str
    partitions: int
    replication_factor: int | None = None  # None: the default (DESIGN §5 "Replication")


def create_ingest_topic(state: CoordinatorState, req: CreateIngestTopic,
                        call: Call) -> m.TopicInfo:
    if not 1 <= req.partitions <= 10_000:
        raise InvalidPartitionsError(f"a topic has 1 to 10000 partitions, not {req.partitions}")
    locations = place_kafka_partitions(state.catalog, req.partitions, state.placement_cursor,
                                       state.catalog_broker_id,
                                       spare=state.config.spare_broker)
    factor = req.replication_factor
    if factor is None:
        factor = 1 if TopicName.parse(req.name).internal \
            else default_replication_factor(state.catalog)
    if factor < 1:
        raise InvalidReplicationFactorError(f"replication factor {factor}: at least 1")
    replicas = place_replicas(state.catalog, locations, factor, state.placement_cursor)
    state.placement_cursor += req.partitions
    change = state.apply(CreateTopicCommand(
        name=req.name, partitions=req.partitions, record_type="bytes", kind=TopicKind.STREAM,
        owner=INGEST, locations=locations, at_ms=call.wall_ms, creator=call.principal,
        replicas=replicas), call.now, call.wall_ms)
    assert isinstance(change.created, Topic)
    return _topic_info(state, change.created)


def delete_topic(state: CoordinatorState, req: m.DeleteTopic, call: Call) -> m.Done:
    party = _party(state, req.session_id, call)
    topic = _find(state, req.name, 0, req.session_id)
    state.apply(DeleteTopicCommand(topic_id=topic.topic_id, requester=party, force=req.force,
                                   principal=call.principal), call.now, call.wall_ms)
    # Answered once the brokers that are up dropped the files (or a bound passed): a client
    # creating the name again right after finds it empty (coordinator/_drops.py).
    raise WaitForDrops(topic.topic_id, m.Done(version=state.catalog.version))


def alter_topic(state: CoordinatorState, req: m.AlterTopic, call: Call) -> m.TopicInfo:
    party = _party(state, req.session_id, call)
    topic = _find(state, req.name, 0, req.session_id)
    locations: tuple[int, ...] = ()
    replicas: tuple[tuple[int, ...], ...] = ()
    if req.partitions is not None and req.partitions > topic.partitions:
        added = req.partitions - topic.partitions
        if req.locations is not None:
            locations = tuple(req.locations)
        elif req.partitions <= 10_000:
            locations = place_partitions(state.catalog, party, added, state.placement_cursor,
                                         state.catalog_broker_id,
                                         spare=state.config.spare_broker)
            # A replicated topic's new partitions are copied as many times as its others.
            replicas = place_replicas(state.catalog, locations, topic.replication_factor,
                                      state.placement_cursor)
            state.placement_cursor += added
    configs = tuple(sorted((_bounded(k, MAX_LABEL, "a config name"),
                            None if v is None else _bounded(v, MAX_LABEL, "a config value"))
                           for k, v in req.configs.items()))
    change = state.apply(AlterTopic(topic_id=topic.topic_id, partitions=req.partitions,
                                    locations=locations, configs=configs,
                                    principal=call.principal, replicas=replicas),
                         call.now, call.wall_ms)
    assert isinstance(change.created, Topic)
    return _topic_info(state, change.created)


def report_partitions_dropped(state: CoordinatorState, req: m.ReportPartitionsDropped,
                              call: Call) -> m.Done:
    state.renew(req.session_id, call.now)
    broker = state.catalog.broker(req.broker_id)
    if broker.session_id != req.session_id:
        raise NotOwnerError(f"broker {req.broker_id} was registered by another session")
    if state.catalog.pending_drop(req.topic_id, req.broker_id) is not None:
        # Absent: reported already (a drop is sent again until reported, so twice is fine).
        state.apply(PartitionsDropped(topic_id=req.topic_id, broker_id=req.broker_id),
                    call.now, call.wall_ms)
    return m.Done(version=state.catalog.version)


def alter_partition(state: CoordinatorState, req: m.AlterPartition, call: Call) -> m.TopicInfo:
    """A replicated partition's leader changes its ISR (DESIGN §5 "Replication"); the catalog
    checks that the session holds the leading broker at its epoch and saw the ISR as it is."""
    state.renew(req.session_id, call.now)
    change = state.apply(AlterPartitionCommand(
        session_id=req.session_id, topic_id=req.topic_id, partition=req.partition,
        broker_id=req.broker_id, leader_epoch=req.leader_epoch,
        expected_isr=tuple(req.expected_isr), isr=tuple(req.isr)), call.now, call.wall_ms)
    assert isinstance(change.created, Topic)
    return _topic_info(state, change.created)


def _process(state: CoordinatorState, session_id: int) -> int | None:
    """Which process of its query a session is, if it is one: a query's publication is held
    per process (DESIGN §5 "Collective publishing")."""
    binding = state.bindings.get(session_id)
    return binding[1] if binding is not None else None


def publish(state: CoordinatorState, req: m.Publish, call: Call) -> m.TopicInfo:
    party = _party(state, req.session_id, call)
    topic = _find(state, req.name, 0, req.session_id)
    change = state.apply(PublishCommand(topic_id=topic.topic_id, publisher=party,
                                        process=_process(state, req.session_id)), call.now,
                         call.wall_ms)
    info = _topic_info(state, state.catalog.topic(topic.topic_id))
    publication = change.created
    assert isinstance(publication, Publication)
    return msgspec.structs.replace(info, epoch=publication.epoch)


def unpublish(state: CoordinatorState, req: m.Unpublish, call: Call) -> m.Done:
    party = _party(state, req.session_id, call)
    topic = _find(state, req.name, 0, req.session_id)
    state.apply(UnpublishCommand(topic_id=topic.topic_id, publisher=party,
                                 process=_process(state, req.session_id)), call.now,
                call.wall_ms)
    return m.Done(version=state.catalog.version)


def subscribe(state: CoordinatorState, req: m.Subscribe, call: Call) -> m.TopicInfo:
    if req.record_type is not None:  # before it waits for the topic, held with the request
        _record_type(req.record_type)
    party = _party(state, req.session_id, call)
    topic = _find(state, req.name, req.wait_ms, req.session_id)
    state.apply(SubscribeCommand(topic_id=topic.topic_id, subscriber=party,
                                 record_type=req.record_type, kind=req.kind),
                call.now, call.wall_ms)
    return _topic_info(state, topic)


def unsubscribe(state: CoordinatorState, req: m.Unsubscribe, call: Call) -> m.Done:
    party = _party(state, req.session_id, call)
    topic = _find(state, req.name, 0, req.session_id)
    state.apply(UnsubscribeCommand(topic_id=topic.topic_id, subscriber=party), call.now,
                call.wall_ms)
    return m.Done(version=state.catalog.version)


# -- brokers and executors ----------------------------------------------------------------------


def register_broker(state: CoordinatorState, req: m.RegisterBroker, call: Call) -> m.BrokerInfo:
    state.renew(req.session_id, call.now)
    change = state.apply(RegisterBrokerCommand(host=_label(req.host, "the host", _HOST),
                                               address=_bounded(req.address, MAX_TEXT,
                                                                "the address"),
                                               session_id=req.session_id,
                                               broker_id=req.broker_id,
                                               kafka_address=_bounded(req.kafka_address,
                                                                      MAX_TEXT,
                                                                      "the Kafka address"),
                                               curve_key=_bounded(req.curve_key, MAX_LABEL,
                                                                  "the CURVE key"),
                                               slot=req.slot),
                         call.now, call.wall_ms)
    assert isinstance(change.created, Broker)
    return m.BrokerInfo(broker=change.created, version=state.catalog.version)


def remove_broker(state: CoordinatorState, req: m.RemoveBroker, call: Call) -> m.Done:
    state.renew(req.session_id, call.now)
    broker = state.catalog.broker(req.broker_id)
    if broker.session_id != req.session_id:
        raise NotOwnerError(f"broker {req.broker_id} was registered by another session")
    state.apply(RemoveBrokerCommand(broker_id=req.broker_id), call.now, call.wall_ms)
    return m.Done(version=state.catalog.version)


def decommission_broker(state: CoordinatorState, req: m.DecommissionBroker,
                        call: Call) -> m.Decommissioned:
    """DESIGN §5 "Decommissioning a broker": placement chooses where each replica goes, the
    catalog checks and applies it in one change (the plan and the change see one catalog:
    nothing runs between them), and the reply says what moved and what could not."""
    state.renew(req.session_id, call.now)
    if req.broker_id == state.catalog_broker_id:
        raise InvalidCommandError(f"broker {req.broker_id} is the coordinator's own broker: "
                                  "it holds the catalog and is never decommissioned")
    plan = plan_decommission(state.catalog, req.broker_id)
    change = state.apply(DecommissionBrokerCommand(
        broker_id=req.broker_id, requester=call.principal, force=req.force,
        moves=plan.moves), call.now, call.wall_ms)
    home = state.catalog.find_home(req.broker_id)
    return m.Decommissioned(
        broker_id=req.broker_id,
        moved=[m.PartitionMove(topic=state.catalog.topic(t).short_name, partition=p, to=to)
               for t, p, to in plan.moves],
        stuck=[m.PartitionStuck(topic=state.catalog.topic(t).short_name, partition=p,
                                reason=why) for t, p, why in plan.stuck],
        retired=home is not None and home.retired, version=change.version)


def register_executor(state: CoordinatorState, req: m.RegisterExecutor,
                      call: Call) -> m.ExecutorInfo:
    state.renew(req.session_id, call.now)
    change = state.apply(RegisterExecutorCommand(host=_label(req.host, "the host", _HOST),
                                                 broker_id=req.broker_id,
                                                 resources=req.resources,
                                                 session_id=req.session_id, at_ms=call.wall_ms,
                                                 shards=req.shards),
                         call.now, call.wall_ms)
    assert isinstance(change.created, Executor)
    return m.ExecutorInfo(executor=change.created,
                          version=state.catalog.version)


def remove_executor(state: CoordinatorState, req: m.RemoveExecutor, call: Call) -> m.Done:
    state.renew(req.session_id, call.now)
    executor = state.catalog.executor(req.executor_id)
    if executor.session_id != req.session_id:
        raise NotOwnerError(f"executor {req.executor_id} was registered by another session")
    state.apply(RemoveExecutorCommand(executor_id=req.executor_id, at_ms=call.wall_ms),
                call.now, call.wall_ms)
    return m.Done(version=state.catalog.version)


# -- queries ------------------------------------------------------------------------------------


def submit_query(state: CoordinatorState, req: m.SubmitQuery, call: Call) -> m.QueryInfo:
    state.renew(req.session_id, call.now)
    if principal_kind(call.principal) is PrincipalKind.EXECUTOR:
        raise NotAuthorizedError(f"{call.principal} runs queries; it does not submit them")
    _label(req.name, "the query name", "a query name is printable (tq submit --name NAME)")
    _bounded(req.program, MAX_TEXT, "the program")
    if not may_run_program(state.catalog, call.principal, req.program,
                           uploaded=call.principal in state.uploads.get(req.program, ())):
        raise NotAuthorizedError(
            f"{call.principal} may not run program {req.program[:200]!r}: only the admin names "
            "files and URLs on the executors' hosts; upload a program pack (tq submit does) "
            "and run that")
    if len(req.args) > MAX_ARGS:
        raise InvalidCommandError(f"the query has {len(req.args)} arguments; at most {MAX_ARGS}")
    _bounded("".join(req.args), MAX_ARGS_CHARS, "the arguments")
    if not 1 <= req.processes <= 10_000:
        raise InvalidCommandError(f"a query has 1 to 10000 processes, not {req.processes}")
    start_timeout_ms = req.start_timeout_ms
    if start_timeout_ms is not None and not 1 <= start_timeout_ms <= (
            state.config.max_start_timeout_ms):
        raise InvalidCommandError(f"a start timeout is 1 to {state.config.max_start_timeout_ms}"
                                  f" ms, not {start_timeout_ms}")
    executors = req.executors
    if executors is None:
        # Behind pending queries it waits its turn; else it is placed now if it fits.
        placed = None if state.pending else place_processes(
            state.catalog, req.processes, state.loads, only_free=True)
        executors = placed or ()  # (): pending, placed once slots free (CoordinatorState)
    change = state.apply(SubmitQueryCommand(
        name=req.name, program=req.program, processes=req.processes, workers=req.workers,
        executors=tuple(executors), args=tuple(req.args), at_ms=call.wall_ms,
        owner=call.principal, start_timeout_ms=start_timeout_ms or 0), call.now, call.wall_ms)
    query = change.created
    assert isinstance(query, Query)
    state.queue_or_place(query, call.now, call.wall_ms)
    query = state.catalog.query(query.query_id)
    if req.wait:
        if query.ended:
            raise QueryFailedError(f"query {query.query_id} ({query.name}) "
                                   f"{query.state.value}: {query.reason}")
        raise WaitForStart(query.query_id)
    return m.QueryInfo(query=query, version=state.catalog.version)


def await_start(state: CoordinatorState, req: m.AwaitStart, call: Call) -> m.QueryInfo:
    state.renew(req.session_id, call.now)
    query = state.catalog.query(req.query_id)
    if not manages_query(state.catalog, call.principal, query):
        raise NotAuthorizedError(f"{call.principal} may not wait on query {query.query_id}")
    if query.state in (QueryState.PENDING, QueryState.SUBMITTED):
        raise WaitForStart(query.query_id)
    if query.state in (QueryState.FAILED, QueryState.KILLED):
        raise QueryFailedError(f"query {query.query_id} ({query.name}) {query.state.value}: "
                               f"{query.reason or 'no reason given'}")
    return m.QueryInfo(query=query, version=state.catalog.version)


def report_spawn_failed(state: CoordinatorState, req: m.ReportSpawnFailed,
                        call: Call) -> m.QueryInfo:
    state.renew(req.session_id, call.now)
    query = state.catalog.query(req.query_id)
    if not placed_on_session(state.catalog, query, req.process, req.session_id):
        raise NotAuthorizedError(f"process {req.process} of query {query.query_id} was not "
                                 "placed on this session's executor")
    if not query.ended:
        state.apply(FailQuery(query_id=req.query_id, at_ms=call.wall_ms, reason=(
            f"process {req.process} could not start: {req.reason[:MAX_TEXT]}")),
            call.now, call.wall_ms)
    return m.QueryInfo(query=state.catalog.query(req.query_id), version=state.catalog.version)


def report_exit(state: CoordinatorState, req: m.ReportExit, call: Call) -> m.QueryInfo:
    state.renew(req.session_id, call.now)
    state.apply(ProcessExited(query_id=req.query_id, process=req.process,
                              exit_code=req.exit_code, at_ms=call.wall_ms,
                              session_id=req.session_id, reason=req.reason[:MAX_TEXT]),
                call.now, call.wall_ms)
    state.start_if_registered(req.query_id, call.now, call.wall_ms)
    return m.QueryInfo(query=state.catalog.query(req.query_id), version=state.catalog.version)


def kill_query(state: CoordinatorState, req: m.KillQuery, call: Call) -> m.QueryInfo:
    state.renew(req.session_id, call.now)
    state.apply(KillQueryCommand(query_id=req.query_id, at_ms=call.wall_ms,
                                 reason=req.reason[:500], requester=call.principal),
                call.now, call.wall_ms)
    return m.QueryInfo(query=state.catalog.query(req.query_id), version=state.catalog.version)


# -- users (DESIGN §12) -------------------------------------------------------------------------
# The replies carry the user record; the shell seals the key into them (the core holds none).


def add_user(state: CoordinatorState, req: m.AddUser, call: Call) -> m.UserCredential:
    state.renew(req.session_id, call.now)
    change = state.apply(AddUser(principal=_bounded(req.principal, MAX_LABEL, "the name"),
                                 role=req.role, requester=call.principal, at_ms=call.wall_ms),
                         call.now, call.wall_ms)
    assert isinstance(change.created, User)
    return m.UserCredential(user=change.created, sealed_key=b"", version=change.version)


def rotate_user(state: CoordinatorState, req: m.RotateUser, call: Call) -> m.UserCredential:
    state.renew(req.session_id, call.now)
    change = state.apply(RotateUser(principal=_bounded(req.principal, MAX_LABEL, "the name"),
                                    requester=call.principal), call.now, call.wall_ms)
    assert isinstance(change.created, User)
    return m.UserCredential(user=change.created, sealed_key=b"", version=change.version)


def remove_user(state: CoordinatorState, req: m.RemoveUser, call: Call) -> m.Done:
    state.renew(req.session_id, call.now)
    state.apply(RemoveUser(principal=_bounded(req.principal, MAX_LABEL, "the name"),
                           requester=call.principal), call.now, call.wall_ms)
    return m.Done(version=state.catalog.version)


# -- joining a host (DESIGN §12 "Joining a host") ----------------------------------------------
# As for users, the core holds no key: the shell seals the token's secret and the joiner's key
# into the replies, and fills in where joiners reach the coordinator.


@dataclass(frozen=True, slots=True)
class MintToken:
    """In process only: the shell's form of `m.CreateToken`, with the random salt it drew
    (the core draws no randomness)."""

    session_id: int
    ttl_ms: int
    name: str
    salt: int


def create_token(state: CoordinatorState, req: MintToken, call: Call) -> m.TokenMinted:
    state.renew(req.session_id, call.now)
    change = state.apply(CreateTokenCommand(
        salt=req.salt, name=_label(req.name, "the token's name", "a token's name is printable"),
        ttl_ms=req.ttl_ms,
        requester=call.principal, at_ms=call.wall_ms), call.now, call.wall_ms)
    assert isinstance(change.created, JoinToken)
    return m.TokenMinted(token=change.created, sealed_secret=b"", coordinators=[],
                         version=change.version)


def revoke_token(state: CoordinatorState, req: m.RevokeToken, call: Call) -> m.Done:
    state.renew(req.session_id, call.now)
    state.apply(RevokeTokenCommand(token_id=req.token_id, requester=call.principal),
                call.now, call.wall_ms)
    return m.Done(version=state.catalog.version)


def join_cluster(state: CoordinatorState, req: m.JoinCluster, call: Call) -> m.JoinBundle:
    """The holder of a join token redeems it: once, before it expires (the catalog's rule;
    one change, so of two racing joiners one wins), for a new executor principal."""
    token_id = token_of_principal(call.principal)
    if token_id is None:
        raise NotAuthorizedError(f"{call.principal} holds no join token; joining takes one "
                                 "(tq token create, then tq executor --join TOKEN)")
    change = state.apply(RedeemToken(token_id=token_id,
                                     name=_bounded(req.name, MAX_LABEL, "the name"),
                                     at_ms=call.wall_ms), call.now, call.wall_ms)
    assert isinstance(change.created, User)
    return m.JoinBundle(principal=change.created.principal, sealed_key=b"", coordinators=[],
                        namespace=_namespace(), version=change.version)


HANDLERS: dict[type, Handler] = {
    m.OpenSession: open_session,
    m.Heartbeat: heartbeat,
    m.CloseSession: close_session,
    m.GetCatalogInfo: catalog_info,
    m.GetLoads: loads,
    m.LookupTopic: lookup_topic,
    m.CreateTopic: create_topic,
    m.DeleteTopic: delete_topic,
    m.AlterTopic: alter_topic,
    m.ReportPartitionsDropped: report_partitions_dropped,
    m.AlterPartition: alter_partition,
    m.Publish: publish,
    m.Unpublish: unpublish,
    m.Subscribe: subscribe,
    m.Unsubscribe: unsubscribe,
    m.RegisterBroker: register_broker,
    m.RemoveBroker: remove_broker,
    m.DecommissionBroker: decommission_broker,
    m.RegisterExecutor: register_executor,
    m.RemoveExecutor: remove_executor,
    m.SubmitQuery: submit_query,
    m.AwaitStart: await_start,
    m.ReportExit: report_exit,
    m.KillQuery: kill_query,
    m.ReportSpawnFailed: report_spawn_failed,
    m.AddUser: add_user,
    m.RotateUser: rotate_user,
    m.RemoveUser: remove_user,
    m.RevokeToken: revoke_token,
    m.JoinCluster: join_cluster,
}

# Requests of the coordinator's own components, in process; never registered with RPC.
INTERNAL_HANDLERS: dict[type, Handler] = {
    CreateIngestTopic: create_ingest_topic,
    MintToken: create_token,
}
