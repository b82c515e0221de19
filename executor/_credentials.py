"""The credentials of this host's query processes (DESIGN §12).

The coordinator mints one key per query (principal `query:ID`) and sends it to each executor
it places processes on, sealed with that executor's own key. The executor unseals it and
writes one credential file per process, mode 0600 in a 0700 folder under its data directory,
named in the process's TQ_CREDENTIALS; the file goes when the process has exited. A query
process never sees the cluster secret or the executor's own credential.

Must not: decide anything about who may run what (the coordinator did), or spawn processes.
"""

from __future__ import annotations

import os
from pathlib import Path

from catalog import query_principal
from querylib.rpc import Credential, SecretFileError, unseal, write_credential

__all__ = ["ProcessCredentials"]


class ProcessCredentials:
    """Credential files of running query processes, under `root`."""

    def __init__(self, root: str | os.PathLike[str], own: Credential) -> None:
        self.root = Path(root)
        self._own = own

    def path(self, query_id: int, process: int) -> Path:
        return self.root / f"q{query_id}-p{process}.json"

    def write(self, query_id: int, process: int, sealed: bytes, *,
              coordinator: str = "") -> Path:
        """Unseal the query's key and write process `process`'s credential file (thread
        side: it fsyncs). SecretFileError when the coordinator sent no credential."""
        if not sealed:
            raise SecretFileError(f"the coordinator sent no credential for query {query_id}; "
                                  "it runs an older tq than this executor")
        credential = Credential(query_principal(query_id), unseal(self._own.key, sealed))
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(query_id, process)
        path.unlink(missing_ok=True)  # a process spawned again after a rejoin
        write_credential(path, credential, coordinator=coordinator)
        return path

    def remove(self, query_id: int, process: int) -> None:
        self.path(query_id, process).unlink(missing_ok=True)
