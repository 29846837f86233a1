"""A Spark driver run as a subprocess by the crash test: two streaming queries on one topic.

    python driver.py BROKER TOPIC QUEUE WORKDIR MODE

- `parquet`: the topic into Parquet files (`WORKDIR/parquet`), through Spark's file sink;
- `sink`: the topic into the queue, through the sluice sink.

MODE `crash` runs both until the sink has written batch `KILL_AT_BATCH` to the broker and then
holds that batch's commit, so the test can SIGKILL the whole process tree at the worst moment:
the broker has the batch, Spark's checkpoint does not. MODE `finish` runs both with
`availableNow` and exits when everything is read; the test restarts the queries that way in its
own Spark session (`start_queries`), which spares a second JVM start.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

import sluice.spark
from sluice.spark.options import sink_options
from sluice.spark.sink import SluiceStreamWriter
from sluice.spark.source import SluiceDataSource

KILL_AT_BATCH = 2
# Small batches while the crash is staged; the finishing run may take bigger ones (the replayed
# batch keeps the range written in the offset log).
OFFSETS_PER_BATCH = {"crash": 200, "finish": 2000}


class HoldingWriter(SluiceStreamWriter):
    """The sluice stream writer, but its commit of batch `KILL_AT_BATCH` never returns."""

    def __init__(self, options: Any, schema: Any, markers: str) -> None:
        super().__init__(options, schema)
        self.markers = markers

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        Path(self.markers, f"sink-batch-{batchId}").touch()
        if batchId == KILL_AT_BATCH:
            while True:  # the tasks have committed to the broker; Spark never will
                time.sleep(1)
        super().commit(messages, batchId)


class HoldingSource(SluiceDataSource):
    """`format("sluice-holding")`: the sluice source and a sink that holds one commit."""

    @classmethod
    def name(cls) -> str:
        return "sluice-holding"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        # `markers` is this test sink's own option: the sluice sink would refuse it.
        options = {k: v for k, v in self.options.items() if k.lower() != "markers"}
        return HoldingWriter(sink_options(options), schema, self.options["markers"])


def start_queries(
    spark: Any, broker: str, topic: str, queue: str, work: Path, mode: str
) -> list[Any]:
    """Start both queries on `spark` (see the module docstring); return them."""
    markers = work / "markers"
    markers.mkdir(parents=True, exist_ok=True)

    def source(name: str) -> Any:
        return (
            spark.readStream.format("sluice")
            .option("broker", broker)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(OFFSETS_PER_BATCH[mode]))
            .option("minPartitions", "2")
            .option("subscription", name)
            .load()
        )

    parquet = (
        source("crash-parquet")
        .select("offset", sf.col("body").cast("string").alias("body"))
        .writeStream.format("parquet")
        .option("path", str(work / "parquet"))
        .option("checkpointLocation", str(work / "checkpoint-parquet"))
    )
    sink = (
        source("crash-sink")
        .select(
            sf.col("body"),
            sf.create_map(sf.lit("offset"), sf.col("offset").cast("string")).alias("headers"),
        )
        .writeStream.format("sluice-holding" if mode == "crash" else "sluice")
        .option("broker", broker)
        .option("destination", queue)
        .option("checkpointLocation", str(work / "checkpoint-sink"))
    )
    if mode == "crash":
        sink = sink.option("markers", str(markers))
    if mode == "finish":
        parquet = parquet.trigger(availableNow=True)
        sink = sink.trigger(availableNow=True)
    return [parquet.start(), sink.start()]


def main() -> None:
    broker, topic, queue, workdir, mode = sys.argv[1:6]
    work = Path(workdir)
    logging.basicConfig(level=logging.WARNING)
    builder = SparkSession.builder.master("local[2]").appName(f"sluice-crash-{mode}")
    java_options = f"-Dlog4j.configurationFile=file:{work / 'log4j'} -XX:TieredStopAtLevel=1"
    for key, value in (
        ("spark.ui.enabled", "false"),
        ("spark.ui.showConsoleProgress", "false"),
        ("spark.sql.shuffle.partitions", "2"),
        ("spark.driver.memory", "1g"),
        ("spark.sql.session.timeZone", "UTC"),
        ("spark.driver.extraJavaOptions", java_options),
    ):
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    sluice.spark.register(spark)
    sluice.spark.register_data_source(spark, HoldingSource)
    queries = start_queries(spark, broker, topic, queue, work, mode)
    Path(work, "markers", f"started-{mode}-{os.getpid()}").touch()
    for query in queries:
        query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
