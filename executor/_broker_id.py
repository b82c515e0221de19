"""The executor broker's id and addresses, kept across restarts in `<data>/broker.id` (as Kafka
keeps `broker.id` in its log dir's meta.properties) and `<data>/broker.endpoints`.

Topic partitions are located by broker id in the catalog. A restarted executor (after `tq up`
stops and starts again on the same data) must register its broker under the id it had, or
every partition on its disk would name a broker that never comes back (DESIGN §6 "Executor
broker ids"). It also binds the addresses it had, where it chose "any free port" and they are
still free, so that running clients find it where they left it (DESIGN §5 "Restarts"); where
one is taken it takes another and clients look it up again. And it
keeps the cluster's default tenant/namespace in `<data>/cluster.namespace`, so a restarted
broker names the topics on its disk as the cluster does before its session tells it again.

The session that registered the broker is kept too (`<data>/broker.session`). The caller holds
the data dir's lock, so the process that wrote it has ended (an flock ends with its process):
a run after a crash closes that session rather than wait out its lease for the broker's id
(DESIGN §6 "Executor broker ids").

    previous = remembered_endpoints(data_dir)      # what the last run bound, or empty
    remember_endpoints(data_dir, Endpoints(broker=..., connector=..., kafka=...))
    broker = await register_remembered(cluster, data_dir, host, address, kafka_address=...)

Must not: register anything but the broker, or decide placement.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from catalog import (
    Broker,
    BrokerExistsError,
    NotOwnerError,
    TqError,
    UnknownBrokerError,
    default_namespace,
    set_default_namespace,
)
from querylib._state_file import replace_file
from querylib.cluster import AsyncCluster
from querylib.cluster.messages import CloseSession

__all__ = ["BROKER_ENDPOINTS_FILE", "BROKER_ID_FILE", "BROKER_SESSION_FILE", "NAMESPACE_FILE",
           "Endpoints",
           "follow_remembered_namespace", "preferred_listen", "register_remembered",
           "remember_endpoints", "remember_namespace", "remembered_endpoints"]

logger = logging.getLogger("executor")

BROKER_ID_FILE = "broker.id"
BROKER_ENDPOINTS_FILE = "broker.endpoints"
BROKER_SESSION_FILE = "broker.session"
NAMESPACE_FILE = "cluster.namespace"
_MAX_NAMESPACE_BYTES = 1024  # TENANT/NAMESPACE, as the coordinator's own `namespace` file


@dataclass(frozen=True)
class Endpoints:
    """Where the broker listened: its RPC endpoint (tcp://HOST:PORT) and its connector and
    Kafka listeners (HOST:PORT); "" for none."""

    broker: str = ""
    connector: str = ""
    kafka: str = ""


def remembered_endpoints(data_dir: Path) -> Endpoints:
    """The endpoints the last run wrote, or none (no file, or one we cannot read)."""
    try:
        raw = json.loads((data_dir / BROKER_ENDPOINTS_FILE).read_text())
    except FileNotFoundError:
        return Endpoints()
    except (OSError, ValueError) as exc:
        logger.warning("ignoring %s: %s", data_dir / BROKER_ENDPOINTS_FILE, exc)
        return Endpoints()
    if not isinstance(raw, dict):
        return Endpoints()
    return Endpoints(**{k: v for k, v in raw.items()
                        if k in ("broker", "connector", "kafka") and isinstance(v, str)})


def remember_endpoints(data_dir: Path, endpoints: Endpoints) -> None:
    """Write atomically and durably, as the id."""
    replace_file(data_dir / BROKER_ENDPOINTS_FILE, json.dumps(asdict(endpoints)).encode()
                 + b"\n")


def remember_namespace(data_dir: Path) -> None:
    """Keep the default tenant/namespace this process follows (its session set it)."""
    replace_file(data_dir / NAMESPACE_FILE, "/".join(default_namespace()).encode() + b"\n")


def follow_remembered_namespace(data_dir: Path) -> None:
    """Follow the default the last run's session learned, if any (before the broker opens
    its logs: it names what it finds on disk by short names)."""
    try:
        with open(data_dir / NAMESPACE_FILE, "rb") as f:
            raw = f.read(_MAX_NAMESPACE_BYTES + 1)
        if len(raw) > _MAX_NAMESPACE_BYTES:
            raise ValueError(f"more than {_MAX_NAMESPACE_BYTES} bytes")
        tenant, _, namespace = raw.decode("utf-8").strip().partition("/")
        set_default_namespace(tenant, namespace)
    except FileNotFoundError:
        return
    except (OSError, ValueError, TqError) as exc:  # ValueError: too long, or not UTF-8
        logger.warning("ignoring %s: %s", data_dir / NAMESPACE_FILE, exc)


def preferred_listen(listen: str, previous: str) -> str | None:
    """The previous endpoint to bind first when `listen` asks for any free port on the same
    host (tcp://HOST:0), else None."""
    host, _, port = listen.rpartition(":")
    if port != "0" or not previous:
        return None
    old_host, _, old_port = previous.rpartition(":")
    return previous if old_host == host and old_port.isdigit() and old_port != "0" else None
_RETRY = 0.2  # seconds between attempts while the old registration is still up
_MAX_NUMBER_BYTES = 20  # a broker id or session id: an int64 has at most 19 digits


def _remembered(data_dir: Path, name: str = BROKER_ID_FILE) -> int | None:
    """The positive number in the file, None when there is none or it is damaged: read
    bounded, and only ASCII digits count (bytes that are no UTF-8, or digits int() refuses,
    are damage like any other, not a traceback at start)."""
    try:
        with open(data_dir / name, "rb") as f:
            raw = f.read(_MAX_NUMBER_BYTES + 1).strip()
    except FileNotFoundError:
        return None
    if len(raw) > _MAX_NUMBER_BYTES or not raw.isdigit():  # bytes.isdigit: ASCII only
        return None
    return int(raw) or None


def _remember(data_dir: Path, number: int, name: str = BROKER_ID_FILE) -> None:
    """Write atomically and durably (`replace_file`: a temporary file of its own, fsynced,
    renamed, the folder fsynced), so a crash or power loss leaves the old number or the new
    one, never half a file, and the id, session and endpoints files never take each other's
    content."""
    replace_file(data_dir / name, f"{number}\n".encode())


async def _close_predecessor(cluster: AsyncCluster, data_dir: Path) -> None:
    """Close the session of the run that last registered this data dir's broker, if it is
    not ours: that run has ended (we hold the dir's lock), and its session would hold the
    broker's id until its lease ran out (10 s, or the recovery lease after a coordinator
    restart). The coordinator closes only a session of the caller's own principal; one gone
    already is refused, which is fine."""
    previous = await asyncio.to_thread(_remembered, data_dir, BROKER_SESSION_FILE)
    if previous is None or previous == cluster.session_id:
        return
    try:
        await cluster.request(CloseSession(session_id=previous), timeout=5.0)
    except TqError as exc:
        logger.debug("session %d of %s's previous run not closed: %s", previous, data_dir,
                     exc)
    else:
        logger.info("closed session %d of %s's previous run (ended: its broker id is free)",
                    previous, data_dir)


async def register_remembered(cluster: AsyncCluster, data_dir: Path, host: str, address: str,
                              *, kafka_address: str = "", curve_key: str = "", slot: int = 0,
                              claim: int | None = None, wait: float = 30.0) -> Broker:
    """Register the broker under `claim` (`tq executor --broker-id`), else its remembered id,
    else under the one the catalog gives (remembered then): with no id asked, the id last
    registered from this host, principal and `slot` if that is down (a host that lost its
    data dir gets its broker id back, DESIGN §6 "Executor broker ids"), else a new one.

    The caller holds `data_dir`'s lock: the session that registered the broker last time
    (`broker.session`) is closed first, its process having ended. A registration still up
    after that (another session's: `--broker-id`, a session file lost) is retried until it
    goes, for at most `wait` seconds, then BrokerExistsError (two live brokers must not
    share an id). A remembered id
    this catalog never assigned (the data dir came from another cluster) or decommissioned
    (the host came back after all) is dropped for a new one; a claimed one is an error
    (UnknownBrokerError), as is one of another principal's (NotOwnerError).
    """
    stored = await asyncio.to_thread(_remembered, data_dir)
    remembered = claim if claim is not None else stored
    await _close_predecessor(cluster, data_dir)
    deadline = time.monotonic() + wait
    while True:
        try:
            broker = await cluster.register_broker(host, address, broker_id=remembered,
                                                   kafka_address=kafka_address,
                                                   curve_key=curve_key, slot=slot)
            break
        except NotOwnerError as exc:
            if claim is not None:
                raise
            raise NotOwnerError(f"{exc} ({data_dir / BROKER_ID_FILE} names it): run this "
                                "executor with that credential, or remove the file to "
                                "register under another id") from exc
        except UnknownBrokerError as exc:  # never assigned here, or decommissioned
            if claim is not None:
                raise
            logger.warning("broker id %s in %s: %s; registering without it", remembered,
                           data_dir / BROKER_ID_FILE, exc)
            remembered = None
        except BrokerExistsError:
            if time.monotonic() > deadline:
                raise
            logger.info("broker %s is still registered (a previous run's session); waiting "
                        "for it to expire", remembered)
            await asyncio.sleep(_RETRY)
    if broker.broker_id != stored:
        await asyncio.to_thread(_remember, data_dir, broker.broker_id)
    if cluster.session_id is not None:
        await asyncio.to_thread(_remember, data_dir, cluster.session_id, BROKER_SESSION_FILE)
    return broker
