"""The PySpark data source `tq` (DESIGN §7): read and write tq topics from Spark.

    spark = querylib.spark.session()            # local session, tq registered
    df = spark.read.format("tq").option("subscribe", "orders").load("/var/lib/tq")
    q = (spark.readStream.format("tq").option("subscribe", "orders").load("/var/lib/tq")
         .writeStream.format("tq").option("topic", "copy").option("path", "/var/lib/tq")
         .option("checkpointLocation", "/tmp/cp").trigger(availableNow=True).start())
    df.write.format("tq").option("topic", "new").option("partitions", "4").save()
                                                # appends; creates a missing topic
    querylib.spark.register(spark)              # for a session made elsewhere
    querylib.spark.catalog_table(spark, "queries")   # a catalog collection as a table

Without option path the source talks to a cluster: the coordinator (option coordinator, else
TQ_COORDINATOR or $TQ_HOME/cluster.json) says where partitions are, and tasks read from and
write through the brokers hosting them.

Rows have Spark's Kafka source schema plus `tq_time` (see `_schema`; the headers column with
option includeHeaders=true, as in Kafka's source); options follow the
Kafka source's names (see `_options`). Spark also finds the source by itself through the
top-level module `pyspark_tq` (see `_session`).

    _schema.py    the row schema, for Spark and for Arrow
    _options.py   options, parsed and checked (pure)
    _plan.py      partitions, offsets, rate limits, task splits (pure)
    _columns.py   record batches -> Arrow record batches (the hot path; the record format
                  is read by querylib.records' scanning primitives, only Arrow is built here)
    _vector.py    ... the regular case, by numpy;  _pieces.py  ... the general case's
                  columns
    _local.py     a data dir's topics and offset ranges, read through querylib.log's
                  read-only segment reader
    _cluster.py   a cluster's topics: coordinator lookups, broker reads and producers
    _access.py    where partitions are; what a task runs to read a range
    _source.py    the DataSource and its batch and stream readers
    _writer.py    batch and stream writers (at-least-once)
    _catalog.py   catalog collections as tables
    _session.py   session() and register();  _java.py / _java_wrapper.py  finding Java
"""

from querylib.spark._catalog import catalog_table
from querylib.spark._errors import (
    BadOptionError,
    BadSchemaError,
    BrokerUnreachableError,
    DataLossError,
    JavaNotFoundError,
)
from querylib.spark._java import ensure_java
from querylib.spark._schema import ARROW_SCHEMA, ARROW_SCHEMA_NO_HEADERS, SCHEMA, SCHEMA_NO_HEADERS
from querylib.spark._session import register, session
from querylib.spark._source import TqDataSource
from querylib.spark._writer import TqCommitMessage

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_NO_HEADERS",
    "SCHEMA",
    "SCHEMA_NO_HEADERS",
    "BadOptionError",
    "BadSchemaError",
    "BrokerUnreachableError",
    "DataLossError",
    "JavaNotFoundError",
    "TqCommitMessage",
    "TqDataSource",
    "catalog_table",
    "ensure_java",
    "register",
    "session",
]
