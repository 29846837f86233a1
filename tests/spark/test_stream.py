"""Streaming reads: admission control, availableNow, the durable cursor, data loss."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import functions as sf
from pyspark.sql.streaming.datasource import ReadAllAvailable

from conftest import RunningBroker, start_broker
from sluice.spark.offsets import fetch_offsets, move_cursor
from sluice.spark.options import source_options
from sluice.spark.source import SluiceDataSource

from .helpers import publish

pytestmark = pytest.mark.spark

# Python workers' log records land in `spark.tvf.python_worker_logs()` while this is on.
WORKER_LOGGING = "spark.sql.pyspark.worker.logging.enabled"


def stream(spark: Any, broker: str, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("sluice").option("broker", broker).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df: Any, work: Path) -> Any:
    """Run `df` into Parquet files under `work` until it has read what is available now."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return query


def output(spark: Any, work: Path) -> list[Any]:
    """The rows the query committed so far."""
    if not (work / "out").exists():
        return []
    return list(spark.read.parquet(str(work / "out")).collect())


def durable_cursor(broker: RunningBroker, topic: str, name: str) -> int:
    def cursor() -> int:
        durables = broker.server.broker.destinations[topic].durables
        return int(durables[("sluice-spark", name)].cursor)

    return int(broker.call(cursor))


def test_available_now_honours_max_offsets_per_trigger(
    spark: Any, spark_broker: RunningBroker, tmp_path: Path
) -> None:
    topic = "/topic/stream.limit"
    publish(spark_broker, topic, [b"m%d" % i for i in range(250)])
    df = stream(
        spark,
        spark_broker.address,
        topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="100",
        subscription="limit-test",
    )
    query = run_available_now(df, tmp_path)

    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [100, 100, 50]
    rows = output(spark, tmp_path)
    assert sorted(r.offset for r in rows) == list(range(1, 251))
    assert {r.body for r in rows} == {b"m%d" % i for i in range(250)}
    # Batches 0 and 1 were committed when the next was planned: the cursor is before offset 201.
    assert durable_cursor(spark_broker, topic, "limit-test") == 200

    # A restart reads only what came since (the last batch is committed on the way).
    publish(spark_broker, topic, [b"n%d" % i for i in range(30)])
    run_available_now(df, tmp_path)
    assert sorted(r.offset for r in output(spark, tmp_path)) == list(range(1, 281))
    assert durable_cursor(spark_broker, topic, "limit-test") == 250


def test_latest_start_skips_what_was_there(
    spark: Any, spark_broker: RunningBroker, tmp_path: Path
) -> None:
    topic = "/topic/stream.latest"
    publish(spark_broker, topic, [b"old"] * 5)
    df = stream(spark, spark_broker.address, topic)  # startingOffsets defaults to latest
    run_available_now(df, tmp_path)
    assert output(spark, tmp_path) == []
    publish(spark_broker, topic, [b"new"] * 3)
    run_available_now(df, tmp_path)
    assert sorted(r.offset for r in output(spark, tmp_path)) == [6, 7, 8]


@pytest.fixture
def lossy_broker() -> Iterator[RunningBroker]:
    """A broker without retention: a topic keeps only what a durable subscription holds."""
    running = start_broker()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def worker_logs(spark: Any) -> Iterator[Any]:
    """Collect what the Python workers log; a function that returns the WARNING messages so far."""
    spark.conf.set(WORKER_LOGGING, "true")

    def warnings(logger: str) -> list[str]:
        logs = spark.tvf.python_worker_logs()
        found = logs.where((sf.col("level") == "WARNING") & (sf.col("logger") == logger))
        return [r.msg for r in found.select("msg").collect()]

    try:
        yield warnings
    finally:
        spark.conf.unset(WORKER_LOGGING)


def test_data_loss_fails_or_is_skipped(
    spark: Any, lossy_broker: RunningBroker, tmp_path: Path, worker_logs: Any
) -> None:
    topic = "/topic/lossy"
    address = lossy_broker.address
    publish(lossy_broker, topic, [b"gone%d" % i for i in range(10)])  # nobody keeps these
    keeper = source_options(
        {"broker": address, "topic": topic, "subscription": "keeper"}, streaming=True
    )
    move_cursor(keeper, 11)
    publish(lossy_broker, topic, [b"kept%d" % i for i in range(10)])
    assert fetch_offsets(address, topic) == (11, 20)
    lost = "offsets 1 to 10 of /topic/lossy are lost: the topic keeps offsets from 11 on"
    skipped = f"{lost}; skipped, as failOnDataLoss=false"

    batch = spark.read.format("sluice").option("broker", address).option("topic", topic)
    with pytest.raises(PySparkException, match=lost):
        batch.option("startingOffsets", "1").load().collect()
    assert skipped not in worker_logs("sluice.spark.fetch")
    rows = batch.option("startingOffsets", "1").option("failOnDataLoss", "false").load().collect()
    assert sorted(r.offset for r in rows) == list(range(11, 21))
    assert skipped in worker_logs("sluice.spark.fetch")

    # A stream fails the same way (the task that reads the range), and checkpoints nothing.
    failing = stream(spark, address, topic, startingOffsets="1")
    with pytest.raises(StreamingQueryException, match=lost):
        run_available_now(failing, tmp_path / "failing")
    assert list((tmp_path / "failing").glob("out/*.parquet")) == []
    assert not (tmp_path / "failing" / "checkpoint" / "commits" / "0").exists()

    df = stream(spark, address, topic, startingOffsets="1", failOnDataLoss="false")
    run_available_now(df, tmp_path)
    # (Spark 4.3 collects the logs of batch reads' workers, not of streaming reads'.)
    assert sorted(r.offset for r in output(spark, tmp_path)) == list(range(11, 21))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_stream_ahead_of_its_topic_fails_or_waits(
    spark: Any, tmp_path: Path, fail_on_data_loss: bool, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "/topic/stream.reset"
    kept = {"retention_s": 3600.0}
    first, replaced = start_broker(policy=kept), start_broker(policy=kept)
    try:
        publish(first, topic, [b"r%d" % i for i in range(5)])
        run_available_now(stream(spark, first.address, topic, startingOffsets="earliest"), tmp_path)
        assert sorted(r.offset for r in output(spark, tmp_path)) == [1, 2, 3, 4, 5]
        # The same query restarted on a broker whose store was replaced: the topic ends at 0.
        publish(replaced, "/queue/stream.unrelated", [b"x"])
        df = stream(spark, replaced.address, topic, failOnDataLoss=str(fail_on_data_loss).lower())
        message = (
            f"{topic} ends at offset 0, before the query's offset 6: was the topic deleted or "
            "the broker's store replaced?"
        )
        if fail_on_data_loss:
            with pytest.raises(StreamingQueryException, match=re.escape(message)):
                run_available_now(df, tmp_path)
        else:
            query = run_available_now(df, tmp_path)
            assert sum(p["numInputRows"] for p in query.recentProgress) == 0
            # The planner runs next to the driver: ask its code directly what it logs.
            reader = SluiceDataSource(
                {"broker": replaced.address, "topic": topic, "failOnDataLoss": "false"}
            ).streamReader(None)
            with caplog.at_level(logging.WARNING, logger="sluice.spark.source"):
                start = {"topic": topic, "offset": 6}
                assert reader.latestOffset(start, ReadAllAvailable()) == start
            assert f"{message}; waiting for it to pass offset 6" in caplog.text
        assert sorted(r.offset for r in output(spark, tmp_path)) == [1, 2, 3, 4, 5]
    finally:
        first.stop()
        replaced.stop()


def test_a_running_stream_takes_batches_of_at_most_max_offsets_in_min_partitions(
    spark: Any, spark_broker: RunningBroker, tmp_path: Path
) -> None:
    topic = "/topic/stream.trigger"
    publish(spark_broker, topic, [b"t%d" % i for i in range(250)])
    df = stream(
        spark,
        spark_broker.address,
        topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="100",
        minPartitions="3",
    )
    batches: dict[int, list[tuple[int, int, int]]] = {}

    def record(batch: Any, batch_id: int) -> None:
        # (first offset, last offset, rows) of each partition the source made for this batch
        parts = batch.groupBy(sf.spark_partition_id().alias("p")).agg(
            sf.min("offset"), sf.max("offset"), sf.count("*")
        )
        batches[batch_id] = sorted((r[1], r[2], r[3]) for r in parts.collect())

    query = (
        df.writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        query.processAllAvailable()
        publish(spark_broker, topic, [b"u%d" % i for i in range(120)])
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None

    ranges = [batches[i] for i in sorted(batches)]
    assert ranges == [
        [(1, 34, 34), (35, 67, 33), (68, 100, 33)],
        [(101, 134, 34), (135, 167, 33), (168, 200, 33)],
        [(201, 217, 17), (218, 234, 17), (235, 250, 16)],
        [(251, 284, 34), (285, 317, 33), (318, 350, 33)],
        [(351, 357, 7), (358, 364, 7), (365, 370, 6)],
    ]
