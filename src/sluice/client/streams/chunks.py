"""A stream chunk's headers, read and checked: `parse_chunk`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.client.message import Message
from sluice.client.streams.headers import (
    STREAM_ABORT,
    STREAM_ABORT_REASON,
    STREAM_END,
    STREAM_ID,
    STREAM_LENGTH,
    STREAM_OFFSET,
    STREAM_SEQ,
    STREAM_SHA256,
)

__all__ = ["Chunk", "parse_chunk"]

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Chunk:
    """What a MESSAGE says about its place in a stream.

    `offset` is None when the chunk did not say (only the resume mark needs it). An abort marker
    has `abort` set and no sequence (`seq` -1).
    """

    stream_id: str
    seq: int
    offset: int | None
    end: bool = False
    length: int | None = None
    sha256: str | None = None
    abort: bool = False
    abort_reason: str = ""


def _natural(headers: dict[str, str], name: str) -> int | None:
    """A non-negative integer header; None when absent; ValueError when malformed."""
    raw = headers.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{name} is not a non-negative integer: {raw[:40]!r}")
    return int(text)


def parse_chunk(message: Message) -> tuple[Chunk | None, str | None]:
    """The chunk `message` carries, or (None, why it is not a valid chunk).

    A valid chunk may still be out of place; that is the reader's business.
    """
    headers = message.headers
    stream_id = headers.get(STREAM_ID)
    if not stream_id:
        return None, "is not a stream chunk (no x-stream-id)"
    if headers.get(STREAM_ABORT) == "true":
        reason = headers.get(STREAM_ABORT_REASON, "no reason given")
        return Chunk(stream_id, -1, None, abort=True, abort_reason=reason), None
    try:
        seq = _natural(headers, STREAM_SEQ)
        offset = _natural(headers, STREAM_OFFSET)
        length = _natural(headers, STREAM_LENGTH)
    except ValueError as exc:
        return None, str(exc)
    if seq is None:
        return None, "has no x-stream-seq"
    end = headers.get(STREAM_END) == "true"
    sha256 = headers.get(STREAM_SHA256)
    if sha256 is not None:
        sha256 = sha256.strip().lower()
        if not _SHA256_HEX.fullmatch(sha256):
            return None, f"has a malformed x-stream-sha256: {sha256[:80]!r}"
    return Chunk(stream_id, seq, offset, end=end, length=length, sha256=sha256), None
