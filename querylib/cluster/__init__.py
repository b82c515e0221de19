"""The client side of the control plane: what every tq process uses to talk to the coordinator.

    discover / Connection     where the coordinator is (--coordinator, TQ_COORDINATOR,
                              $TQ_HOME/cluster.json) and the cluster secret
    AsyncCluster / Cluster    a session with a lease kept alive by heartbeats, and the requests
                              (topics, publications, subscriptions, brokers, executors, queries)
    follow(collection)        a catalog collection as a snapshot, then diffs (CollectionView is
                              the pure part), read from the catalog topics on the broker
    find_query / wait_for_query_end   a query's record, now or once it ended
    _messages                 the coordinator's RPC messages (also used by the coordinator)

Must not: import `coordinator` (the server imports us, not the other way round).
"""

from querylib.cluster._blocking import Cluster
from querylib.cluster._connection import (
    ClusterInfo,
    Connection,
    cluster_file,
    discover,
    read_cluster_file,
    remove_cluster_file,
    tq_home,
    write_cluster_file,
)
from querylib.cluster._errors import (
    ClusterFileError,
    NoCoordinatorError,
    QueryFailedError,
    QueryTimeoutError,
    SessionLostError,
)
from querylib.cluster._follow import (
    AsyncCollectionFollower,
    CatalogEvent,
    CollectionFollower,
    CollectionView,
    Diff,
    Snapshot,
    read_collections,
)
from querylib.cluster._messages import (
    BrokerInfo,
    CatalogInfo,
    ExecutorInfo,
    HostLoad,
    KillProcesses,
    ProcessLoad,
    QueryInfo,
    SpawnProcesses,
    TopicInfo,
)
from querylib.cluster._queries import find_query, wait_for_query_end
from querylib.cluster._session import AsyncCluster, default_peer
from querylib.cluster._topic_io import TopicRoute, TopicWriter, read_topic, route_topic

__all__ = [
    "AsyncCluster",
    "AsyncCollectionFollower",
    "BrokerInfo",
    "CatalogEvent",
    "CatalogInfo",
    "Cluster",
    "ClusterFileError",
    "ClusterInfo",
    "CollectionFollower",
    "CollectionView",
    "Connection",
    "Diff",
    "ExecutorInfo",
    "HostLoad",
    "KillProcesses",
    "NoCoordinatorError",
    "ProcessLoad",
    "QueryFailedError",
    "QueryInfo",
    "QueryTimeoutError",
    "SessionLostError",
    "SpawnProcesses",
    "Snapshot",
    "TopicInfo",
    "TopicRoute",
    "TopicWriter",
    "cluster_file",
    "default_peer",
    "read_collections",
    "read_topic",
    "discover",
    "find_query",
    "read_cluster_file",
    "remove_cluster_file",
    "route_topic",
    "tq_home",
    "wait_for_query_end",
    "write_cluster_file",
]
