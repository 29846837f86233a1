"""Credentials kept out of Spark's plans: a read and a write planned with a passcode and a TLS key
password, their `explain` output and the plan's string searched for both."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

from conftest import RunningBroker

pytestmark = pytest.mark.spark

PASSCODE = "pc-s3cret-42"
KEY_PASSWORD = "kp-s3cret-43"


def _plan_text(df: Any) -> str:
    execution = df._jdf.queryExecution()
    return str(execution.toString()) + str(execution.analyzed().toString())


def test_a_read_plan_shows_no_credentials(spark: Any, spark_broker: RunningBroker) -> None:
    df = (
        spark.read.format("sluice")
        .option("broker", spark_broker.address)
        .option("topic", "/topic/plan")
        .option("login", "someone")
        .option("passcode", PASSCODE)
        .option("tls.keyPassword", KEY_PASSWORD)
        .option("tls.cert", "/etc/sluice/spark.pem")
        .option("tls.key", "/etc/sluice/spark.key")
        .load()
    )
    text = _plan_text(df)
    assert "BatchScan sluice" in text
    assert PASSCODE not in text
    assert KEY_PASSWORD not in text
