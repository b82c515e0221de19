"""Finding the coordinator (DESIGN §9): `--coordinator ADDR`, else `TQ_COORDINATOR`, else the
connection file `$TQ_HOME/cluster.json` (default ~/.tq/) that `tq coordinator` writes, as
Jupyter's runtime files work. The file holds the coordinator's address and the path of the
secret file (never the secret), plus the pid and host of the process that wrote it, so a file
left behind by a killed coordinator is recognised instead of waited on.

Only the process holding `$TQ_HOME/cluster.lock` (`claim_cluster_file`, what `tq up` and
`tq coordinator` take before anything else) writes cluster.json, and removes it when it stops:
a second cluster under the same TQ_HOME is refused, naming the first, instead of taking its
file over. A file left by a killed process is replaced (its lock ended with it). Likewise
`hold_data_dir` locks a server's data directory while it runs, naming the holder to another.

Small blocking file work; no sockets. The first request tells whether anyone answers.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from catalog import ADMIN
from querylib._pidlock import PidLock, hold_data_dir
from querylib._state_file import replace_file
from querylib.rpc import (
    Credential,
    coordinator_public_key,
    curve_forced,
    default_secret_path,
    leaves_host,
    load_credential,
    remember_server_key,
)

from ._errors import (
    START_HINT,
    ClusterFileError,
    ClusterRunningError,
    NoCoordinatorError,
)

T = TypeVar("T")

__all__ = [
    "COORDINATOR_KEY_ENV",
    "ClusterInfo",
    "Connection",
    "claim_cluster_file",
    "cluster_file",
    "discover",
    "hold_data_dir",
    "read_cluster_file",
    "remove_cluster_file",
    "tq_home",
    "write_cluster_file",
]

CLUSTER_FILE = "cluster.json"
COORDINATOR_KEY_ENV = "TQ_COORDINATOR_KEY"  # the coordinator's CURVE public key
CLUSTER_LOCK = "cluster.lock"
_MAX_FILE_BYTES = 64 * 1024


def tq_home() -> Path:
    """`$TQ_HOME`, default ~/.tq: where cluster.json and the secret live."""
    return Path(os.environ.get("TQ_HOME") or os.path.join(os.path.expanduser("~"), ".tq"))


def cluster_file(home: str | os.PathLike[str] | None = None) -> Path:
    return Path(home if home is not None else tq_home()) / CLUSTER_FILE


@dataclass(frozen=True)
class ClusterInfo:
    """What cluster.json says."""

    coordinator: str
    secret_file: str
    catalog_broker: str = ""
    pid: int | None = None
    host: str | None = None
    data: str | None = None
    connector: str = ""  # HOST:PORT of `tq up`'s connector endpoint, if it opened one
    kafka: str = ""  # HOST:PORT Kafka clients bootstrap from, if `tq up` opened a listener
    console: str = ""  # the web console's URL, if one was started (DESIGN §13)
    coordinator_key: str = ""  # its CURVE public key when it is a CURVE server (DESIGN §2)


@dataclass(frozen=True)
class Connection:
    """Where the coordinator is, our credential (`secret`: the cluster secret's admin, or a
    principal's credential file), and where we learned the address."""

    address: str
    secret: Credential
    secret_file: str
    source: str
    coordinator_key: str = ""  # its CURVE public key, when known: the link is then CURVE


def write_cluster_file(info: ClusterInfo, home: str | os.PathLike[str] | None = None) -> Path:
    """Write cluster.json atomically and durably (0600; the folder 0700, created if missing):
    `replace_file`'s temporary file has an unguessable name and is made new, so a link
    planted in TQ_HOME is never followed, and a crash leaves the old file or the new one,
    never an empty one."""
    path = cluster_file(home)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_file(path, json.dumps(asdict(info), indent=2).encode() + b"\n")
    return path


def read_cluster_file(home: str | os.PathLike[str] | None = None) -> ClusterInfo | None:
    """The connection file's contents, None if there is none; ClusterFileError if unusable."""
    path = cluster_file(home)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ClusterFileError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        if len(data) > _MAX_FILE_BYTES:
            raise ValueError("too large")
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        info = ClusterInfo(
            coordinator=_field(raw, "coordinator", str),
            secret_file=_field(raw, "secret_file", str),
            catalog_broker=_text(raw, "catalog_broker") or "",
            pid=raw.get("pid"),
            host=_text(raw, "host"),
            data=_text(raw, "data"),
            connector=_text(raw, "connector") or "",
            kafka=_text(raw, "kafka") or "",
            coordinator_key=_text(raw, "coordinator_key") or "",
        )
        if info.pid is not None and not isinstance(info.pid, int):
            raise ValueError("pid is not an integer")
    except (ValueError, TypeError) as exc:
        raise ClusterFileError(f"{path} is not a tq connection file ({exc}); delete it and "
                               f"restart the coordinator") from exc
    return info


def _text(raw: dict[str, object], name: str) -> str | None:
    """An optional text field: absent or null is None; any other non-text is damage, said
    here rather than met where the field is used (a CURVE key that is a number)."""
    value = raw.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name!r} is not text")
    return value


def _field(raw: dict[str, object], name: str, kind: type[T]) -> T:
    value = raw.get(name)
    if not isinstance(value, kind) or not value:
        raise ValueError(f"missing {name!r}")
    return value


def claim_cluster_file(home: str | os.PathLike[str] | None = None) -> PidLock:
    """Hold `$TQ_HOME/cluster.lock` for as long as this process serves the cluster that
    cluster.json names (release it after removing the file). ClusterRunningError, naming the
    running cluster and how to run another, when another process holds it."""
    where = Path(home if home is not None else tq_home())
    lock = PidLock(where / CLUSTER_LOCK)
    if lock.acquire():
        return lock
    running = None
    try:
        running = read_cluster_file(where)
    except ClusterFileError:
        pass
    pid = lock.holder_pid()
    if running is not None and running.pid == pid:
        what = f"pid {pid}, coordinator {running.coordinator}"
    else:
        what = f"{lock.holder()}, starting"
    raise ClusterRunningError(
        f"a tq cluster already runs under TQ_HOME={where} ({what}); use it, stop it, or run "
        f"another under another TQ_HOME: TQ_HOME=/tmp/tq2 tq up")


def remove_cluster_file(pid: int, home: str | os.PathLike[str] | None = None) -> None:
    """Remove cluster.json if it is still the one process `pid` wrote."""
    try:
        info = read_cluster_file(home)
    except ClusterFileError:
        return
    if info is not None and info.pid == pid:
        cluster_file(home).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def _key_in_cluster_file(info: ClusterInfo | None, coordinator: str,
                         home: str | os.PathLike[str] | None) -> str:
    """The coordinator key cluster.json names for `coordinator`, if it names that one."""
    if info is None:
        try:
            info = read_cluster_file(home)
        except ClusterFileError:
            return ""
    return info.coordinator_key if info is not None and info.coordinator == coordinator else ""


def discover(coordinator: str | None = None, *, secret_file: str | None = None,
             home: str | os.PathLike[str] | None = None,
             coordinator_key: str | None = None) -> Connection:
    """Where to reach the coordinator, and the credential to sign with: `secret_file`, else
    `TQ_CREDENTIALS`, else the secret file cluster.json names (its holder is the admin).
    The coordinator's CURVE public key, when it is a CURVE server: `coordinator_key`, else
    TQ_COORDINATOR_KEY, else the credential file's, else cluster.json's (when it names that
    coordinator), else, for the admin reaching a CURVE coordinator (another host's, or CURVE
    forced), derived from the secret; remembered for its
    address (`remember_server_key`), so every client of this process connects with CURVE.

    Raises NoCoordinatorError (saying how to start one) when nothing names a coordinator, or
    when the connection file names one that is not running on this host; SecretFileError when
    the credential file is missing or unsafe.
    """
    info = None
    if coordinator:
        source = "--coordinator"
    elif os.environ.get("TQ_COORDINATOR"):
        coordinator, source = os.environ["TQ_COORDINATOR"], "TQ_COORDINATOR"
    else:
        info = read_cluster_file(home)
        path = cluster_file(home)
        if info is None:
            raise NoCoordinatorError(f"no coordinator found (no {path}, no TQ_COORDINATOR, no "
                                     f"--coordinator); {START_HINT}")
        if info.pid is not None and info.host == socket.gethostname() and not _alive(info.pid):
            raise NoCoordinatorError(f"the coordinator in {path} (pid {info.pid}) is not "
                                     f"running; {START_HINT}")
        coordinator, source = info.coordinator, str(path)
    if secret_file is None:
        secret_file = os.environ.get("TQ_CREDENTIALS") or None
    if secret_file is None:
        secret_file = info.secret_file if info is not None else str(default_secret_path())
    credential = load_credential(secret_file)
    key = (coordinator_key or os.environ.get(COORDINATOR_KEY_ENV) or credential.coordinator_key
           or _key_in_cluster_file(info, coordinator, home))
    if not key and credential.principal == ADMIN and (
            curve_forced() or any(leaves_host(a) for a in coordinator.split(","))):
        key = coordinator_public_key(credential.key)  # the admin holds what it derives from
    if key:
        remember_server_key(coordinator, key)
    return Connection(coordinator, credential, secret_file, source, key)
