"""`StreamMethods`: the stream operations of `Client` (`send_stream`, `stream_reader`).

A mixin whose methods ask of `self` only the narrow transports of `sluice.client.streams.transport`,
so this package never imports the client that uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Unpack

from sluice.client.streams.chunker import StreamSource
from sluice.client.streams.options import StreamOptionFields, StreamOptions
from sluice.client.streams.reader import DEFAULT_STREAM_PREFETCH_BYTES, GapPolicy, StreamReader
from sluice.client.streams.send import SentStream, send_stream
from sluice.client.streams.transport import ReadTransport, SendTransport

__all__ = ["StreamMethods"]


class StreamMethods:
    """Mixed into `Client`: sending and reading streams of chunks (DESIGN.md section 7)."""

    async def send_stream(
        self: SendTransport,
        destination: str,
        source: StreamSource,
        options: StreamOptions | None = None,
        **changes: Unpack[StreamOptionFields],
    ) -> SentStream:
        """Send `source` (bytes, a path, a binary file, an iterable or async iterable of bytes)
        to `destination` as a stream of persistent chunks.

        `options` (a `StreamOptions`), or its fields as keyword arguments (`chunk_size`,
        `transactional`, `stream_id`, `headers`, `window`, `resume`, `on_progress`), say how;
        keywords change the fields of `options`. Raises `ConnectionLost`, `ReceiptTimeout` or
        `BrokerErrorFrame` as `send` does; see `sluice.client.streams.send`.
        """
        return await send_stream(self, destination, source, StreamOptions.of(options, changes))

    def stream_reader(
        self: ReadTransport,
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
        `sluice.client.streams.reader`.
        """
        return StreamReader(
            self, destination, prefetch_bytes=prefetch_bytes, on_gap=on_gap, headers=headers
        )
