"""Errors of talking to the cluster (finding the coordinator, holding a session).

    TqError (catalog.errors)
    ├── UserError
    │   ├── NoCoordinatorError   none configured, none running, or none answering: says how to
    │   │                        start one
    │   ├── ClusterFileError     $TQ_HOME/cluster.json exists but cannot be used
    │   ├── ClusterRunningError  a cluster already runs under this $TQ_HOME (names it)
    │   └── DataDirInUseError    (querylib.errors) a running process holds this data directory
    ├── SessionLostError         the coordinator no longer holds our session (lease expired)
    ├── QueryTimeoutError        a query did not end within the time we were willing to wait
    └── QueryEndedError (catalog)
        └── QueryFailedError     a submitted query failed or was killed before it ran
"""

from __future__ import annotations

from catalog.errors import QueryEndedError, TqError, UserError
from querylib.errors import DataDirInUseError

__all__ = ["AdvertiseError", "BadJoinTokenError", "ClusterFileError", "ClusterRunningError",
           "DataDirInUseError", "NoCoordinatorError",
           "QueryFailedError", "QueryTimeoutError", "SessionLostError"]

START_HINT = "start one with `tq coordinator` (or `tq up`)"


class NoCoordinatorError(UserError):
    """No coordinator to talk to; the message says where we looked and how to start one."""


class ClusterFileError(UserError):
    """The connection file is unreadable or malformed; the message names it."""


class BadJoinTokenError(UserError):
    """A join token that is not one (mangled when copied), or that no coordinator it names
    accepts (wrong, or revoked)."""


class AdvertiseError(UserError):
    """A server bound to a wildcard with no address to tell others (say --advertise HOST)."""


class ClusterRunningError(UserError):
    """Another process holds this $TQ_HOME's cluster.json: a second cluster there would take
    it over. The message names the running one and says how to run another."""


class SessionLostError(TqError):
    """The coordinator dropped our session (its lease expired while we could not renew it):
    everything the session owned is gone; open a new session."""


class QueryTimeoutError(TqError):
    """A query we waited for has not ended yet; it goes on running (wait again, or kill it)."""

    retriable = True


class QueryFailedError(QueryEndedError):
    """A submitted query failed or was killed before it ran (a spawn failed, a process did not
    register in time); the message says why."""

    exit_code = 1  # `tq submit`: the query failed (as with --wait when it fails later)
