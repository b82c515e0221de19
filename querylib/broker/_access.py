"""Who may write a topic, as the broker's core decides it (DESIGN §5 "Admission"): principals,
writers rules, and the rule of a catalog topic.

A principal is a string naming who a broker session writes as:

    admin               the holder of the cluster secret
    user:<name>         a user             executor:<name>  an executor agent
    query:<id>          a query's process  session:<id>     a client session (until users come)
    system              tq's own writers in the broker's process (catalog, __logs, offsets)
    anonymous           an unauthenticated Kafka client or connector

A topic's writers rule is "*" (an ingest topic: any principal), "system" (`__` topics), or one
principal, the topic's owner. A writer is admitted iff the rule admits its principal; "admin"
is no owner of anyone's topic. `__` topics are "system" by their name, wherever they live and
whatever a directory says. Pure: no I/O, no clocks.
"""

from __future__ import annotations

import re

from catalog import IngestRef, QueryRef, SessionRef, SystemRef, Topic, TopicName
from catalog.errors import InvalidTopicNameError

from ._errors import PrincipalError
from ._events import TopicAccess

__all__ = ["ADMIN", "ANONYMOUS", "ANYONE", "SYSTEM", "admits", "catalog_access",
           "check_principal", "internal", "writers_of"]

ADMIN = "admin"
SYSTEM = "system"
ANONYMOUS = "anonymous"
ANYONE = "*"

_NAMED = re.compile(r"(user|executor|query|session):[A-Za-z0-9_.@+=-]{1,128}")
_MAX_PRINCIPAL = 160


def check_principal(principal: str) -> str:
    """`principal` if it is well formed, else PrincipalError."""
    if principal in (ADMIN, SYSTEM, ANONYMOUS) or (
            len(principal) <= _MAX_PRINCIPAL and _NAMED.fullmatch(principal)):
        return principal
    raise PrincipalError(f"{principal[:80]!r} is not a principal (admin, system, anonymous, "
                         "or user:/executor:/query:/session: and a name)")


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
    """The writers rule of a topic with this catalog owner: the owning query or session, "*"
    for an ingest topic, "system" for the system's own."""
    if isinstance(owner, QueryRef):
        return f"query:{owner.query_id}"
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
    return TopicAccess(topic.short_name, writers_of(topic.owner), topic.partitions, here)
