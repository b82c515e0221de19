"""Errors the executor raises, below catalog's `TqError` root (traits, not message strings).

    TqError (catalog.errors)
    └── ExecutorError
        ├── ArtifactError                a program artifact that cannot be had or used
        │   ├── ArtifactMissingError     nobody holds the blob with this digest
        │   ├── FetchFailedError         a source did not deliver (`reason` says why)
        │   ├── DigestMismatchError      the bytes do not hash to the digest asked for
        │   └── InvalidArtifactError     bytes that are not a pack we can unpack, or a path
        │                                we cannot pack (also a UserError: the fix is theirs)
        ├── ExecFailedError              the process could not be started (`reason` says why)
        ├── ExecutorExitedError          `tq up`'s executor child exited before it was ready
        ├── NoFreeSlotsError             every process slot of this host is taken (retriable)
        ├── ProcessExistsError           this (query, process) already runs on this host
        └── UnknownProcessError          no process with this (query, process) runs here

Only this module defines executor errors; foreign exceptions (OSError, urllib, tarfile) are
translated into them where they happen, with `raise ... from exc`.
"""

from __future__ import annotations

import enum

from catalog.errors import TqError, UserError

__all__ = [
    "ArtifactError",
    "ArtifactMissingError",
    "DigestMismatchError",
    "ExecFailedError",
    "ExecutorError",
    "ExecutorExitedError",
    "FetchFailedError",
    "FetchReason",
    "InvalidArtifactError",
    "NoFreeSlotsError",
    "ProcessExistsError",
    "UnknownProcessError",
]


class ExecutorError(TqError):
    """Something the host agent could not do."""


class ArtifactError(ExecutorError):
    """A program artifact could not be fetched, verified or installed."""


class ArtifactMissingError(ArtifactError):
    """No blob with this digest: not in the cache, and the uploader does not have it either.
    Not retriable: the program has to be uploaded (submitted) again."""

    exit_code = 2


class FetchReason(enum.StrEnum):
    """Why a fetch failed; decides whether trying again can help."""

    NOT_FOUND = "not_found"          # no such file, HTTP 404/410
    TOO_LARGE = "too_large"          # the source is larger than the configured maximum
    TIMEOUT = "timeout"              # no answer in time
    UNREACHABLE = "unreachable"      # connection refused, DNS, network down
    HTTP_STATUS = "http_status"      # any other non-2xx answer
    UNSUPPORTED = "unsupported"      # a source scheme we do not fetch from, a redirect


_RETRIABLE_REASONS = frozenset({FetchReason.TIMEOUT, FetchReason.UNREACHABLE,
                                FetchReason.HTTP_STATUS})


class FetchFailedError(ArtifactError):
    """A source did not deliver the artifact. `reason` (a FetchReason) says why, `source` from
    where; retriable for timeouts, unreachable hosts and server errors (HTTP 5xx, 408, 429)."""

    def __init__(self, message: str, *, reason: FetchReason, source: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.source = source
        self.retriable = reason in _RETRIABLE_REASONS


class DigestMismatchError(ArtifactError):
    """The fetched bytes hash to `actual`, not to the `expected` digest: the source holds
    another program than the one submitted (or the transfer was corrupted)."""

    def __init__(self, message: str, *, expected: str, actual: str) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class InvalidArtifactError(ArtifactError, UserError):
    """A blob that is not a tq pack (unsafe member names, links, special files, too many
    members), or a path that cannot be packed (missing, special file, too large)."""


class ExecFailedError(ExecutorError):
    """The query process could not be started; `reason` is the OS's or the launcher's word."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class NoFreeSlotsError(ExecutorError):
    """Every process slot of this executor is taken; a slot frees when a process exits."""

    retriable = True


class ProcessExistsError(ExecutorError):
    """A process for this (query, process index) is already running on this executor (a
    duplicate spawn request); the running one is kept."""


class UnknownProcessError(ExecutorError):
    """No process for this (query, process index) is running on this executor."""


class ExecutorExitedError(ExecutorError):
    """A `tq executor` child (tq up's executor, an executor's broker shard:
    `_ready_child.py`) exited before it was ready; it said why on stderr. tq up exits with its
    code (1 when it was killed by a signal)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
