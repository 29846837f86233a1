"""The schemas of the data sources, as DDL text and as the Arrow schemas their batches carry.

Readers hand Spark `pyarrow.RecordBatch`es rather than tuples (about twice as fast): Spark checks
that a batch's schema equals the one it derives from the DDL (`timestamp[us, tz=UTC]`, `binary`,
`map<string, string>`, every field nullable), so the Arrow schemas here are written to match it
exactly; a test compares them with pyspark's own conversion.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "JOURNAL_ARROW_SCHEMA",
    "JOURNAL_COLUMNS",
    "JOURNAL_DDL",
    "KAFKA_ARROW_SCHEMA",
    "KAFKA_COLUMNS",
    "KAFKA_DDL",
    "KAFKA_KEY_HEADER",
    "TOPIC_ARROW_SCHEMA",
    "TOPIC_COLUMNS",
    "TOPIC_DDL",
    "kafka_batch",
    "timestamps_from_text",
    "timestamps_us",
]

TOPIC_COLUMNS = (
    ("offset", "LONG"),
    ("destination", "STRING"),
    ("message_id", "STRING"),
    ("timestamp", "TIMESTAMP"),
    ("headers", "MAP<STRING,STRING>"),
    ("body", "BINARY"),
)
JOURNAL_COLUMNS = (
    ("file", "STRING"),
    ("position", "LONG"),
    ("record_type", "STRING"),
    ("destination", "STRING"),
    ("sequence", "LONG"),
    ("message_id", "STRING"),
    ("timestamp", "TIMESTAMP"),
    ("headers", "MAP<STRING,STRING>"),
    ("body", "BINARY"),
    ("transaction", "LONG"),
)
# `schema=kafka`: the columns of Spark's Kafka source, so a Kafka pipeline ports by its options.
KAFKA_COLUMNS = (
    ("key", "BINARY"),
    ("value", "BINARY"),
    ("topic", "STRING"),
    ("partition", "INT"),
    ("offset", "LONG"),
    ("timestamp", "TIMESTAMP"),
    ("timestampType", "INT"),
    ("headers", "ARRAY<STRUCT<key:STRING,value:BINARY>>"),
)
# The message header that plays Kafka's key: a message group, the broker's per-key ordering.
KAFKA_KEY_HEADER = "JMSXGroupID"
# Kafka's timestampType 1 is LogAppendTime: the broker's time of acceptance, as Sluice stamps.
_LOG_APPEND_TIME = 1
TOPIC_DDL = ", ".join(f"{name} {kind}" for name, kind in TOPIC_COLUMNS)
JOURNAL_DDL = ", ".join(f"{name} {kind}" for name, kind in JOURNAL_COLUMNS)
KAFKA_DDL = ", ".join(f"`{name}` {kind}" for name, kind in KAFKA_COLUMNS)

_KAFKA_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_ARROW_TYPES: dict[str, Any] = {
    "LONG": pa.int64(),
    "STRING": pa.string(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "MAP<STRING,STRING>": pa.map_(pa.string(), pa.string()),
    "BINARY": pa.binary(),
    "INT": pa.int32(),
    "ARRAY<STRUCT<key:STRING,value:BINARY>>": pa.list_(pa.field("element", _KAFKA_HEADER)),
}


def _arrow_schema(columns: tuple[tuple[str, str], ...]) -> Any:
    return pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in columns])


TOPIC_ARROW_SCHEMA = _arrow_schema(TOPIC_COLUMNS)
JOURNAL_ARROW_SCHEMA = _arrow_schema(JOURNAL_COLUMNS)
KAFKA_ARROW_SCHEMA = _arrow_schema(KAFKA_COLUMNS)
_TIMESTAMP = _ARROW_TYPES["TIMESTAMP"]


def timestamps_us(millis: list[int | None]) -> Any:
    """An Arrow `timestamp[us, tz=UTC]` array from milliseconds since the epoch."""
    return pa.array([None if m is None else m * 1000 for m in millis], type=_TIMESTAMP)


def timestamps_from_text(millis: list[str | None]) -> Any:
    """`timestamps_us` for milliseconds still in text (as MESSAGE headers carry them), converted
    in one vectorised step."""
    as_int = pa.array(millis, type=pa.string()).cast(pa.int64())
    return pc.multiply(as_int, 1000).cast(_TIMESTAMP)


def kafka_batch(batch: Any, topic_name: str) -> Any:
    """A record batch of the topic schema (built whole, not a slice) in Kafka's columns,
    converted column by column: `key` is the `JMSXGroupID` header, `topic` the topic's name
    without `/topic/`, `partition` 0, `timestampType` 1 (LogAppendTime), `headers` the map as
    (key, UTF-8 value) pairs."""
    count = batch.num_rows
    headers = batch.column("headers")
    key = pc.map_lookup(headers, pa.scalar(KAFKA_KEY_HEADER), "first").cast(pa.binary())
    pairs = pa.StructArray.from_arrays(
        [headers.keys, headers.items.cast(pa.binary())], fields=list(_KAFKA_HEADER)
    )
    offsets = headers.offsets
    return pa.RecordBatch.from_arrays(
        [
            key,
            batch.column("body"),
            pa.array([topic_name] * count, type=pa.string()),
            pa.array([0] * count, type=pa.int32()),
            batch.column("offset"),
            batch.column("timestamp"),
            pa.array([_LOG_APPEND_TIME] * count, type=pa.int32()),
            pa.ListArray.from_arrays(offsets, pairs, type=_ARROW_TYPES[KAFKA_COLUMNS[-1][1]]),
        ],
        schema=KAFKA_ARROW_SCHEMA,
    )
