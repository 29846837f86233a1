"""The pipeline example (`examples/spark_pipeline`) on a small input: no event lost or doubled.

The producer ends with a tick that moves the watermark past every window, so an availableNow run
must write every window: each event counted in exactly one window, in Parquet and on the queue.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")

from conftest import RunningBroker

from .helpers import drain_queue

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline"
WINDOW_MS = 10_000


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"spark_pipeline_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def millis(value: datetime.datetime | str) -> int:
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if value.tzinfo is None:  # Spark hands out naive datetimes in the session's zone, UTC here
        value = value.replace(tzinfo=datetime.UTC)
    return int(value.timestamp() * 1000)


def test_every_event_is_counted_in_exactly_one_window(
    spark: Any, spark_broker: RunningBroker, tmp_path: Path
) -> None:
    producer, job = load("producer"), load("job")
    topic, queue = "/topic/example.events", "/queue/example.windows"
    events = producer.publish_events(spark_broker.address, topic, 1500, keys=3)
    expected = Counter((e["ts"] // WINDOW_MS * WINDOW_MS, e["key"]) for e in events)
    # The last window holds events: it is the one a watermark left behind would keep open.
    last = max(expected)
    assert expected[last] > 0

    work = str(tmp_path)
    for query in job.start_queries(
        spark, spark_broker.address, topic, queue, work, available_now=True
    ):
        query.awaitTermination(180)
        assert query.exception() is None

    rows = spark.read.parquet(f"{work}/windows").collect()
    written = Counter({(millis(r.window_start), r.key): r.events for r in rows})
    assert len(rows) == len(written), "a window was written twice"
    assert written == expected
    assert job.check(spark, spark_broker.address, topic, work) == []

    frames = drain_queue(spark_broker.address, queue, len(expected))
    sent = [json.loads(f.body) for f in frames]
    assert Counter((millis(w["window_start"]), w["key"]) for w in sent) == Counter(expected.keys())
    assert {(millis(w["window_start"]), w["key"]): w["events"] for w in sent} == expected
