"""The demo's Spark query: clicks per page per event-time window, from topic `clicks` into
topic `page_counts`, with Structured Streaming and the tq source and sink.

    tq submit querylib/examples/page_counts.py -- --checkpoint /tmp/pc-checkpoint

Spark reads `clicks` with spark.readStream.format("tq") (the coordinator and secret come from
the TQ_* variables the executor sets), takes each click's event time from `tq_time` (ms),
counts clicks per (window, page) in update mode and writes the counts with the tq sink (its batch
writer, called from foreachBatch: Spark refuses Update mode for a Python data source's stream
sink): each micro-batch publishes the new count of every (window, page) it changed, as JSON
{"page", "window_start", "window_end", "count"} with key "<window_start>|<page>" and tq_time =
window_start. `page_counts` is a changelog, like a compacted Kafka topic: the latest record of
a key is its count. That makes the sink's at-least-once delivery harmless: a retried task
writes the same counts again, and a key's records stay in batch order in its partition.

How it ends: the process also subscribes to `clicks` through querylib (which puts the
subscription in the catalog) and follows it to its end of stream. Once the generator has ended
every partition, everything it published is in the log, so `processAllAvailable()` lets Spark
drain it, and the query stops between micro-batches. Closing this query's publication of
`page_counts` then ends that stream, so its readers end too.

Must not: run without an executor's TQ_* variables or a `tq up` to find (it is a query).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import querylib

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

_POLL_SECONDS = 0.5  # how often the driver looks at the query's progress while it runs


class EndWatch:
    """Follows a topic through a querylib subscription on a thread of its own: records seen,
    the frontier, and whether every partition has ended."""

    def __init__(self, subscription: querylib.Subscription) -> None:
        self.subscription = subscription
        self.records = 0
        self.frontier = 0
        self.ended = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="end-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self.subscription:
                if isinstance(event, querylib.Data):
                    self.records += len(event.records)
                elif isinstance(event, querylib.Progress):
                    self.frontier = event.frontier
                elif isinstance(event, querylib.EndOfStream):
                    break
        except BaseException as exc:  # handed to the driver, which raises it
            self.failure = exc
        finally:
            self.ended.set()

    def close(self) -> None:
        self.subscription.close()
        self._thread.join(timeout=30)


def counts_query(spark: SparkSession, *, source: str, sink: str, window_seconds: int,
                 checkpoint: str, trigger_seconds: float) -> StreamingQuery:
    """Start the streaming query: clicks per page per window of event time, in update mode."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    clicks = (spark.readStream.format("tq")
              .option("subscribe", source).option("startingOffsets", "earliest").load())
    counts = (clicks
              .select(F.timestamp_millis("tq_time").alias("event_time"),
                      F.get_json_object(F.col("value").cast("string"), "$.page").alias("page"))
              .groupBy(F.window("event_time", f"{window_seconds} seconds"), "page")
              .count())
    start = F.unix_millis(F.col("window.start"))
    rows = counts.select(
        F.concat_ws("|", start.cast("string"), F.col("page")).alias("key"),
        F.to_json(F.struct(F.col("page"), start.alias("window_start"),
                           F.unix_millis(F.col("window.end")).alias("window_end"),
                           F.col("count"))).alias("value"),
        start.alias("tq_time"))
    # Spark takes Update mode only from sinks that declare it (SupportsStreamingUpdateAsAppend),
    # which a Python data source cannot: each micro-batch's updated counts go through the tq
    # batch sink instead. Delivery stays at-least-once; the changelog makes that harmless.
    def publish(batch: Any, batch_id: int) -> None:
        batch.write.format("tq").option("topic", sink).mode("append").save()

    return (rows.writeStream.outputMode("update").foreachBatch(publish)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{trigger_seconds} seconds").start())


def page_counts(ctx: querylib.Context, *, source: str, sink: str, window_seconds: int,
                checkpoint: str, trigger_seconds: float, timeout: float) -> int:
    watch = EndWatch(ctx.subscribe(source, serde="json", timeout=timeout))
    out = ctx.publish(sink, partition=querylib.Merge, serde="json")
    try:
        began = time.monotonic()
        print("starting Spark (a JVM and Python workers)...", flush=True)
        from querylib import spark as tq_spark  # imports pyspark: after registering

        spark = tq_spark.session("tq-page-counts")
        spark.sparkContext.setLogLevel("ERROR")
        print(f"Spark {spark.version} ready in {time.monotonic() - began:.1f}s", flush=True)
        try:
            query = counts_query(spark, source=source, sink=sink,
                                 window_seconds=window_seconds, checkpoint=checkpoint,
                                 trigger_seconds=trigger_seconds)
            reported = -1
            while not watch.ended.wait(_POLL_SECONDS):
                reported = _report(query, reported)
            if watch.failure is not None:
                raise watch.failure
            print(f"{source} ended ({watch.records} records): draining", flush=True)
            query.processAllAvailable()
            _report(query, reported)
            query.stop()
            if query.exception() is not None:
                raise RuntimeError(f"the Spark query failed: {query.exception()}")
        finally:
            spark.stop()
    finally:
        out.close()  # ends the stream of page_counts
        watch.close()
    print(f"counted {watch.records} clicks", flush=True)
    return watch.records


def _report(query: StreamingQuery, reported: int) -> int:
    """Print the micro-batches finished since batch `reported`; raise if the query died."""
    if not query.isActive and query.exception() is not None:
        raise RuntimeError(f"the Spark query failed: {query.exception()}")
    for progress in query.recentProgress:
        batch = progress["batchId"]
        if batch > reported and progress["numInputRows"]:
            print(f"batch {batch}: {progress['numInputRows']} clicks counted", flush=True)
        reported = max(reported, batch)
    return reported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="clicks")
    parser.add_argument("--sink", default="page_counts")
    parser.add_argument("--window", type=int, default=1, help="window, seconds of event time")
    parser.add_argument("--checkpoint", help="Spark checkpoint dir (default: a new temp dir)")
    parser.add_argument("--trigger", type=float, default=1.0,
                        help="seconds between micro-batches (default 1)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the source topic to appear")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="tq-page-counts-")
    querylib.execute(lambda ctx: page_counts(
        ctx, source=args.source, sink=args.sink, window_seconds=args.window,
        checkpoint=checkpoint, trigger_seconds=args.trigger, timeout=args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
