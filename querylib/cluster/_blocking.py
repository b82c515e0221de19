"""The blocking `Cluster`: an `AsyncCluster` on an event loop thread of its own, for scripts,
the CLI and threads (as `querylib.rpc.BlockingClient` wraps `RpcClient`).

    with Cluster.connect() as cluster:
        cluster.create_topic("numbers", partitions=4)
        with cluster.follow("topics") as follower:
            for event in follower: ...

Thread-safe: calls from any thread are handed to the loop thread (`querylib.rpc._bridge`),
which alone touches the socket; heartbeats run there too, so a busy caller never lets the
lease run out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from catalog import Broker, Executor, Query, Resources, TopicKind
from querylib.rpc import ClientClosedError, Credential, Notify, Reply, Request
from querylib.rpc._bridge import LoopThread

from . import messages as m
from ._connection import discover
from ._session import AsyncCluster

__all__ = ["Cluster"]

R = TypeVar("R", bound=Reply)


class Cluster:
    """A blocking connection to the coordinator (with a session unless `session=False`)."""

    def __init__(self, address: str, secret: bytes | Credential, **options: Any) -> None:
        self._bridge = LoopThread(f"tq-cluster {address}", owner="a Cluster")
        self._call = self._bridge.call
        try:
            self._async = self._call(self._start(address, secret, options))
        except BaseException:
            self._bridge.close()
            raise

    @staticmethod
    async def _start(address: str, secret: bytes | Credential,
                     options: dict[str, Any]) -> AsyncCluster:
        return await AsyncCluster(address, secret, **options).start()

    @classmethod
    def connect(cls, coordinator: str | None = None, *, secret_file: str | None = None,
                coordinator_key: str | None = None, **options: Any) -> Cluster:
        """Find the coordinator (argument, TQ_COORDINATOR, cluster.json) and connect."""
        found = discover(coordinator, secret_file=secret_file, coordinator_key=coordinator_key)
        return cls(found.address, found.secret, source=found.source,
                   coordinator_key=found.coordinator_key, **options)

    # -- what AsyncCluster knows ---------------------------------------------------------------

    @property
    def address(self) -> str:
        return self._async.address

    @property
    def secret(self) -> Credential:
        """Our credential (what clients of this cluster's brokers sign with)."""
        return self._async.secret

    @property
    def principal(self) -> str:
        return self._async.principal

    @property
    def session_id(self) -> int | None:
        return self._async.session_id

    @property
    def catalog_broker(self) -> str:
        return self._async.catalog_broker

    @property
    def version(self) -> int:
        return self._async.version

    @property
    def lease(self) -> float:
        return self._async.lease

    @property
    def resumed(self) -> bool:
        return self._async.resumed

    @property
    def lost(self) -> bool:
        return self._async.lost

    # -- requests ------------------------------------------------------------------------------

    def request(self, request: Request[R], *, timeout: float | None = None) -> R:
        return self._call(self._async.request(request, timeout=timeout))

    def info(self) -> m.CatalogInfo:
        return self._call(self._async.info())

    def loads(self) -> dict[int, m.HostLoad]:
        """Each executor's load as its last heartbeat reported it, by executor id."""
        return self._call(self._async.loads())

    def groups(self) -> list[m.GroupInfo]:
        """The consumer groups this principal may describe, with their committed offsets."""
        return self._call(self._async.groups())

    def lookup_topic(self, name: str, *, wait: float = 0.0) -> m.TopicInfo:
        return self._call(self._async.lookup_topic(name, wait=wait))

    def create_topic(self, name: str, partitions: int = 1, *, record_type: str = "bytes",
                     kind: TopicKind | str = TopicKind.STREAM, ingest: bool = False,
                     locations: tuple[int, ...] | None = None,
                     replication_factor: int | None = None) -> m.TopicInfo:
        return self._call(self._async.create_topic(name, partitions, record_type=record_type,
                                                   kind=kind, ingest=ingest,
                                                   locations=locations,
                                                   replication_factor=replication_factor))

    def delete_topic(self, name: str, *, force: bool = False) -> None:
        self._call(self._async.delete_topic(name, force=force))

    def alter_topic(self, name: str, *, partitions: int | None = None,
                    locations: tuple[int, ...] | None = None,
                    configs: dict[str, str | None] | None = None) -> m.TopicInfo:
        return self._call(self._async.alter_topic(name, partitions=partitions,
                                                  locations=locations, configs=configs))

    def publish(self, name: str) -> m.TopicInfo:
        return self._call(self._async.publish(name))

    def unpublish(self, name: str) -> None:
        self._call(self._async.unpublish(name))

    def subscribe(self, name: str, *, record_type: str | None = None,
                  kind: TopicKind | str | None = None, wait: float = 0.0) -> m.TopicInfo:
        return self._call(self._async.subscribe(name, record_type=record_type, kind=kind,
                                                wait=wait))

    def unsubscribe(self, name: str) -> None:
        self._call(self._async.unsubscribe(name))

    def register_broker(self, host: str, address: str, *, broker_id: int | None = None,
                        kafka_address: str = "", curve_key: str = "",
                        slot: int = 0) -> Broker:
        return self._call(self._async.register_broker(host, address, broker_id=broker_id,
                                                      kafka_address=kafka_address,
                                                      curve_key=curve_key, slot=slot))

    def register_executor(self, host: str, broker_id: int, resources: Resources,
                          shards: tuple[int, ...] = ()) -> Executor:
        return self._call(self._async.register_executor(host, broker_id, resources, shards))

    def submit_query(self, name: str, program: str, **options: Any) -> Query:
        return self._call(self._async.submit_query(name, program, **options))

    def await_start(self, query_id: int, *, timeout: float | None = None) -> Query:
        return self._call(self._async.await_start(query_id, timeout=timeout))

    def report_exit(self, query_id: int, process: int, exit_code: int, *,
                    reason: str = "") -> Query:
        return self._call(self._async.report_exit(query_id, process, exit_code, reason=reason))

    def kill_query(self, query_id: int, reason: str = "killed") -> Query:
        return self._call(self._async.kill_query(query_id, reason))

    def add_user(self, principal: str, role: str = "user") -> Credential:
        return self._call(self._async.add_user(principal, role))

    def rotate_user(self, principal: str) -> Credential:
        return self._call(self._async.rotate_user(principal))

    def remove_user(self, principal: str) -> None:
        self._call(self._async.remove_user(principal))

    def create_token(self, ttl_ms: int = 3_600_000, name: str = "") -> tuple[Any, str]:
        return self._call(self._async.create_token(ttl_ms, name))

    def decommission_broker(self, broker_id: int, *, force: bool = False) -> Any:
        return self._call(self._async.decommission_broker(broker_id, force=force))

    def revoke_token(self, token_id: int) -> None:
        self._call(self._async.revoke_token(token_id))

    def upload_artifact(self, digest: str, pack: bytes) -> str:
        return self._call(self._async.upload_artifact(digest, pack))

    def on_notify(self, message_type: type[Notify], callback: Callable[[Any], object]) -> None:
        """Run `callback(notification)` on the loop thread for each notify of that type (an
        executor's `KillProcesses`). It must be quick and must not call this Cluster."""
        self._async.on_notify(message_type, callback)

    def follow(self, collection: str, *, credit: int = 4 * 1024 * 1024) -> Any:
        """A CollectionFollower (`with` / `for`): a snapshot at the current version or later,
        then every later diff."""
        from ._follow import CollectionFollower

        return CollectionFollower(self, collection, credit=credit)

    def watch_leader(self, topic: str, partition: int, moved: Callable[[], None], *,
                     since: tuple[int, int, int] | None = None) -> Callable[[], None]:
        """Call `moved()` (on this cluster's loop thread: quick, please) whenever the catalog
        names another leader of partition `partition` of `topic` than its client knows
        (`since` at first: see AsyncCluster.watch_leader); returns the function that ends
        the watch. Both may be called from any thread but this cluster's loop thread."""
        return self._later(self._call(self._watch_leader(topic, partition, moved, since)))

    async def _watch_leader(self, topic: str, partition: int, moved: Callable[[], None],
                            since: tuple[int, int, int] | None) -> Callable[[], None]:
        return self._async.watch_leader(topic, partition, moved, since=since)

    def hold_leaders(self) -> Callable[[], None]:
        """Keep following the catalog's leaders while no partition is watched (see
        AsyncCluster.hold_leaders); returns the function that lets go (from any thread but
        this cluster's loop thread)."""
        return self._later(self._call(self._hold_leaders()))

    async def _hold_leaders(self) -> Callable[[], None]:
        return self._async.hold_leaders()

    def _later(self, end: Callable[[], None]) -> Callable[[], None]:
        """`end` (a function of this cluster's loop) as one any other thread may call: run
        there soon; nothing once the cluster is closed (which ended everything)."""
        def call() -> None:
            with contextlib.suppress(ClientClosedError):
                self._bridge.soon(end)

        return call

    def snapshot(self, *collections: str, timeout: float = 30.0) -> dict[str, Any]:
        """A Snapshot of each collection, read concurrently (see `read_collections`)."""
        from ._follow import read_collections

        return self._call(read_collections(self._async, collections, timeout=timeout))

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the session and the connection, stop the loop thread. Idempotent."""
        if self._bridge.closed:
            return
        try:
            self._call(self._async.close())
        except ClientClosedError:  # another thread closes it at the same moment
            return
        finally:
            self._bridge.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
