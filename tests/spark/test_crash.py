"""A streaming driver killed with SIGKILL and restarted: nothing lost, nothing doubled.

`driver.py` runs two queries on one topic: into Parquet (Spark's file sink) and into a queue
(the sluice sink). The driver is killed while the sink's batch is on the broker but not in Spark's
commit log, with more messages arriving; a restart with availableNow finishes the topic. Then
the Parquet output (read through its metadata log, as any Spark reader does) holds every offset
exactly once, and the queue holds every message exactly once: the replayed batch re-sent the same
dedup ids and the broker dropped them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")

from conftest import RunningBroker

from .conftest import QUIET_LOG4J, spark_environment
from .driver import start_queries
from .helpers import drain_queue, publish

pytestmark = [pytest.mark.spark, pytest.mark.crash]

DRIVER = Path(__file__).with_name("driver.py")
FIRST, LATER = 2000, 1000
WAIT_S = 120.0


def run_driver(
    broker: str, topic: str, queue: str, work: Path, mode: str
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, **spark_environment())
    with open(work / f"driver-{mode}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), broker, topic, queue, str(work), mode],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver, its JVM and every Python worker under them."""
    tree = [proc.pid]
    with contextlib.suppress(psutil.NoSuchProcess):
        tree += [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)


def wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"driver exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            kill_tree(proc)
            pytest.fail(f"{path.name} did not appear:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def test_killed_driver_restarts_exactly_once(
    spark: Any, spark_broker: RunningBroker, tmp_path: Path
) -> None:
    topic, queue = "/topic/crash.events", "/queue/crash.out"
    (tmp_path / "log4j").write_text(QUIET_LOG4J)
    markers = tmp_path / "markers"
    publish(spark_broker, topic, [b"e%d" % i for i in range(FIRST)])

    first = run_driver(spark_broker.address, topic, queue, tmp_path, "crash")
    log = tmp_path / "driver-crash.log"
    try:
        wait_for(markers / "sink-batch-0", first, log)
        publish(spark_broker, topic, [b"e%d" % i for i in range(FIRST, FIRST + LATER)])
        # The sink's batch 2 is on the broker; its commit is held: kill everything now.
        wait_for(markers / "sink-batch-2", first, log)
        wait_for(tmp_path / "checkpoint-parquet" / "commits" / "0", first, log)
    finally:
        kill_tree(first)
    assert first.returncode == -signal.SIGKILL
    assert not (tmp_path / "checkpoint-sink" / "commits" / "2").exists()

    # Restart from the checkpoints (here in the test's own Spark session) and finish the topic.
    for query in start_queries(spark, spark_broker.address, topic, queue, tmp_path, "finish"):
        query.awaitTermination(WAIT_S)
        assert query.exception() is None

    total = FIRST + LATER
    rows = spark.read.parquet(str(tmp_path / "parquet")).collect()
    counts = Counter(r.offset for r in rows)
    assert sorted(counts) == list(range(1, total + 1))
    assert max(counts.values()) == 1
    assert {r.offset: r.body for r in rows} == {i + 1: f"e{i}" for i in range(total)}

    frames = drain_queue(spark_broker.address, queue, total)
    sent = Counter(int(f.headers["offset"]) for f in frames)
    assert len(frames) == total
    assert sorted(sent) == list(range(1, total + 1))
    assert {f.body for f in frames} == {b"e%d" % i for i in range(total)}
