"""Coordinator failover through etcd: who is active, and the catalog replicated to standbys.

Keys, under `/tq/<cluster>/`:

    active                     the active coordinator's address, attached to its etcd lease and
                               created only if absent; its create revision is the active's term
    catalog/<version:020d>     one catalog commit: [(version, [(collection, record, diff)...])...]
    checkpoint/<v:020d>/<i:06d> chunk i of the catalog at version v (each under CHUNK_BYTES)
    checkpointed               [v, chunks]: the last complete checkpoint
    kafka/...                  the Kafka listener's state topics (`_etcd_state.py`)

Never two active: every write is a Txn guarded by `create_revision(active) == term`, so a
coordinator that lost its lease (its key gone, or another's in its place) writes nothing more
and learns it from the refused Txn (`NotActiveError`). It also stops serving at once when its
lease may have expired: the keeper counts the TTL from before each grant or renewal was asked.

A commit is appended (`append`) after it is durable in the local catalog topics and before it is
answered, so every commit a client was told of is in etcd. `checkpoint` writes the whole catalog
in chunks, then in one Txn marks it complete and deletes the log keys and chunks it replaces:
etcd holds at most one checkpoint and the commits after it. A standby reads the checkpoint and
the commits after it in one consistent Txn (`read`) and then watches the prefix from the next
revision (`follow`); a watch that lost history to a compaction re-reads. Once elected, it reads
the commits its watch had not delivered yet (`commits_after`).

Owns its etcd client, its lease and the keeper task; decides nothing about the catalog.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, cast

import msgspec

from catalog import (
    CatalogDecodeError,
    CollectionName,
    CorruptCatalogError,
    TqError,
    Update,
    decode_record,
    encode_record,
)

if TYPE_CHECKING:
    import aetcd

__all__ = ["CHUNK_BYTES", "Commit", "EtcdCatalog", "NotActiveError", "ReadCatalog",
           "etcd_library", "parse_etcd_urls"]

logger = logging.getLogger("coordinator")

# etcd refuses requests over 1.5 MiB (--max-request-bytes): keep every value well under it.
CHUNK_BYTES = 1024 * 1024
# A standby reads the whole checkpoint and the commits after it in one consistent Txn, whose
# answer is the catalog's size: far above gRPC's default 4 MiB for a large catalog.
_CHANNEL_OPTIONS = {"grpc.max_receive_message_length": 1 << 30}


def etcd_library() -> ModuleType:
    """The etcd client library, imported when first used: it pulls in gRPC (about half a
    second), which a coordinator without `--etcd` never needs."""
    import aetcd
    import aetcd.exceptions
    import aetcd.utils

    return aetcd


Commit = tuple[int, list[Update]]  # (version, its updates)
_Wire = list[tuple[int, list[tuple[str, bytes, int]]]]
_decoder = msgspec.msgpack.Decoder(_Wire)


class NotActiveError(TqError):
    """This coordinator is not (or no longer) the active one."""

    exit_code = 75  # EX_TEMPFAIL


@dataclass(frozen=True, slots=True)
class ReadCatalog:
    """The catalog as etcd holds it: every update up to `version`, read at `revision`."""

    version: int
    updates: list[Update]
    revision: int


def parse_etcd_urls(urls: str) -> list[tuple[str, int]]:
    """'http://h1:2379,h2:2379' -> [(h1, 2379), (h2, 2379)]; ValueError when malformed."""
    out = []
    for url in filter(None, (u.strip() for u in urls.split(","))):
        host, sep, port = url.removeprefix("http://").rstrip("/").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"not an etcd address (HOST:PORT): {url!r}")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no etcd address given")
    return out


def _encode(commits: Sequence[Commit]) -> bytes:
    return msgspec.msgpack.encode([(version, [(c, encode_record(r), d) for c, r, d in updates])
                                   for version, updates in commits])


def _decode(value: bytes) -> list[Commit]:
    """A commit (or chunk) as `_encode` wrote it; CorruptCatalogError for anything else."""
    try:
        return [(version, [Update(cast("CollectionName", c), decode_record(c, r), d)
                           for c, r, d in updates])
                for version, updates in _decoder.decode(value)]
    except (msgspec.DecodeError, CatalogDecodeError) as exc:
        raise CorruptCatalogError(f"etcd: not a catalog commit: {exc}") from exc


class EtcdCatalog:
    """One coordinator's view of etcd: its campaign, its guarded writes, its replay."""

    def __init__(self, urls: str, cluster: str, *, lease: float) -> None:
        self.endpoints = parse_etcd_urls(urls)
        self.prefix = f"/tq/{cluster}/".encode()
        self.lease_ttl = max(1, math.ceil(lease))
        self.term = 0  # the create revision of our active key, once active
        self.lost = asyncio.Event()  # set when we were active and may no longer be
        self._client: aetcd.Client | None = None
        self._lease: int | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._expires = 0.0  # monotonic: our lease may have expired from then on
        self._closing = False

    # -- keys -----------------------------------------------------------------------------------

    @property
    def active_key(self) -> bytes:
        return self.prefix + b"active"

    def _log_key(self, version: int) -> bytes:
        return self.prefix + b"catalog/%020d" % version

    def _chunk_key(self, version: int, index: int) -> bytes:
        return self.prefix + b"checkpoint/%020d/%06d" % (version, index)

    # -- connection -----------------------------------------------------------------------------

    async def connect(self, timeout: float = 5.0) -> None:
        """Connect to the first etcd member that answers."""
        errors = []
        for host, port in self.endpoints:
            client = etcd_library().Client(host, port, timeout=max(1, int(timeout)),
                                           options=_CHANNEL_OPTIONS)
            try:
                await client.status()
            except etcd_library().exceptions.ClientError as exc:
                errors.append(f"{host}:{port}: {exc}")
                await client.close()
                continue
            self._client = client
            return
        raise ConnectionError("no etcd member answers: " + "; ".join(errors))

    @property
    def client(self) -> aetcd.Client:
        if self._client is None:
            raise RuntimeError("EtcdCatalog.connect() first")
        return self._client

    async def close(self, *, resign: bool = True) -> None:
        """Stop renewing; `resign` revokes the lease (the active key goes: a standby takes over
        at once instead of after the TTL)."""
        self._closing = True  # the keeper's end is ours, not a lost lease
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self._client is not None:
            if resign and self._lease is not None:
                with contextlib.suppress(etcd_library().exceptions.ClientError):
                    await self._client.revoke_lease(self._lease)
            await self._client.close()
            self._client = None

    # -- election -------------------------------------------------------------------------------

    async def active(self) -> str | None:
        """The active coordinator's address, if any."""
        got = await self.client.get(self.active_key)
        return None if got is None else got.value.decode()

    async def campaign(self, address: str) -> int:
        """Wait until this coordinator is the active one; returns its term."""
        client = self.client
        while True:
            asked = time.monotonic()
            lease = await client.lease(self.lease_ttl)
            succeeded, responses = await client.transaction(
                compare=[client.transactions.create(self.active_key) == 0],
                success=[client.transactions.put(self.active_key, address.encode(),
                                                 lease=lease.id)],
                failure=[client.transactions.get(self.active_key)])
            if succeeded:
                self._lease = lease.id
                self._expires = asyncio.get_running_loop().time() + (
                    self.lease_ttl - (time.monotonic() - asked))
                self.term = responses[0].response_put.header.revision
                self.lost.clear()
                self._keeper = asyncio.get_running_loop().create_task(
                    self._keep(), name="etcd lease")
                logger.info("coordinator: active at term %d", self.term)
                return self.term
            await client.revoke_lease(lease.id)
            held = responses[0]
            revision = held[0][1].mod_revision if held else 0
            await self._await_vacancy(revision)

    async def _await_vacancy(self, revision: int) -> None:
        """Until the active key is deleted after `revision` (or is already gone)."""
        watch = await self.client.watch(self.active_key, start_revision=revision + 1)
        try:
            if await self.client.get(self.active_key) is None:
                return
            async for event in watch:
                if event.kind == "DELETE":
                    return
        finally:
            await watch.cancel()

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._lease is not None
        try:
            while True:
                now = loop.time()
                if now >= self._expires:
                    break
                await asyncio.sleep(min(self.lease_ttl / 3, self._expires - now))
                asked = loop.time()
                try:
                    reply = await asyncio.wait_for(self.client.refresh_lease(self._lease),
                                                   timeout=max(0.0, self._expires - asked))
                except (etcd_library().exceptions.ClientError, TimeoutError) as exc:
                    logger.warning("coordinator: renewing the etcd lease: %s", exc)
                    continue
                if reply is None or reply.TTL <= 0:
                    break  # expired: the active key is gone
                self._expires = asked + reply.TTL
        finally:
            if not self.lost.is_set() and not self._closing:
                logger.error("coordinator: lost the etcd lease (term %d): not active", self.term)
            self.lost.set()

    async def announce(self, address: str) -> None:
        """Say where this active coordinator serves (its key keeps its term and lease)."""
        assert self._lease is not None
        await self.guarded(self.client.transactions.put(self.active_key, address.encode(),
                                                         lease=self._lease))

    # -- guarded writes -------------------------------------------------------------------------

    async def guarded(self, *ops: object) -> None:
        """Apply etcd Txn operations `ops` only while this coordinator is the active one;
        NotActiveError (and `lost` set) otherwise."""
        if self.term == 0 or self.lost.is_set():
            raise NotActiveError("not the active coordinator")
        client = self.client
        succeeded, _ = await client.transaction(
            compare=[client.transactions.create(self.active_key) == self.term],
            success=list(ops), failure=[])
        if not succeeded:
            self.lost.set()
            raise NotActiveError(f"not the active coordinator any more (term {self.term})")

    async def append(self, commits: Sequence[Commit]) -> None:
        """Append one commit (its changes, in version order) after the last; NotActiveError
        when another coordinator is active; ValueError when the commit is too large."""
        value = _encode(commits)
        if len(value) > CHUNK_BYTES:
            if len(commits) == 1:
                raise ValueError(f"a catalog change of {len(value)} bytes exceeds {CHUNK_BYTES}")
            half = len(commits) // 2  # a group commit: its changes in two keys, in order
            await self.append(commits[:half])
            await self.append(commits[half:])
            return
        await self.guarded(self.client.transactions.put(self._log_key(commits[-1][0]), value))

    async def checkpoint(self, version: int, snapshot: Sequence[Update]) -> None:
        """Write the catalog at `version` (every commit up to it appended) and drop the log
        keys and chunks it replaces."""
        chunks: list[list[Update]] = [[]]
        size = 0
        for collection, record, diff in snapshot:
            encoded = len(encode_record(record)) + 64
            if size + encoded > CHUNK_BYTES and chunks[-1]:
                chunks.append([])
                size = 0
            chunks[-1].append(Update(collection, record, diff))
            size += encoded
        t = self.client.transactions
        for index, chunk in enumerate(chunks):
            await self.guarded(t.put(self._chunk_key(version, index),
                                      _encode([(version, chunk)])))
        await self.guarded(
            t.put(self.prefix + b"checkpointed", msgspec.msgpack.encode([version, len(chunks)])),
            t.delete(self.prefix + b"catalog/", self._log_key(version + 1)),
            t.delete(self.prefix + b"checkpoint/", self._chunk_key(version, 0)))

    # -- standby --------------------------------------------------------------------------------

    async def read(self) -> ReadCatalog:
        """The last checkpoint and every commit after it, read in one consistent Txn."""
        client = self.client
        t = client.transactions
        checkpoint, logs = self.prefix + b"checkpoint/", self.prefix + b"catalog/"
        _, (marked, chunks, commits, active) = await client.transaction(
            compare=[], failure=[], success=[
            t.get(self.prefix + b"checkpointed"),
            t.get(checkpoint, etcd_library().utils.prefix_range_end(checkpoint)),
            t.get(logs, etcd_library().utils.prefix_range_end(logs)),
            t.get(self.active_key)])
        # The Txn's revision (every key read carries its header); nothing written yet: 0.
        revision = next((kv.header.revision for _, kv in (*marked, *chunks, *commits, *active)),
                        0)
        version, count = msgspec.msgpack.decode(marked[0][0]) if marked else (0, 0)
        updates: list[Update] = []
        wanted = {self._chunk_key(version, i) for i in range(count)}
        found = [value for value, kv in chunks if kv.key in wanted]
        if len(found) != count:
            raise RuntimeError(f"etcd checkpoint at {version}: {len(found)} of {count} chunks")
        for value in found:
            for _, chunk in _decode(value):
                updates.extend(chunk)
        for value, _ in commits:
            for v, changes in _decode(value):
                if v > version:
                    updates.extend(changes)
                    version = v
        return ReadCatalog(version, updates, revision)

    async def commits_after(self, version: int) -> list[Commit] | None:
        """Every commit after `version`, read in one Txn; None when a checkpoint past `version`
        has replaced some of them (`read` everything then)."""
        client = self.client
        t = client.transactions
        logs = self.prefix + b"catalog/"
        _, (marked, commits) = await client.transaction(compare=[], failure=[], success=[
            t.get(self.prefix + b"checkpointed"),
            t.get(self._log_key(version + 1), etcd_library().utils.prefix_range_end(logs))])
        if marked and msgspec.msgpack.decode(marked[0][0])[0] > version:
            return None
        # A key is named by the last version of its commit: one from `version + 1` on may
        # hold changes up to `version` too (never, with keys written as `append` writes them).
        return [c for value, _ in commits for c in _decode(value) if c[0] > version]

    async def follow(self, after: ReadCatalog,
                     apply: Callable[[list[Commit]], Awaitable[None] | None],
                     reread: Callable[[ReadCatalog], Awaitable[None] | None]) -> None:
        """Until cancelled: `apply` every commit appended after `after`, in order; when
        etcd compacted what the watch needed, `reread` with a fresh read."""
        version, revision = after.version, after.revision
        while True:
            watch = await self.client.watch_prefix(self.prefix + b"catalog/",
                                                   start_revision=revision + 1)
            try:
                async for event in watch:
                    revision = max(revision, event.kv.mod_revision)
                    if event.kind != "PUT":
                        continue
                    commits = [c for c in _decode(event.kv.value) if c[0] > version]
                    if commits:
                        version = commits[-1][0]
                        if (done := apply(commits)) is not None:
                            await done
                return
            except etcd_library().exceptions.RevisionCompactedError:
                fresh = await self.read()
                version, revision = fresh.version, fresh.revision
                if (done := reread(fresh)) is not None:
                    await done
            finally:
                await watch.cancel()
