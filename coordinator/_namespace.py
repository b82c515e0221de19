"""The cluster's default tenant and namespace (seed 003's kafkaTenant / kafkaNamespace): what
a bare topic name means to every client, executor, Kafka listener and `tq` command.

It is chosen when a cluster is first started (`tq up` / `tq coordinator --tenant T
--namespace N`; public/default when not given) and kept in the coordinator's data dir as the
file `namespace` (`T/N`). It never changes afterwards: the catalog's journal was written under
it, and so were the names every client resolved. A coordinator started on an existing data dir
with another default refuses, saying which one the cluster has. A data dir from before this
setting (a catalog but no file) has public/default.

Must not: do anything but read and write that one small file.
"""

from __future__ import annotations

import os

from catalog import DEFAULT_NAMESPACE, DEFAULT_TENANT, UserError, set_default_namespace

__all__ = ["settle_namespace"]

FILE = "namespace"


def settle_namespace(data_dir: str, asked: str | None) -> str:
    """The cluster's default `tenant/namespace`: the stored one, else `asked` (or
    public/default), stored. Also makes it this process's default. UserError when `asked`
    differs from the stored one, or is not `TENANT/NAMESPACE`."""
    path = os.path.join(data_dir, FILE)
    try:
        with open(path, encoding="utf-8") as file:
            stored: str | None = file.read().strip()
    except FileNotFoundError:
        stored = None
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
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as file:
            file.write(chosen + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    return chosen
