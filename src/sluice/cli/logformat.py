"""How the command line writes logs: `text` (`2026-11-25 14:02:11,503 WARNING sluice.x: ...`)
or `json` (`sluice broker --log-format json`): one JSON object per line, for a log shipper.

A JSON line always has `ts` (ISO 8601, UTC, milliseconds), `level`, `logger` and `message`;
and, when the log call has them, `connection_id` (the id the management API shows once a
client is logged in), `session` (a connection's log id before that), `peer` (the client's
address), `user`, and `exception` (the traceback, when one is logged). Nothing else, so that a
query on a field keeps working from one release to the next.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from datetime import UTC, datetime

__all__ = ["EXTRA_FIELDS", "JsonFormatter", "LogFormat", "setup_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Record attributes copied into a JSON line when a log call sets them (`extra=`).
EXTRA_FIELDS = ("connection_id", "session", "peer", "user")
# A log call may set this to the text it put before its message for the text format (a
# connection's `[id peer] `): the JSON line has the fields instead.
PREFIX_FIELD = "log_prefix"


class LogFormat(enum.Enum):
    """How log records are written."""

    TEXT = "text"
    JSON = "json"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line (newlines inside values are escaped)."""
        message = record.getMessage()
        prefix = getattr(record, PREFIX_FIELD, None)
        if isinstance(prefix, str) and message.startswith(prefix):
            message = message[len(prefix) :]
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        for field in EXTRA_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(level: int, log_format: LogFormat = LogFormat.TEXT) -> None:
    """Write log records of `level` and above on standard error, in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format is LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
