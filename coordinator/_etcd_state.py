"""The Kafka listener's state topics kept in etcd, so a coordinator that takes over has every
consumer group's committed offsets and state and every transaction's (DESIGN §3 "Coordinator
failover", §8 "Consumer groups", "Transactions").

The coordinator's Kafka listener is the cluster's group and transaction coordinator; what it
writes to its broker's `__consumer_offsets` and `__transaction_state` (Kafka's record
formats, compacted topics: the last value of each key is the state) it also writes here before
answering, key by key as compaction keeps them (a null value deletes). Keys, under
`/tq/<cluster>/`:

    kafka/<topic>/<record key>   the last value of one key of `topic`
    kafka/<topic>.kept           present once etcd holds `topic`'s state (seeded)

Writes are guarded like the catalog's (`EtcdCatalog.guarded`): a coordinator that is no
longer active writes nothing and its Kafka client is told to find the coordinator again
(CoordinatorNotAvailableError). A new active coordinator reads every key in one Txn (`read`:
one round trip however large, as the catalog's read) and makes its broker's topics say the
same (`querylib.server.kafka.BrokerBackend`); the first coordinator run with `--etcd` finds no
`.kept` mark and copies its own log's state here (`seed`).

Must not: decide anything about groups or transactions (the listener does), or be written by
a coordinator that is not active.
"""

from __future__ import annotations

from collections.abc import Sequence

from querylib.kafka import CoordinatorNotAvailableError, PolicyViolationError

from ._failover import CHUNK_BYTES, EtcdCatalog, NotActiveError, etcd_library

__all__ = ["EtcdStateTopic"]

# etcd refuses a Txn of more than 128 operations (--max-txn-ops) by default.
_OPS_PER_TXN = 100


class EtcdStateTopic:
    """`querylib.server.kafka.StateReplica` of one state topic, over the coordinator's etcd."""

    def __init__(self, etcd: EtcdCatalog, topic: str) -> None:
        self._etcd = etcd
        self.topic = topic
        self._prefix = etcd.prefix + b"kafka/" + topic.encode() + b"/"
        self._kept = etcd.prefix + b"kafka/" + topic.encode() + b".kept"

    def _key(self, key: bytes) -> bytes:
        return self._prefix + key

    async def read(self) -> dict[bytes, bytes] | None:
        """Every record kept, key -> value; None when no coordinator has kept any here."""
        client = self._etcd.client
        t = client.transactions
        _, (mark, records) = await client.transaction(compare=[], failure=[], success=[
            t.get(self._kept),
            t.get(self._prefix, etcd_library().utils.prefix_range_end(self._prefix))])
        if not mark:
            return None
        return {kv.key[len(self._prefix):]: value for value, kv in records}

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
                    f"a {self.topic} record of {cost} bytes is larger than the {CHUNK_BYTES} "
                    "bytes a coordinator keeps in etcd (fewer members or smaller assignments)")
            if ops and (len(ops) >= _OPS_PER_TXN or size + cost > CHUNK_BYTES):
                await self._guarded(ops)
                ops, size = [], 0
            ops.append(t.delete(self._key(key)) if value is None else
                       t.put(self._key(key), value))
            size += cost
        if ops:
            await self._guarded(ops)

    async def seed(self, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Keep a broker's whole state of the topic here for the first time, then mark it."""
        await self.write(records)
        await self._guarded([self._etcd.client.transactions.put(self._kept, b"1")])

    async def _guarded(self, ops: list[object]) -> None:
        try:
            await self._etcd.guarded(*ops)
        except NotActiveError as exc:
            raise CoordinatorNotAvailableError(
                f"this coordinator is no longer the active one: {exc}") from exc
        except etcd_library().exceptions.ClientError as exc:
            raise CoordinatorNotAvailableError(
                f"etcd did not keep the {self.topic} state: {exc}") from exc
