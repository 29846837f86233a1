"""The headers a stream chunk carries (DESIGN.md sections 3 and 7), named once."""

from __future__ import annotations

__all__ = [
    "DEDUP_ID",
    "GROUP_ID",
    "RESERVED_HEADERS",
    "STREAM_ABORT",
    "STREAM_ABORT_REASON",
    "STREAM_END",
    "STREAM_ID",
    "STREAM_LENGTH",
    "STREAM_NAME",
    "STREAM_OFFSET",
    "STREAM_RESUME",
    "STREAM_SEQ",
    "STREAM_SHA256",
    "STREAM_SIZE",
]

STREAM_ID = "x-stream-id"
STREAM_SEQ = "x-stream-seq"
STREAM_OFFSET = "x-stream-offset"
STREAM_END = "x-stream-end"
STREAM_LENGTH = "x-stream-length"
STREAM_SHA256 = "x-stream-sha256"
STREAM_ABORT = "x-stream-abort"
STREAM_ABORT_REASON = "x-stream-abort-reason"
# Set by the broker on the first chunk a consumer gets of a stream another consumer left midway.
STREAM_RESUME = "x-stream-resume"
# Ours, on every chunk when known: the stream's name (a file's base name) and its announced size,
# a hint for progress bars (the end chunk's x-stream-length is what is checked).
STREAM_NAME = "x-stream-name"
STREAM_SIZE = "x-stream-size"
GROUP_ID = "JMSXGroupID"
DEDUP_ID = "x-dedup-id"

# Headers `send_stream` sets itself; a caller's `headers` may not name them.
RESERVED_HEADERS = frozenset(
    {
        STREAM_ID,
        STREAM_SEQ,
        STREAM_OFFSET,
        STREAM_END,
        STREAM_LENGTH,
        STREAM_SHA256,
        STREAM_ABORT,
        STREAM_ABORT_REASON,
        STREAM_RESUME,
        GROUP_ID,
        "JMSXGroupSeq",
        DEDUP_ID,
        "destination",
        "transaction",
        "receipt",
        "persistent",
        "content-length",
    }
)
