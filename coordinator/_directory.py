"""The directory of the coordinator's own broker (DESIGN §5 "Admission"): what its core asks
about a topic that is not a `__` system topic.

That broker holds only tq's own topics (`__catalog.*`, `__catalog_checkpoints`,
`__consumer_offsets`), which its core admits tq itself to by their names. Data topics live on
executor brokers: for one the catalog knows, the answer is its writers rule with no partition
here (writers, Kafka clients included, are sent to the broker that hosts it); for one it does
not know, UnknownTopicError. Read from the coordinator's in-memory catalog; nothing is ever
created here.

Must not: change the catalog, or admit anything itself (the broker's core does).
"""

from __future__ import annotations

from collections.abc import Callable

from catalog import Catalog, UnknownTopicError
from querylib.broker import TopicAccess, catalog_access

__all__ = ["SystemTopicsOnly"]


class SystemTopicsOnly:
    """`querylib.broker.TopicDirectory` of the coordinator's broker."""

    def __init__(self, catalog: Callable[[], Catalog | None],
                 broker_id: Callable[[], int | None]) -> None:
        self._catalog = catalog
        self._broker_id = broker_id

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        catalog = self._catalog()
        found = catalog.find_topic(topic) if catalog is not None else None
        if found is None:
            raise UnknownTopicError(f"no topic {topic!r}: the coordinator's broker holds only "
                                    "tq's system topics, and creates none")
        broker_id = self._broker_id()
        return catalog_access(found, -1 if broker_id is None else broker_id)

    def watch(self, learn: Callable[[TopicAccess], None],
              forget: Callable[[str], None]) -> None:
        pass  # a data topic is never here, whatever its rule becomes
