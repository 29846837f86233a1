"""The `sluice` sink: `df.write.format("sluice")` and `df.writeStream.format("sluice")`.

Rows need a `body` column (binary or string) and may have `headers` (a map) and `destination`
(a string; the `destination` option is the default); or Kafka's sink columns instead (`value`,
and optionally `key`, `topic`, `headers` as an array of key/value structs; `partition` is
ignored). Each task sends its rows in one broker
transaction with deterministic dedup ids (`sluice.spark.produce`):

- a streaming write's id is the query's id (kept in the checkpoint, so it survives restarts) or
  the `writeId` option, and the batch id is Spark's: a batch replayed after a crash sends the
  same ids and the broker drops them;
- a batch write's id is the `writeId` option, or one drawn when the write is planned (retried
  tasks of that write share it; give `writeId` to make a whole re-run idempotent).

The writers take Arrow record batches (`DataSourceArrowWriter`), which spares Spark building a
`Row` per record.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from sluice.spark.options import OptionError, SinkOptions
from sluice.spark.produce import OutgoingRow, dedup_prefix, send_transaction
from sluice.spark.schema import KAFKA_KEY_HEADER

__all__ = ["SluiceBatchWriter", "SluiceCommitMessage", "SluiceStreamWriter"]

logger = logging.getLogger(__name__)

# Local properties Spark sets on the tasks of a streaming query.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class SluiceCommitMessage(WriterCommitMessage):  # type: ignore[misc,unused-ignore]
    """What one task sent: its partition and rows per destination."""

    partition: int
    rows: int
    per_destination: dict[str, int] = field(default_factory=dict)


def _columns(schema: Any) -> tuple[str, bool, bool]:
    """Check the input schema: (body column, has headers, has destination)."""
    fields = {f.name.lower(): f for f in schema.fields}
    body = fields.get("body")
    if body is None or not isinstance(body.dataType, BinaryType | StringType):
        raise OptionError(
            "the sluice sink needs a body column of type binary or string "
            "(or Kafka's value column: see docs/spark.md, From Kafka)"
        )
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers.dataType, MapType) and isinstance(headers.dataType.keyType, StringType)
    ):
        raise OptionError("the headers column must be a map with string keys")
    destination = fields.get("destination")
    if destination is not None and not isinstance(destination.dataType, StringType):
        raise OptionError("the destination column must be a string")
    return body.name, headers is not None, destination is not None


def _kafka_columns(schema: Any) -> dict[str, str]:
    """Check Kafka's sink columns (`value`, optional `key`, `topic`, `headers`, `partition`):
    their names in the input by role."""
    fields = {f.name.lower(): f for f in schema.fields}
    if "body" in fields or "destination" in fields:
        raise OptionError(
            "the input has Kafka's value column and Sluice's body or destination: use one set"
        )
    text_or_bytes = BinaryType | StringType
    for role in ("value", "key"):
        field_ = fields.get(role)
        if field_ is not None and not isinstance(field_.dataType, text_or_bytes):
            raise OptionError(f"the {role} column must be binary or string")
    topic = fields.get("topic")
    if topic is not None and not isinstance(topic.dataType, StringType):
        raise OptionError("the topic column must be a string")
    headers = fields.get("headers")
    if headers is not None and not _is_kafka_headers(headers.dataType):
        raise OptionError(
            "the headers column must be Kafka's array<struct<key: string, value: binary>> "
            f"(or a map, with Sluice's body column), not {headers.dataType.simpleString()}"
        )
    return {role: f.name for role, f in fields.items() if role in _KAFKA_ROLES}


_KAFKA_ROLES = ("value", "key", "topic", "headers")


def _is_kafka_headers(kind: Any) -> bool:
    """An array of (key, value) structs, taken by position: Spark may rename a struct's fields
    on the way to a writer (`col2`)."""
    if not isinstance(kind, ArrayType) or not isinstance(kind.elementType, StructType):
        return False
    fields = kind.elementType.fields
    return (
        len(fields) == 2
        and isinstance(fields[0].dataType, StringType)
        and isinstance(fields[1].dataType, BinaryType | StringType)
    )


def _text(value: bytes | str, what: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise OptionError(f"a {what} must be UTF-8 text (STOMP headers are text)") from None


def _kafka_headers(pairs: Any, key: bytes | str | None) -> dict[str, str] | None:
    headers: dict[str, str] = {}
    for pair in pairs or ():
        name, value = pair.values()
        if name is not None and value is not None:
            headers[name] = _text(value, "header value")
    if key is not None:
        headers[KAFKA_KEY_HEADER] = _text(key, "key")
    return headers or None


class _ArrowRows:
    """Turns record batches into `(destination, headers, body)` rows, column by column; from
    Sluice's columns (`body`, `headers`, `destination`) or Kafka's (`value`, `key`, `topic`,
    `headers`; `key` becomes the `JMSXGroupID` header, a `topic` NAME `/topic/NAME`)."""

    def __init__(self, schema: Any) -> None:
        names = {f.name.lower(): f.name for f in schema.fields}
        self.kafka: dict[str, str] | None = None
        if "value" in names and "body" not in names:
            self.kafka = _kafka_columns(schema)
            return
        self.body, self.has_headers, self.has_destination = _columns(schema)
        self.headers = names.get("headers")
        self.destination = names.get("destination")

    def rows(self, batches: Iterator[Any]) -> Iterator[OutgoingRow]:
        if self.kafka is not None:
            yield from self._kafka_rows(batches, self.kafka)
            return
        for batch in batches:
            count = batch.num_rows
            bodies = batch.column(self.body).to_pylist()
            if self.headers is not None:
                headers: list[Any] = batch.column(self.headers).to_pylist()
            else:
                headers = [None] * count
            if self.destination is not None:
                destinations: list[Any] = batch.column(self.destination).to_pylist()
            else:
                destinations = [None] * count
            for destination, pairs, body in zip(destinations, headers, bodies, strict=True):
                yield destination, dict(pairs) if pairs else None, body

    @staticmethod
    def _kafka_rows(batches: Iterator[Any], names: dict[str, str]) -> Iterator[OutgoingRow]:
        for batch in batches:
            count = batch.num_rows

            def column(role: str, n: int = count, b: Any = batch) -> list[Any]:
                name = names.get(role)
                return b.column(name).to_pylist() if name is not None else [None] * n

            for value, key, topic, pairs in zip(
                column("value"), column("key"), column("topic"), column("headers"), strict=True
            ):
                destination = None
                if topic:
                    destination = topic if topic.startswith("/") else "/topic/" + topic
                yield destination, _kafka_headers(pairs, key), value


def _task_context() -> Any:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the sluice sink writes from Spark tasks only")
    return context


def _warn_window(options: SinkOptions, batch: str, messages: list[Any]) -> None:
    """Warn when a whole write sent more rows to a destination than the dedup window holds.

    Each task stays within the window (`send_transaction` refuses more), but together they may
    not: a replay of the whole write then finds its first ids gone from the broker's window. The
    tasks have committed by now, so failing here would only make Spark replay it.
    """
    totals: Counter[str] = Counter()
    for message in messages:
        if isinstance(message, SluiceCommitMessage):
            totals.update(message.per_destination)
    window = options.dedup_window
    for destination, rows in totals.items():
        if rows > window:
            logger.warning(
                "%s: %d rows to %s, more than the dedup window of %d: a replay of the whole "
                "write (a restart after a driver crash) would send its earliest rows again; "
                "keep a write's rows per destination within the broker's limits.dedup_window "
                "(maxOffsetsPerTrigger, for a stream) or raise it and the dedupWindow option",
                batch,
                rows,
                destination,
                window,
            )


class SluiceBatchWriter(DataSourceArrowWriter):  # type: ignore[misc,unused-ignore]
    """`df.write.format("sluice")`: one transaction per task."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self.options = options
        self.rows = _ArrowRows(schema)
        # Drawn once on the driver; every task and retry of this write gets the same.
        self.write_id = options.write_id or f"w-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Any]) -> SluiceCommitMessage:
        """Send this task's rows."""
        partition = _task_context().partitionId()
        prefix = dedup_prefix(self.write_id, "b", partition)
        result = send_transaction(self.options, self.rows.rows(iterator), prefix)
        return SluiceCommitMessage(partition, result.rows, dict(result.per_destination))

    def commit(self, messages: list[Any]) -> None:
        """Every task committed its transaction."""
        total = sum(m.rows for m in messages if isinstance(m, SluiceCommitMessage))
        logger.info("write %s: %d rows sent", self.write_id, total)
        _warn_window(self.options, f"write {self.write_id}", messages)

    def abort(self, messages: list[Any]) -> None:
        """A task failed for good; what other tasks committed stays (see docs/spark.md)."""
        done = sum(m.rows for m in messages if isinstance(m, SluiceCommitMessage))
        logger.warning(
            "write %s failed; %d rows of its finished tasks were sent (writing again with the "
            "same writeId sends only the rest)",
            self.write_id,
            done,
        )


class SluiceStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc,unused-ignore]
    """`df.writeStream.format("sluice")`: one transaction per task of each micro-batch."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self.options = options
        self.rows = _ArrowRows(schema)

    def write(self, iterator: Iterator[Any]) -> SluiceCommitMessage:
        """Send this task's rows, with ids from the query, batch, partition and row."""
        context = _task_context()
        partition = context.partitionId()
        write_id = self.options.write_id or context.getLocalProperty(_QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(_BATCH_ID_PROPERTY)
        if not write_id or batch is None:
            raise RuntimeError("the sluice stream sink runs inside a streaming query only")
        prefix = dedup_prefix(write_id, batch, partition)
        result = send_transaction(self.options, self.rows.rows(iterator), prefix)
        return SluiceCommitMessage(partition, result.rows, dict(result.per_destination))

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Every task of batch `batchId` committed its transaction."""
        total = sum(m.rows for m in messages if isinstance(m, SluiceCommitMessage))
        logger.debug("batch %d: %d rows sent", batchId, total)
        _warn_window(self.options, f"batch {batchId}", messages)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """A task of batch `batchId` failed; Spark runs the batch again."""
        logger.warning("batch %d of the sluice sink aborted; it will be written again", batchId)
