"""The root of tq's exception hierarchy, and the map of the whole tree.

It lives in `catalog` because every other package may import `catalog` and `catalog` imports no
other tq package. Classes carry traits (`retriable`, `kafka_error_code`, `exit_code`) so callers
branch on attributes, never on message strings. Every class tq raises on purpose descends from
`TqError`, and no two classes share a name (tests/test_error_tree.py); anything else escaping a
component is a bug. Cancellation (`asyncio.CancelledError`) is no error: it is never caught to
be reported as a failure.

The one tree. Each family (the topmost class below these roots) is defined, and drawn member by
member, in the module named beside it; catalog's own families (catalog.errors, this
module) are drawn below.

    TqError
    ├── UserError                  bad arguments or configuration: one line, exit code 2
    │   ├── DataDirInUseError                                    querylib.errors
    │   ├── SecretFileError, SecretRejectedError, AddressError  querylib.rpc._errors
    │   ├── UnknownPartitionError, PartitionNotHereError, PartitionBusyError,
    │   │   InvalidTopicError, StaleIncarnationError, TopicAuthorizationError,
    │   │   NotLeaderOrFollowerError, UnknownLeaderEpochError,
    │   │   NotEnoughReplicasError, StreamEndedError             querylib.broker._errors
    │   ├── EndpointUnavailableError                             querylib.server._endpoints
    │   ├── ConsoleUnavailableError                              querylib.server.console._serve
    │   ├── MetricsUnavailableError                              querylib.server._metrics
    │   ├── ListenError                                          querylib.kafka._errors
    │   ├── NoCoordinatorError, ClusterFileError, ClusterRunningError  querylib.cluster._errors
    │   ├── BadJoinTokenError, AdvertiseError                    querylib.cluster._errors
    │   ├── BadOptionError, BadSchemaError                       querylib.spark._errors
    │   ├── GroupRefusedError                                    querylib.api._group
    │   └── PackError                                            querylib.artifacts
    ├── ProtocolError              a peer sent bytes or requests we cannot accept
    │   ├── CatalogDecodeError                                   (below)
    │   ├── RecordError            record batches and message sets     querylib.errors
    │   ├── RpcProtocolError       RPC messages (frames, signatures)   querylib.rpc._errors
    │   ├── BrokerProtocolError    the broker's rules (sessions, credit, sequences)
    │   │                                                        querylib.broker._errors
    │   ├── FrontierRegressionError, CohortError                 querylib.server.broker._frontier
    │   ├── KafkaProtocolError     Kafka framing: the connection closes  querylib.kafka._errors
    │   ├── ConnectorProtocolError the connector protocol: an ERROR frame
    │   │                                                        querylib.connector._errors
    │   └── ValueDecodeError       a record value its topic's serde cannot read  querylib.api.serdes
    ├── StorageError               the local log or its files
    │   ├── OffsetOutOfRangeError, LogClosedError, LogLockedError,
    │   │   CorruptDataError                                     querylib.errors
    │   └── DataLossError                                        querylib.spark._errors
    ├── CatalogError               a catalog command broke an invariant (below); its
    │                              QueryEndedError has QueryFailedError in querylib.cluster._errors
    ├── RpcError                   a call did not complete           querylib.rpc._errors
    │                              (and BrokerClosingError, querylib.broker._session)
    ├── KafkaRequestError          a request refused with a Kafka code  querylib.kafka._errors
    ├── LocalProtocolError         our side misused the connector codec  querylib.connector._errors
    ├── ConnectorError             a connector client gave up (RewindError, StreamRefusedError)
    │                                                            querylib.connector._client
    ├── ExecutorError              what a host agent could not do    executor._errors
    ├── NotActiveError             this coordinator is not (or no longer) the active one
    │                                                            coordinator._failover
    ├── BrokerUnavailableError                                   querylib.broker._errors
    ├── SessionLostError, QueryTimeoutError                      querylib.cluster._errors
    ├── BrokerUnreachableError, JavaNotFoundError                querylib.spark._errors
    ├── KafkaConnectionError                                     querylib.kafka._client
    └── GroupStateError                                          querylib.server.kafka._group

Foreign exceptions are translated once, where they enter, with `raise ... from exc`: zmq's in the
RPC transport (querylib.rpc), msgspec's in the codecs that decode (catalog's, the RPC codec, the
journal, the catalog's commits in etcd and the files that hold msgspec), kio's in the Kafka
codecs (querylib.kafka's request and `__consumer_offsets` codecs, and the clients' response
decoding), struct's in the record and connector codecs, and OSError where files or sockets are
opened (the log, the executor's artifacts and processes, secrets, cluster files, the
listeners). Code between the edges sees TqErrors only.

Catalog's families:

    TqError
    ├── UserError
    ├── ProtocolError
    │   └── CatalogDecodeError     bytes on a catalog topic that are not a catalog update
    ├── StorageError
    └── CatalogError               a catalog command broke an invariant (exit code 2)
        ├── InvalidCommandError        fields that contradict each other (counts, placement)
        │   ├── InvalidPartitionsError a partition count outside 1..MAX_PARTITIONS
        │   ├── InvalidReplicationFactorError replicas that are too many, too few or not apart
        │   └── InvalidConfigError     a topic config tq does not set, or out of bounds
        ├── InvalidTopicNameError      not NAME, TENANT/NS/NAME or persistent://TENANT/NS/NAME
        │   └── ReservedTopicNameError a `__` name asked for by someone other than the system
        ├── NotFoundError              an id or name the catalog does not hold
        │   ├── UnknownSessionError (a coordinator session), UnknownBrokerError
        │   │   └── BrokerRetiredError  a decommissioned broker id
        │   ├── UnknownExecutorError, UnknownQueryError, UnknownTopicError,
        │   ├── UnknownCollectionError, UnknownPrincipalError
        │   └── NotPublishedError, NotSubscribedError
        ├── ConflictError              the request contradicts the current state
        │   ├── TopicExistsError, BrokerExistsError, BrokerInUseError
        │   ├── TopicBeingDroppedError (retriable)
        │   ├── FencedLeaderEpochError, StaleIsrError (retriable): a leader's old view
        │   ├── AlreadyPublishedError, AlreadySubscribedError, PrincipalExistsError
        │   ├── QueryEndedError, QueryStateError, ProcessAlreadyExitedError
        │   └── RecordTypeMismatchError
        ├── QuotaExceededError         a user's topics would hold too many partitions
        ├── NotAuthorizedError         the requesting principal may not do this
        │   ├── NotOwnerError          only the owner (or who manages it) may do this
        │   └── JoinTokenError         a join token that is used, expired or revoked
        └── CorruptCatalogError        replayed updates do not form a valid catalog

`InvalidTopicNameError` is also a `UserError`: names come from people, and the fix is theirs.

Messages (these errors' and log lines) name what peers sent: `printable` renders such a
string so that it stays on its one line and cannot move an operator's terminal.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` as it may appear in a log line, an error message or a terminal: unchanged when
    every character is printable (ordinary names read as they are, unquoted), else with each
    other character escaped as Python's repr writes it (`\\n`, `\\x1b`, `\\u2028`). A name a
    client chose can then neither start a line of its own ("x\\nERROR forged") nor send a
    terminal an escape sequence. Backslashes are kept as they are: the result is for reading,
    not for parsing back."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class TqError(Exception):
    """Root of every error tq raises on purpose. A traceback of anything else is a bug."""

    retriable: bool = False
    kafka_error_code: int = -1  # UNKNOWN_SERVER_ERROR
    exit_code: int = 1


class UserError(TqError):
    """The user asked for something that cannot be done; the message says what to do instead."""

    exit_code = 2


class ProtocolError(TqError):
    """The peer broke a protocol (bad bytes, bad lengths, bad state). Not our bug."""

    kafka_error_code = 42  # INVALID_REQUEST


class StorageError(TqError):
    """Local storage failed or holds something we cannot use."""

    kafka_error_code = 56  # KAFKA_STORAGE_ERROR


class CatalogError(TqError):
    """A catalog command was refused because it would break an invariant."""

    exit_code = 2


# -- catalog command errors ---------------------------------------------------------------------


class InvalidCommandError(CatalogError):
    """A command whose fields contradict each other or the limits (counts, placement length)."""

    kafka_error_code = 42  # INVALID_REQUEST


class InvalidPartitionsError(InvalidCommandError):
    """A topic asked for fewer than one partition, too many, or locations that do not match
    (or to shrink: a topic's partitions only grow)."""

    kafka_error_code = 37  # INVALID_PARTITIONS


class InvalidReplicationFactorError(InvalidCommandError):
    """Replicas that cannot be placed: more than there are hosts, fewer than one, the same
    broker twice, or not starting with the partition's leader."""

    kafka_error_code = 38  # INVALID_REPLICATION_FACTOR


class InvalidConfigError(InvalidCommandError):
    """A topic config tq does not set per topic, or a value outside its bounds."""

    kafka_error_code = 40  # INVALID_CONFIG


class InvalidTopicNameError(CatalogError, UserError):
    """A topic name that is not one of the accepted forms; the message shows the valid forms."""

    kafka_error_code = 17  # INVALID_TOPIC_EXCEPTION


class ReservedTopicNameError(InvalidTopicNameError):
    """Names starting with `__` belong to the system (catalog topics, logs, consumer offsets)."""


class NotFoundError(CatalogError):
    """The command names something the catalog does not hold (never did, or no longer)."""


class UnknownSessionError(NotFoundError):
    """No open session with this id (it never existed, was closed, or its lease expired)."""


class UnknownBrokerError(NotFoundError):
    """No registered broker with this id."""


class BrokerRetiredError(UnknownBrokerError):
    """The broker id was decommissioned (DESIGN §5 "Decommissioning a broker"): it names no
    broker any more, so it is neither registered nor decommissioned again. An
    UnknownBrokerError, so an executor remembering it registers under a new id."""


class UnknownExecutorError(NotFoundError):
    """No registered executor with this id."""


class UnknownQueryError(NotFoundError):
    """No query with this id."""


class UnknownTopicError(NotFoundError):
    """No topic with this id or name. Retriable: a blocking subscribe waits for it to appear."""

    retriable = True
    kafka_error_code = 3  # UNKNOWN_TOPIC_OR_PARTITION


class UnknownCollectionError(NotFoundError):
    """A catalog collection name that is not one of the catalog's collections."""


class NotPublishedError(NotFoundError):
    """Unpublish of a publication that does not exist."""


class NotSubscribedError(NotFoundError):
    """Unsubscribe of a subscription that does not exist."""


class ConflictError(CatalogError):
    """The command is well formed but contradicts the catalog's current state."""


class TopicExistsError(ConflictError):
    """A topic with this name exists already (delete it first to reuse the name)."""

    kafka_error_code = 36  # TOPIC_ALREADY_EXISTS


class TopicBeingDroppedError(ConflictError):
    """A topic of this name was deleted and a broker the new one would live on has not dropped
    the old partitions yet: creating it there now could mix old files with new. Retry."""

    retriable = True


class FencedLeaderEpochError(ConflictError):
    """A request named a partition's leader epoch that is not the current one: its sender (a
    broker acting as leader, a follower, a client) learns the newer role from the catalog and
    retries. Raised by the catalog (AlterPartition) and by brokers."""

    kafka_error_code = 74  # FENCED_LEADER_EPOCH
    retriable = True


class StaleIsrError(ConflictError):
    """A leader asked to change its in-sync replicas from a set that is no longer the
    catalog's; it re-reads the partition and decides again."""

    kafka_error_code = 108  # INVALID_UPDATE_VERSION
    retriable = True


class BrokerExistsError(ConflictError):
    """A broker re-joined with an id that is registered (up) right now."""


class BrokerInUseError(ConflictError):
    """A broker cannot leave while a registered executor still names it."""


class AlreadyPublishedError(ConflictError):
    """This party publishes this topic already."""


class AlreadySubscribedError(ConflictError):
    """This party subscribes to this topic already."""


class QueryEndedError(ConflictError):
    """The query has finished, failed or been killed; it can no longer own, publish or subscribe."""


class QueryStateError(ConflictError):
    """A query event that its current state does not allow (a pair missing from the table)."""

    def __init__(self, message: str, state: str = "", event: str = "") -> None:
        super().__init__(message)
        self.state = state
        self.event = event


class ProcessAlreadyExitedError(ConflictError):
    """A second exit report for the same process of a query."""


class RecordTypeMismatchError(ConflictError):
    """A subscriber expects another record type (or kind) than the topic carries."""


class QuotaExceededError(CatalogError):
    """A user's topics would hold more than MAX_PARTITIONS_PER_USER partitions in all (DESIGN
    §3 "Ownership")."""

    kafka_error_code = 44  # POLICY_VIOLATION
    exit_code = 2


class NotAuthorizedError(CatalogError):
    """The authenticated principal behind the request may not do this (DESIGN §12)."""

    kafka_error_code = 31  # CLUSTER_AUTHORIZATION_FAILED
    exit_code = 2


class NotOwnerError(NotAuthorizedError):
    """Only a topic's or query's owner (or an admin, with force) may do this."""

    kafka_error_code = 29  # TOPIC_AUTHORIZATION_FAILED


class JoinTokenError(NotAuthorizedError):
    """A join token that joins nobody now: used already, expired, or revoked (DESIGN §12
    "Joining a host")."""


class UnknownPrincipalError(NotFoundError):
    """A user or executor principal the catalog does not hold."""


class PrincipalExistsError(ConflictError):
    """A user or executor principal of that name exists already."""


class CorruptCatalogError(CatalogError):
    """Replayed updates do not form a valid catalog (a negative count, a dangling reference).

    Raised on recovery; the catalog topics hold something this code never wrote.
    """

    exit_code = 1


class CatalogDecodeError(ProtocolError):
    """Bytes read from a catalog topic that do not decode to a well-typed catalog update."""
