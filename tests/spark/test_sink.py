"""The sluice sink from batch DataFrames: bodies, headers, destinations, no duplicates."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")
from pyspark import cloudpickle
from pyspark.sql import functions as sf

import sluice.spark
from conftest import RunningBroker

from . import flaky
from .helpers import drain_queue

pytestmark = pytest.mark.spark


def test_batch_write_sends_each_row_once(spark: Any, spark_broker: RunningBroker) -> None:
    rows = [
        (f"body-{i}", {"key": str(i % 3)}, "/queue/sink.a" if i % 2 else None) for i in range(40)
    ]
    df = spark.createDataFrame(rows, "body STRING, headers MAP<STRING,STRING>, destination STRING")
    df = df.repartition(3)
    writer = (
        df.write.format("sluice")
        .mode("append")
        .option("broker", spark_broker.address)
        .option("destination", "/queue/sink.b")
        .option("writeId", "sink-test-1")
    )
    writer.save()
    # The same rows written again with the same writeId: every dedup id is known, nothing is sent.
    writer.save()

    to_a = drain_queue(spark_broker.address, "/queue/sink.a", 20)
    to_b = drain_queue(spark_broker.address, "/queue/sink.b", 20)
    assert sorted(f.body for f in to_a) == sorted(f"body-{i}".encode() for i in range(1, 40, 2))
    assert sorted(f.body for f in to_b) == sorted(f"body-{i}".encode() for i in range(0, 40, 2))
    for frame in to_a + to_b:
        number = int(frame.body.split(b"-")[1])
        assert frame.headers["key"] == str(number % 3)
        assert frame.headers["persistent"] == "true"
        assert frame.headers["x-dedup-id"].startswith("sink-test-1:b:")


def test_binary_bodies_round_trip_through_a_topic(spark: Any, spark_broker: RunningBroker) -> None:
    payloads = [bytes([i]) * i + b"\x00\n:\\" for i in range(1, 30)]
    df = spark.createDataFrame([(p,) for p in payloads], "body BINARY")
    (
        df.write.format("sluice")
        .mode("append")
        .option("broker", spark_broker.address)
        .option("destination", "/topic/sink.binary")
        .save()
    )
    back = (
        spark.read.format("sluice")
        .option("broker", spark_broker.address)
        .option("topic", "/topic/sink.binary")
        .load()
        .select(sf.col("body"))
        .collect()
    )
    assert sorted(r.body for r in back) == sorted(payloads)


def test_rows_without_destination_are_refused(spark: Any, spark_broker: RunningBroker) -> None:
    df = spark.createDataFrame([("x",)], "body STRING")
    writer = df.write.format("sluice").mode("append").option("broker", spark_broker.address)
    with pytest.raises(Exception, match="no destination"):
        writer.save()


def test_only_append_mode_is_accepted(spark: Any, spark_broker: RunningBroker) -> None:
    df = spark.createDataFrame([("x",)], "body STRING")
    writer = df.write.format("sluice").option("broker", spark_broker.address)
    with pytest.raises(Exception, match="only appends"):
        writer.option("destination", "/queue/sink.mode").mode("overwrite").save()


def test_a_task_beyond_the_dedup_window_fails_before_its_commit(
    spark: Any, spark_broker: RunningBroker
) -> None:
    queue = "/queue/sink.window"
    df = spark.range(30, numPartitions=1).select(sf.col("id").cast("string").alias("body"))
    writer = (
        df.write.format("sluice")
        .mode("append")
        .option("broker", spark_broker.address)
        .option("destination", queue)
        .option("dedupWindow", "20")
    )
    with pytest.raises(Exception, match=r"limit dedupWindow=20 exceeded.*/queue/sink\.window"):
        writer.save()
    assert drain_queue(spark_broker.address, queue, 0, quiet_s=1.0) == []
    # Spread over partitions of at most 20 rows, the same rows go.
    (
        df.repartition(2)
        .write.format("sluice")
        .mode("append")
        .option("broker", spark_broker.address)
        .option("destination", queue)
        .option("dedupWindow", "20")
        .save()
    )
    frames = drain_queue(spark_broker.address, queue, 30, quiet_s=1.0)
    assert Counter(f.body for f in frames) == Counter(str(i).encode() for i in range(30))


@pytest.fixture(scope="module")
def flaky_sink(spark: Any) -> str:
    cloudpickle.register_pickle_by_value(flaky)
    sluice.spark.register_data_source(spark, flaky.FlakySource)
    return flaky.FlakySource.name()


@pytest.mark.parametrize("failure", ["midway", "after-commit"])
def test_a_retried_task_sends_each_row_once(
    spark: Any, spark_broker: RunningBroker, flaky_sink: str, failure: str, tmp_path: Path
) -> None:
    queue = f"/queue/sink.retry.{failure}"
    rows = 400
    pad = "x" * 4000  # 100 rows fill the sink's write buffer more than once: they reach the broker
    df = spark.range(rows, numPartitions=2).select(
        sf.concat(sf.lit("row-"), sf.col("id").cast("string"), sf.lit(":" + pad)).alias("body")
    )
    dropped_before = spark_broker.stats().get("duplicates_dropped", 0)
    (
        df.write.format(flaky_sink)
        .mode("append")
        .option("broker", spark_broker.address)
        .option("destination", queue)
        .option("failure", failure)
        .option("markers", str(tmp_path))
        .save()
    )
    # Partition 0 ran twice, partition 1 once.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p0-a0", "p0-a1", "p1-a0"]

    frames = drain_queue(spark_broker.address, queue, rows, quiet_s=1.0)
    expected = Counter(f"row-{i}:{pad}".encode() for i in range(rows))
    assert Counter(f.body for f in frames) == expected
    dropped = spark_broker.stats().get("duplicates_dropped", 0) - dropped_before
    # The committed first attempt's rows came again and the broker dropped every one of them;
    # the attempt that died before its COMMIT left no id behind to drop.
    assert dropped == (rows // 2 if failure == "after-commit" else 0)
