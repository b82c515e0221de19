"""Lets Spark find the `tq` data source by itself.

On the first use of a Python data source, Spark imports every top-level module named
`pyspark_*` and registers its `DefaultSource` under `DefaultSource.name()`, here "tq". The
implementation lives in `querylib.spark`; this module only names it.
"""

from querylib.spark import TqDataSource as DefaultSource

__all__ = ["DefaultSource"]
