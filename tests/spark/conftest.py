"""Fixtures for the Spark connector tests: one local Spark session and one broker per session.

Every test module starts with `pytest.importorskip("pyspark")`, and the `spark` fixture skips
when no Java is found: without the `spark` extra or a JDK the tests are skipped, not failed.
The session follows `docs/spark.md`: `local[2]` (with a second attempt for failed tasks), no UI,
two shuffle partitions, UTC, quiet logs.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sluice.spark
from conftest import RunningBroker, start_broker

QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""

# Spark settings for tests and the crash-test driver (docs/spark.md, "Running Spark locally").
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "30s",
}


def spark_environment() -> dict[str, str]:
    """Environment variables a Spark driver (in-process or a subprocess) needs."""
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


def log4j_file(directory: Path) -> Path:
    """Write the quiet log configuration into `directory` and return its path."""
    path = directory / "log4j2.properties"
    path.write_text(QUIET_LOG4J)
    return path


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Spark session with the Sluice data sources registered."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java found (Spark needs a JDK 17+ on PATH or in JAVA_HOME)")
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only once pyspark is known present

    os.environ.update(spark_environment())
    log_config = log4j_file(tmp_path_factory.mktemp("spark-conf"))
    # Two threads, and a failed task gets a second attempt as on a cluster (spark.task.maxFailures
    # is ignored in local mode): the retry tests need it.
    builder = SparkSession.builder.master("local[2,2]").appName("sluice-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    builder = builder.config(
        "spark.driver.extraJavaOptions",
        f"-Dlog4j.configurationFile=file:{log_config} -XX:TieredStopAtLevel=1",
    )
    session = builder.getOrCreate()
    sluice.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_broker() -> Iterator[RunningBroker]:
    """A broker (memory store) whose topics keep their messages for an hour."""
    running = start_broker(
        policy={"retention_s": 3600.0},
        limits={"destination_memory_limit_bytes": 256 * 1024 * 1024},
    )
    try:
        yield running
    finally:
        running.stop()
