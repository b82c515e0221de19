"""The catalog state machine: commands in, consolidated diffs out, one version per change.

`Catalog.apply(command)` either raises a CatalogError and changes nothing, or commits the
command's updates to the collections, advances the version by one and returns a `Change`. A
command that would change nothing returns an empty Change at the same version.

Every change also retracts and re-inserts the single `counters` record (version and next ids), so
the updates alone, even compacted to a snapshot, rebuild the catalog exactly:
`Catalog.replay(c.snapshot()) == c` and `Catalog.replay(all updates ever emitted) == c`.

Policy decisions (the issue leaves them to us):
- Topics outlive their owners. When a query ends or a session closes, its publications and
  subscriptions leave, but the topics it owns stay readable (the log is on disk). Such an
  orphaned topic may be deleted by anyone; a re-run that wants the name deletes it first.
- Deleting a topic removes every publication and subscription of it.
- Queries stay in the catalog after they end, with their exit codes (history for `tq status`):
  each submitter's newest ENDED_QUERIES_KEPT, and older ones something still leads back
  through (`_rules._forget_ended`).
- A query with a process still running on an executor that leaves fails ("lost executor").

Must not: read clocks, do I/O, or mutate state before a command has been fully checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import cast

import msgspec

from catalog._collection import Collection
from catalog._commands import Change, Command
from catalog._invariants import check_invariants
from catalog._names import TopicName
from catalog._records import (
    COLLECTIONS,
    Broker,
    BrokerHome,
    Counters,
    Executor,
    IngestRef,
    JoinToken,
    Owner,
    Party,
    PendingDrop,
    PrincipalRef,
    Publication,
    Query,
    QueryRef,
    Record,
    Session,
    SessionRef,
    Subscription,
    SystemRef,
    Topic,
    Update,
    User,
    catalog_topic,
)
from catalog._rules import HANDLERS, Txn
from catalog.errors import (
    CorruptCatalogError,
    InvalidCommandError,
    UnknownBrokerError,
    UnknownExecutorError,
    UnknownQueryError,
    UnknownSessionError,
    UnknownTopicError,
)

__all__ = ["Catalog", "consolidate_updates"]

# The id field of each collection whose records have one; the catalog indexes them by it.
_ID_FIELDS = {
    "sessions": "session_id",
    "brokers": "broker_id",
    "homes": "broker_id",
    "executors": "executor_id",
    "queries": "query_id",
    "topics": "topic_id",
    "tokens": "token_id",
}


def consolidate_updates(updates: Iterable[Update]) -> list[Update]:
    """Sum the diffs of equal (collection, record) pairs, drop zeros, put retractions first.

    Retractions first means a reader applying updates one by one never sees a record twice where
    a command replaced it.
    """
    sums: dict[tuple[str, Record], int] = {}
    for collection, record, diff in updates:
        key = (collection, record)
        sums[key] = sums.get(key, 0) + diff
    retractions = [Update(c, r, d) for (c, r), d in sums.items() if d < 0]  # type: ignore[arg-type]  # c: a COLLECTIONS name
    insertions = [Update(c, r, d) for (c, r), d in sums.items() if d > 0]  # type: ignore[arg-type]  # c: a COLLECTIONS name
    return retractions + insertions


class Catalog:
    """The catalog: its collections, the version, and the rules that change them."""

    def __init__(self) -> None:
        self._collections: dict[str, Collection[Record]] = {
            name: Collection() for name in COLLECTIONS
        }
        self._counters = Counters()
        self._by_id: dict[str, dict[int, Record]] = {name: {} for name in _ID_FIELDS}
        self._topic_by_name: dict[str, Topic] = {}
        self._users: dict[str, User] = {}
        self._sessions_of: Counter[str] = Counter()  # open sessions per principal

    # -- changing it ----------------------------------------------------------------------------

    def apply(self, command: Command) -> Change:
        """Check and commit one command. Raises a CatalogError subclass, changing nothing."""
        handler = HANDLERS.get(type(command))
        if handler is None:
            raise InvalidCommandError(f"not a catalog command: {type(command).__name__}")
        txn = Txn(self._counters)
        handler(self, txn, command)
        return self._commit(txn.updates, txn.counters, txn.created)

    def _commit(self, updates: list[Update], counters: Counters, created: Record | None) -> Change:
        changes = consolidate_updates(updates)
        if not changes:
            return Change(version=self.version, updates=(), created=created)
        old = self._counters
        new = msgspec.structs.replace(counters, version=old.version + 1)
        retractions = [u for u in changes if u.diff < 0]
        insertions = [u for u in changes if u.diff > 0]
        if old.version:
            retractions.append(Update("counters", old, -1))
        insertions.append(Update("counters", new, 1))
        changes = retractions + insertions
        self._write(changes)
        self._counters = new
        return Change(version=new.version, updates=tuple(changes), created=created)

    def apply_committed(self, version: int, updates: Sequence[Update]) -> None:
        """Apply change `version`, committed by another catalog (a standby following the active
        coordinator's log; DESIGN §3 "Coordinator failover"): its updates as that catalog
        emitted them, counters included. CorruptCatalogError, changing nothing, unless it is
        the next change and applies."""
        if version != self.version + 1:
            raise CorruptCatalogError(f"change {version} does not follow version {self.version}")
        counters = [r for c, r, d in updates if c == "counters" and d > 0]
        if len(counters) != 1 or not isinstance(counters[0], Counters) \
                or counters[0].version != version:
            raise CorruptCatalogError(f"change {version} does not set the catalog version")
        for collection, record, _ in updates:
            if type(record) is not COLLECTIONS.get(collection):
                raise CorruptCatalogError(
                    f"a {type(record).__name__} record in collection {collection!r}")
        self._write(list(updates))
        self._counters = counters[0]

    def _write(self, updates: list[Update]) -> None:
        grouped: dict[str, list[tuple[Record, int]]] = {}
        for collection, record, diff in updates:
            grouped.setdefault(collection, []).append((record, diff))
        # Check every collection before touching any, so a bug surfaces as an error, not as a
        # half-applied command.
        for name, batch in grouped.items():
            self._collections[name].check(batch)
        for name, batch in grouped.items():
            self._collections[name].apply(batch)
        for collection, record, diff in updates:
            self._index(collection, record, diff)

    def _index(self, collection: str, record: Record, diff: int) -> None:
        if isinstance(record, User):
            if diff > 0:
                self._users[record.principal] = record
            elif self._users.get(record.principal) == record:
                del self._users[record.principal]
            return
        field = _ID_FIELDS.get(collection)
        if field is None:
            return
        index = self._by_id[collection]
        key = getattr(record, field)
        if diff > 0:
            index[key] = record
            if isinstance(record, Topic):
                self._topic_by_name[record.name] = record
            elif isinstance(record, Session):
                self._sessions_of[record.principal] += 1
        elif index.get(key) == record:
            del index[key]
            if isinstance(record, Topic) and self._topic_by_name.get(record.name) == record:
                del self._topic_by_name[record.name]
            elif isinstance(record, Session):
                self._sessions_of[record.principal] -= 1
                if not self._sessions_of[record.principal]:
                    del self._sessions_of[record.principal]

    # -- rebuilding it --------------------------------------------------------------------------

    @classmethod
    def replay(cls, updates: Iterable[Update]) -> Catalog:
        """Rebuild a catalog from updates: every change ever emitted, or a snapshot, in any
        order across collections. Raises CorruptCatalogError if they do not form a valid
        catalog (wrong record type for a collection, a negative count, a broken invariant)."""
        catalog = cls()
        grouped: dict[str, list[tuple[Record, int]]] = {name: [] for name in COLLECTIONS}
        for update in updates:
            collection, record, diff = update
            expected = COLLECTIONS.get(collection)
            if expected is None or type(record) is not expected:
                raise CorruptCatalogError(
                    f"a {type(record).__name__} record in collection {collection!r}"
                )
            grouped[collection].append((record, diff))
        for name, batch in grouped.items():
            catalog._collections[name].apply(batch)
        counters = list(catalog._collections["counters"].items())
        if len(counters) > 1 or (counters and counters[0][1] != 1):
            raise CorruptCatalogError(f"expected one counters record, found {counters!r}")
        if counters:
            record = counters[0][0]
            assert isinstance(record, Counters)
            catalog._counters = record
        for name in (*_ID_FIELDS, "users"):
            for record in catalog._collections[name]:
                catalog._index(name, record, 1)
        catalog.check_invariants()
        return catalog

    def snapshot(self) -> list[Update]:
        """The whole catalog as consolidated updates, collection by collection, in a fixed order.

        `Catalog.replay(snapshot)` equals this catalog, version and id counters included.
        """
        return [
            Update(name, record, count)  # type: ignore[arg-type]  # a COLLECTIONS name
            for name in COLLECTIONS
            for record, count in self._collections[name].snapshot()
        ]

    def check_invariants(self) -> None:
        """Raise CorruptCatalogError if any invariant does not hold (see `_invariants`)."""
        check_invariants(self)

    # -- reading it -----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """How many changes the catalog has seen: the logical time of the catalog topics."""
        return self._counters.version

    @property
    def counters(self) -> Counters:
        return self._counters

    def collection(self, name: str) -> Collection[Record]:
        """A collection by name. Read it; do not apply to it (that bypasses every rule)."""
        catalog_topic(name)  # raises UnknownCollectionError, listing the names
        return self._collections[name]

    def collections(self) -> Iterator[tuple[str, Collection[Record]]]:
        return iter(self._collections.items())

    @property
    def sessions(self) -> Collection[Session]:
        return cast("Collection[Session]", self._collections["sessions"])

    @property
    def brokers(self) -> Collection[Broker]:
        return cast("Collection[Broker]", self._collections["brokers"])

    @property
    def homes(self) -> Collection[BrokerHome]:
        return cast("Collection[BrokerHome]", self._collections["homes"])

    def find_home(self, broker_id: int) -> BrokerHome | None:
        """Where broker `broker_id` was last registered by a session, or None."""
        record = self._by_id["homes"].get(broker_id)
        return record if isinstance(record, BrokerHome) else None

    def retired_brokers(self) -> set[int]:
        """The decommissioned broker ids (DESIGN §5 "Decommissioning a broker"). O(homes),
        one home per broker id ever registered by an executor: a few hundred at most."""
        return {h.broker_id for h in self.homes if isinstance(h, BrokerHome) and h.retired}

    @property
    def executors(self) -> Collection[Executor]:
        return cast("Collection[Executor]", self._collections["executors"])

    @property
    def queries(self) -> Collection[Query]:
        return cast("Collection[Query]", self._collections["queries"])

    @property
    def topics(self) -> Collection[Topic]:
        return cast("Collection[Topic]", self._collections["topics"])

    @property
    def publications(self) -> Collection[Publication]:
        return cast("Collection[Publication]", self._collections["publications"])

    @property
    def subscriptions(self) -> Collection[Subscription]:
        return cast("Collection[Subscription]", self._collections["subscriptions"])

    @property
    def users(self) -> Collection[User]:
        return cast("Collection[User]", self._collections["users"])

    def user(self, principal: str) -> User | None:
        """The named principal (`user:NAME`, `executor:NAME`), or None."""
        return self._users.get(principal)

    @property
    def tokens(self) -> Collection[JoinToken]:
        return cast("Collection[JoinToken]", self._collections["tokens"])

    def find_token(self, token_id: int) -> JoinToken | None:
        """Join token `token_id` (until revoked), or None."""
        record = self._by_id["tokens"].get(token_id)
        return record if isinstance(record, JoinToken) else None

    def find_session(self, session_id: int) -> Session | None:
        record = self._by_id["sessions"].get(session_id)
        return record if isinstance(record, Session) else None

    def sessions_of(self, principal: str) -> int:
        """How many open sessions `principal` holds (O(1): indexed)."""
        return self._sessions_of[principal]

    def find_executor(self, executor_id: int) -> Executor | None:
        record = self._by_id["executors"].get(executor_id)
        return record if isinstance(record, Executor) else None

    def find_query(self, query_id: int) -> Query | None:
        record = self._by_id["queries"].get(query_id)
        return record if isinstance(record, Query) else None

    def session(self, session_id: int) -> Session:
        record = self._by_id["sessions"].get(session_id)
        if record is None:
            raise UnknownSessionError(f"no open session {session_id}")
        assert isinstance(record, Session)
        return record

    def broker(self, broker_id: int) -> Broker:
        record = self._by_id["brokers"].get(broker_id)
        if record is None:
            raise UnknownBrokerError(f"no registered broker {broker_id}")
        assert isinstance(record, Broker)
        return record

    def executor(self, executor_id: int) -> Executor:
        record = self._by_id["executors"].get(executor_id)
        if record is None:
            raise UnknownExecutorError(f"no registered executor {executor_id}")
        assert isinstance(record, Executor)
        return record

    def query(self, query_id: int) -> Query:
        record = self._by_id["queries"].get(query_id)
        if record is None:
            raise UnknownQueryError(f"no query {query_id}")
        assert isinstance(record, Query)
        return record

    def topic(self, topic_id: int) -> Topic:
        record = self._by_id["topics"].get(topic_id)
        if record is None:
            raise UnknownTopicError(f"no topic with id {topic_id}")
        assert isinstance(record, Topic)
        return record

    def find_topic(self, name: str) -> Topic | None:
        """The topic with this name in any accepted spelling, or None. Bad names raise."""
        return self._topic_by_name.get(TopicName.parse(name).full)

    def topic_by_name(self, name: str) -> Topic:
        topic = self.find_topic(name)
        if topic is None:
            raise UnknownTopicError(f"no topic {TopicName.parse(name).short!r}")
        return topic

    # These scan a collection: O(n), fine for the catalog's sizes (thousands, not millions).

    def publications_of(self, party: Party) -> list[Publication]:
        return [p for p in self.publications if isinstance(p, Publication) and p.publisher == party]

    def subscriptions_of(self, party: Party) -> list[Subscription]:
        return [
            s for s in self.subscriptions if isinstance(s, Subscription) and s.subscriber == party
        ]

    def publications_on(self, topic_id: int) -> list[Publication]:
        return [
            p for p in self.publications if isinstance(p, Publication) and p.topic_id == topic_id
        ]

    def subscriptions_on(self, topic_id: int) -> list[Subscription]:
        return [
            s for s in self.subscriptions if isinstance(s, Subscription) and s.topic_id == topic_id
        ]

    def pending_drops(self, broker_id: int | None = None) -> list[PendingDrop]:
        """Drops of deleted topics' partitions not yet reported done (on one broker)."""
        return [d for d in self._collections["drops"] if isinstance(d, PendingDrop)
                and (broker_id is None or d.broker_id == broker_id)]

    def pending_drop(self, topic_id: int, broker_id: int) -> PendingDrop | None:
        return next((d for d in self.pending_drops(broker_id) if d.topic_id == topic_id), None)

    def is_live(self, owner: Owner) -> bool:
        """A query is live while submitted or running, a session while open; ingest and the
        system always are."""
        if isinstance(owner, QueryRef):
            query = self._by_id["queries"].get(owner.query_id)
            return isinstance(query, Query) and not query.ended
        if isinstance(owner, SessionRef):
            return owner.session_id in self._by_id["sessions"]
        if isinstance(owner, PrincipalRef):
            return not owner.principal.partition(":")[1] or owner.principal in self._users
        assert isinstance(owner, IngestRef | SystemRef)
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Catalog):
            return NotImplemented
        return self._collections == other._collections

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={len(c)}" for name, c in self._collections.items())
        return f"<Catalog version={self.version} {sizes}>"
