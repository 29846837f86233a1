"""The `sluice` data source: topics read as offset ranges (batch and streaming), and the sink.

Where the code runs (see `docs/spark.md`): `initialOffset`, `latestOffset`, `partitions` and
`commit` run in one long-lived Python process next to the driver; `read` runs in executor workers
on a pickled copy of the reader that holds only its options. Nothing here keeps a connection on an
object: every call opens and closes its own.

Offsets in Spark's checkpoint are `{"topic": "/topic/NAME", "offset": N}`, N being the next offset
to read. A batch covers `[start, end)`; `partitions` cuts it into `minPartitions` ranges; `read`
fetches exactly its range (`sluice.spark.fetch`). The checkpoint is the truth: `commit` only moves
the durable subscription's cursor (option `subscription`) so the broker may drop what is done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice.errors import ClientError
from sluice.spark.fetch import DataLossError, read_range
from sluice.spark.offsets import (
    OffsetRange,
    TopicOffsets,
    move_cursor,
    resolve,
    split_range,
    topic_offsets,
)
from sluice.spark.options import (
    EARLIEST,
    SCHEMA_KAFKA,
    SCHEMA_SLUICE,
    OptionError,
    SourceOptions,
    sink_options,
    source_options,
)
from sluice.spark.schema import KAFKA_COLUMNS, TOPIC_COLUMNS
from sluice.spark.sink import SluiceBatchWriter, SluiceStreamWriter

__all__ = [
    "NothingKeptError",
    "SluiceBatchReader",
    "SluiceDataSource",
    "SluiceStreamReader",
    "TopicRange",
    "UnknownTopicError",
    "check_topic",
    "spark_type",
    "topic_schema",
]

logger = logging.getLogger(__name__)

_SPARK_TYPES: dict[str, Any] = {
    "LONG": LongType(),
    "STRING": StringType(),
    "TIMESTAMP": TimestampType(),
    "MAP<STRING,STRING>": MapType(StringType(), StringType()),
    "BINARY": BinaryType(),
    "INT": IntegerType(),
    "ARRAY<STRUCT<key:STRING,value:BINARY>>": ArrayType(
        StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    ),
}


def spark_type(kind: str) -> Any:
    """The Spark type of a column kind of `sluice.spark.schema`."""
    return _SPARK_TYPES[kind]


def topic_schema(kind: str = SCHEMA_SLUICE) -> Any:
    """`offset LONG, destination STRING, message_id STRING, timestamp TIMESTAMP,
    headers MAP<STRING,STRING>, body BINARY`, or with `kind` kafka Kafka's columns (`key`,
    `value`, ...), built without asking the JVM to parse DDL."""
    columns = KAFKA_COLUMNS if kind == SCHEMA_KAFKA else TOPIC_COLUMNS
    return StructType([StructField(name, spark_type(kind)) for name, kind in columns])


class TopicRange(InputPartition):  # type: ignore[misc,unused-ignore]
    """One partition of a read: offsets `start` to `end - 1` of `topic`."""

    def __init__(self, offsets: OffsetRange) -> None:
        super().__init__(offsets)
        self.offsets = offsets

    def __repr__(self) -> str:
        o = self.offsets
        return f"TopicRange({o.topic} [{o.start}, {o.end}))"


class UnknownTopicError(OptionError):
    """The topic has never had a message: most likely its name is misspelled."""


class NothingKeptError(OptionError):
    """`startingOffsets=earliest` on a topic that keeps none of its messages."""


def check_topic(options: SourceOptions, kept: TopicOffsets, *, streaming: bool) -> None:
    """Refuse to read nothing silently: an unknown topic, or `earliest` on a topic that keeps
    none of the messages it had (see docs/spark.md, "What the broker must keep")."""
    topic = options.topic
    if kept.last == 0:
        if not options.fail_on_unknown_topic:
            logger.info(
                "%s has no message yet; reading it anyway (failOnUnknownTopic=false)", topic
            )
            return
        wait = "wait for its first message" if streaming else "read it as empty"
        raise UnknownTopicError(
            f"{topic} has never had a message on {options.broker} (its last offset is 0): "
            "is its name right? "
            f"Set failOnUnknownTopic=false to {wait}"
        )
    if options.starting != EARLIEST or kept.first <= kept.last:
        return
    message = (
        f"startingOffsets=earliest, but {topic} keeps none of its {kept.last} messages "
        f"(offsets 1 to {kept.last} are gone): a topic keeps a message only while its retention "
        "(retention_s or retention_bytes in the broker's [[destination]] policy for it) or a "
        "durable subscription holds it, and the broker's default retention is 0"
    )
    if streaming and options.subscription is not None:
        # The durable subscription keeps everything from here on: the stream is sound.
        logger.warning("%s; the stream starts at offset %d", message, kept.end)
        return
    raise NothingKeptError(message)


def _partitions(options: SourceOptions, whole: OffsetRange) -> list[TopicRange]:
    return [TopicRange(r) for r in split_range(whole, options.min_partitions)]


class SluiceDataSource(DataSource):  # type: ignore[misc,unused-ignore]
    """`format("sluice")`: read a topic as a log, or write rows to destinations."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "sluice"

    def schema(self) -> Any:
        """The schema of rows read from a topic (option `schema`: sluice or kafka)."""
        kind = str(self.options.get("schema", SCHEMA_SLUICE)).strip().lower()
        return topic_schema(SCHEMA_KAFKA if kind == SCHEMA_KAFKA else SCHEMA_SLUICE)

    def reader(self, schema: Any) -> SluiceBatchReader:
        """`spark.read.format("sluice")`."""
        return SluiceBatchReader(source_options(self.options, streaming=False))

    def streamReader(self, schema: Any) -> SluiceStreamReader:  # noqa: N802
        """`spark.readStream.format("sluice")`."""
        return SluiceStreamReader(source_options(self.options, streaming=True))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        """`df.write.format("sluice")`, in append mode (a broker has nothing to overwrite)."""
        if overwrite:
            raise OptionError('the sluice sink only appends messages: use .mode("append")')
        return SluiceBatchWriter(sink_options(self.options), schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        """`df.writeStream.format("sluice")`."""
        return SluiceStreamWriter(sink_options(self.options), schema)


class SluiceBatchReader(DataSourceReader):  # type: ignore[misc,unused-ignore]
    """A batch read of `[startingOffsets, endingOffsets)`, resolved when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """The range, resolved against what the topic keeps now, cut into partitions."""
        options = self.options
        kept = topic_offsets(options)
        check_topic(options, kept, streaming=False)
        start = resolve(options.starting, kept)
        end = resolve(options.ending, kept)
        if end > kept.end:
            raise OptionError(
                f"endingOffsets {end} is beyond the end of {options.topic} "
                f"(its last offset is {kept.last})"
            )
        logger.info("batch read of %s offsets [%d, %d)", options.topic, start, end)
        whole = OffsetRange(options.topic, start, max(start, end))
        # A batch scan needs at least one partition, even an empty one.
        return _partitions(options, whole) or [TopicRange(whole)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The messages of one range, as Arrow record batches."""
        assert isinstance(partition, TopicRange)
        return read_range(self.options, partition.offsets)


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc,unused-ignore]
    """A topic read as a stream of offset ranges, with admission control and availableNow."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # The end fixed by prepareForTriggerAvailableNow: nothing after it is read.
        self._target: int | None = None
        self._reported: int | None = None

    def _offset(self, offset: dict[str, Any]) -> int:
        topic = offset.get("topic")
        if topic != self.options.topic:
            raise OptionError(
                f"the checkpoint holds offsets of {topic!r} but the query reads "
                f"{self.options.topic!r}: use a new checkpointLocation for another topic"
            )
        return int(offset["offset"])

    def _dict(self, offset: int) -> dict[str, Any]:
        return {"topic": self.options.topic, "offset": offset}

    def _kept(self) -> TopicOffsets:
        kept = topic_offsets(self.options)
        self._reported = kept.end
        return kept

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        """Where a new query starts: `startingOffsets` resolved now (default `latest`)."""
        kept = self._kept()
        check_topic(self.options, kept, streaming=True)
        start = resolve(self.options.starting, kept)
        # From here on the broker keeps what the query will need.
        move_cursor(self.options, start)
        logger.info("new query on %s starts at offset %d", self.options.topic, start)
        return self._dict(start)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        """The end of the next batch: what is available, capped by the read limit."""
        begin = self._offset(start)
        available = self._kept().end
        if self._target is not None:
            available = min(available, self._target)
        if available < begin:
            message = (
                f"{self.options.topic} ends at offset {available - 1}, before the query's "
                f"offset {begin}: was the topic deleted or the broker's store replaced?"
            )
            if self.options.fail_on_data_loss:
                raise DataLossError(message + " (set failOnDataLoss=false to wait instead)")
            logger.warning("%s; waiting for it to pass offset %d", message, begin)
            return start
        end = available
        if isinstance(limit, ReadMaxRows) and limit.max_rows > 0:
            end = min(end, begin + limit.max_rows)
        return self._dict(end)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        """`maxOffsetsPerTrigger` offsets per batch when set, else everything available."""
        most = self.options.max_offsets_per_trigger
        return ReadMaxRows(most) if most else ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802
        """The end of the topic at the last look (shown in the query's progress)."""
        return self._dict(self._reported) if self._reported is not None else None

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Fix the end of an availableNow run: the topic's end now."""
        self._target = self._kept().end
        logger.info("availableNow run on %s up to offset %d", self.options.topic, self._target)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """`[start, end)` cut into `minPartitions` ranges (none when empty)."""
        whole = OffsetRange(self.options.topic, self._offset(start), self._offset(end))
        return _partitions(self.options, whole)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The messages of one range, as Arrow record batches."""
        assert isinstance(partition, TopicRange)
        return read_range(self.options, partition.offsets)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark is done with everything before `end`: move the durable cursor there."""
        if self.options.subscription is None:
            return
        try:
            move_cursor(self.options, self._offset(end))
        except (ClientError, OSError) as exc:
            # Only a hint to the broker; the next commit moves it further.
            logger.warning(
                "could not move subscription %s of %s: %s",
                self.options.subscription,
                self.options.topic,
                exc,
            )

    def stop(self) -> None:
        """Nothing is held between calls."""
