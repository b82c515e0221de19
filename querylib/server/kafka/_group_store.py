"""What `__consumer_offsets` says: committed offsets and group states, rebuilt by replaying the
topic's records (Kafka's key/value formats) and kept current as commits are appended.

`BrokerBackend` holds one. Pure bookkeeping over decoded records; reading the log is the
caller's (`replay` takes the log, reads it, and only reads).
"""

from __future__ import annotations

import logging

from catalog.errors import StorageError
from querylib.errors import CorruptDataError
from querylib.log import PartitionLog, data_records

from ._backend import CommittedOffset, GroupRecord
from ._offsets_format import (
    GroupOwner,
    GroupTombstone,
    OffsetTombstone,
    OwnerTombstone,
    decode_offsets_record,
)

__all__ = ["GroupStore"]

logger = logging.getLogger("querylib.kafka")

def _damaged(exc: CorruptDataError) -> None:
    # Commits are superseded by later ones: a group whose last commits were in the damaged
    # range resumes from an earlier one (reads again, at least once) rather than never start.
    logger.error("__consumer_offsets: skipping damaged records: %s", exc)


class GroupStore:
    """Committed offsets per group and the last state of each group."""

    def __init__(self) -> None:
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self.groups: dict[str, GroupRecord] = {}
        self.owners: dict[str, str] = {}  # group -> the principal it belongs to

    def replay(self, log: PartitionLog, end: int | None = None,
               latest: dict[bytes, bytes] | None = None) -> None:
        """Apply every record of `log` below `end` (default: its end). Blocking reads. With
        `latest`, also keep there the last value of each key the log holds (what compaction
        would leave; a null value deletes)."""
        for record in data_records(log, end=end, on_damage=_damaged):
            self.apply(record.key, record.value)
            if latest is not None and record.key is not None:
                if record.value is None:
                    latest.pop(record.key, None)
                else:
                    latest[record.key] = record.value
        logger.info("replayed __consumer_offsets: %d group(s) with offsets, %d group state(s)",
                    len(self.offsets), len(self.groups))

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        try:
            decoded = decode_offsets_record(key, value)
        except StorageError as exc:
            logger.warning("__consumer_offsets: skipping a record: %s", exc)
            return
        if isinstance(decoded, OffsetTombstone):
            self.offsets.get(decoded.group_id, {}).pop((decoded.topic, decoded.partition), None)
        elif isinstance(decoded, GroupTombstone):
            self.groups.pop(decoded.group_id, None)
        elif isinstance(decoded, GroupRecord):
            self.groups[decoded.group_id] = decoded
        elif isinstance(decoded, GroupOwner):
            self.owners.setdefault(decoded.group_id, decoded.principal)
        elif isinstance(decoded, OwnerTombstone):
            self.owners.pop(decoded.group_id, None)
        else:
            group_id, committed = decoded
            self.committed(group_id, [committed])

    def committed(self, group_id: str, offsets: list[CommittedOffset]) -> None:
        stored = self.offsets.setdefault(group_id, {})
        for committed in offsets:
            stored[(committed.topic, committed.partition)] = committed
