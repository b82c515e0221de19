"""The directory of the coordinator's own broker (DESIGN §5 "Admission"): what its core asks
about a topic that is not a `__` system topic, read from the coordinator's in-memory catalog.

That broker holds tq's own topics (`__catalog.*`, `__catalog_checkpoints`,
`__consumer_offsets`), which its core admits tq itself to by their names. Data topics live on
the brokers the catalog places them on: executor brokers, or this one while no executor has
registered one. For a topic the catalog knows, the answer is its writers rule and the
partitions placed here (none: writers, Kafka clients included, are sent to the broker that
hosts it); for one it does not know, UnknownTopicError: nothing is ever created here. Each
catalog change that touches a topic is passed on (`changed`), so a topic deleted and made
again under another owner gets its new rule.

Must not: change the catalog, or admit anything itself (the broker's core does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from catalog import Catalog, Topic, UnknownTopicError, Update
from querylib.server.broker import TopicAccess, catalog_access

__all__ = ["CatalogDirectory"]


class CatalogDirectory:
    """`querylib.broker.TopicDirectory` of the coordinator's broker."""

    def __init__(self, catalog: Callable[[], Catalog | None],
                 broker_id: Callable[[], int | None]) -> None:
        self._catalog = catalog
        self._broker_id = broker_id
        self._learn: Callable[[TopicAccess], None] | None = None
        self._forget: Callable[[str], None] | None = None

    def _access(self, name: str) -> TopicAccess | None:
        catalog = self._catalog()
        found = catalog.find_topic(name) if catalog is not None else None
        if found is None:
            return None
        broker_id = self._broker_id()
        return catalog_access(found, -1 if broker_id is None else broker_id)

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        access = self._access(topic)
        if access is None:
            raise UnknownTopicError(f"no topic {topic!r}: the coordinator's broker creates no "
                                    "topics")
        return access

    def watch(self, learn: Callable[[TopicAccess], None],
              forget: Callable[[str], None]) -> None:
        self._learn, self._forget = learn, forget

    def changed(self, updates: Iterable[Update]) -> None:
        """A catalog change was made: tell the broker the rules of the topics it touched, as
        the catalog has them now."""
        if self._learn is None or self._forget is None:
            return
        names = {u.record.short_name for u in updates if isinstance(u.record, Topic)}
        for name in sorted(names):
            access = self._access(name)
            if access is None:
                self._forget(name)
            else:
                self._learn(access)
