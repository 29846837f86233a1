"""How a stream is sent: `StreamOptions`, and what a sender is told back as chunks are receipted.

`StreamOptions` is the one place where the settings of `send_stream` are named, given their
defaults and checked. `Client.send_stream` and `BlockingClient.send_stream` take one, and also
accept its fields as keyword arguments (`StreamOptionFields`) that change it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from sluice.client.streams.headers import RESERVED_HEADERS
from sluice.config import MiB
from sluice.errors import ClientError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_STREAM_WINDOW",
    "MAX_CHUNK_BYTES",
    "StreamOptionFields",
    "StreamOptions",
    "StreamProgress",
    "StreamResume",
    "hash_prefix",
]

DEFAULT_CHUNK_BYTES = 1 * MiB
# Frames are bounded by the broker's max_frame_bytes (64 MiB by default); leave room for headers.
MAX_CHUNK_BYTES = 63 * MiB
# Chunks written and not yet receipted, at most.
DEFAULT_STREAM_WINDOW = 16


@dataclass(frozen=True)
class StreamResume:
    """Where a new producer continues a stream whose earlier chunks the broker already has.

    `next_seq` and `offset` are those of the first chunk to send; `sha256` is a hashlib SHA-256
    object that has already hashed exactly the first `offset` bytes (see `hash_prefix`). The
    source handed to `send_stream` must start at `offset`.
    """

    next_seq: int
    offset: int
    sha256: Any


@dataclass(frozen=True)
class StreamProgress:
    """A chunk the broker has confirmed (its RECEIPT came), reported in order."""

    stream_id: str
    seq: int
    # Bytes of the stream up to the end of this chunk.
    offset_end: int
    end: bool


@dataclass(frozen=True)
class StreamOptions:
    """The settings of one `send_stream`; checked when made (`ClientError` if wrong).

    `chunk_size` bytes per chunk. At most `window` chunks are written and not yet receipted at
    once. With `transactional`, all chunks go in one transaction, committed at the end: the
    stream is seen whole or not at all. `stream_id` defaults to a random one; `headers` go on
    every chunk and may not name the headers the stream sets itself. `resume` continues a stream
    from a chunk (the source then starts at its offset); `on_progress` is called as chunks are
    receipted, in order.
    """

    chunk_size: int = DEFAULT_CHUNK_BYTES
    transactional: bool = False
    stream_id: str | None = None
    headers: Mapping[str, str] | None = None
    window: int = DEFAULT_STREAM_WINDOW
    resume: StreamResume | None = None
    on_progress: Callable[[StreamProgress], None] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_size <= MAX_CHUNK_BYTES:
            raise ClientError(
                f"chunk_size must be between 1 and {MAX_CHUNK_BYTES} (got {self.chunk_size})"
            )
        if self.window < 1:
            raise ClientError(f"window must be at least 1 (got {self.window})")
        if self.resume is not None and self.transactional:
            raise ClientError("a transactional stream cannot resume: it starts again from chunk 0")
        reserved = sorted(RESERVED_HEADERS.intersection(self.headers or {}))
        if reserved:
            raise ClientError(f"send_stream sets these headers itself: {', '.join(reserved)}")

    @classmethod
    def of(cls, options: StreamOptions | None, changes: StreamOptionFields) -> StreamOptions:
        """`options` (or the defaults) with `changes` applied."""
        base = options if options is not None else cls()
        return dataclasses.replace(base, **changes) if changes else base


class StreamOptionFields(TypedDict, total=False):
    """The fields of `StreamOptions`, as keyword arguments of `send_stream`."""

    chunk_size: int
    transactional: bool
    stream_id: str | None
    headers: Mapping[str, str] | None
    window: int
    resume: StreamResume | None
    on_progress: Callable[[StreamProgress], None] | None


def hash_prefix(path: str | os.PathLike[str], length: int, *, block_bytes: int = MiB) -> Any:
    """A SHA-256 object that has hashed the first `length` bytes of the file at `path`.

    Raises `ClientError` if the file is shorter than that.
    """
    hasher = hashlib.sha256()
    remaining = length
    with open(path, "rb") as file:
        while remaining > 0:
            block = file.read(min(block_bytes, remaining))
            if not block:
                raise ClientError(f"{os.fspath(path)} has fewer than {length} bytes")
            hasher.update(block)
            remaining -= len(block)
    return hasher
