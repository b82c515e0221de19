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
    parse_token / redeem      join tokens: the string a new host joins with, and redeeming it
    advertised_host           what a server bound to 0.0.0.0 tells other hosts to connect to
    _messages                 the coordinator's RPC messages (also used by the coordinator)

Names are loaded on first use (PEP 562): a query process registering (the start barrier) needs
only the session (`Cluster`), not the catalog follower, whose record codecs and broker client
cost about a third of its start; `from querylib.cluster import X` works as before.

Must not: import `coordinator` (the server imports us, not the other way round), or load a
submodule at import time that registration does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

# Names are loaded on first use (PEP 562, querylib/_lazy.py): a query process imports only
# what it touches.
if TYPE_CHECKING:
    from ._advertise import (
        advertise_endpoint,
        advertised_host,
        is_wildcard,
        local_address_toward,
    )
    from ._blocking import Cluster
    from ._connection import (
        ClusterInfo,
        Connection,
        claim_cluster_file,
        cluster_file,
        discover,
        hold_data_dir,
        read_cluster_file,
        remove_cluster_file,
        tq_home,
        write_cluster_file,
    )
    from ._errors import (
        AdvertiseError,
        BadJoinTokenError,
        ClusterFileError,
        ClusterRunningError,
        DataDirInUseError,
        NoCoordinatorError,
        QueryFailedError,
        QueryTimeoutError,
        SessionLostError,
    )
    from ._follow import (
        AsyncCollectionFollower,
        CatalogEvent,
        CollectionFollower,
        CollectionView,
        Diff,
        Snapshot,
        read_collections,
    )
    from ._join import (
        Joined,
        ParsedToken,
        format_token,
        parse_token,
        redeem,
    )
    from ._queries import find_query, resolve_query, wait_for_exits, wait_for_query_end
    from ._session import AsyncCluster, default_peer
    from ._topic_io import (
        TopicRoute,
        TopicWriter,
        last_records_start,
        partition_infos,
        read_topic,
        route_topic,
    )
    from .messages import (
        BrokerInfo,
        CatalogInfo,
        DropPartitions,
        ExecutorInfo,
        HostLoad,
        KillProcesses,
        ProcessLoad,
        QueryInfo,
        SpawnProcesses,
        TopicInfo,
    )

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
