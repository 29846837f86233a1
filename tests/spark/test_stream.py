"""Streaming reads: admission control, availableNow, the durable cursor, data loss."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")
from pyspark.errors import PySparkException

from conftest import RunningBroker, start_broker
from sluice.spark.offsets import fetch_offsets, move_cursor
from sluice.spark.options import source_options

from .helpers import publish

pytestmark = pytest.mark.spark


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


def test_data_loss_fails_or_is_skipped(
    spark: Any, lossy_broker: RunningBroker, tmp_path: Path
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

    batch = spark.read.format("sluice").option("broker", address).option("topic", topic)
    with pytest.raises(PySparkException, match=r"offsets 1 to 10 of /topic/lossy are lost"):
        batch.option("startingOffsets", "1").load().collect()
    rows = batch.option("startingOffsets", "1").option("failOnDataLoss", "false").load().collect()
    assert sorted(r.offset for r in rows) == list(range(11, 21))

    df = stream(spark, address, topic, startingOffsets="1", failOnDataLoss="false")
    run_available_now(df, tmp_path)
    assert sorted(r.offset for r in output(spark, tmp_path)) == list(range(11, 21))
