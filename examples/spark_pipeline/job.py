"""A Structured Streaming job: sensor events from a Sluice topic, aggregated by window and key.

    python job.py --broker HOST:PORT --work DIR [--available-now [--check] | --run-seconds S]
    spark-submit --py-files sluice.zip job.py --broker HOST:PORT --work DIR ...

Two queries read the topic `/topic/pipeline.events` with the `sluice` source (each with its own
checkpoint and durable subscription) and count, average and take the maximum of the values per
10-second event-time window and key, with a 5-second watermark. Finished windows go

- to Parquet files under `DIR/windows` (Spark's file sink), and
- to the queue `/queue/pipeline.windows` as JSON messages (the `sluice` sink, exactly once).

With `--available-now` both queries read what the topic holds and stop, then the job prints the
Parquet results; `--check` then compares them with a batch aggregate of the whole topic and fails
unless every event is counted in exactly one written window. Without `--available-now` the
queries run for `--run-seconds` (or until interrupted).

The producer ends with a `_tick` event 30 s ahead in event time, so that the watermark passes
every window and a bounded run closes them all. The tick must reach the watermark: a filter on
`key` before the aggregation would not do, as Spark pushes a filter that does not use the
event-time column below `withWatermark`, and the last windows would then stay open forever. So
ticks are aggregated like events, in a group of their own, counted by none and dropped after the
aggregation by a filter on the count (which cannot be pushed below it).
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
TICK_KEY = "_tick"
WINDOW = "10 seconds"
WATERMARK = "5 seconds"
WINDOW_COLUMNS = ("window_start", "window_end", "key", "events")


def events(spark: Any, broker: str, topic: str, subscription: str | None) -> Any:
    """The topic's events as `event_time, key, value`, ticks included, read as a stream."""
    df = (
        spark.readStream.format("sluice")
        .option("broker", broker)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "20000")
        .option("minPartitions", "2")
    )
    if subscription is not None:
        df = df.option("subscription", subscription)
    return parse(df.load())


def parse(messages: Any) -> Any:
    """`event_time, key, value` from the JSON bodies of the topic's messages."""
    parsed = messages.select(sf.from_json(sf.col("body").cast("string"), EVENT_SCHEMA).alias("e"))
    return parsed.select(
        sf.timestamp_millis(sf.col("e.ts")).alias("event_time"), "e.key", "e.value"
    )


def aggregate(parsed: Any) -> Any:
    """Count, mean and maximum per window and key; ticks are counted by no window."""
    is_event = sf.col("key") != TICK_KEY
    return (
        parsed.groupBy(sf.window("event_time", WINDOW), "key")
        .agg(
            sf.count(sf.when(is_event, True)).alias("events"),
            sf.round(sf.avg("value"), 3).alias("mean"),
            sf.max("value").alias("max"),
        )
        # On the aggregate's output: Spark cannot push this below the watermark.
        .where(sf.col("events") > 0)
        .select(
            sf.col("window.start").alias("window_start"),
            sf.col("window.end").alias("window_end"),
            "key",
            "events",
            "mean",
            "max",
        )
    )


def windows(spark: Any, broker: str, topic: str, subscription: str) -> Any:
    """The windowed aggregate of the topic's events (append mode: only finished windows)."""
    return aggregate(
        events(spark, broker, topic, subscription).withWatermark("event_time", WATERMARK)
    )


def start_queries(
    spark: Any, broker: str, topic: str, queue: str, work: str, *, available_now: bool
) -> list[Any]:
    """Start the two queries: finished windows to Parquet under `work`, and to `queue`."""
    work = work.rstrip("/")
    to_parquet = (
        windows(spark, broker, topic, "pipeline-parquet")
        .writeStream.format("parquet")
        .option("path", f"{work}/windows")
        .option("checkpointLocation", f"{work}/checkpoints/parquet")
    )
    to_queue = (
        windows(spark, broker, topic, "pipeline-queue")
        .select(
            sf.to_json(sf.struct("*")).alias("body"),
            sf.create_map(sf.lit("key"), sf.col("key")).alias("headers"),
        )
        .writeStream.format("sluice")
        .option("broker", broker)
        .option("destination", queue)
        .option("checkpointLocation", f"{work}/checkpoints/queue")
    )
    if available_now:
        to_parquet = to_parquet.trigger(availableNow=True)
        to_queue = to_queue.trigger(availableNow=True)
    return [to_parquet.start(), to_queue.start()]


def check(spark: Any, broker: str, topic: str, work: str) -> list[str]:
    """What is wrong with the Parquet output of a finished run (nothing: an empty list).

    Expected: the windows of a batch aggregate over everything the topic holds, each (window,
    key) once with the same count. Meaningful after an `--available-now` run over a topic that
    ends with a tick.
    """
    whole = parse(
        spark.read.format("sluice").option("broker", broker).option("topic", topic).load()
    )
    expected = sorted(tuple(r) for r in aggregate(whole).select(*WINDOW_COLUMNS).collect())
    written = sorted(
        tuple(r)
        for r in spark.read.parquet(f"{work.rstrip('/')}/windows").select(*WINDOW_COLUMNS).collect()
    )
    problems = []
    events_in = sum(r[3] for r in expected)
    events_out = sum(r[3] for r in written)
    if events_out != events_in:
        problems.append(f"{events_out} events in written windows, {events_in} on the topic")
    missing = sorted(set(expected) - set(written))
    extra = sorted(set(written) - set(expected))
    doubled = len(written) - len(set(written))
    for row in missing[:5]:
        problems.append(f"missing window {row[0]} {row[2]}: {row[3]} events")
    for row in extra[:5]:
        problems.append(f"unexpected window {row[0]} {row[2]}: {row[3]} events")
    if doubled:
        problems.append(f"{doubled} windows written more than once")
    return problems


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
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --available-now: fail unless every event is in exactly one written window",
    )
    args = parser.parse_args()
    if args.check and not args.available_now:
        parser.error("--check needs --available-now")

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

    queries = start_queries(
        spark, args.broker, args.topic, args.queue, args.work, available_now=args.available_now
    )
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

    work = args.work.rstrip("/")
    results = spark.read.parquet(f"{work}/windows").orderBy("window_start", "key")
    print(f"{results.count()} finished windows in {work}/windows:")
    results.show(12, truncate=False)
    problems = check(spark, args.broker, args.topic, work) if args.check and not failed else []
    for problem in problems:
        print(f"check: {problem}", file=sys.stderr)
    if args.check and not failed and not problems:
        print("check: every event is counted in exactly one written window")
    spark.stop()
    sys.exit(1 if failed or problems else 0)


if __name__ == "__main__":
    main()
