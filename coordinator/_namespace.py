"""The cluster's default tenant and namespace (seed 003's kafkaTenant / kafkaNamespace): what
a bare topic name means to every client, executor, Kafka listener and `tq` command.

It is chosen when a cluster is first started (`tq up` / `tq coordinator --tenant T
--namespace N`; public/default when not given) and kept in the coordinator's data dir as the
file `namespace` (`T/N`). It never changes afterwards: the catalog's journal was written under
it, and so were the names every client resolved. A coordinator started on an existing data dir
with another default refuses, saying which one the cluster has. A data dir from before this
setting (a catalog but no file) has public/default. A file that is there but holds no
`TENANT/NAMESPACE` (empty, not UTF-8, a directory, unreadable) stops the start in one line
naming it: taking a default instead could change what every bare name means.

Must not: do anything but read and write that one small file.
"""

from __future__ import annotations

import os

from catalog import (
    DEFAULT_NAMESPACE,
    DEFAULT_TENANT,
    InvalidTopicNameError,
    StorageError,
    TopicName,
    UserError,
    set_default_namespace,
)
from querylib._state_file import replace_file

__all__ = ["settle_namespace"]

FILE = "namespace"
# Far more than TENANT/NAMESPACE takes (two topic-name parts); a longer file is not ours.
MAX_BYTES = 1024
_FIX = ("it keeps the cluster's default TENANT/NAMESPACE (public/default unless chosen at "
        "its first start): write back the one this cluster has, or start another cluster "
        "(another --data)")


def settle_namespace(data_dir: str, asked: str | None) -> str:
    """The cluster's default `tenant/namespace`: the stored one, else `asked` (or
    public/default), stored. Also makes it this process's default. UserError when `asked`
    differs from the stored one, or is not `TENANT/NAMESPACE`; StorageError, naming the
    file, when the stored one cannot be read or is not one."""
    path = os.path.join(data_dir, FILE)
    stored = _stored(path)
    if stored is None:
        broker = os.path.join(data_dir, "broker")
        if os.path.isdir(broker) and os.listdir(broker):
            stored = f"{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}"  # a catalog from before
    if stored is not None and asked is not None and asked != stored:
        raise UserError(f"this cluster's default namespace is {stored} (chosen when it was "
                        f"first started), not {asked}: a bare topic name means {stored}/NAME "
                        "to everything written so far; start without --tenant/--namespace "
                        "(or with these), or start another cluster (another --data)")
    chosen = stored or asked or f"{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}"
    tenant, slash, namespace = chosen.partition("/")
    if not slash or "/" in namespace:
        raise UserError(f"a default namespace is TENANT/NAMESPACE, not {chosen!r}")
    set_default_namespace(tenant, namespace)  # InvalidTopicNameError (a UserError) if bad
    if stored is None:
        try:
            # A temporary file of its own, fsynced, the directory too: a planted link is not
            # followed, and a power loss does not lose the default names were resolved with.
            replace_file(path, chosen.encode() + b"\n", mode=0o644)
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return chosen


def _stored(path: str) -> str | None:
    """The `TENANT/NAMESPACE` the file at `path` keeps; None when there is no file."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory, no permission, an I/O error
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}; {_FIX}") from exc
    if len(raw) > MAX_BYTES:
        raise StorageError(f"{path} holds more than {MAX_BYTES} bytes; {_FIX}")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise StorageError(f"{path} is not UTF-8 text; {_FIX}") from None
    if not text:
        raise StorageError(f"{path} is empty; {_FIX}")
    _, slash, namespace = text.partition("/")
    try:
        if not slash or "/" in namespace:
            raise InvalidTopicNameError(text)
        TopicName.parse(f"{text}/x")  # both parts are names
    except InvalidTopicNameError:
        shown = repr(text) if len(text) <= 80 else repr(text[:80] + "...")
        raise StorageError(f"{path} holds {shown}, not TENANT/NAMESPACE (each letters, "
                           f"digits, '.', '_' or '-'); {_FIX}") from None
    return text
