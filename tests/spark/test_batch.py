"""Batch reads of a topic: exact offset ranges, the schema, splitting, data loss."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")
from pyspark.sql.pandas.types import to_arrow_schema

from conftest import RunningBroker
from sluice.spark.journal_source import journal_schema
from sluice.spark.offsets import fetch_offsets
from sluice.spark.schema import JOURNAL_ARROW_SCHEMA, TOPIC_ARROW_SCHEMA
from sluice.spark.source import topic_schema

from .helpers import publish

pytestmark = pytest.mark.spark


def read(spark: Any, broker: RunningBroker, topic: str, **options: str) -> Any:
    reader = spark.read.format("sluice").option("broker", broker.address).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_reads_exactly_the_range(spark: Any, spark_broker: RunningBroker) -> None:
    topic = "/topic/batch.range"
    publish(spark_broker, topic, [b"m%d" % i for i in range(100)], kind="test")
    assert fetch_offsets(spark_broker.address, topic) == (1, 100)

    rows = read(spark, spark_broker, topic).orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(1, 101))
    assert [r.body for r in rows] == [b"m%d" % i for i in range(100)]
    first = rows[0]
    assert first.destination == topic
    assert first.message_id
    assert isinstance(first.timestamp, datetime.datetime)
    assert first.headers["kind"] == "test"
    assert first.headers["n"] == "0"
    assert "x-offset" not in first.headers

    window = read(
        spark,
        spark_broker,
        topic,
        startingOffsets="10",
        endingOffsets="20",
        minPartitions="3",
    )
    assert window.rdd.getNumPartitions() == 3
    assert sorted(r.offset for r in window.collect()) == list(range(10, 20))


def test_schema_is_the_documented_one(spark: Any, spark_broker: RunningBroker) -> None:
    topic = "/topic/batch.schema"
    publish(spark_broker, topic, [b"x"])
    df = read(spark, spark_broker, topic)
    assert df.schema.simpleString() == (
        "struct<offset:bigint,destination:string,message_id:string,timestamp:timestamp,"
        "headers:map<string,string>,body:binary>"
    )


def test_arrow_schema_matches_spark(spark: Any) -> None:
    assert to_arrow_schema(topic_schema(), timezone="UTC").equals(TOPIC_ARROW_SCHEMA)
    assert to_arrow_schema(journal_schema(), timezone="UTC").equals(JOURNAL_ARROW_SCHEMA)


def test_empty_range_reads_nothing(spark: Any, spark_broker: RunningBroker) -> None:
    topic = "/topic/batch.empty"
    assert read(spark, spark_broker, topic, failOnUnknownTopic="false").count() == 0
