"""Kafka's columns: a Kafka pipeline ports by changing the format and the options."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")
from pyspark.sql import functions as sf
from pyspark.sql.pandas.types import to_arrow_schema

from conftest import RunningBroker
from sluice.spark.schema import KAFKA_ARROW_SCHEMA
from sluice.spark.source import topic_schema

from .helpers import publish

pytestmark = pytest.mark.spark


def test_kafka_arrow_schema_matches_spark() -> None:
    assert to_arrow_schema(topic_schema("kafka"), timezone="UTC").equals(KAFKA_ARROW_SCHEMA)


def test_read_with_kafka_columns(spark: Any, spark_broker: RunningBroker) -> None:
    topic = "/topic/kafka.read"
    publish(spark_broker, topic, [b"v0", b"v1"], JMSXGroupID="user-7", region="eu")
    df = (
        spark.read.format("sluice")
        .option("broker", spark_broker.address)
        .option("topic", "kafka.read")
        .option("schema", "kafka")
        .load()
    )
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    rows = df.orderBy("offset").collect()
    assert [(r.key, r.value, r.topic, r.partition, r.offset) for r in rows] == [
        (b"user-7", b"v0", "kafka.read", 0, 1),
        (b"user-7", b"v1", "kafka.read", 0, 2),
    ]
    assert rows[0].timestampType == 1
    headers = {h.key: h.value for h in rows[1].headers}
    assert headers["region"] == b"eu"
    assert headers["n"] == b"1"


def test_write_kafka_columns_and_read_them_back(spark: Any, spark_broker: RunningBroker) -> None:
    count = 20
    df = spark.range(count).select(
        sf.concat(sf.lit("k"), (sf.col("id") % 3).cast("string")).alias("key"),
        sf.concat(sf.lit("value-"), sf.col("id").cast("string")).cast("binary").alias("value"),
        sf.lit("kafka.written").alias("topic"),
        sf.array(
            sf.struct(sf.lit("id").alias("key"), sf.col("id").cast("string").cast("binary")).alias(
                "h"
            )
        ).alias("headers"),
    )
    (df.write.format("sluice").mode("append").option("broker", spark_broker.address).save())
    back = (
        spark.read.format("sluice")
        .option("broker", spark_broker.address)
        .option("topic", "/topic/kafka.written")
        .option("schema", "kafka")
        .load()
        .collect()
    )
    assert len(back) == count
    by_value = {r.value: r for r in back}
    for i in range(count):
        row = by_value[b"value-%d" % i]
        assert row.key == b"k%d" % (i % 3)
        assert {h.key: h.value for h in row.headers}["id"] == str(i).encode()
