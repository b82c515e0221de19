"""The group coordinator's state in etcd, so a coordinator that takes over has every consumer
group's committed offsets and state (DESIGN §3 "Coordinator failover", §8 "Consumer groups").

The coordinator's Kafka listener is the cluster's group coordinator; what it writes to its
broker's `__consumer_offsets` (Kafka's record formats) it also writes here before answering,
key by key as a compacted topic keeps them (a null value deletes). Keys, under
`/tq/<cluster>/`:

    groups/<bucket:02x>/<record key>   the last value of one `__consumer_offsets` key; bucket
                                       is crc32(key) % BUCKETS, so no read of one range is
                                       larger than a gRPC message may be
    groups-kept                        present once etcd holds the groups (seeded)

Writes are guarded like the catalog's (`EtcdCatalog.guarded`): a coordinator that is no
longer active writes nothing and its Kafka client is told to find the coordinator again
(CoordinatorNotAvailableError). A new active coordinator reads every key (`read`) and makes its
broker's `__consumer_offsets` say the same (`querylib.server.kafka.BrokerBackend`); the first
coordinator run with `--etcd` finds no `groups-kept` and copies its own log's state here
(`seed`).

Must not: decide anything about groups (the listener's group service does), or be written by
a coordinator that is not active.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from querylib.kafka import CoordinatorNotAvailableError, PolicyViolationError

from ._failover import CHUNK_BYTES, EtcdCatalog, NotActiveError, etcd_library

__all__ = ["BUCKETS", "EtcdGroups"]

BUCKETS = 64
# etcd refuses a Txn of more than 128 operations (--max-txn-ops) by default.
_OPS_PER_TXN = 100


class EtcdGroups:
    """`querylib.server.kafka.GroupsReplica` over the coordinator's etcd."""

    def __init__(self, etcd: EtcdCatalog) -> None:
        self._etcd = etcd
        self._prefix = etcd.prefix + b"groups/"
        self._kept = etcd.prefix + b"groups-kept"

    def _key(self, key: bytes) -> bytes:
        return self._prefix + b"%02x/" % (zlib.crc32(key) % BUCKETS) + key

    async def read(self) -> dict[bytes, bytes] | None:
        """Every record kept, key -> value; None when no coordinator has kept groups here."""
        client = self._etcd.client
        if await client.get(self._kept) is None:
            return None
        kept: dict[bytes, bytes] = {}
        for bucket in range(BUCKETS):
            start = self._prefix + b"%02x/" % bucket
            for kv in await client.get_range(start,
                                             etcd_library().utils.prefix_range_end(start)):
                kept[kv.key[len(start):]] = kv.value
        return kept

    async def write(self, records: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Keep `records` (in order; a null value deletes its key); answered once etcd has them.
        CoordinatorNotAvailableError when this coordinator is no longer the active one or etcd
        does not answer; PolicyViolationError for a record larger than etcd keeps."""
        t = self._etcd.client.transactions
        ops: list[object] = []
        size = 0
        for key, value in records:
            cost = len(key) + len(value or b"") + 64
            if cost > CHUNK_BYTES:
                raise PolicyViolationError(
                    f"a group record of {cost} bytes is larger than the {CHUNK_BYTES} bytes "
                    "a coordinator keeps in etcd (fewer members or smaller assignments)")
            if ops and (len(ops) >= _OPS_PER_TXN or size + cost > CHUNK_BYTES):
                await self._guarded(ops)
                ops, size = [], 0
            ops.append(t.delete(self._key(key)) if value is None else
                       t.put(self._key(key), value))
            size += cost
        if ops:
            await self._guarded(ops)

    async def seed(self, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Keep a broker's whole group state here for the first time, then mark it kept."""
        await self.write(records)
        await self._guarded([self._etcd.client.transactions.put(self._kept, b"1")])

    async def _guarded(self, ops: list[object]) -> None:
        try:
            await self._etcd.guarded(*ops)
        except NotActiveError as exc:
            raise CoordinatorNotAvailableError(
                f"this coordinator is no longer the active one: {exc}") from exc
        except etcd_library().exceptions.ClientError as exc:
            raise CoordinatorNotAvailableError(f"etcd did not keep the group state: {exc}") \
                from exc
