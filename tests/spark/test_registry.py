"""Registration: one data source used by queries started at the same time stays usable."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")

import sluice.spark
from conftest import RunningBroker
from sluice.spark import registry
from sluice.spark.source import SluiceDataSource

from .helpers import publish

pytestmark = pytest.mark.spark


def environment(spark: Any, name: str) -> Any:
    """The JVM map every Python runner of the registered source `name` shares."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    return manager.lookupDataSource(name).dataSourceCls().envVars()


def entries(env: Any) -> int:
    count, it = 0, env.entrySet().iterator()
    while it.hasNext():
        it.next()
        count += 1
    return count


def test_registered_sources_share_a_concurrent_environment(spark: Any) -> None:
    for name in ("sluice", "sluice-journal"):
        env = environment(spark, name)
        assert env.getClass().getName() == "java.util.concurrent.ConcurrentHashMap", name


def test_queries_started_together_leave_the_source_usable(
    spark: Any, spark_broker: RunningBroker, tmp_path: Path
) -> None:
    # The race needs two driver threads inside the map's put at the same instant: this test can
    # pass on a plain HashMap too. What pins the fix is the map's class (the test above); this
    # one checks that concurrent starts on a fresh registration work and leave it consistent.
    topic = "/topic/registry.together"
    publish(spark_broker, topic, [b"t%d" % i for i in range(300)])
    sluice.spark.register(spark)  # a fresh environment: every runner adds its keys from scratch
    count = 4
    barrier = threading.Barrier(count)
    queries: list[Any] = [None] * count

    def start(i: int) -> None:
        df = (
            spark.readStream.format("sluice")
            .option("broker", spark_broker.address)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "100")
            .load()
        )
        writer = (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / f"checkpoint-{i}"))
            .trigger(availableNow=True)
        )
        barrier.wait(60)
        queries[i] = writer.start()

    threads = [threading.Thread(target=start, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for query in queries:
        assert query is not None
        query.awaitTermination(120)
        assert query.exception() is None
        assert sum(p["numInputRows"] for p in query.recentProgress) == 300

    env = environment(spark, "sluice")
    assert env.size() == entries(env)
    # Later work on the same registration still runs.
    batch = spark.read.format("sluice").option("broker", spark_broker.address)
    assert batch.option("topic", topic).load().count() == 300


class _ConnectLikeSession:
    """A session without a JVM behind it, as in Spark Connect."""

    def __init__(self) -> None:
        self.registered: list[type] = []
        self.dataSource = self

    @property
    def sparkContext(self) -> Any:
        raise NotImplementedError("sparkContext is not available in Spark Connect")

    def register(self, source: type) -> None:
        self.registered.append(source)


def test_sessions_without_a_jvm_use_the_public_registration() -> None:
    session = _ConnectLikeSession()
    sluice.spark.register_data_source(session, SluiceDataSource)
    assert session.registered == [SluiceDataSource]


class _RecordingSession:
    """The test session, but the public registration only records what it is given."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self.registered: list[type] = []
        self.dataSource = self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)

    def register(self, source: type) -> None:
        self.registered.append(source)


class _ProbeSource(SluiceDataSource):
    @classmethod
    def name(cls) -> str:
        return "sluice-registry-probe"


class _ParquetSource(SluiceDataSource):
    @classmethod
    def name(cls) -> str:
        return "parquet"


@pytest.mark.parametrize(
    "hook",
    [
        # No such class: py4j hands out a package, which cannot be called.
        ("_DATA_SOURCE_CLASS", "org.apache.spark.sql.execution.datasources.v2.python.Missing"),
        # The class exists but takes other arguments (a Py4JError from the constructor).
        ("_DATA_SOURCE_CLASS", "java.lang.Thread"),
        # No registration method of that name on the session.
        ("_REGISTER_METHOD", "registerPythonSource"),
    ],
    ids=["missing-class", "other-constructor", "missing-method"],
)
def test_a_different_private_hook_falls_back_to_the_public_call(
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    hook: tuple[str, str],
) -> None:
    monkeypatch.setattr(registry, *hook)
    session = _RecordingSession(spark)
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        sluice.spark.register_data_source(session, _ProbeSource)
    assert session.registered == [_ProbeSource]
    assert "registering sluice-registry-probe with the public API" in caplog.text
    assert (
        not spark._jsparkSession.sessionState()
        .dataSourceManager()
        .dataSourceExists("sluice-registry-probe")
    )


def test_an_error_of_the_registration_itself_is_raised_not_retried(
    spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    session = _RecordingSession(spark)
    with pytest.raises(Exception, match="DATA_SOURCE_ALREADY_EXISTS"):
        sluice.spark.register_data_source(session, _ParquetSource)
    assert session.registered == []
    assert "public API" not in caplog.text


def test_found_without_register(spark: Any, spark_broker: RunningBroker) -> None:
    """A session nobody called `register` on finds both sources through Spark's discovery of
    `pyspark_*` modules (`pyspark_sluice`, `pyspark_sluice_journal`)."""
    import pyspark_sluice  # noqa: PLC0415
    import pyspark_sluice_journal  # noqa: PLC0415

    assert pyspark_sluice.DefaultSource is SluiceDataSource
    assert pyspark_sluice_journal.DefaultSource.name() == "sluice-journal"
    topic = "/topic/registry.discovered"
    publish(spark_broker, topic, [b"d%d" % i for i in range(7)])
    fresh = spark.newSession()  # its own data source registry, nothing registered at runtime
    # Not the registration of `register` (which gives a ConcurrentHashMap): the discovered one.
    discovered_env = environment(fresh, "sluice").getClass().getName()
    assert discovered_env != "java.util.concurrent.ConcurrentHashMap"
    df = fresh.read.format("sluice").option("broker", spark_broker.address).option("topic", topic)
    assert sorted(r.body for r in df.load().collect()) == [b"d%d" % i for i in range(7)]
    assert "record_type" in fresh.read.format("sluice-journal").load("/nonexistent").columns
