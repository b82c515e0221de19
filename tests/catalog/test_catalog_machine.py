"""Random command sequences against the catalog state machine (hypothesis stateful testing).

After every step: the invariants hold (checked here directly, not only through
`check_invariants`), no id was ever handed out twice, a refused command changed nothing, the
emitted updates are exactly the step's difference, and replaying every update emitted so far,
from empty, rebuilds an equal catalog (collections, version and id counters).
"""

from __future__ import annotations

from collections import defaultdict

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from catalog import (
    INGEST,
    SYSTEM,
    AddUser,
    AlreadyPublishedError,
    Broker,
    Catalog,
    CatalogError,
    Change,
    CloseSession,
    Collection,
    Command,
    CorruptCatalogError,
    CreateTopic,
    DecommissionBroker,
    DeleteTopic,
    Executor,
    FailQuery,
    InvalidCommandError,
    KillQuery,
    NotAuthorizedError,
    NotOwnerError,
    NotPublishedError,
    OpenSession,
    PlaceQuery,
    PrincipalRef,
    ProcessExited,
    Publication,
    Publish,
    Query,
    QueryEndedError,
    QueryRef,
    RegisterBroker,
    RegisterExecutor,
    RemoveBroker,
    RemoveExecutor,
    RemoveUser,
    RotateUser,
    SessionExpired,
    SessionKind,
    SessionRef,
    StartQuery,
    SubmitQuery,
    Subscribe,
    Subscription,
    Topic,
    TopicKind,
    UnknownQueryError,
    UnknownSessionError,
    UnknownTopicError,
    Unpublish,
    Unsubscribe,
    decode_updates,
    encode_updates,
)
from tests.catalog._helpers import RESOURCES

# Who acts: the admin, two users, an admin user, an executor; "user:nobody" is never added.
PRINCIPALS = ["admin", "user:alice", "user:bob", "user:root", "executor:h", "user:nobody"]

NEVER = 10_000  # an id no run gets near: exercises the "unknown id" paths
TOPIC_NAMES = [
    "numbers",
    "persistent://public/default/numbers",  # the same topic, spelled in full
    "acme/prod/orders",
    "__logs",  # reserved for the system
    "bad name",  # invalid
    "a/b",  # invalid
]
_ID_OF = {
    "Session": "session_id",
    "Broker": "broker_id",
    "Executor": "executor_id",
    "Query": "query_id",
    "Topic": "topic_id",
}


class CatalogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.catalog = Catalog()
        self.log: list = []
        self.issued: dict[str, set[int]] = defaultdict(set)  # every id ever handed out, per kind
        self.clock = 0
        self.changes = 0
        self.mirror = self.contents()
        self.last_error: CatalogError | None = None

    # -- running a command ------------------------------------------------------------------

    def contents(self) -> dict[str, Collection]:
        return {name: collection.copy() for name, collection in self.catalog.collections()}

    def run(self, command: Command) -> Change | None:
        before = self.contents()
        version = self.catalog.version
        try:
            change = self.catalog.apply(command)
        except CatalogError as exc:
            event(f"{type(command).__name__} -> {type(exc).__name__}")
            # Corrupt means a bug in the rules (a retraction of something absent), not a refusal.
            assert not isinstance(exc, CorruptCatalogError), exc
            assert str(exc)
            assert self.contents() == before, "a refused command changed the catalog"
            assert self.catalog.version == version
            self.last_error = exc
            return None
        self.last_error = None
        event(f"{type(command).__name__} -> ok")
        if change.updates:
            self.changes += 1
            assert change.version == version + 1 == self.catalog.version
            assert all(u.diff != 0 for u in change.updates)
        else:
            assert change.version == version == self.catalog.version
        # The emitted updates are exactly this step's difference: applied to a mirror that has
        # seen every earlier update, they give the catalog's collections.
        for update in change.updates:
            self.mirror[update.collection].apply([(update.record, update.diff)])
        assert self.mirror == self.contents()
        self.log.extend(change.updates)
        rejoin = isinstance(command, RegisterBroker) and (
            command.broker_id is not None or self.homecoming(command, change, before))
        kind = type(change.created).__name__
        if kind in _ID_OF and not rejoin:
            new_id = getattr(change.created, _ID_OF[kind])
            assert new_id not in self.issued[kind], f"{kind} id {new_id} reused"
            self.issued[kind].add(new_id)
        return change

    def homecoming(self, command: RegisterBroker, change: Change,
                   before: dict[str, Collection]) -> bool:
        """Whether a broker asking for no id got an old one back: only one that was down,
        last registered on its host, by its principal, in its slot (test_broker_homes.py)."""
        broker_id = change.created.broker_id
        if broker_id not in self.issued["Broker"]:
            return False
        assert broker_id not in {b.broker_id for b in before["brokers"]}, "a live id again"
        session = self.catalog.session(command.session_id)
        homes = {h.broker_id: (h.host, h.principal, h.slot) for h in before["homes"]}
        assert homes.get(broker_id) == (command.host, session.principal, command.slot)
        assert broker_id not in self.retired(before), "a decommissioned id handed out again"
        return True

    @staticmethod
    def retired(contents: dict[str, Collection]) -> set[int]:
        return {h.broker_id for h in contents["homes"] if h.retired}

    def now(self) -> int:
        self.clock += 1
        return self.clock

    def live(self, kind: str) -> list[int]:
        catalog = self.catalog
        if kind == "Query":
            return sorted(q.query_id for q in catalog.queries if not q.ended)
        collection = {
            "Session": catalog.sessions,
            "Broker": catalog.brokers,
            "Executor": catalog.executors,
            "Topic": catalog.topics,
        }[kind]
        return sorted(getattr(record, _ID_OF[kind]) for record in collection)

    def pick(self, data: st.DataObject, kind: str) -> int:
        """An id of this kind: mostly one that is alive now, sometimes one handed out earlier
        (gone now, or still alive) or one never handed out."""
        live = self.live(kind)
        # One draw from a weighted list: live ids three times over, then everything else.
        choices = live * 3 + sorted(self.issued[kind]) + [NEVER]
        return data.draw(st.sampled_from(choices), label=kind)

    def party(self, data: st.DataObject) -> QueryRef | SessionRef | type(SYSTEM):
        choice = data.draw(st.sampled_from(["query", "session", "system"]), label="party")
        if choice == "query":
            return QueryRef(self.pick(data, "Query"))
        if choice == "session":
            return SessionRef(self.pick(data, "Session"))
        return SYSTEM

    def owner(self, data: st.DataObject):
        choice = data.draw(st.integers(0, 3), label="owner kind")
        if choice == 0:
            return INGEST
        if choice == 1:
            return PrincipalRef(self.principal(data))
        return self.party(data)

    def principal(self, data: st.DataObject) -> str:
        """Someone to act as: mostly a named one, sometimes a query of the run."""
        if data.draw(st.integers(0, 3), label="query principal?") == 0:
            return f"query:{self.pick(data, 'Query')}"
        return data.draw(st.sampled_from(PRINCIPALS), label="principal")

    # -- the authorization rules, restated independently of catalog._access -----------------

    def user_role(self, principal: str) -> str | None:
        if principal == "admin":
            return "admin"
        found = [u.role for u in self.catalog.users if u.principal == principal]
        return found[0] if found else None

    def query_record(self, query_id: int) -> Query | None:
        return next((q for q in self.catalog.queries if q.query_id == query_id), None)

    def chain(self, query: Query) -> list[str]:
        """The query and the principals that submitted it, up the chain."""
        found, owner = [f"query:{query.query_id}"], query.owner
        while True:
            found.append(owner)
            parent = (self.query_record(int(owner[6:])) if owner.startswith("query:")
                      else None)
            if parent is None or len(found) > 70:
                return found
            owner = parent.owner

    def may_kill(self, principal: str, query: Query) -> bool:
        return self.user_role(principal) == "admin" or principal in self.chain(query)

    def may_delete(self, principal: str, topic: Topic, force: bool) -> bool:
        admin = self.user_role(principal) == "admin"
        owner = topic.owner
        if owner == INGEST:
            return force and (admin or (topic.creator != "" and principal == topic.creator))
        if admin and (force or not self.alive(owner)):
            return True
        if isinstance(owner, PrincipalRef):
            return principal == owner.principal
        if isinstance(owner, QueryRef):
            query = self.query_record(owner.query_id)
            return query is not None and principal in self.chain(query)
        if isinstance(owner, SessionRef):
            session = [s for s in self.catalog.sessions if s.session_id == owner.session_id]
            return not session or session[0].principal == principal
        return False

    def acts_as_owner(self, party, topic: Topic) -> bool:
        if topic.owner == INGEST or party == topic.owner:
            return True
        if isinstance(topic.owner, PrincipalRef) and isinstance(party, SessionRef):
            session = [s for s in self.catalog.sessions if s.session_id == party.session_id]
            return bool(session) and session[0].principal == topic.owner.principal
        return False

    def principal_of(self, party) -> str | None:
        if isinstance(party, QueryRef):
            return f"query:{party.query_id}"
        if isinstance(party, PrincipalRef):
            return party.principal
        if isinstance(party, SessionRef):
            found = [s.principal for s in self.catalog.sessions
                     if s.session_id == party.session_id]
            return found[0] if found else None
        return None

    def root(self, principal: str) -> str:
        query = (self.query_record(int(principal[6:])) if principal.startswith("query:")
                 else None)
        return principal if query is None else self.chain(query)[-1]

    def takes_over(self, party, topic: Topic) -> bool:
        """Re-running: an ended query's topic, or a principal's that none of its sessions
        publishes, goes to a publisher acting for the same principal at the root."""
        owner = topic.owner
        if isinstance(owner, QueryRef):
            active = self.alive(owner)
        elif isinstance(owner, PrincipalRef):
            active = self.alive(owner) and any(
                p.topic_id == topic.topic_id for p in self.catalog.publications)
        else:
            return False
        mine, theirs = self.principal_of(party), self.principal_of(owner)
        return (not active and not topic.internal and mine is not None and theirs is not None
                and self.root(mine) == self.root(theirs))

    def maybe_session(self, data: st.DataObject) -> int | None:
        return None if data.draw(st.booleans(), label="no session") else self.pick(data, "Session")

    # -- rules --------------------------------------------------------------------------------

    @rule(data=st.data(), kind=st.sampled_from(SessionKind))
    def open_session(self, data: st.DataObject, kind: SessionKind) -> None:
        principal = data.draw(st.sampled_from(PRINCIPALS[:5]), label="principal")
        self.run(OpenSession(kind=kind, peer="p", at_ms=self.now(), principal=principal))

    @rule(data=st.data(), expired=st.booleans())
    def end_session(self, data: st.DataObject, expired: bool) -> None:
        command = SessionExpired if expired else CloseSession
        self.run(command(session_id=self.pick(data, "Session"), at_ms=self.now()))

    @rule(data=st.data(), rejoin=st.booleans())
    def register_broker(self, data: st.DataObject, rejoin: bool) -> None:
        broker_id = self.pick(data, "Broker") if rejoin else None
        session_id = self.maybe_session(data)
        slot = data.draw(st.integers(0, 1), label="slot")  # the agent's broker, a shard
        self.run(
            RegisterBroker(
                host="h", address="tcp://h:1", session_id=session_id, broker_id=broker_id,
                slot=slot,
            )
        )
        self.check_host_agent(session_id)

    def check_host_agent(self, session_id: int | None) -> None:
        """Only executor credentials (and admins) register brokers and executors."""
        session = [s for s in self.catalog.sessions if s.session_id == session_id]
        if session and self.user_role(session[0].principal) not in ("executor", "admin"):
            assert isinstance(self.last_error, NotAuthorizedError)

    @rule(data=st.data(), force=st.booleans())
    def decommission_broker(self, data: st.DataObject, force: bool) -> None:
        """Only an admin; a live broker only with force, never the coordinator's own; an id
        only once; retired only when nothing is placed on it, and then never registered."""
        broker_id = self.pick(data, "Broker")
        requester = self.principal(data)
        before = self.contents()
        live = {b.broker_id: b for b in before["brokers"]}
        change = self.run(DecommissionBroker(broker_id=broker_id, requester=requester,
                                             force=force))
        if change is None:
            return
        assert self.user_role(requester) == "admin"
        assert broker_id not in self.retired(before)
        assert broker_id in {h.broker_id for h in before["homes"]}
        if broker_id in live:
            assert force and live[broker_id].session_id is not None
        placed = {b for t in before["topics"] for b in t.locations}
        assert (broker_id in self.retired(self.contents())) == (broker_id not in placed)
        if broker_id in self.retired(self.contents()) and broker_id not in live:
            session = self.maybe_session(data)
            self.run(RegisterBroker(host="h", address="tcp://h:1", session_id=session,
                                    broker_id=broker_id))
            assert self.last_error is not None, "a decommissioned id registered again"

    @rule(data=st.data())
    def remove_broker(self, data: st.DataObject) -> None:
        self.run(RemoveBroker(broker_id=self.pick(data, "Broker")))

    @rule(data=st.data())
    def register_executor(self, data: st.DataObject) -> None:
        self.run(
            RegisterExecutor(
                host="h",
                broker_id=self.pick(data, "Broker"),
                resources=RESOURCES,
                session_id=(session_id := self.maybe_session(data)),
                at_ms=self.now(),
            )
        )
        self.check_host_agent(session_id)

    @rule(data=st.data())
    def remove_executor(self, data: st.DataObject) -> None:
        self.run(RemoveExecutor(executor_id=self.pick(data, "Executor"), at_ms=self.now()))

    @rule(data=st.data(), processes=st.integers(0, 3), pending=st.booleans())
    def submit_query(self, data: st.DataObject, processes: int, pending: bool) -> None:
        executors = () if pending else tuple(
            self.pick(data, "Executor") for _ in range(max(processes, 1)))
        self.run(
            SubmitQuery(
                name="q",
                program="prog",
                processes=processes,
                workers=1,
                executors=executors,
                at_ms=self.now(),
                owner=self.principal(data),
            )
        )

    @rule(data=st.data(), processes=st.integers(0, 4))
    def place_query(self, data: st.DataObject, processes: int) -> None:
        """Place a pending query (or try a placed one: refused); the count may be wrong."""
        executors = tuple(self.pick(data, "Executor") for _ in range(processes))
        self.run(PlaceQuery(query_id=self.pick(data, "Query"), executors=executors,
                            at_ms=self.now()))

    @rule(data=st.data())
    def start_query(self, data: st.DataObject) -> None:
        self.run(StartQuery(query_id=self.pick(data, "Query"), at_ms=self.now()))

    @rule(data=st.data(), code=st.sampled_from([0, 0, 0, 1, -15]))
    def process_exited(self, data: st.DataObject, code: int) -> None:
        query_id = self.pick(data, "Query")
        known = [q.processes for q in self.catalog.queries if q.query_id == query_id]
        process = data.draw(st.integers(0, known[0] if known else 2), label="process")
        session_id = self.maybe_session(data)
        query = self.query_record(query_id)
        self.run(ProcessExited(query_id=query_id, process=process, exit_code=code,
                               at_ms=self.now(), session_id=session_id))
        if (query is not None and 0 <= process < query.processes and session_id is not None
                and query.placed):
            placed = [e.session_id for e in self.catalog.executors
                      if e.executor_id == query.executors[process]]
            if placed != [session_id]:
                # Only the executor the process runs on reports its exit.
                assert isinstance(self.last_error, NotAuthorizedError)

    @rule(data=st.data(), kill=st.booleans())
    def end_query(self, data: st.DataObject, kill: bool) -> None:
        query_id = self.pick(data, "Query")
        if kill:
            requester = self.principal(data)
            query = self.query_record(query_id)
            self.run(KillQuery(query_id=query_id, at_ms=self.now(), requester=requester))
            if query is not None and not self.may_kill(requester, query):
                assert isinstance(self.last_error, NotOwnerError)
        else:
            self.run(FailQuery(query_id=query_id, reason="gave up", at_ms=self.now()))

    @rule(
        data=st.data(),
        name=st.sampled_from(TOPIC_NAMES),
        partitions=st.integers(0, 3),
        kind=st.sampled_from(TopicKind),
        record_type=st.sampled_from(["int", "str"]),
    )
    def create_topic(
        self, data: st.DataObject, name: str, partitions: int, kind: TopicKind, record_type: str
    ) -> None:
        locations = tuple(self.pick(data, "Broker") for _ in range(max(partitions, 1)))
        self.run(
            CreateTopic(
                name=name,
                partitions=partitions,
                record_type=record_type,
                kind=kind,
                owner=self.owner(data),
                locations=locations,
                at_ms=self.now(),
                creator=self.principal(data),
            )
        )

    def topic_or_none(self, topic_id: int) -> Topic | None:
        return next((t for t in self.catalog.topics if t.topic_id == topic_id), None)

    @rule(data=st.data(), force=st.booleans())
    def delete_topic(self, data: st.DataObject, force: bool) -> None:
        topic_id = self.pick(data, "Topic")
        topic = self.topic_or_none(topic_id)
        requester = self.party_for(data, topic_id, "subscriptions")
        if data.draw(st.integers(0, 5), label="ingest requester?") == 0:
            requester = INGEST
        principal = self.principal(data)
        if topic is not None and data.draw(st.booleans(), label="a relevant principal?"):
            candidates = [topic.creator or "admin"]
            if isinstance(topic.owner, PrincipalRef):
                candidates.append(topic.owner.principal)
            if isinstance(topic.owner, QueryRef) and (
                    query := self.query_record(topic.owner.query_id)) is not None:
                candidates += self.chain(query)
            principal = data.draw(st.sampled_from(candidates), label="principal")
        self.run(DeleteTopic(topic_id=topic_id, requester=requester, force=force,
                             principal=principal))
        # The ownership rule, stated independently of the implementation.
        if topic is None:
            assert isinstance(self.last_error, UnknownTopicError)
        elif topic.internal and requester != SYSTEM:
            assert isinstance(self.last_error, NotOwnerError)
        elif not topic.internal and not self.may_delete(principal, topic, force):
            assert isinstance(self.last_error, NotOwnerError)
        else:
            assert self.last_error is None
            assert self.topic_or_none(topic_id) is None

    def party_for(self, data: st.DataObject, topic_id: int, collection: str):
        """A party likely to matter for this topic: its owner, a current publisher or
        subscriber, or any party at all."""
        topic = next((t for t in self.catalog.topics if t.topic_id == topic_id), None)
        candidates = []
        if topic is not None and topic.owner != INGEST:
            candidates.append(topic.owner)
        for record in self.catalog.collection(collection):
            if record.topic_id == topic_id:
                candidates.append(getattr(record, "publisher", None) or record.subscriber)
        if candidates and data.draw(st.booleans(), label="relevant party?"):
            return data.draw(st.sampled_from(candidates), label="party")
        return self.party(data)

    @rule(data=st.data(), undo=st.booleans())
    def publish(self, data: st.DataObject, undo: bool) -> None:
        topic_id = self.pick(data, "Topic")
        topic = self.topic_or_none(topic_id)
        publisher = self.party_for(data, topic_id, "publications")
        if undo:
            self.run(Unpublish(topic_id=topic_id, publisher=publisher))
            return
        was_publishing = self.publication(topic_id, publisher) is not None
        self.run(Publish(topic_id=topic_id, publisher=publisher))
        if topic is None:
            assert isinstance(self.last_error, UnknownTopicError)
        elif isinstance(publisher, PrincipalRef):  # an owner, never a party
            assert isinstance(self.last_error, InvalidCommandError)
        elif not self.alive(publisher):
            assert isinstance(
                self.last_error, UnknownSessionError | UnknownQueryError | QueryEndedError
            )
        elif not self.acts_as_owner(publisher, topic):
            if self.takes_over(publisher, topic):
                assert self.last_error is None
                owner = self.topic_or_none(topic_id).owner
                assert owner == (publisher if isinstance(publisher, QueryRef)
                                 else PrincipalRef(self.principal_of(publisher)))
            else:
                assert isinstance(self.last_error, NotOwnerError)
        elif was_publishing:
            assert isinstance(self.last_error, AlreadyPublishedError)
        else:
            assert self.last_error is None

    def publication(self, topic_id: int, publisher) -> Publication | None:
        found = [p for p in self.catalog.publications
                 if p.topic_id == topic_id and p.publisher == publisher]
        assert len(found) <= 1
        return found[0] if found else None

    @precondition(lambda self: any(isinstance(t.owner, QueryRef) for t in self.catalog.topics))
    @rule(data=st.data(), undo=st.booleans())
    def process_publishes(self, data: st.DataObject, undo: bool) -> None:
        """A process of the owning query publishes (or stops): the publication is held by the
        set of processes publishing and leaves when the last lets go."""
        topic = data.draw(st.sampled_from([t for t in self.catalog.topics
                                           if isinstance(t.owner, QueryRef)]))
        query = next((q for q in self.catalog.queries if q.query_id == topic.owner.query_id),
                     None)
        count = query.processes if query is not None else 1
        process = data.draw(st.integers(-1, count), label="process")
        current = self.publication(topic.topic_id, topic.owner)
        held = set(current.processes) if current is not None else set()
        command = Unpublish if undo else Publish
        self.run(command(topic_id=topic.topic_id, publisher=topic.owner, process=process))
        after = self.publication(topic.topic_id, topic.owner)
        if not 0 <= process < count:
            assert self.last_error is not None
        elif undo:
            if current is None or (held and process not in held):
                assert isinstance(self.last_error, NotPublishedError)
            else:
                assert self.last_error is None
                left = held - {process}
                assert (after is None) if not left else after.processes == tuple(sorted(left))
        elif not self.alive(topic.owner):
            assert isinstance(self.last_error, UnknownQueryError | QueryEndedError)
        elif current is not None and (not held or process in held):
            assert isinstance(self.last_error, AlreadyPublishedError)
        else:
            assert self.last_error is None
            assert after.processes == tuple(sorted(held | {process}))

    @rule(
        data=st.data(),
        undo=st.booleans(),
        record_type=st.sampled_from([None, "int", "str"]),
        kind=st.sampled_from([None, *TopicKind]),
    )
    def subscribe(self, data: st.DataObject, undo: bool, record_type, kind) -> None:
        topic_id = self.pick(data, "Topic")
        party = self.party_for(data, topic_id, "subscriptions")
        if undo:
            self.run(Unsubscribe(topic_id=topic_id, subscriber=party))
        else:
            self.run(
                Subscribe(topic_id=topic_id, subscriber=party, record_type=record_type, kind=kind)
            )

    # Chains of valid commands, so that random runs reach deep states (running queries with
    # topics, publications and subscriptions on several hosts) often, not by luck.

    @rule(data=st.data(), action=st.sampled_from(["add", "remove", "rotate"]))
    def manage_user(self, data: st.DataObject, action: str) -> None:
        requester = self.principal(data)
        name = data.draw(st.sampled_from(PRINCIPALS + ["user:carol", "executor:g", "bad name"]),
                         label="user")
        before = {u.principal: u for u in self.catalog.users}
        role_before = self.user_role(requester)
        if action == "add":
            role = data.draw(st.sampled_from(["user", "admin", "executor", "king"]))
            self.run(AddUser(principal=name, role=role, requester=requester, at_ms=self.now()))
        elif action == "remove":
            self.run(RemoveUser(principal=name, requester=requester))
        else:
            self.run(RotateUser(principal=name, requester=requester))
        if role_before != "admin":
            assert isinstance(self.last_error, NotAuthorizedError)
        elif action == "rotate" and self.last_error is None:
            after = next(u for u in self.catalog.users if u.principal == name)
            assert after.generation == before[name].generation + 1

    @initialize(data=st.data(), hosts=st.integers(0, 2), queries=st.integers(0, 3))
    def populate(self, data: st.DataObject, hosts: int, queries: int) -> None:
        for principal, role in (("user:alice", "user"), ("user:bob", "user"),
                                ("user:root", "admin"), ("executor:h", "executor")):
            self.run(AddUser(principal=principal, role=role, requester="admin",
                             at_ms=self.now()))
        for _ in range(hosts):
            self.join_host()
        if hosts:
            # The system topics a coordinator creates at start, on its first broker.
            broker = self.live("Broker")[0]
            for name, kind in (
                ("__logs", TopicKind.STREAM),
                ("__catalog.topics", TopicKind.COLLECTION),
            ):
                self.run(
                    CreateTopic(
                        name=name,
                        partitions=1,
                        record_type="catalog",
                        kind=kind,
                        owner=SYSTEM,
                        locations=(broker,),
                        at_ms=self.now(),
                    )
                )
        for _ in range(queries if hosts else 0):
            self.launch_query(data, processes=data.draw(st.integers(1, 3)), start=True)

    @rule()
    def join_host(self) -> None:
        agent = "executor:h" if self.user_role("executor:h") else "admin"
        session = self.run(OpenSession(kind=SessionKind.EXECUTOR, peer="agent", at_ms=self.now(),
                                       principal=agent))
        assert session is not None
        session_id = session.created.session_id
        broker = self.run(RegisterBroker(host="h", address="tcp://h:2", session_id=session_id))
        assert broker is not None
        self.run(
            RegisterExecutor(
                host="h",
                broker_id=broker.created.broker_id,
                resources=RESOURCES,
                session_id=session_id,
                at_ms=self.now(),
            )
        )

    @precondition(lambda self: len(self.catalog.executors) > 0)
    @rule(data=st.data(), processes=st.integers(1, 3), start=st.booleans())
    def launch_query(self, data: st.DataObject, processes: int, start: bool) -> None:
        executors = tuple(
            data.draw(st.sampled_from(self.live("Executor"))) for _ in range(processes)
        )
        change = self.run(
            SubmitQuery(
                name="q",
                program="prog",
                processes=processes,
                workers=2,
                executors=executors,
                at_ms=self.now(),
                owner=data.draw(st.sampled_from(PRINCIPALS[:4]), label="owner"),
            )
        )
        assert change is not None
        query = QueryRef(change.created.query_id)
        if start:
            self.run(StartQuery(query_id=query.query_id, at_ms=self.now()))
        # On a broker that takes topics: not one drained out (decommissioned while live).
        retired = self.retired(self.contents())
        open_brokers = [b for b in self.live("Broker") if b not in retired]
        if not open_brokers:
            return
        topic = self.run(
            CreateTopic(
                name=f"out-{query.query_id}",
                partitions=processes,
                record_type="int",
                kind=TopicKind.STREAM,
                owner=query,
                locations=tuple(open_brokers[:1]) * processes,
                at_ms=self.now(),
            )
        )
        assert topic is not None
        self.run(Publish(topic_id=topic.created.topic_id, publisher=query))
        other = data.draw(st.sampled_from(self.live("Topic")))
        self.run(Subscribe(topic_id=other, subscriber=query))

    @precondition(lambda self: len(self.catalog.topics) > 0)
    @rule(data=st.data())
    def client_reads_and_feeds(self, data: st.DataObject) -> None:
        change = self.run(OpenSession(kind=SessionKind.CLIENT, peer="cli", at_ms=self.now(),
                                      principal=data.draw(st.sampled_from(PRINCIPALS[:4]))))
        assert change is not None
        me = SessionRef(change.created.session_id)
        topic = data.draw(st.sampled_from(self.live("Topic")))
        self.run(Subscribe(topic_id=topic, subscriber=me))
        ingest = [t.topic_id for t in self.catalog.topics if t.owner == INGEST]
        if ingest:
            self.run(Publish(topic_id=data.draw(st.sampled_from(ingest)), publisher=me))

    # -- invariants ---------------------------------------------------------------------------

    def alive(self, party) -> bool:
        if isinstance(party, QueryRef):
            query = next((q for q in self.catalog.queries if q.query_id == party.query_id), None)
            return query is not None and not query.ended
        if isinstance(party, SessionRef):
            return any(s.session_id == party.session_id for s in self.catalog.sessions)
        if isinstance(party, PrincipalRef) and party.principal != "admin":
            return any(u.principal == party.principal for u in self.catalog.users)
        return True

    @invariant()
    def invariants_hold(self) -> None:
        catalog = self.catalog
        catalog.check_invariants()
        topics = {t.topic_id: t for t in catalog.topics if isinstance(t, Topic)}
        for publication in catalog.publications:
            assert isinstance(publication, Publication)
            topic = topics[publication.topic_id]  # names an existing topic
            assert self.alive(publication.publisher)  # and a live query or open session
            assert self.acts_as_owner(publication.publisher, topic)
        for subscription in catalog.subscriptions:
            assert isinstance(subscription, Subscription)
            assert subscription.topic_id in topics
            assert self.alive(subscription.subscriber)
        brokers = {b.broker_id for b in catalog.brokers if isinstance(b, Broker)}
        for executor in catalog.executors:
            assert isinstance(executor, Executor)
            assert executor.broker_id in brokers
            assert executor.session_id is None or self.alive(SessionRef(executor.session_id))
        for query in catalog.queries:
            assert isinstance(query, Query)
            assert query.query_id in self.issued["Query"]
        names = [t.name for t in topics.values()]
        assert len(names) == len(set(names))
        assert catalog.version == self.changes
        # The per-principal count the coordinator bounds sessions by (DESIGN §12).
        held: dict[str, int] = {}
        for session in catalog.sessions:
            held[session.principal] = held.get(session.principal, 0) + 1
        for principal in {*held, "admin", "user:alice", "query:1"}:
            assert catalog.sessions_of(principal) == held.get(principal, 0)

    def teardown(self) -> None:
        # Each step already checked replay(snapshot before + its updates) == the catalog after;
        # here the whole history is replayed from empty, as the coordinator recovers.
        replayed = Catalog.replay(self.log)
        assert replayed == self.catalog
        for session in self.catalog.sessions:
            assert replayed.sessions_of(session.principal) == \
                self.catalog.sessions_of(session.principal)
        assert replayed.counters == self.catalog.counters
        assert Catalog.replay(self.catalog.snapshot()) == self.catalog
        for name, collection in self.catalog.collections():
            rebuilt = Collection((u.record, u.diff) for u in self.log if u.collection == name)
            assert rebuilt == collection
        decoded = decode_updates(encode_updates(self.log))
        assert decoded == self.log
        # Each collection topic is read on its own: order across collections must not matter.
        by_collection = sorted(decoded, key=lambda u: u.collection, reverse=True)
        assert Catalog.replay(by_collection) == self.catalog


CatalogMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCatalogMachine = CatalogMachine.TestCase
