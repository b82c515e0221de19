"""Who may do what to which record: the authorization rules of the catalog (DESIGN §12).

The coordinator fills every command that needs it with the authenticated principal behind the
request (`requester`, `principal`), and the rules in `_rules` call these predicates, so every
decision is pure and is tested against the catalog alone.

    admin           anything, `force` included; manages users
    user:NAME       with role admin in `users`: as admin; with role user: its own queries (and
                    the queries they submitted), topics it owns or created, ingest topics
    executor:NAME   registers executors and brokers; reports the exits of processes placed on
                    its own executor (checked by session, not by name)
    query:ID        acts as its query: that query's topics, the queries it submitted, itself

Must not: mutate the catalog, read clocks, do I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog._principals import (
    ADMIN,
    PrincipalKind,
    Role,
    principal_kind,
    query_of_principal,
    token_of_principal,
)
from catalog._records import (
    INGEST,
    SYSTEM,
    Owner,
    Party,
    PrincipalRef,
    Query,
    QueryRef,
    SessionRef,
    Topic,
)
from catalog.errors import InvalidCommandError

if TYPE_CHECKING:
    from catalog._catalog import Catalog

__all__ = [
    "placed_on_session",
    "is_admin",
    "is_executor",
    "known_principal",
    "leads_back",
    "manages_query",
    "may_delete_topic",
    "may_read_program",
    "may_run_program",
    "may_take_over",
    "owner_active",
    "owner_principal",
    "party_principal",
    "publishes_as_owner",
    "quota_principal",
    "root_principal",
    "successor_owner",
]

_MAX_CHAIN = 64  # queries submitting queries: far deeper than anything real


def known_principal(catalog: Catalog, principal: str) -> bool:
    """Whether `principal` may hold a credential now: admin always; a named one while it is in
    `users`; a query's while the query exists and has not ended; a join token's until it is
    revoked (a used or expired token's holder is admitted to be told so, and may do nothing)."""
    try:
        kind = principal_kind(principal)
    except InvalidCommandError:
        return False
    if kind is PrincipalKind.ADMIN:
        return True
    if kind in (PrincipalKind.USER, PrincipalKind.EXECUTOR):
        return catalog.user(principal) is not None
    if kind is PrincipalKind.QUERY:
        query = catalog.find_query(query_of_principal(principal) or 0)
        return query is not None and not query.ended
    if kind is PrincipalKind.JOIN:  # until revoked: a used or expired one is told so
        return catalog.find_token(token_of_principal(principal) or 0) is not None
    return False


def _role(catalog: Catalog, principal: str) -> Role | None:
    if principal == ADMIN:
        return Role.ADMIN
    user = catalog.user(principal)
    return None if user is None else Role(user.role)


def is_admin(catalog: Catalog, principal: str) -> bool:
    return _role(catalog, principal) is Role.ADMIN


def is_executor(catalog: Catalog, principal: str) -> bool:
    """May act as a host agent: an executor principal, or an admin (tq up's own executor)."""
    return _role(catalog, principal) in (Role.EXECUTOR, Role.ADMIN)


def placed_on_session(catalog: Catalog, query: Query, process: int, session_id: int) -> bool:
    """Whether `session_id` is the session of the executor process `process` was placed on:
    only it reports what became of the process."""
    if not 0 <= process < query.processes or not query.placed:
        return False
    executor = catalog.find_executor(query.executors[process])
    return executor is not None and executor.session_id == session_id


def _owners_of(catalog: Catalog, query: Query) -> list[str]:
    """The principals a query acts for: its own, its submitter's, and up the chain of queries
    that submitted queries."""
    found = [f"query:{query.query_id}"]
    owner = query.owner
    for _ in range(_MAX_CHAIN):
        found.append(owner)
        parent_id = query_of_principal(owner)
        parent = None if parent_id is None else catalog.find_query(parent_id)
        if parent is None:
            break
        owner = parent.owner
    return found


def manages_query(catalog: Catalog, principal: str, query: Query) -> bool:
    """May kill it: an admin, the query itself, or a principal on its chain of submitters."""
    return is_admin(catalog, principal) or principal in _owners_of(catalog, query)


def may_run_program(catalog: Catalog, principal: str, program: str, *,
                    uploaded: bool) -> bool:
    """May submit a query of `program`. A file or URL (`file://`, `http(s)://`) is read on
    the executor's host, as its OS user: the admin's to name. Anyone else runs a pack
    (`sha256:<hex>`) it `uploaded`, or one it may read already (`may_read_program`): not one
    named by a digest the catalog shows, which would run another's code as its query and
    make it readable."""
    if is_admin(catalog, principal):
        return True
    return program.startswith("sha256:") and (
        uploaded or may_read_program(catalog, principal, program))


def may_read_program(catalog: Catalog, principal: str, program: str) -> bool:
    """May fetch the program pack `program` (`sha256:<hex>`; its code and, for a submitted
    function, the pickled arguments): a host agent, which runs queries (admins too), or who
    manages a query of that program. Naming it (the catalog shows every query's) is not
    enough. O(queries); packs are fetched once per query and host."""
    if is_executor(catalog, principal):
        return True
    return any(query.program == program and manages_query(catalog, principal, query)
               for query in catalog.queries if isinstance(query, Query))


def party_principal(catalog: Catalog, party: Party) -> str | None:
    """The principal a publishing or subscribing party acts as (None if unknown)."""
    if isinstance(party, QueryRef):
        return f"query:{party.query_id}"
    if isinstance(party, SessionRef):
        session = catalog.find_session(party.session_id)
        return None if session is None else session.principal
    return None


def owner_principal(owner: Owner) -> str | None:
    """The principal that owns a topic, if one principal does (not ingest or the system)."""
    if isinstance(owner, PrincipalRef):
        return owner.principal
    if isinstance(owner, QueryRef):
        return f"query:{owner.query_id}"
    return None


def publishes_as_owner(catalog: Catalog, party: Party, topic: Topic) -> bool:
    """Whether `party` may publish to `topic`: its owner (a session of the owning principal
    counts), or anyone for an ingest topic."""
    if topic.owner == INGEST or party == topic.owner:
        return True
    if isinstance(topic.owner, PrincipalRef):
        return party_principal(catalog, party) == topic.owner.principal
    return False


def root_principal(catalog: Catalog, principal: str) -> str:
    """Who `principal` acts for in the end: a query's principal leads, up its chain of
    submitters, to the user (or admin, or executor) that submitted the first of them."""
    for _ in range(_MAX_CHAIN):
        query_id = query_of_principal(principal)
        query = None if query_id is None else catalog.find_query(query_id)
        if query is None:
            return principal
        principal = query.owner
    return principal


def quota_principal(catalog: Catalog, owner: Owner, creator: str) -> str | None:
    """The principal a topic's partitions count against (the partition quota): who its owner
    acts for in the end (a query's submitter, up the chain), an ingest topic's creator; None
    for the system's, an admin's, and a closed session's of an older catalog."""
    if owner == SYSTEM:
        return None
    if owner == INGEST:
        principal = creator or None
    elif isinstance(owner, SessionRef):
        session = catalog.find_session(owner.session_id)
        principal = None if session is None else session.principal
    else:
        principal = owner_principal(owner)
    if principal is None:
        return None
    root = root_principal(catalog, principal)
    return None if is_admin(catalog, root) else root


def leads_back(catalog: Catalog) -> set[int]:
    """The queries through which something still leads back to who may delete, kill or take
    it over (`_owners_of`, `root_principal`): a topic's owning query, and the
    submitters up the chain of that one and of every live query."""
    named: set[int] = set()
    starts = [t.owner.query_id for t in catalog.topics
              if isinstance(t, Topic) and isinstance(t.owner, QueryRef)]
    named.update(starts)
    starts += [q.query_id for q in catalog.queries if isinstance(q, Query) and not q.ended]
    for query_id in starts:  # a chain met before (or a start, walked in its turn) is done
        query = catalog.find_query(query_id)
        while query is not None:
            parent = query_of_principal(query.owner)
            if parent is None or parent in named:
                break
            named.add(parent)
            query = catalog.find_query(parent)
    return named


def owner_active(catalog: Catalog, topic: Topic) -> bool:
    """Whether the topic's owner may still write it: a query until it ends, a session while it
    is open, a principal while one of its sessions publishes the topic; ingest and the system
    always."""
    if isinstance(topic.owner, PrincipalRef):
        return catalog.is_live(topic.owner) and bool(catalog.publications_on(topic.topic_id))
    return catalog.is_live(topic.owner)


def successor_owner(catalog: Catalog, party: Party) -> Owner | None:
    """The owner a topic gets when `party` takes it over, as if `party` had created it: a
    query itself, a client session its principal (a script run again still owns it)."""
    if isinstance(party, QueryRef):
        return party
    principal = party_principal(catalog, party)
    return None if principal is None else PrincipalRef(principal)


def may_take_over(catalog: Catalog, party: Party, topic: Topic) -> bool:
    """Whether `party` may become the owner of `topic` by publishing it (re-running a query or
    script, DESIGN §3 "Ownership"): its owner is a query or principal that is no longer
    active, and both act for the same principal at the root of their chains of submitters.
    Ingest and system topics never change owner, nor those of an older catalog's closed
    session (whose principal is gone with it); an admin is no successor of another principal's
    topics (it deletes an ended owner's topic instead)."""
    owner = topic.owner
    if not isinstance(owner, QueryRef | PrincipalRef) or topic.internal:
        return False
    if owner_active(catalog, topic):
        return False
    mine = party_principal(catalog, party)
    theirs = owner_principal(owner)
    if mine is None or theirs is None:
        return False
    return root_principal(catalog, mine) == root_principal(catalog, theirs)


def may_alter_topic(catalog: Catalog, principal: str, topic: Topic) -> bool:
    """Grow a topic or set its configs (Kafka's ALTER and ALTER_CONFIGS): an admin, the owning
    principal, whoever manages the owning query; an ingest topic: an admin or its creator."""
    if is_admin(catalog, principal):
        return True
    owner = topic.owner
    if owner == INGEST:
        return bool(topic.creator) and principal == topic.creator
    return may_delete_topic(catalog, principal, topic, force=False)


def may_delete_topic(catalog: Catalog, principal: str, topic: Topic, *, force: bool) -> bool:
    """An ingest topic: with `force`, an admin or its creator. Others: an admin (with `force`
    while the owner is alive), the owning principal, whoever manages the owning query, and
    anyone for an orphan of an older catalog's closed session."""
    owner = topic.owner
    admin = is_admin(catalog, principal)
    if owner == INGEST:  # fed by anyone: live for good, so deleting one is always forced
        return force and (admin or (bool(topic.creator) and principal == topic.creator))
    if admin and (force or not catalog.is_live(owner)):
        return True
    if isinstance(owner, PrincipalRef):
        return principal == owner.principal
    if isinstance(owner, QueryRef):
        query = catalog.find_query(owner.query_id)
        return query is not None and principal in _owners_of(catalog, query)
    if isinstance(owner, SessionRef):
        session = catalog.find_session(owner.session_id)
        return session is None or session.principal == principal
    return False
