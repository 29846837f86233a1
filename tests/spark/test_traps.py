"""Mistakes that used to read nothing, silently: each is now an error that says what to do.

A misspelled option, a Kafka option name, an unknown topic, and `earliest` on a topic that keeps
nothing. The option checks are pure; the topic checks ask a real broker; one test per trap runs
through Spark to show the user sees the message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")
from pyspark.errors import PySparkException, StreamingQueryException

from conftest import RunningBroker, start_broker
from sluice.spark.offsets import topic_offsets
from sluice.spark.options import OptionError, journal_options, sink_options, source_options
from sluice.spark.source import (
    NothingKeptError,
    SluiceBatchReader,
    SluiceDataSource,
    UnknownTopicError,
    check_topic,
)

from .helpers import publish

pytestmark = pytest.mark.spark


# -- option names (no broker, no Spark) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("startingOffset", "startingOffsets"),
        ("endingoffset", "endingOffsets"),
        ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
        ("brokers", "broker"),
        ("failOnDataloss2", "failOnDataLoss"),
    ],
)
def test_a_misspelled_source_option_names_the_closest(name: str, closest: str) -> None:
    with pytest.raises(OptionError, match=f"unknown option {name} .*did you mean {closest}\\?"):
        source_options({"topic": "t", name: "1"}, streaming=True)


def test_a_misspelled_sink_or_journal_option_names_the_closest() -> None:
    with pytest.raises(OptionError, match="did you mean destination"):
        sink_options({"destinaton": "/queue/x"})
    with pytest.raises(OptionError, match="did you mean failOnCorruption"):
        journal_options({"path": "/tmp", "failOnCorrupton": "true"})
    # Nothing close: the error lists what is known.
    with pytest.raises(OptionError, match=r"unknown option zzz .*\(known: broker, "):
        sink_options({"zzz": "1"})


@pytest.mark.parametrize(
    ("name", "value", "hint"),
    [
        ("kafka.bootstrap.servers", "127.0.0.1:9092", "use option broker"),
        ("subscribe", "events", "use option topic"),
        ("subscribePattern", "ev.*", "use option topic"),
        ("assign", '{"events":[0]}', "use option topic"),
        ("kafka.group.id", "g", "use option subscription"),
        ("kafkaConsumer.pollTimeoutMs", "1000", "use option timeoutMs"),
        ("kafka.security.protocol", "SSL", "no kafka.\\* settings"),
        ("startingTimestamp", "0", "use option startingOffsets"),
    ],
)
def test_a_kafka_source_option_names_the_sluice_one(name: str, value: str, hint: str) -> None:
    with pytest.raises(OptionError, match=f"option {name} is a Kafka option .*{hint}"):
        source_options({"topic": "t", name: value}, streaming=True)


def test_kafka_offsets_json_and_sink_options_are_refused() -> None:
    with pytest.raises(OptionError, match="not Kafka's JSON"):
        source_options({"topic": "t", "startingOffsets": '{"t":{"0":5}}'}, streaming=False)
    with pytest.raises(OptionError, match=r"option topic is a Kafka .*use option destination"):
        sink_options({"topic": "events"})
    with pytest.raises(OptionError, match="use option broker"):
        sink_options({"kafka.bootstrap.servers": "h:9092"})


def test_kafka_names_with_the_same_meaning_are_taken() -> None:
    opts = source_options(
        {
            "topic": "t",
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "10",
            "minPartitions": "2",
            "failOnDataLoss": "false",
        },
        streaming=True,
    )
    assert (opts.starting, opts.max_offsets_per_trigger, opts.min_partitions) == ("earliest", 10, 2)
    assert not opts.fail_on_data_loss
    # Spark adds checkpointLocation to a streaming sink's options.
    assert sink_options({"checkpointLocation": "/tmp/c", "destination": "/queue/x"}).destination


def test_a_path_is_refused_with_the_option_to_use() -> None:
    with pytest.raises(OptionError, match="takes no path"):
        source_options({"topic": "t", "path": "/topic/t"}, streaming=False)


# -- topics (a real broker, no Spark) ----------------------------------------------------------


@pytest.fixture(scope="module")
def bare_broker() -> Iterator[RunningBroker]:
    """A broker with the default policy: topics keep nothing without a durable subscription."""
    running = start_broker()
    try:
        yield running
    finally:
        running.stop()


def test_an_unknown_topic_is_an_error_unless_allowed(spark_broker: RunningBroker) -> None:
    options = {"broker": spark_broker.address, "topic": "/topic/traps.never.written"}
    reader = SluiceBatchReader(source_options(options, streaming=False))
    with pytest.raises(UnknownTopicError, match=r"has never had a message .*failOnUnknownTopic"):
        reader.partitions()
    allowed = source_options({**options, "failOnUnknownTopic": "false"}, streaming=False)
    partitions = SluiceBatchReader(allowed).partitions()
    assert [len(p.offsets) for p in partitions] == [0]


def test_earliest_on_a_topic_that_keeps_nothing_is_an_error(
    bare_broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "/topic/traps.kept.nothing"
    publish(bare_broker, topic, [b"a", b"b", b"c"])  # nobody keeps them
    options = {"broker": bare_broker.address, "topic": topic, "startingOffsets": "earliest"}
    batch = source_options(options, streaming=False)
    kept = topic_offsets(batch)
    assert (kept.first, kept.last) == (4, 3)
    with pytest.raises(NothingKeptError, match=r"keeps none of its 3 messages .*retention_s"):
        check_topic(batch, kept, streaming=False)
    with pytest.raises(NothingKeptError):
        check_topic(source_options(options, streaming=True), kept, streaming=True)
    # With a durable subscription a stream keeps what comes from now on: a warning, no error.
    durable = source_options({**options, "subscription": "s"}, streaming=True)
    with caplog.at_level(logging.WARNING, logger="sluice.spark.source"):
        check_topic(durable, kept, streaming=True)
    assert "keeps none of its 3 messages" in caplog.text
    # An explicit offset is the user's choice; what is gone is then data loss (test_stream).
    check_topic(
        source_options({**options, "startingOffsets": "1"}, streaming=False), kept, streaming=False
    )


# -- what the user sees through Spark ----------------------------------------------------------


def test_spark_users_see_each_trap(spark: Any, spark_broker: RunningBroker, tmp_path: Path) -> None:
    topic = "/topic/traps.spark"
    publish(spark_broker, topic, [b"x"])

    def reader() -> Any:  # a DataFrameReader keeps the options it was given: one per read
        return spark.read.format("sluice").option("broker", spark_broker.address)

    with pytest.raises(PySparkException, match="did you mean startingOffsets"):
        reader().option("topic", topic).option("startingOffset", "1").load().collect()
    with pytest.raises(PySparkException, match="use option broker"):
        reader().option("topic", topic).option("kafka.bootstrap.servers", "h:1").load().collect()
    with pytest.raises(PySparkException, match=r"traps\.spark\.typo has never had a message"):
        reader().option("topic", "/topic/traps.spark.typo").load().collect()
    assert reader().option("topic", topic).load().count() == 1

    stream = (
        spark.readStream.format("sluice")
        .option("broker", spark_broker.address)
        .option("topic", "/topic/traps.spark.typo")
        .load()
    )
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="has never had a message"):
        query.awaitTermination(120)


def test_a_data_source_object_checks_its_options_when_built() -> None:
    source = SluiceDataSource({"topic": "t", "startingOffset": "1"})
    with pytest.raises(OptionError, match="did you mean startingOffsets"):
        source.reader(None)
