"""`StreamMethods`: the stream operations of `Client` (`send_stream`, `stream_reader`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

from sluice.client.stream import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_STREAM_WINDOW,
    SentStream,
    StreamProgress,
    StreamResume,
    StreamSource,
    send_stream,
)
from sluice.client.stream_reader import DEFAULT_STREAM_PREFETCH_BYTES, GapPolicy, StreamReader

if TYPE_CHECKING:
    from sluice.client.aio import Client

__all__ = ["StreamMethods"]


class StreamMethods:
    """Mixed into `Client`: sending and reading streams of chunks (DESIGN.md section 7)."""

    async def send_stream(
        self,
        destination: str,
        source: StreamSource,
        *,
        chunk_size: int = DEFAULT_CHUNK_BYTES,
        transactional: bool = False,
        stream_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        window: int = DEFAULT_STREAM_WINDOW,
        resume: StreamResume | None = None,
        on_progress: Callable[[StreamProgress], None] | None = None,
    ) -> SentStream:
        """Send `source` (bytes, a path, a binary file, an iterable or async iterable of bytes)
        to `destination` as a stream of persistent chunks of `chunk_size` bytes.

        At most `window` chunks are written and not yet receipted at once. With
        `transactional`, all chunks go in one transaction, committed at the end: the stream is
        seen whole or not at all. `stream_id` defaults to a random one; `headers` go on every
        chunk. `resume` continues a stream from a chunk (the source then starts at its offset);
        `on_progress` is called as chunks are receipted, in order. Raises `ConnectionLost`,
        `ReceiptTimeout` or `BrokerErrorFrame` as `send` does; see `sluice.client.stream`.
        """
        return await send_stream(
            cast("Client", self),
            destination,
            source,
            chunk_size=chunk_size,
            transactional=transactional,
            stream_id=stream_id,
            headers=headers,
            window=window,
            resume=resume,
            on_progress=on_progress,
        )

    def stream_reader(
        self,
        destination: str,
        *,
        prefetch_bytes: int = DEFAULT_STREAM_PREFETCH_BYTES,
        on_gap: GapPolicy | str = GapPolicy.RAISE,
        headers: Mapping[str, str] | None = None,
    ) -> StreamReader:
        """A reader of the streams sent to `destination`, one at a time:
        `async with client.stream_reader(dest) as reader: async for stream in reader: ...`.

        `prefetch_bytes` is the broker's byte credit (a few chunks). `on_gap` says what to do
        with a chunk out of place or a stream that fails its checks: `raise` or `skip`. See
        `sluice.client.stream_reader`.
        """
        return StreamReader(
            cast("Client", self),
            destination,
            prefetch_bytes=prefetch_bytes,
            on_gap=on_gap,
            headers=headers,
        )
