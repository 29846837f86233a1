"""Errors the client raises besides those of `sluice.errors`.

All are `ClientError`s, so a caller that only cares that an operation failed catches that; a
caller that retries can tell a lost connection (the outcome of a frame already written is unknown)
from a broker that did not answer in time. Stream readers raise `StreamError`s: an aborted
stream, or chunks that fail a check.
"""

from __future__ import annotations

from sluice.errors import ClientError

__all__ = [
    "ConnectionLost",
    "ReceiptTimeout",
    "StreamAborted",
    "StreamCorrupted",
    "StreamError",
    "StreamOutOfOrder",
]


class ConnectionLost(ClientError):
    """The connection to the broker dropped (or was closed) before the operation completed."""


class ReceiptTimeout(ClientError):
    """The broker did not answer a frame's `receipt` within the client's receipt timeout."""


class StreamError(ClientError):
    """A stream could not be read whole. `stream_id` names it (None if the chunk had none)."""

    def __init__(self, message: str, stream_id: str | None = None) -> None:
        self.stream_id = stream_id
        super().__init__(message)


class StreamAborted(StreamError):
    """The broker ended the stream with an abort marker: its producer died or went quiet.

    `reason` is the marker's `x-stream-abort-reason`; `offset` the bytes received before it.
    """

    def __init__(self, message: str, stream_id: str | None, reason: str, offset: int) -> None:
        self.reason = reason
        self.offset = offset
        super().__init__(message, stream_id)


class StreamCorrupted(StreamError):
    """A chunk or a whole stream failed a check (bad headers, length or SHA-256).

    `seq` is the offending chunk's `x-stream-seq` (None for a whole-stream check). `skipped` says
    what the reader did: True when it dropped the chunk (or the rest of the stream) and went on,
    False when it raised and stopped.
    """

    def __init__(
        self, message: str, stream_id: str | None, seq: int | None, *, skipped: bool
    ) -> None:
        self.seq = seq
        self.skipped = skipped
        super().__init__(message, stream_id)


class StreamOutOfOrder(StreamCorrupted):
    """A chunk that is not the next one of its stream: a sequence gap, a duplicate, a chunk of
    another stream in the middle of this one, or a mid-stream chunk without the resume mark."""
