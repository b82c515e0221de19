"""The public surface of `querylib.spark` and the `pyspark_tq` shim."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import DataSource

import pyspark_tq
import querylib.spark
from catalog.errors import StorageError, TqError, UserError

pytestmark = pytest.mark.spark

PUBLIC = {
    "ARROW_SCHEMA", "ARROW_SCHEMA_NO_HEADERS", "SCHEMA", "SCHEMA_NO_HEADERS", "BadOptionError",
    "BadSchemaError", "BrokerUnreachableError",
    "DataLossError", "JavaNotFoundError", "TqCommitMessage", "TqDataSource", "catalog_table",
    "ensure_java", "register", "session",
}


def test_public_names() -> None:
    assert set(querylib.spark.__all__) == PUBLIC
    assert len(querylib.spark.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(querylib.spark, name) is not None


def test_errors_sit_under_tq_roots() -> None:
    assert issubclass(querylib.spark.BadOptionError, UserError)
    assert issubclass(querylib.spark.BadSchemaError, UserError)
    assert issubclass(querylib.spark.DataLossError, StorageError)
    assert issubclass(querylib.spark.BrokerUnreachableError, TqError)
    assert querylib.spark.BrokerUnreachableError.retriable


def test_the_shim_is_what_spark_looks_for() -> None:
    """Spark's lookup registers `DefaultSource` of each `pyspark_*` module by its name()."""
    assert issubclass(pyspark_tq.DefaultSource, DataSource)
    assert pyspark_tq.DefaultSource is querylib.spark.TqDataSource
    assert pyspark_tq.DefaultSource.name() == "tq"
