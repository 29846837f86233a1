"""Streams from plain threads: `BlockingStreamReader` and `BlockingInboundStream`.

They wrap `StreamReader` and `InboundStream` and run each call on the blocking client's loop
thread, so `with client.stream_reader(dest) as reader: for stream in reader: stream.read(n)`
works as the asyncio version does (see `sluice.client.streams.reader`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any

from sluice.client.streams.inbound import InboundStream, StreamState
from sluice.client.streams.reader import StreamReader
from sluice.errors import ClientError

__all__ = ["BlockingInboundStream", "BlockingStreamReader"]

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


class BlockingInboundStream:
    """An `InboundStream` read from a plain thread, like a binary file opened for reading.

    `read(n)` returns up to `n` bytes (short at chunk boundaries; b"" at the end); `read()` the
    rest of the current chunk, never the whole stream at once. The asyncio stream is `aio`.
    """

    def __init__(self, stream: InboundStream, run: Runner) -> None:
        self.aio = stream
        self._run = run

    def __repr__(self) -> str:
        return f"<BlockingInboundStream {self.aio.id} at {self.aio.position}>"

    @property
    def id(self) -> str:
        """The stream's `x-stream-id`."""
        return self.aio.id

    @property
    def name(self) -> str | None:
        """Its `x-stream-name` as sent (unsanitized)."""
        return self.aio.name

    @property
    def headers(self) -> Mapping[str, str]:
        """The first chunk's headers."""
        return self.aio.headers

    @property
    def size_hint(self) -> int | None:
        """The size the producer announced (`x-stream-size`), if any."""
        return self.aio.size_hint

    @property
    def resumed_at(self) -> int:
        """Offset of the first byte handed out (0 unless resumed)."""
        return self.aio.resumed_at

    @property
    def resumed(self) -> bool:
        """Whether the stream was picked up after its start."""
        return self.aio.resumed

    @property
    def continued(self) -> bool:
        """Whether the stream continues, without the resume mark, where this reader (or the
        application, through `expect`) left it."""
        return self.aio.continued

    @property
    def position(self) -> int:
        """Offset of the next byte."""
        return self.aio.position

    @property
    def length(self) -> int | None:
        """The stream's length, once its end is reached."""
        return self.aio.length

    @property
    def sha256(self) -> str | None:
        """The producer's SHA-256 (hex), once the end is reached."""
        return self.aio.sha256

    @property
    def verified(self) -> bool | None:
        """Whether the SHA-256 was checked over the whole stream (known at the end)."""
        return self.aio.verified

    @property
    def ended(self) -> bool:
        """Whether every byte has been handed out and checked."""
        return self.aio.ended

    @property
    def error(self) -> ClientError | None:
        """Why the stream failed, if it did."""
        return self.aio.error

    @property
    def state(self) -> StreamState:
        """Where the stream stands."""
        return self.aio.state

    def readable(self) -> bool:
        """Always True: a stream is read."""
        return True

    def read(self, size: int = -1) -> bytes:
        """See `InboundStream.read`."""
        data: bytes = self._run(self.aio.read(size))
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:
        """See `InboundStream.readinto`."""
        count: int = self._run(self.aio.readinto(buffer))
        return count

    def __iter__(self) -> Iterator[bytes]:
        """The stream's bytes, a chunk (or what is left of one) at a time."""
        while True:
            data = self.read()
            if not data:
                return
            yield data

    def seed_sha256(self, hasher: Any) -> None:
        """See `InboundStream.seed_sha256`."""
        self.aio.seed_sha256(hasher)

    def skip(self) -> None:
        """See `InboundStream.skip`."""
        self._run(self.aio.skip())

    def finish(self) -> None:
        """See `InboundStream.finish`."""
        self._run(self.aio.finish())


class BlockingStreamReader:
    """A `StreamReader` used from a plain thread: `with client.stream_reader(dest) as reader:
    for stream in reader: ...`, or `reader.next_stream(timeout)`."""

    def __init__(self, reader: StreamReader, run: Runner) -> None:
        self.aio = reader
        self._run = run

    def __repr__(self) -> str:
        return f"<BlockingStreamReader {self.aio.destination}>"

    @property
    def skipped_chunks(self) -> int:
        """Chunks dropped under `on_gap="skip"`."""
        return self.aio.skipped_chunks

    @property
    def last_error(self) -> ClientError | None:
        """The last check that failed."""
        return self.aio.last_error

    def open(self) -> BlockingStreamReader:
        """Subscribe; return self."""
        self._run(self.aio.open())
        return self

    def close(self) -> None:
        """Unsubscribe (unacknowledged chunks go back to the broker)."""
        self._run(self.aio.close())

    def __enter__(self) -> BlockingStreamReader:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._run(self.aio.__aexit__(exc_type, exc, tb))

    def expect(self, stream_id: str, offset: int) -> None:
        """See `StreamReader.expect`."""
        self.aio.expect(stream_id, offset)

    def next_stream(self, timeout: float | None = None) -> BlockingInboundStream | None:
        """See `StreamReader.next_stream`."""
        stream: InboundStream | None = self._run(self.aio.next_stream(timeout))
        return None if stream is None else BlockingInboundStream(stream, self._run)

    def __iter__(self) -> Iterator[BlockingInboundStream]:
        """Streams until the subscription ends."""
        while True:
            try:
                stream: InboundStream = self._run(self.aio.__anext__())
            except StopAsyncIteration:
                return
            yield BlockingInboundStream(stream, self._run)
