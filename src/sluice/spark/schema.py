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
    "TOPIC_ARROW_SCHEMA",
    "TOPIC_COLUMNS",
    "TOPIC_DDL",
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
TOPIC_DDL = ", ".join(f"{name} {kind}" for name, kind in TOPIC_COLUMNS)
JOURNAL_DDL = ", ".join(f"{name} {kind}" for name, kind in JOURNAL_COLUMNS)

_ARROW_TYPES: dict[str, Any] = {
    "LONG": pa.int64(),
    "STRING": pa.string(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "MAP<STRING,STRING>": pa.map_(pa.string(), pa.string()),
    "BINARY": pa.binary(),
}


def _arrow_schema(columns: tuple[tuple[str, str], ...]) -> Any:
    return pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in columns])


TOPIC_ARROW_SCHEMA = _arrow_schema(TOPIC_COLUMNS)
JOURNAL_ARROW_SCHEMA = _arrow_schema(JOURNAL_COLUMNS)
_TIMESTAMP = _ARROW_TYPES["TIMESTAMP"]


def timestamps_us(millis: list[int | None]) -> Any:
    """An Arrow `timestamp[us, tz=UTC]` array from milliseconds since the epoch."""
    return pa.array([None if m is None else m * 1000 for m in millis], type=_TIMESTAMP)


def timestamps_from_text(millis: list[str | None]) -> Any:
    """`timestamps_us` for milliseconds still in text (as MESSAGE headers carry them), converted
    in one vectorised step."""
    as_int = pa.array(millis, type=pa.string()).cast(pa.int64())
    return pc.multiply(as_int, 1000).cast(_TIMESTAMP)
