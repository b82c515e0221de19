"""Who may write a topic, as the broker's core decides it (DESIGN §5 "Admission"): principals,
writers rules, and the rule of a catalog topic.

A principal is a string naming who a broker session writes as (`catalog/_principals.py`,
DESIGN §12): `admin`, `user:NAME`, `executor:NAME`, `query:ID`, `system` (tq's own writers in
the broker's process: catalog, __logs, offsets) or `anonymous` (an unauthenticated Kafka client
or connector). An RPC client's is the one it authenticated as; in-process callers state theirs
through `BrokerPort`. The writers rule of a topic owned by a session of an older catalog is
`session:ID`, which no client can be any more.

A topic's writers rule is "*" (an ingest topic: any principal), "system" (`__` topics), or one
principal, the topic's owner. A writer is admitted iff the rule admits its principal; "admin"
is no owner of anyone's topic. `__` topics are "system" by their name, wherever they live and
whatever a directory says. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from catalog import (
    IngestRef,
    PrincipalRef,
    QueryRef,
    SessionRef,
    SystemRef,
    Topic,
    TopicName,
    principal_kind,
)
from catalog.errors import InvalidCommandError, InvalidTopicNameError
from querylib.broker._errors import PrincipalError

from ._events import TopicAccess

__all__ = ["ADMIN", "ANONYMOUS", "ANYONE", "SYSTEM", "admits", "catalog_access",
           "check_principal", "internal", "writers_of"]

ADMIN = "admin"
SYSTEM = "system"
ANONYMOUS = "anonymous"
ANYONE = "*"

def check_principal(principal: str) -> str:
    """`principal` if it is well formed, else PrincipalError."""
    try:
        principal_kind(principal)
    except InvalidCommandError as exc:
        raise PrincipalError(str(exc)) from None
    return principal


def admits(writers: str, principal: str) -> bool:
    """Whether a topic whose writers rule is `writers` may be written by `principal`."""
    return writers == ANYONE or writers == principal


def internal(topic: str) -> bool:
    """Whether a broker topic name (its short form) names a `__` system topic."""
    try:
        return TopicName.parse(topic).internal
    except InvalidTopicNameError:
        return False


def writers_of(owner: object) -> str:
    """The writers rule of a topic with this catalog owner: the owning query or principal (a
    session of an older catalog), "*" for an ingest topic, "system" for the system's own."""
    if isinstance(owner, QueryRef):
        return f"query:{owner.query_id}"
    if isinstance(owner, PrincipalRef):
        return owner.principal
    if isinstance(owner, SessionRef):
        return f"session:{owner.session_id}"
    if isinstance(owner, IngestRef):
        return ANYONE
    if isinstance(owner, SystemRef):
        return SYSTEM
    raise TypeError(f"not a topic owner: {owner!r}")


def catalog_access(topic: Topic, broker_id: int) -> TopicAccess:
    """A catalog topic's access as broker `broker_id` sees it: its writers, its partition
    count, and the partitions the catalog places on that broker."""
    here = tuple(i for i, b in enumerate(topic.locations) if b == broker_id)
    return TopicAccess(topic.short_name, writers_of(topic.owner), topic.partitions, here,
                       topic.configs)
