"""A Structured Streaming job: sensor events from a Sluice topic, aggregated by window and key.

    python job.py --broker HOST:PORT --work DIR [--available-now | --run-seconds S]
    spark-submit --py-files sluice.zip job.py --broker HOST:PORT --work DIR ...

Two queries read the topic `/topic/pipeline.events` with the `sluice` source (each with its own
checkpoint and durable subscription) and count, average and take the maximum of the values per
10-second event-time window and key, with a 5-second watermark. Finished windows go

- to Parquet files under `DIR/windows` (Spark's file sink), and
- to the queue `/queue/pipeline.windows` as JSON messages (the `sluice` sink, exactly once).

With `--available-now` both queries read what the topic holds and stop, then the job prints the
Parquet results. Without it they run for `--run-seconds` (or until interrupted).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

import sluice.spark

EVENT_SCHEMA = "ts LONG, key STRING, value DOUBLE"


def windows(spark: Any, broker: str, topic: str, subscription: str) -> Any:
    """The windowed aggregate of the topic's events (append mode: only finished windows)."""
    events = (
        spark.readStream.format("sluice")
        .option("broker", broker)
        .option("topic", topic)
        .option("subscription", subscription)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "20000")
        .option("minPartitions", "2")
        .load()
    )
    parsed = events.select(
        sf.from_json(sf.col("body").cast("string"), EVENT_SCHEMA).alias("e")
    ).select(sf.timestamp_millis(sf.col("e.ts")).alias("event_time"), "e.key", "e.value")
    return (
        parsed.withWatermark("event_time", "5 seconds")
        # After the watermark, so that ticks move it without being counted.
        .where(sf.col("key") != "_tick")
        .groupBy(sf.window("event_time", "10 seconds"), "key")
        .agg(
            sf.count("*").alias("events"),
            sf.round(sf.avg("value"), 3).alias("mean"),
            sf.max("value").alias("max"),
        )
        .select(
            sf.col("window.start").alias("window_start"),
            sf.col("window.end").alias("window_end"),
            "key",
            "events",
            "mean",
            "max",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="127.0.0.1:61613")
    parser.add_argument("--topic", default="/topic/pipeline.events")
    parser.add_argument("--queue", default="/queue/pipeline.windows")
    parser.add_argument("--work", required=True, help="checkpoints and Parquet output (a URI)")
    parser.add_argument("--master", help="Spark master (spark-submit sets it; default local[*])")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--available-now", action="store_true", help="read what is there, stop")
    mode.add_argument("--run-seconds", type=float, help="run this long, then stop")
    args = parser.parse_args()

    builder = SparkSession.builder.appName("sluice-pipeline")
    if args.master:
        builder = builder.master(args.master)
    spark = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sluice.spark.register(spark)

    work = args.work.rstrip("/")
    to_parquet = (
        windows(spark, args.broker, args.topic, "pipeline-parquet")
        .writeStream.format("parquet")
        .option("path", f"{work}/windows")
        .option("checkpointLocation", f"{work}/checkpoints/parquet")
    )
    to_queue = (
        windows(spark, args.broker, args.topic, "pipeline-queue")
        .select(
            sf.to_json(sf.struct("*")).alias("body"),
            sf.create_map(sf.lit("key"), sf.col("key")).alias("headers"),
        )
        .writeStream.format("sluice")
        .option("broker", args.broker)
        .option("destination", args.queue)
        .option("checkpointLocation", f"{work}/checkpoints/queue")
    )
    if args.available_now:
        to_parquet = to_parquet.trigger(availableNow=True)
        to_queue = to_queue.trigger(availableNow=True)
    queries = [to_parquet.start(), to_queue.start()]
    deadline = None if args.run_seconds is None else time.monotonic() + args.run_seconds
    try:
        for query in queries:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            query.awaitTermination(timeout)
    finally:
        for query in queries:
            query.stop()
    failed = [q for q in queries if q.exception() is not None]
    for query in failed:
        print(f"query {query.name or query.id} failed: {query.exception()}", file=sys.stderr)

    results = spark.read.parquet(f"{work}/windows").orderBy("window_start", "key")
    print(f"{results.count()} finished windows in {work}/windows:")
    results.show(12, truncate=False)
    spark.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
