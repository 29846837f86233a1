"""The Spark source and the Sluice sink across a failover: two brokers on one data directory
(`[ha] role = "auto"`), both queries given both addresses, the master killed with SIGKILL while
they run. Tasks that were reading or writing fail and are tried again; a connection made during
the failover waits for the new master. Every offset reaches Parquet once, and every message
reaches the sink's queue once (a replayed transaction is dropped by its dedup ids)."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import functions as sf

from ha.harness import ha_pair
from sluice.spark.options import sink_options
from sluice.spark.produce import send_transaction
from waiting import wait_until

from .helpers import drain_queue

pytestmark = pytest.mark.crash

TOPIC = "/topic/failover.events"
QUEUE = "/queue/failover.out"
FIRST, LATER = 400, 200
# Topics keep their messages (the source reads them as a log); small files, many rollovers.
RETENTION = "\n[policy]\nretention_s = 3600.0\n"


def _publish(brokers: str, start: int, count: int) -> None:
    options = sink_options({"broker": brokers, "destination": TOPIC, "persistent": "true"})
    rows = ((None, {}, b"e%d" % i) for i in range(start, start + count))
    send_transaction(options, rows, f"failover-{uuid.uuid4().hex}:")


def _commits(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else 0


def test_a_stream_and_the_sink_survive_a_failover_exactly_once(spark: Any, tmp_path: Path) -> None:
    with ha_pair(tmp_path, lease_s=2.0, extra=RETENTION) as pair:
        master = pair.launch("a")
        master.wait_listening()
        slave = pair.launch("b")
        slave.wait_log("waiting for the lease")
        brokers = pair.brokers
        _publish(brokers, 0, FIRST)

        def source(name: str) -> Any:
            return (
                spark.readStream.format("sluice")
                .option("broker", brokers)
                .option("topic", TOPIC)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "50")
                .option("minPartitions", "2")
                .option("subscription", name)
                .load()
            )

        work = tmp_path / "spark"
        parquet = (
            source("failover-parquet")
            .select("offset", sf.col("body").cast("string").alias("body"))
            .writeStream.format("parquet")
            .option("path", str(work / "parquet"))
            .option("checkpointLocation", str(work / "checkpoint-parquet"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        sink = (
            source("failover-sink")
            .select(
                sf.col("body"),
                sf.create_map(sf.lit("offset"), sf.col("offset").cast("string")).alias("headers"),
            )
            .writeStream.format("sluice")
            .option("broker", brokers)
            .option("destination", QUEUE)
            .option("checkpointLocation", str(work / "checkpoint-sink"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        queries = [parquet, sink]
        try:
            # Kill the master with both queries under way, neither done with the topic.
            wait_until(
                lambda: (
                    _commits(work / "checkpoint-parquet") >= 2
                    and _commits(work / "checkpoint-sink") >= 2
                ),
                timeout=120,
                what="two batches of each query",
            )
            master.kill()
            slave.wait_listening(60)
            _publish(brokers, FIRST, LATER)
            for query in queries:
                query.processAllAvailable()
                assert query.exception() is None
        finally:
            for query in queries:
                query.stop()

        total = FIRST + LATER
        rows = spark.read.parquet(str(work / "parquet")).collect()
        counts = Counter(r.offset for r in rows)
        assert sorted(counts) == list(range(1, total + 1))
        assert max(counts.values()) == 1
        assert {r.offset: r.body for r in rows} == {i + 1: f"e{i}" for i in range(total)}

        frames = drain_queue(brokers, QUEUE, total)
        sent = Counter(int(f.headers["offset"]) for f in frames)
        assert len(frames) == total, sorted(o for o, n in sent.items() if n > 1)[:10]
        assert sorted(sent) == list(range(1, total + 1))
        assert slave.stop() == 0
