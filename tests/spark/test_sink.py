"""The sluice sink from batch DataFrames: bodies, headers, destinations, no duplicates."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")
from pyspark.sql import functions as sf

from conftest import RunningBroker

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
