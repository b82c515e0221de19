"""The client side of the control plane: what every tq process uses to talk to the coordinator.

    discover / Connection     where the coordinator is (--coordinator, TQ_COORDINATOR,
                              $TQ_HOME/cluster.json) and the cluster secret
    AsyncCluster / Cluster    a session with a lease kept alive by heartbeats, and the requests
                              (topics, publications, subscriptions, brokers, executors, queries)
    follow(collection)        a catalog collection as a snapshot, then diffs (CollectionView is
                              the pure part), read from the catalog topics on the broker
    find_query / wait_for_query_end   a query's record, now or once it ended
    wait_for_exits                    ... once every process of it reported its exit
    resolve_query                     a query by id or name (a name: its newest query)
    _messages                 the coordinator's RPC messages (also used by the coordinator)

Names are loaded on first use (PEP 562): a query process registering its worker group needs
only the session (`Cluster`), not the catalog follower, whose record codecs and broker client
cost about a third of its start; `from querylib.cluster import X` works as before.

Must not: import `coordinator` (the server imports us, not the other way round), or load a
submodule at import time that registration does not need.
"""

from __future__ import annotations

from querylib._lazy import lazy_exports as _lazy_exports

_EXPORTS = {
    "AsyncCluster": "_session",
    "AsyncCollectionFollower": "_follow",
    "BrokerInfo": "_messages",
    "CatalogEvent": "_follow",
    "CatalogInfo": "_messages",
    "Cluster": "_blocking",
    "ClusterFileError": "_errors",
    "ClusterRunningError": "_errors",
    "DataDirInUseError": "_errors",
    "ClusterInfo": "_connection",
    "CollectionFollower": "_follow",
    "CollectionView": "_follow",
    "Connection": "_connection",
    "Diff": "_follow",
    "DropPartitions": "_messages",
    "ExecutorInfo": "_messages",
    "HostLoad": "_messages",
    "KillProcesses": "_messages",
    "NoCoordinatorError": "_errors",
    "ProcessLoad": "_messages",
    "QueryFailedError": "_errors",
    "QueryInfo": "_messages",
    "QueryTimeoutError": "_errors",
    "SessionLostError": "_errors",
    "Snapshot": "_follow",
    "SpawnProcesses": "_messages",
    "TopicInfo": "_messages",
    "TopicRoute": "_topic_io",
    "TopicWriter": "_topic_io",
    "claim_cluster_file": "_connection",
    "cluster_file": "_connection",
    "default_peer": "_session",
    "discover": "_connection",
    "find_query": "_queries",
    "hold_data_dir": "_connection",
    "last_records_start": "_topic_io",
    "partition_infos": "_topic_io",
    "resolve_query": "_queries",
    "read_cluster_file": "_connection",
    "read_collections": "_follow",
    "read_topic": "_topic_io",
    "remove_cluster_file": "_connection",
    "route_topic": "_topic_io",
    "tq_home": "_connection",
    "wait_for_exits": "_queries",
    "wait_for_query_end": "_queries",
    "write_cluster_file": "_connection",
}

__all__ = [
    "AsyncCluster",
    "AsyncCollectionFollower",
    "BrokerInfo",
    "CatalogEvent",
    "CatalogInfo",
    "Cluster",
    "ClusterFileError",
    "ClusterRunningError",
    "ClusterInfo",
    "CollectionFollower",
    "CollectionView",
    "Connection",
    "DataDirInUseError",
    "Diff",
    "DropPartitions",
    "ExecutorInfo",
    "HostLoad",
    "KillProcesses",
    "NoCoordinatorError",
    "ProcessLoad",
    "QueryFailedError",
    "QueryInfo",
    "QueryTimeoutError",
    "SessionLostError",
    "Snapshot",
    "SpawnProcesses",
    "TopicInfo",
    "TopicRoute",
    "TopicWriter",
    "claim_cluster_file",
    "cluster_file",
    "default_peer",
    "discover",
    "find_query",
    "hold_data_dir",
    "last_records_start",
    "partition_infos",
    "resolve_query",
    "read_cluster_file",
    "read_collections",
    "read_topic",
    "remove_cluster_file",
    "route_topic",
    "tq_home",
    "wait_for_exits",
    "wait_for_query_end",
    "write_cluster_file",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
